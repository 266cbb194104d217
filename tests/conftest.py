"""Settings every test process shares.

Private values are encrypted at rest (:mod:`app.crypto`). Every in-process app and every
``gatekeeper`` subprocess of the suite reads the same key from ``GATEKEEPER_ENCRYPTION_KEYS`` —
set here, before anything reads the settings — so processes sharing a database can read each
other's rows and no key file is written into the checkout. ``tests/service/test_encryption.py``
covers the key file of the embedded default separately.
"""

from __future__ import annotations

import os

from app import crypto

TEST_ENCRYPTION_KEY = os.environ.setdefault("GATEKEEPER_ENCRYPTION_KEYS", crypto.new_key())
crypto.configure(crypto.cipher_from_settings(TEST_ENCRYPTION_KEY, "", production=False))

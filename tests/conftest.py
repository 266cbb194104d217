"""Settings every test process shares.

Private values are encrypted at rest (:mod:`app.crypto`). Every in-process app and every
``gatekeeper`` subprocess of the suite reads the same key from ``GATEKEEPER_ENCRYPTION_KEYS`` —
set here, before anything reads the settings — so processes sharing a database can read each
other's rows and no key file is written into the checkout. ``tests/service/test_encryption.py``
covers the key file of the embedded default separately.
"""

from __future__ import annotations

import os

import pytest

from app import crypto

TEST_ENCRYPTION_KEY = os.environ.setdefault("GATEKEEPER_ENCRYPTION_KEYS", crypto.new_key())
crypto.configure(crypto.cipher_from_settings(TEST_ENCRYPTION_KEY, "", production=False))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest tests first, so the two test processes finish together.

    The suite is mostly fast tables plus a few tests of minutes (SIGKILL scenarios, schemathesis,
    the browser, statistical checks), all marked ``slow``. In collection order the run used to
    end with one long test alone on one core; started first, the long ones overlap and the fast
    ones fill in around them (pytest-xdist hands out tests in this order). Stable: within each
    group the collection order stays.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

"""Encryption at rest of the objects' private values (authenticated: Fernet, AES-128-CBC + HMAC).

Keys. ``GATEKEEPER_ENCRYPTION_KEYS`` is a comma-separated list of Fernet keys (``gatekeeper
encryption new-key`` prints one); the first encrypts, all of them decrypt (``MultiFernet``), which
is what makes rotation possible. Without it the embedded default reads the key file
``GATEKEEPER_ENCRYPTION_KEY_FILE`` (``./data/encryption.key``), creating it on first use with
permissions ``0600`` — and says so in the log. With ``GATEKEEPER_ENV=production`` a missing key is
an error: a key must be given, never generated next to the data it protects.

Storage. A stored value is ``fernet:`` + token. :class:`app.db.types.EncryptedText` (the column
type of ``objects.value``) encrypts on every write and decrypts on every read with the process's
cipher (:func:`configure` / :func:`active`), so no code path can store a plaintext value by
mistake; with no cipher configured it refuses both. Rows written before encryption existed
(plain JSON) are encrypted by :func:`app.services.encryption.encrypt_plaintext_rows`, which
``gatekeeper serve`` runs after migrating. This module holds the cipher only: it imports nothing
of the database layer.

Rotation. Put the new key first in ``GATEKEEPER_ENCRYPTION_KEYS`` (old keys after it), restart,
run ``gatekeeper encryption rotate`` (re-encrypts every value with the new key), then drop the old
keys. See README, "Encryption at rest".
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

log = logging.getLogger("gatekeeper")

PREFIX = "fernet:"


class EncryptionKeyError(ValueError):
    """No usable key (the message never contains key material)."""


class ValueCipher:
    """Encrypts and decrypts stored values with a list of Fernet keys (first one encrypts)."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise EncryptionKeyError("no encryption key")
        try:
            self._fernet = MultiFernet([Fernet(k) for k in keys])
        except (ValueError, TypeError):
            raise EncryptionKeyError(
                "an encryption key is not a valid Fernet key (32 url-safe base64-encoded bytes; "
                "`gatekeeper encryption new-key` prints one)"
            ) from None

    def encrypt(self, plaintext: str) -> str:
        """``fernet:`` + token of ``plaintext``."""
        return PREFIX + self._fernet.encrypt(plaintext.encode()).decode("ascii")

    def decrypt(self, stored: str) -> str:
        """The plaintext of a stored value (raises :class:`EncryptionKeyError` on a bad key)."""
        if not stored.startswith(PREFIX):
            raise EncryptionKeyError("a stored value is not encrypted (run `gatekeeper serve`)")
        try:
            return self._fernet.decrypt(stored[len(PREFIX) :].encode("ascii")).decode()
        except InvalidToken:
            raise EncryptionKeyError(
                "a stored value does not decrypt with any configured key"
            ) from None


def new_key() -> str:
    """A fresh Fernet key."""
    return Fernet.generate_key().decode("ascii")


def load_key_file(path: Path, *, create: bool) -> bytes:
    """The key in ``path``; with ``create``, a new one is written (``0600``) if there is none.

    Several processes may start at once: the file is created with ``O_EXCL``, and a process that
    loses the race reads the winner's key.
    """
    if not path.exists():
        if not create:
            raise EncryptionKeyError(
                "no encryption key: set GATEKEEPER_ENCRYPTION_KEYS or provide the key file "
                f"GATEKEEPER_ENCRYPTION_KEY_FILE (no file at {path.resolve()})"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(new_key() + "\n")
            log.warning(
                "generated an encryption key for private values at %s (mode 0600); back it up: "
                "without it the stored values cannot be read",
                path,
            )
    for _ in range(50):  # a racing creator may not have written it yet
        key = path.read_text().strip()
        if key:
            return key.encode("ascii")
        threading.Event().wait(0.02)
    raise EncryptionKeyError(f"the key file {path} is empty")


def cipher_from_settings(
    keys: str | None, key_file: str, *, production: bool, create: bool = True
) -> ValueCipher:
    """The cipher the settings describe (see the module docstring).

    Without keys the key file is read; it is created when missing only with ``create`` outside
    production (``gatekeeper serve`` and ``migrate`` create it, the other commands never do).
    """
    if keys:
        return ValueCipher([k.strip().encode("ascii") for k in keys.split(",") if k.strip()])
    return ValueCipher([load_key_file(Path(key_file), create=create and not production)])


_active: ValueCipher | None = None


def configure(cipher: ValueCipher) -> None:
    """Make ``cipher`` the one :class:`EncryptedText` uses in this process."""
    global _active
    _active = cipher


def active() -> ValueCipher:
    """The configured cipher (raises if none: values are never handled in plaintext)."""
    if _active is None:
        raise EncryptionKeyError("no encryption key configured in this process")
    return _active

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

import base64
import binascii
import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.fernet import Fernet, MultiFernet
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

log = logging.getLogger("gatekeeper")

PREFIX = "fernet:"
#: The URL-safe base64 alphabet's two letters as the standard one's (``urlsafe_b64decode``'s).
_URLSAFE = bytes.maketrans(b"-_", b"+/")


class EncryptionKeyError(ValueError):
    """No usable key (the message never contains key material)."""


class ValueCipher:
    """Encrypts and decrypts stored values with a list of Fernet keys (first one encrypts)."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise EncryptionKeyError("no encryption key")
        try:
            self._fernet = MultiFernet([Fernet(k) for k in keys])
            # (signing key, encryption key) of each Fernet key, in order (decrypt_many)
            self._halves = [
                (raw[:16], raw[16:]) for raw in (base64.urlsafe_b64decode(k) for k in keys)
            ]
            # each key's HMAC-SHA256 keyed once (decrypt copies it per token)
            self._signers = [hmac.new(sign, digestmod=hashlib.sha256) for sign, _ in self._halves]
            self._threads = threading.local()
        except (ValueError, TypeError, binascii.Error):
            raise EncryptionKeyError(
                "an encryption key is not a valid Fernet key (32 url-safe base64-encoded bytes; "
                "`gatekeeper encryption new-key` prints one)"
            ) from None

    def encrypt(self, plaintext: str) -> str:
        """``fernet:`` + token of ``plaintext``."""
        return PREFIX + self._fernet.encrypt(plaintext.encode()).decode("ascii")

    def decrypt(self, stored: str) -> str:
        """The plaintext of a stored value (raises :class:`EncryptionKeyError` on a bad key).

        ``MultiFernet.decrypt`` of the token, without its per-token costs (a new AES-CBC context
        and an HMAC keyed anew: 8.7 → 4.2 µs in ``bench/submit_parts.py``, docs/benchmarks.md,
        "h/submit4"): each key
        is tried in order as MultiFernet tries it — the token decoded as its non-strict base64
        decoder does, version byte ``0x80``, HMAC-SHA256 of everything before the tag under the
        key's signing half (keyed once, copied per token), compared in constant time, before
        anything is decrypted — then its blocks are decrypted with the calling thread's AES-ECB
        context of that key (made once per thread; always whole blocks, so it never holds a
        partial one) and chained (``P_i = D_K(C_i) ⊕ C_{i−1}``, ``C_0`` the IV) as CBC does, and
        the PKCS7 padding checked and removed as Fernet's unpadder does; a key whose HMAC
        matches but whose padding does not leaves the next key to try, as in MultiFernet.
        (Tested against ``MultiFernet.decrypt`` on every padding length, rotated keys and
        tampered tokens.)
        """
        if not stored.startswith(PREFIX):
            raise EncryptionKeyError("a stored value is not encrypted (run `gatekeeper serve`)")
        token = stored[len(PREFIX) :].encode("ascii")
        try:
            data = binascii.a2b_base64(token.translate(_URLSAFE))
        except (binascii.Error, ValueError):
            raise self._undecryptable() from None
        body = len(data) - 57  # version 1 + timestamp 8 + IV 16 + tag 32
        if body <= 0 or body % 16 or data[0] != 0x80:
            raise self._undecryptable()
        signed, tag = data[:-32], data[-32:]
        for k, signer in enumerate(self._signers):
            mac = signer.copy()
            mac.update(signed)
            if not hmac.compare_digest(mac.digest(), tag):
                continue
            blocks = data[25:-32]
            decrypted = self._ecb(k).update(blocks)
            padded = (
                int.from_bytes(decrypted, "big") ^ int.from_bytes(data[9:-48], "big")
            ).to_bytes(len(blocks), "big")
            pad = padded[-1]
            if 1 <= pad <= 16 and padded[-pad:] == bytes([pad]) * pad:
                return padded[:-pad].decode()
        raise self._undecryptable()

    def _ecb(self, k: int) -> Any:
        """The calling thread's AES-ECB decryption context of key ``k`` (made once per thread).

        ECB is only ``D_K`` block by block, the first half of CBC decryption (the chaining XOR
        follows in :meth:`decrypt`); it is fed whole blocks only, so between two tokens it holds
        nothing, and nothing is ever encrypted with it.
        """
        contexts = getattr(self._threads, "ecb", None)
        if contexts is None:
            contexts = self._threads.ecb = [None] * len(self._halves)
        context = contexts[k]
        if context is None:
            key = self._halves[k][1]
            context = contexts[k] = Cipher(algorithms.AES(key), modes.ECB()).decryptor()  # noqa: S305
        return context

    def decrypt_many(self, stored: Sequence[str]) -> list[str]:
        """The plaintexts of many stored values: :meth:`decrypt` of each, in one pass.

        A survey chunk decrypts 5,000 values; through ``MultiFernet.decrypt`` each costs about
        25 µs, mostly building a new AES-CBC context per token. Here each token is checked
        exactly as Fernet checks it (version byte ``0x80``, length, HMAC-SHA256 of everything
        before the tag under the signing half of the first key that verifies it, compared in
        constant time — before anything is decrypted), then the ciphertexts of all the tokens
        verified under one key are decrypted together. CBC decryption is
        ``P_i = D_K(C_i) ⊕ C_{i−1}`` with ``C_0 = IV``: the block decryptions ``D_K`` of every
        block of every token are one AES-ECB pass, and the chaining is one XOR of that buffer
        with the buffer of each block's predecessor (the token's IV before its first block).
        PKCS7 padding is then checked and removed as Fernet's unpadder does. Any failure raises
        :class:`EncryptionKeyError` like :meth:`decrypt`. (Tested against ``decrypt`` on tokens
        of every padding length, rotated keys and tampered tokens.)
        """
        prefix = len(PREFIX)
        plain = [""] * len(stored)  # every token is placed in exactly one batch below
        # per key: the indexes, and the buffers of ciphertext blocks and of their predecessors
        batches: list[tuple[list[int], list[bytes], list[bytes]]] = [
            ([], [], []) for _ in self._halves
        ]
        # per key, HMAC-SHA256 keyed once and copied per token (hmac.digest keys it every
        # time: two more SHA-256 blocks), in the order the keys are tried
        signers = [
            (hmac.new(sign, digestmod=hashlib.sha256), batch)
            for (sign, _), batch in zip(self._halves, batches, strict=True)
        ]
        # urlsafe_b64decode without its Python layers: the same non-strict decoder
        a2b, urlsafe, compare = binascii.a2b_base64, _URLSAFE, hmac.compare_digest
        for n, text in enumerate(stored):
            if not text.startswith(PREFIX):
                raise EncryptionKeyError("a stored value is not encrypted (run `gatekeeper serve`)")
            try:
                data = a2b(text[prefix:].encode("ascii").translate(urlsafe))
            except (binascii.Error, ValueError):
                raise self._undecryptable() from None
            body = len(data) - 57  # version 1 + timestamp 8 + IV 16 + tag 32
            if body <= 0 or body % 16 or data[0] != 0x80:
                raise self._undecryptable()
            signed, tag = data[:-32], data[-32:]
            for signer, batch in signers:
                mac = signer.copy()
                mac.update(signed)
                if compare(mac.digest(), tag):
                    batch[0].append(n)
                    batch[1].append(data[25:-32])
                    batch[2].append(data[9:-48])  # IV, then every ciphertext block but the last
                    break
            else:
                raise self._undecryptable()
        for (_, key), (indexes, blocks, previous) in zip(self._halves, batches, strict=True):
            if not indexes:
                continue
            # ECB here is only D_K block by block, the first half of CBC decryption (the
            # chaining XOR follows); nothing is ever encrypted in this mode
            decryptor = Cipher(algorithms.AES(key), modes.ECB()).decryptor()  # noqa: S305
            decrypted = decryptor.update(b"".join(blocks)) + decryptor.finalize()
            chained = (
                np.frombuffer(decrypted, dtype=np.uint8)
                ^ np.frombuffer(b"".join(previous), dtype=np.uint8)
            ).tobytes()
            start = 0
            for n, block in zip(indexes, blocks, strict=True):
                padded = chained[start : start + len(block)]
                start += len(block)
                pad = padded[-1]
                if not 1 <= pad <= 16 or padded[-pad:] != bytes([pad]) * pad:
                    raise self._undecryptable()
                try:
                    plain[n] = padded[:-pad].decode()
                except UnicodeDecodeError:
                    raise self._undecryptable() from None
        return plain

    @staticmethod
    def _undecryptable() -> EncryptionKeyError:
        return EncryptionKeyError("a stored value does not decrypt with any configured key")


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

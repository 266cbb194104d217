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
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.hmac import HMAC

# NumPy (~0.06 s of CPU) is imported by the batch decryption that uses it, not with this module:
# app.settings imports this module, and a `gatekeeper serve` parent or a command that never
# decrypts a batch need not load it (docs/benchmarks.md, "Nineteenth session, h/spawn")
if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

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
            # per key, HMAC-SHA256 keyed once and copied per token (decrypt_many)
            self._signers = [HMAC(sign, hashes.SHA256()) for sign, _ in self._halves]
        except (ValueError, TypeError, binascii.Error):
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
            raise _not_encrypted()
        try:
            return self._fernet.decrypt(stored[len(PREFIX) :].encode("ascii")).decode()
        except InvalidToken:
            raise _undecryptable() from None

    def decrypt_many(self, stored: Sequence[str]) -> list[str]:
        """The plaintexts of many stored values: :meth:`decrypt` of each, in one pass.

        A survey chunk decrypts 5,000 values; through ``MultiFernet.decrypt`` each costs about
        25 µs, mostly building a new AES-CBC context per token. Here each token is checked
        exactly as Fernet checks it (version byte ``0x80``, length, HMAC-SHA256 of everything
        before the tag under the signing half of the first key that verifies it, compared in
        constant time — every token of a length before any of them is decrypted), then the
        ciphertexts of all the tokens verified under one key are decrypted together. CBC
        decryption is ``P_i = D_K(C_i) ⊕ C_{i−1}`` with ``C_0 = IV``: the block decryptions
        ``D_K`` of every block of every token are one AES-ECB pass, and the chaining is one XOR
        of that buffer with the buffer of each block's predecessor (the token's IV before its
        first block). PKCS7 padding is then checked and removed as Fernet's unpadder does. Any
        failure raises :class:`EncryptionKeyError` like :meth:`decrypt`. (Tested against
        ``decrypt`` on tokens of every padding length, rotated keys, tampered and malformed
        tokens.)

        The tokens are base64-decoded as arrays, those of one length together
        (:func:`_decoded`), and checked, decrypted and unpadded as rows of an array: per token
        only its HMAC (cryptography's, which Fernet uses) and its text's slice and UTF-8
        decoding are Python calls (docs/benchmarks.md, "h/member: the seventh survey's
        decryption").
        """
        plain = [""] * len(stored)  # every token is in exactly one batch of _decoded's
        for indexes, data in _decoded(stored):
            self._open(indexes, data, plain)
        return plain

    def _open(self, indexes: Sequence[int], data: npt.NDArray[np.uint8], plain: list[str]) -> None:
        """:meth:`decrypt_many` of tokens of one length (one a row of ``data``) into ``plain``."""
        import numpy as np

        count, size = data.shape
        body = size - 57  # version 1 + timestamp 8 + IV 16 + tag 32
        if body <= 0 or body % 16 or not (data[:, 0] == 0x80).all():
            raise _undecryptable()
        tokens = data.tobytes()
        view = memoryview(tokens)
        owners = np.zeros(count, dtype=np.intp)  # each token's key: the first that verifies it
        first = self._signers[0]
        for row in range(count):
            start = row * size
            tag = start + size - 32
            mac = first.copy()
            mac.update(view[start:tag])
            try:
                mac.verify(tokens[tag : start + size])
            except InvalidSignature:
                owners[row] = self._signer_of(view[start:tag], tokens[tag : start + size])
        for owner, (_, key) in enumerate(self._halves):
            rows = np.flatnonzero(owners == owner)
            if not rows.size:
                continue
            mine = data if rows.size == count else data[rows]
            # ECB here is only D_K block by block, the first half of CBC decryption (the
            # chaining XOR follows); nothing is ever encrypted in this mode
            decryptor = Cipher(algorithms.AES(key), modes.ECB()).decryptor()  # noqa: S305
            blocks = np.ascontiguousarray(mine[:, 25 : size - 32]).tobytes()
            decrypted = decryptor.update(blocks) + decryptor.finalize()
            padded = np.frombuffer(decrypted, dtype=np.uint8).reshape(rows.size, body)
            padded = padded ^ mine[:, 9 : size - 48]  # the IV, then every block but the last
            # PKCS7: the last byte n is 1..16, and so are the n last bytes
            pad = padded[:, -1]
            covered = np.arange(16, 0, -1) <= pad[:, None]  # which of the last 16 bytes n covers
            if not (
                ((pad >= 1) & (pad <= 16)).all()
                and ((padded[:, -16:] == pad[:, None]) | ~covered).all()
            ):
                raise _undecryptable()
            texts = padded.tobytes()
            places = indexes if rows.size == count else [indexes[r] for r in rows.tolist()]
            try:
                for row, (n, length) in enumerate(zip(places, (body - pad).tolist(), strict=True)):
                    start = row * body
                    plain[n] = texts[start : start + length].decode()
            except UnicodeDecodeError:
                raise _undecryptable() from None

    def _signer_of(self, signed: memoryview, tag: bytes) -> int:
        """The number of the first key but the first whose HMAC verifies a token (rotation)."""
        for owner, signer in enumerate(self._signers[1:], start=1):
            mac = signer.copy()
            mac.update(signed)
            try:
                mac.verify(tag)
            except InvalidSignature:
                continue
            return owner
        raise _undecryptable()


def _undecryptable() -> EncryptionKeyError:
    return EncryptionKeyError("a stored value does not decrypt with any configured key")


def _not_encrypted() -> EncryptionKeyError:
    return EncryptionKeyError("a stored value is not encrypted (run `gatekeeper serve`)")


def _decoded(stored: Sequence[str]) -> list[tuple[Sequence[int], npt.NDArray[np.uint8]]]:
    """The stored values' tokens by length: their places in ``stored`` and their bytes, one a row.

    The texts of one length that are all the prefix and canonical base64 with the same padding
    (what :meth:`ValueCipher.encrypt` writes) are decoded together (:func:`_decoded_alike`);
    any other text by ``binascii`` alone, as ``urlsafe_b64decode`` (Fernet's) decodes it.
    Raises :class:`EncryptionKeyError` for a value without the prefix or that is not base64.
    """
    import numpy as np

    lengths = list(map(len, stored))
    if lengths and min(lengths) == max(lengths):
        groups: dict[int, Sequence[int]] = {lengths[0]: range(len(stored))}
    else:
        groups = defaultdict(list)
        for n, length in enumerate(lengths):
            groups[length].append(n)  # type: ignore[attr-defined]
    found: list[tuple[Sequence[int], npt.NDArray[np.uint8]]] = []
    odd: dict[int, tuple[list[int], list[bytes]]] = defaultdict(lambda: ([], []))
    for length, indexes in groups.items():
        alike = _decoded_alike([stored[n] for n in indexes], length)
        if alike is not None:
            found.append((indexes, alike))
            continue
        for n in indexes:
            token = _token(stored[n])
            places, tokens = odd[len(token)]
            places.append(n)
            tokens.append(token)
    for size, (places, tokens) in odd.items():
        data = np.frombuffer(b"".join(tokens), dtype=np.uint8).reshape(len(tokens), size)
        found.append((places, data))
    return found


#: The URL-safe base64 alphabet's two letters as the standard one's, and the padding character
#: as a zero sextet (``A``): the bytes a padded quad does encode come out the same (its other
#: bits, which binascii ignores, become bytes cut off).
_STANDARD = bytes.maketrans(b"-_=", b"+/A")
_PREFIX_BYTES = PREFIX.encode("ascii")


def _decoded_alike(texts: list[str], length: int) -> npt.NDArray[np.uint8] | None:
    """The tokens of ``texts`` (each ``length`` characters) as rows, decoded in one call.

    None unless every text is the prefix and then base64 without a character outside its
    alphabets, a multiple of 4 long, ending in the same padding (0, 1 or 2 ``=``) and holding no
    other ``=`` — then the same bytes as ``urlsafe_b64decode`` of each: the texts but their
    prefixes, joined, are whole quads, decoded by ``a2b_base64`` in strict mode (which refuses
    any character outside the alphabet), the padding's bytes cut off each row.
    """
    width = length - len(PREFIX)
    if not texts or width <= 0 or width % 4:
        return None
    import numpy as np

    try:
        joined = "".join(texts).encode("ascii")
    except UnicodeEncodeError:
        return None
    chars = np.frombuffer(joined, dtype=np.uint8).reshape(len(texts), length)
    if not (chars[:, : len(PREFIX)] == np.frombuffer(_PREFIX_BYTES, dtype=np.uint8)).all():
        return None
    padding = 0
    while padding < 2 and chars[0, length - 1 - padding] == ord("="):
        padding += 1
    if (
        joined.count(b"=") != padding * len(texts)
        or not (chars[:, length - padding :] == ord("=")).all()
    ):
        return None
    body = chars[:, len(PREFIX) :].tobytes().translate(_STANDARD)
    try:
        data = binascii.a2b_base64(body, strict_mode=True)
    except binascii.Error:
        return None
    size = width // 4 * 3
    if len(data) != size * len(texts):
        return None
    return np.frombuffer(data, dtype=np.uint8).reshape(len(texts), size)[:, : size - padding]


def _token(text: str) -> bytes:
    """One stored value's token, decoded as ``urlsafe_b64decode`` (Fernet's) decodes it."""
    if not text.startswith(PREFIX):
        raise _not_encrypted()
    try:
        return binascii.a2b_base64(text[len(PREFIX) :].encode("ascii").translate(_URLSAFE))
    except (binascii.Error, ValueError):
        raise _undecryptable() from None


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

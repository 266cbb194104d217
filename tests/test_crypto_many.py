"""``ValueCipher.decrypt_many`` (one AES pass for a chunk's values) against Fernet's own decrypt."""

from __future__ import annotations

import base64
import secrets

import pytest
from cryptography.fernet import Fernet

from app import crypto


def _plaintexts() -> list[str]:
    # every PKCS7 padding length (1..16 bytes) and several blocks, non-ASCII included
    texts = ["x" * n for n in range(0, 40)]
    texts += ['{"age": 41, "region": "Zürich"}', "é" * 17, "[1, 2.5, null]"]
    return texts


def test_decrypt_many_equals_decrypt_for_every_padding_length() -> None:
    cipher = crypto.ValueCipher([Fernet.generate_key()])
    texts = _plaintexts()
    stored = [cipher.encrypt(t) for t in texts]
    assert cipher.decrypt_many(stored) == [cipher.decrypt(s) for s in stored] == texts
    assert cipher.decrypt_many([]) == []


def test_decrypt_many_reads_tokens_of_every_rotated_key_in_order() -> None:
    new, old = Fernet.generate_key(), Fernet.generate_key()
    before, after = crypto.ValueCipher([old]), crypto.ValueCipher([new, old])
    texts = _plaintexts()
    stored = [(after if n % 3 else before).encrypt(t) for n, t in enumerate(texts)]
    assert after.decrypt_many(stored) == texts
    with pytest.raises(crypto.EncryptionKeyError, match="does not decrypt"):
        crypto.ValueCipher([new]).decrypt_many(stored)


def _tampered(stored: str, position: int) -> str:
    data = bytearray(base64.urlsafe_b64decode(stored[len(crypto.PREFIX) :]))
    data[position] ^= 0x01
    return crypto.PREFIX + base64.urlsafe_b64encode(bytes(data)).decode()


@pytest.mark.parametrize("position", [0, 1, 9, 24, 25, 40, -33, -1])
def test_decrypt_many_refuses_what_decrypt_refuses(position: int) -> None:
    """A flipped bit anywhere (version, timestamp, IV, ciphertext, tag): refused, like decrypt."""
    cipher = crypto.ValueCipher([Fernet.generate_key()])
    good = [cipher.encrypt(t) for t in ("a", "b" * 20, "c")]
    bad = _tampered(good[1], position)
    with pytest.raises(crypto.EncryptionKeyError):
        cipher.decrypt(bad)
    with pytest.raises(crypto.EncryptionKeyError, match="does not decrypt"):
        cipher.decrypt_many([good[0], bad, good[2]])


@pytest.mark.parametrize(
    "stored",
    [
        '{"age": 3}',  # a plaintext row: never read as a value
        crypto.PREFIX + "not base64!",
        crypto.PREFIX + "gAAAAABé",  # not ASCII: no base64 at all
        crypto.PREFIX + base64.urlsafe_b64encode(b"\x80" + b"\x00" * 60).decode(),  # too short
        crypto.PREFIX + base64.urlsafe_b64encode(b"\x80" + b"\x00" * 80).decode(),  # not blocks
    ],
)
def test_decrypt_many_refuses_malformed_tokens(stored: str) -> None:
    cipher = crypto.ValueCipher([Fernet.generate_key()])
    with pytest.raises(crypto.EncryptionKeyError):
        cipher.decrypt_many([cipher.encrypt("ok"), stored])


def test_decrypt_many_on_a_large_batch() -> None:
    cipher = crypto.ValueCipher([Fernet.generate_key(), Fernet.generate_key()])
    texts = [secrets.token_hex(secrets.randbelow(30)) for _ in range(2_000)]
    stored = [cipher.encrypt(t) for t in texts]
    assert cipher.decrypt_many(stored) == texts


def test_decrypt_many_checks_the_padding_under_a_valid_tag() -> None:
    """A token signed with the right key whose plaintext is badly padded: refused by both."""
    import hashlib
    import hmac
    import struct
    import time

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = Fernet.generate_key()
    raw = base64.urlsafe_b64decode(key)
    iv = secrets.token_bytes(16)
    encryptor = Cipher(algorithms.AES(raw[16:]), modes.CBC(iv)).encryptor()
    body = encryptor.update(b"x" * 15 + b"\x05") + encryptor.finalize()  # pad byte 5, not 5 fives
    signed = b"\x80" + struct.pack(">Q", int(time.time())) + iv + body
    token = signed + hmac.digest(raw[:16], signed, hashlib.sha256)
    stored = crypto.PREFIX + base64.urlsafe_b64encode(token).decode()
    cipher = crypto.ValueCipher([key])
    with pytest.raises(crypto.EncryptionKeyError):
        cipher.decrypt(stored)
    with pytest.raises(crypto.EncryptionKeyError, match="does not decrypt"):
        cipher.decrypt_many([stored])

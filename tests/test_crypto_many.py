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


@pytest.mark.parametrize(
    "padded",
    [
        b"x" * 15 + b"\x05",  # pad byte 5, not 5 fives
        b"x" * 16 + b"\x11" * 16,  # seventeen: more than a block, though the last 16 agree
        b"x" * 15 + b"\x00",  # zero
    ],
)
def test_decrypt_many_checks_the_padding_under_a_valid_tag(padded: bytes) -> None:
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
    body = encryptor.update(padded) + encryptor.finalize()
    signed = b"\x80" + struct.pack(">Q", int(time.time())) + iv + body
    token = signed + hmac.digest(raw[:16], signed, hashlib.sha256)
    stored = crypto.PREFIX + base64.urlsafe_b64encode(token).decode()
    cipher = crypto.ValueCipher([key])
    with pytest.raises(crypto.EncryptionKeyError):
        cipher.decrypt(stored)
    with pytest.raises(crypto.EncryptionKeyError, match="does not decrypt"):
        cipher.decrypt_many([stored])


def test_decrypt_many_reads_any_base64_fernet_reads() -> None:
    """Texts of one length are decoded as arrays only when they are canonical base64 (either
    alphabet) with the same padding; any other text Fernet decodes (with characters outside the
    alphabet, which its non-strict decoder skips) is decoded alone; all as ``decrypt`` does."""
    cipher = crypto.ValueCipher([Fernet.generate_key()])
    texts = ["x" * n for n in range(0, 40)]  # tokens of 73, 89 and 105 bytes: 2, 1 and 0 "="
    stored = [cipher.encrypt(t) for t in texts]
    standard = [s.replace("-", "+").replace("_", "/") for s in stored]
    spaced = [s[:20] + "\n" + s[20:-4] + " " + s[-4:] for s in stored]
    mixed = [(stored, standard, spaced)[n % 3][n] for n in range(len(stored))]
    for batch in (standard, spaced, mixed, stored[:1] + spaced[1:2] + stored[2:]):
        assert [cipher.decrypt(s) for s in batch] == texts[: len(batch)]
        assert cipher.decrypt_many(batch) == texts[: len(batch)]


def test_decrypt_many_refuses_one_odd_token_among_alike_ones() -> None:
    """A text as long as the others but not a token (its prefix, a character, its padding, its
    key): the batch is refused as ``decrypt`` refuses that text, whatever the others."""
    key = Fernet.generate_key()
    cipher = crypto.ValueCipher([key])
    stored = [cipher.encrypt("y" * 20) for _ in range(6)]  # 89 bytes: one "="
    other = crypto.ValueCipher([Fernet.generate_key()]).encrypt("y" * 20)
    unprefixed = "fernex:" + stored[3][len(crypto.PREFIX) :]
    cases = {
        "not encrypted": unprefixed,
        "does not decrypt": other,
    }
    for message, odd in cases.items():
        with pytest.raises(crypto.EncryptionKeyError, match=message):
            cipher.decrypt(odd)
        with pytest.raises(crypto.EncryptionKeyError, match=message):
            cipher.decrypt_many([*stored[:3], odd, *stored[4:]])
    for odd in (stored[3][:-5] + "!" + stored[3][-4:], stored[3][:-2] + "=="):
        with pytest.raises(crypto.EncryptionKeyError):
            cipher.decrypt(odd)
        with pytest.raises(crypto.EncryptionKeyError, match="does not decrypt"):
            cipher.decrypt_many([*stored[:3], odd, *stored[4:]])
    rotated = crypto.ValueCipher([Fernet.generate_key(), key])
    assert rotated.decrypt_many(stored) == ["y" * 20] * 6


def test_a_chunks_canonical_tokens_are_decoded_as_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``encrypt`` writes (either base64 alphabet) takes the array road; a text of another
    form is decoded alone (``_token``), its length's alike texts still together."""
    cipher = crypto.ValueCipher([Fernet.generate_key()])
    texts = ["x" * (n % 40) for n in range(120)]  # 2, 1 and 0 "=" of padding
    stored = [cipher.encrypt(t) for t in texts]
    alone: list[str] = []
    token = crypto._token

    def decoded_alone(text: str) -> bytes:
        alone.append(text)
        return token(text)

    monkeypatch.setattr(crypto, "_token", decoded_alone)
    assert cipher.decrypt_many(stored) == texts
    assert alone == []
    standard = [s.replace("-", "+").replace("_", "/") for s in stored]
    assert standard != stored
    assert cipher.decrypt_many(standard) == texts
    assert alone == []
    spaced = stored[5][:20] + "\n" + stored[5][20:]
    assert cipher.decrypt_many([*stored[:5], spaced, *stored[6:]]) == texts
    assert alone == [spaced]

"""``ValueCipher.decrypt`` (one token, kept HMAC and AES contexts) against ``MultiFernet.decrypt``.

The definition of a stored value's plaintext is Fernet's: ``MultiFernet([keys]).decrypt(token)``
decoded as UTF-8, any ``InvalidToken`` an :class:`~app.crypto.EncryptionKeyError`. Every outcome
of ``decrypt`` must be that one: plaintexts of every padding length, tokens of rotated keys,
tampered and malformed tokens, a key whose tag matches but whose padding does not, many tokens
in a row and from several threads on the same cipher (its per-thread AES contexts).
"""

from __future__ import annotations

import base64
import secrets
import threading
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from app import crypto


def _definition(keys: list[bytes], stored: str) -> tuple[str, Any]:
    """MultiFernet's outcome: ("text", plaintext) or ("error", the exception's type)."""
    if not stored.startswith(crypto.PREFIX):
        return "error", crypto.EncryptionKeyError
    try:
        token = stored[len(crypto.PREFIX) :].encode("ascii")
        return "text", MultiFernet([Fernet(k) for k in keys]).decrypt(token).decode()
    except InvalidToken:
        return "error", crypto.EncryptionKeyError
    except (UnicodeEncodeError, UnicodeDecodeError) as exc:
        return "error", type(exc)


def _outcome(cipher: crypto.ValueCipher, stored: str) -> tuple[str, Any]:
    try:
        return "text", cipher.decrypt(stored)
    except (crypto.EncryptionKeyError, UnicodeEncodeError, UnicodeDecodeError) as exc:
        return "error", type(exc)


def _plaintexts() -> list[str]:
    texts = ["x" * n for n in range(0, 50)]  # every PKCS7 padding length, up to four blocks
    texts += ['{"age": 41, "region": "Zürich"}', "é" * 17, "[1, 2.5, null]", "\u2603" * 40]
    return texts


def test_decrypt_is_multifernet_for_every_padding_length_in_any_order() -> None:
    keys = [Fernet.generate_key()]
    cipher = crypto.ValueCipher(keys)
    stored = [cipher.encrypt(t) for t in _plaintexts()]
    order = stored + stored[::-1] + [stored[n] for n in (3, 40, 0, 17, 16, 15, 49)]
    for s in order:  # one thread's AES context across tokens of every length
        assert _outcome(cipher, s) == _definition(keys, s)
    assert [cipher.decrypt(s) for s in stored] == _plaintexts()


def test_decrypt_reads_tokens_of_every_rotated_key_as_multifernet_does() -> None:
    new, old, gone = Fernet.generate_key(), Fernet.generate_key(), Fernet.generate_key()
    after = crypto.ValueCipher([new, old])
    writers = [crypto.ValueCipher([k]) for k in (new, old, gone)]
    for n, text in enumerate(_plaintexts()):
        stored = writers[n % 3].encrypt(text)
        assert _outcome(after, stored) == _definition([new, old], stored)
    assert _outcome(after, writers[2].encrypt("x"))[0] == "error"


def test_a_key_whose_tag_matches_but_padding_does_not_leaves_the_next_key() -> None:
    """Two keys sharing a signing half: the first verifies every tag of the second's tokens but
    decrypts them to bad padding (nearly always), and MultiFernet goes on to the second."""
    sign = secrets.token_bytes(16)
    first = base64.urlsafe_b64encode(sign + secrets.token_bytes(16))
    second = base64.urlsafe_b64encode(sign + secrets.token_bytes(16))
    keys = [first, second]
    cipher = crypto.ValueCipher(keys)
    writer = crypto.ValueCipher([second])
    for text in _plaintexts():
        stored = writer.encrypt(text)
        assert _outcome(cipher, stored) == _definition(keys, stored)


def _tampered(stored: str, position: int) -> str:
    data = bytearray(base64.urlsafe_b64decode(stored[len(crypto.PREFIX) :]))
    data[position] ^= 0x01
    return crypto.PREFIX + base64.urlsafe_b64encode(bytes(data)).decode()


@pytest.mark.parametrize("position", [0, 1, 8, 9, 24, 25, 40, -49, -33, -32, -1])
def test_decrypt_refuses_a_tampered_token_as_multifernet_does(position: int) -> None:
    keys = [Fernet.generate_key()]
    cipher = crypto.ValueCipher(keys)
    bad = _tampered(cipher.encrypt("b" * 20), position)
    assert _outcome(cipher, bad) == _definition(keys, bad) == ("error", crypto.EncryptionKeyError)


@pytest.mark.parametrize(
    "stored",
    [
        '{"age": 3}',  # a plaintext row
        crypto.PREFIX,
        crypto.PREFIX + "not base64!",
        crypto.PREFIX + "gAAAAABé",  # not ASCII
        crypto.PREFIX + base64.urlsafe_b64encode(b"\x80" + b"\x00" * 56).decode(),  # no block
        crypto.PREFIX + base64.urlsafe_b64encode(b"\x80" + b"\x00" * 60).decode(),  # too short
        crypto.PREFIX + base64.urlsafe_b64encode(b"\x80" + b"\x00" * 80).decode(),  # not blocks
        crypto.PREFIX + base64.urlsafe_b64encode(b"\x81" + b"\x00" * 88).decode(),  # version
    ],
)
def test_decrypt_refuses_malformed_tokens_as_multifernet_does(stored: str) -> None:
    keys = [Fernet.generate_key()]
    cipher = crypto.ValueCipher(keys)
    assert _outcome(cipher, stored) == _definition(keys, stored)
    assert _outcome(cipher, stored)[0] == "error"
    assert cipher.decrypt(cipher.encrypt("ok")) == "ok"  # nothing left in its contexts


def test_decrypt_from_several_threads_at_once() -> None:
    cipher = crypto.ValueCipher([Fernet.generate_key(), Fernet.generate_key()])
    texts = [secrets.token_hex(secrets.randbelow(40)) for _ in range(400)]
    stored = [cipher.encrypt(t) for t in texts]
    wrong: list[int] = []
    start = threading.Barrier(4)

    def work(offset: int) -> None:
        start.wait()
        for n in range(len(stored)):
            k = (n + 97 * offset) % len(stored)
            if cipher.decrypt(stored[k]) != texts[k]:
                wrong.append(k)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []

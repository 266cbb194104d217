"""A survey's history hashes by ``history_hashes_after``: ``next_history_hash``'s, bit for bit."""

from __future__ import annotations

import hashlib
import random

from app.services.snapshots import history_hashes_after, next_history_hash, state_key


def test_history_hashes_after_is_next_history_hash() -> None:
    rng = random.Random(27)
    alphabet = "abcdef0123456789{}[]:,\"' éßα\x1f\x00"
    for _ in range(3000):
        query = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        output = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        step = history_hashes_after(query, output)
        for previous in (None, "", "".join(rng.choice("0123456789abcdef") for _ in range(32))):
            assert step(previous) == next_history_hash(previous, query, output)
    # the separator is part of the hashed bytes: moving it between the parts changes the hash
    assert history_hashes_after("ab", "c")("x") != history_hashes_after("a", "bc")("x")


def _by_definition(*parts: str) -> str:
    """The stored hashes' definition: BLAKE2b-128 of each part's UTF-8, then ``\\x1f``."""
    hasher = hashlib.blake2b(digest_size=16)
    for part in parts:
        hasher.update(part.encode())
        hasher.update(b"\x1f")
    return hasher.hexdigest()


def test_history_hashes_keep_their_definition() -> None:
    """Stored history hashes and state keys stay readable: the framing is not to change."""
    rng = random.Random(28)
    alphabet = "abc{}[]:,\"' éßα\x1f\x00"
    for _ in range(500):
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in "abc"]
        assert next_history_hash(*parts) == _by_definition(*parts)
        assert history_hashes_after(parts[1], parts[2])(parts[0]) == _by_definition(*parts)
        assert state_key(parts[0], parts[1]) == _by_definition(parts[0], parts[1])
    assert next_history_hash(None, "", "") == _by_definition("", "", "")
    # values computed before the framing was shared (f384213)
    assert next_history_hash(None, '{"q":1}', '"a"') == "c3436e91a3dfb79d57ed641236fa592a"
    previous = "0123456789abcdef0123456789abcdef"
    assert next_history_hash(previous, '{"q":1}', '"a"') == "cb4418e6c99e5da81acfc7fa32cb464c"
    assert state_key("dom", "0123") == "84eb6d1da28e81a6b40968a2da1d8872"

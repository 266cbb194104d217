"""A survey's history hashes by ``history_hashes_after``: ``next_history_hash``'s, bit for bit."""

from __future__ import annotations

import random

from app.services.snapshots import history_hashes_after, next_history_hash


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

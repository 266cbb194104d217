"""``gatekeeper verify``'s replays (:class:`app.services.verify.Replays`) share prefixes.

The replay of ``h[:n]`` is the kept replay of ``h[:n-1]`` one step further: it must be what
folding the whole history from the start gives (the engine's :func:`fold_history`), bit for bit,
whatever the order histories are met in and however small the cache — and an entry corrupted
inside a prefix other histories share must show in that history's replay only.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import numpy as np
import pytest

from app.engine.likelihood import LikelihoodState
from app.engine.pipeline import fold_history, history_entry
from app.services.snapshots import content_key, next_history_hash, state_key
from app.services.verify import Content, Replays

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 9},
        {"name": "flu", "type": "categorical", "values": ["no", "yes", "unsure"]},
    ]
}
DOMAIN_TEXT = json.dumps(DOMAIN, sort_keys=True, separators=(",", ":"))
QUERIES: list[tuple[dict[str, object], list[object], str]] = [
    ({"mechanism": "grr", "attribute": "flu", "epsilon": 0.5}, ["no", "yes", "unsure"], "1/2"),
    ({"mechanism": "grr", "attribute": "age", "epsilon": 1.0}, list(range(10)), "1"),
]


def _content(at: int, output: object, epsilon: str | None = None) -> Content:
    query, _, exact = QUERIES[at]
    return (json.dumps(query), json.dumps(output), epsilon or exact)


def _histories(seed: int, n: int, length: int) -> list[tuple[Content, ...]]:
    """Histories of a diverging survey sequence: few outputs, many orders, shared prefixes."""
    rng = random.Random(seed)
    found = []
    for _ in range(n):
        history = []
        for step in range(rng.randrange(length + 1)):
            at = step % len(QUERIES)
            history.append(_content(at, rng.choice(QUERIES[at][1][:3])))
        found.append(tuple(history))
    return found


def _from_scratch(contents: tuple[Content, ...], held: int) -> dict[str, object]:
    """What a replay must hold, folded from the start with the engine (no prefix kept)."""
    domain = Replays().domain(DOMAIN_TEXT)
    entries = [history_entry(domain, json.loads(q), json.loads(o)) for q, o, _ in contents]
    state, basic = fold_history(domain, entries)
    held_state, _ = fold_history(domain, entries[:held])
    assert isinstance(state, LikelihoodState)
    assert isinstance(held_state, LikelihoodState)
    chain = None
    held_chain = None
    for i, (q, o, _) in enumerate(contents, start=1):
        chain = next_history_hash(chain, q, o)
        if i == held:
            held_chain = chain
    bad = [
        i
        for i, (e, c) in enumerate(zip(entries, contents, strict=True))
        if Fraction(c[2]) != e.mechanism.epsilon_exact
    ]
    return {
        "basic": basic,
        "chain": chain,
        "expected_key": state_key(DOMAIN_TEXT, held_chain) if held_chain else None,
        "content_key": content_key(DOMAIN_TEXT, held_state) if held_chain else None,
        "bad_epsilon": bad,
        "loss": state.loss(basic),
        "held": held_state,
    }


def _check(replays: Replays, contents: tuple[Content, ...], held: int) -> None:
    replay = replays.replay((DOMAIN_TEXT, held, contents))
    want = _from_scratch(contents, held)
    assert replay.basic == want["basic"]
    assert replay.chain == want["chain"]
    assert replay.expected_key == want["expected_key"]
    assert replay.content_key == want["content_key"]
    assert replay.bad_epsilon == want["bad_epsilon"]
    assert replay.loss == want["loss"]
    held_state = want["held"]
    assert isinstance(held_state, LikelihoodState)
    assert replay.held_state is not None
    # bit for bit: the same floats, rounding error and exact form as a fold from the start
    assert replay.held_state.logp.tobytes() == held_state.logp.tobytes()
    assert replay.held_state.err == held_state.err
    assert replay.held_state.exact is not None
    assert held_state.exact is not None
    assert replay.held_state.exact.same_as(held_state.exact)
    assert len(replay.entries) == len(contents)


@pytest.mark.parametrize(("capacity", "cells"), [(20_000, 20_000_000), (2, 90)])
def test_prefix_shared_replays_equal_folds_from_the_start(capacity: int, cells: int) -> None:
    """Whatever is kept (a cache of a few prefixes evicts them all the time)."""
    replays = Replays(capacity=capacity, prefix_cells=cells)
    rng = random.Random(7)
    for contents in _histories(27, 300, 7):
        held = len(contents) - rng.choice([0, 0, 0, 1]) if contents else 0
        _check(replays, contents, max(held, 0))
    assert replays.folded + replays.reused == 300


def test_an_entry_corrupted_in_a_shared_prefix_shows_in_its_history_only() -> None:
    replays = Replays()
    prefix = (_content(0, "yes"), _content(1, 3), _content(0, "no"))
    last = _content(1, 5)
    clean = (*prefix, last)
    others = [(*prefix, _content(1, k)) for k in range(10)]
    for contents in [clean, *others]:
        _check(replays, contents, len(contents))
    reference = replays.replay((DOMAIN_TEXT, 4, clean))
    # one object's second entry: another output, or the right output with a wrong ε written
    for corrupted in (
        (prefix[0], _content(1, 4), prefix[2], last),
        (prefix[0], _content(1, 3, "2"), prefix[2], last),
    ):
        replay = replays.replay((DOMAIN_TEXT, 4, corrupted))
        _check(replays, corrupted, 4)
        if corrupted[1][2] == "2":
            assert replay.bad_epsilon == [1]
            assert replay.chain == reference.chain  # the hash chain holds query and output
        else:
            assert replay.chain != reference.chain
            assert replay.held_state is not None
            assert reference.held_state is not None
            assert not np.array_equal(replay.held_state.logp, reference.held_state.logp)
    # the clean histories' replays are unchanged by the corrupted one met in between
    for contents in [clean, *others]:
        _check(replays, contents, len(contents))
    assert replays.replay((DOMAIN_TEXT, 4, clean)) is reference

"""Certified bounds bracket the extremes found by an independent search (acceptance test 1).

Each instance is a random box (``d <= 4``) with up to 8 mixed plain-linear, truncated-linear and
logistic queries, random outputs and ε in ``[0.05, 2]``. The engine is driven through
``compute_loss`` (the JSON contract); a spy on ``maximize`` exposes the two searches
(``max log P`` and ``max -log P``) it runs. The reference is :mod:`.reference`: ``log P``
written from contract.md's formulas, maximised and minimised by a dense grid plus multistart
L-BFGS-B.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.engine.calculator import compute_loss
from tests.engine.continuous.reference import (
    LOGISTIC,
    PLAIN,
    TRUNCATED,
    Instance,
    random_instance,
    spy_maximize,
)

TOLERANCE = 1e-4  # compute_loss's default tolerance
SLACK = 1e-9
PER_CHUNK = 5


def check_brackets(
    inst: Instance, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> bool:
    """Run one instance through ``compute_loss`` and check it against the reference.

    Returns whether a search hit a limit (the answer then says ``"limit"``).
    """
    spy = spy_maximize(monkeypatch)
    answer = compute_loss(inst.request(time_limit=600.0))
    assert len(spy.calls) == 2, "one search for max log P and one for max -log P"
    (terms, box, top), (_neg_terms, _, bottom) = spy.calls

    # the engine's objective is the contract.md log P (independently written)
    probe = np.concatenate([inst.grid(3), rng.uniform(inst.lo, inst.hi, size=(32, inst.dim))])
    engine_values, _ = terms.evaluate_many(probe)
    np.testing.assert_allclose(engine_values, inst.logp(probe), rtol=0, atol=1e-10)
    np.testing.assert_allclose(box.lo, inst.lo)
    np.testing.assert_allclose(box.hi, inst.hi)

    found_max, _, found_min, _ = inst.search(rng)

    # certified: lower <= max F <= upper, and the bracket holds the reference's extremes
    assert top.lower <= top.upper
    assert bottom.lower <= bottom.upper
    assert top.upper >= found_max - SLACK, (top, found_max)
    assert -bottom.upper <= found_min + SLACK, (bottom, found_min)

    # the lower bounds are achieved at the points the engine returns (inside the box)
    for result in (top, bottom):
        assert np.all(result.x >= inst.lo)
        assert np.all(result.x <= inst.hi)
    assert inst.logp(top.x)[0] >= top.lower - SLACK
    assert -inst.logp(bottom.x)[0] >= bottom.lower - SLACK

    loss = answer["realized_loss"]
    assert 0.0 <= loss["lower"] <= loss["upper"]
    assert loss["upper"] >= found_max - found_min - SLACK, (loss, found_max - found_min)
    assert loss["upper"] <= answer["basic_composition"] + 1e-12
    limited = top.status.hit_limit or bottom.status.hit_limit
    if answer["status"] == "ok":
        assert loss["upper"] - loss["lower"] <= TOLERANCE
    else:
        assert answer["status"] == "limit"
        assert limited, "status 'limit' although both searches closed their gap"
        assert loss["upper"] - loss["lower"] > TOLERANCE
    if not limited:
        assert top.upper - top.lower <= TOLERANCE / 2 + 1e-12
        assert bottom.upper - bottom.lower <= TOLERANCE / 2 + 1e-12
    return limited


def run_chunk(
    seed: int, monkeypatch: pytest.MonkeyPatch, kinds: tuple[str, ...], dims: tuple[int, ...]
) -> int:
    make, search = np.random.default_rng(seed), np.random.default_rng(seed + 10**6)
    limited = 0
    for _ in range(PER_CHUNK):
        inst = random_instance(
            make, dim=int(make.choice(dims)), size=int(make.integers(1, 9)), kinds=kinds
        )
        with monkeypatch.context() as patch:
            limited += check_brackets(inst, search, patch)
    return limited


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(36))
def test_brackets_mixed_queries(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """180 instances: mixed query kinds, d in 1..4."""
    limited = run_chunk(1000 + seed, monkeypatch, (PLAIN, TRUNCATED, LOGISTIC), (1, 2, 3, 4))
    assert limited == 0, f"{limited} of {PER_CHUNK} instances hit a limit"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "seed"), [(PLAIN, 0), (PLAIN, 1), (LOGISTIC, 0), (LOGISTIC, 1), (TRUNCATED, 0)]
)
def test_brackets_single_kind(kind: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """5 instances of one query kind per case (plain-linear histories take the concave path)."""
    limited = run_chunk(2000 + seed, monkeypatch, (kind,), (1, 2, 3, 4))
    assert limited == 0, f"{limited} of {PER_CHUNK} instances hit a limit"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_candidate_per_output_brackets(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``candidate.per_output``: the last query of an instance as the candidate of the others.

    Each output's bounds bracket the reference loss of the history extended by that output,
    and its lower bound is the loss between the two points the engine's searches returned.
    """
    make, search = np.random.default_rng(5000 + seed), np.random.default_rng(6000 + seed)
    for _ in range(5):
        inst = random_instance(make, dim=int(make.integers(1, 5)), size=int(make.integers(2, 9)))
        request = inst.request(time_limit=600.0)
        request["history"] = request["history"][:-1]
        request["candidate"] = inst.query_json(inst.size - 1)
        request["budget"] = 100.0
        with monkeypatch.context() as patch:
            spy = spy_maximize(patch)
            answer = compute_loss(request)
        assert answer["status"] == "ok"
        per_output = answer["candidate"]["per_output"]
        assert len(per_output) == 2
        assert len(spy.calls) == 6  # the history, then each output: max and min
        for j, entry in enumerate(per_output):
            extended = replace(inst, high=inst.high.copy())
            extended.high[-1] = bool(j)
            assert entry["output"] == extended.output_json(inst.size - 1)
            found_max, _, found_min, _ = extended.search(search)
            assert 0.0 <= entry["lower"] <= entry["upper"]
            assert entry["upper"] - entry["lower"] <= TOLERANCE
            assert entry["upper"] >= found_max - found_min - SLACK, (entry, found_max - found_min)
            (_, _, top), (_, _, bottom) = spy.calls[2 + 2 * j : 4 + 2 * j]
            at_points = float(extended.logp(top.x)[0] - extended.logp(bottom.x)[0])
            assert entry["lower"] <= at_points + SLACK
        worst = answer["candidate"]["worst_case_upper"]
        assert worst == max(o["upper"] for o in per_output)

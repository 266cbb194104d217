"""The one road into the engine (:mod:`app.engine.pipeline`): pure, and the same as replaying.

* :func:`evaluate` and :func:`record` never change the snapshot they are given;
* recording outputs one by one gives the state folding the whole history gives;
* the decision's searched bounds are reused by :func:`record` (no search), and a snapshot whose
  stored bounds are known needs no search to decide;
* the basic state (the fallback) gives basic composition's answers;
* the module's docstring examples run.
"""

from __future__ import annotations

import doctest
import pickle
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import app.engine.continuous.state as continuous_state
import app.engine.jsonfields
import app.engine.pipeline
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState, LossBounds
from app.engine.mechanisms import parse_query
from app.engine.pipeline import (
    BasicState,
    HistoryEntry,
    ObjectSnapshot,
    evaluate,
    fold_history,
    record,
)

FINITE = parse_domain(
    {
        "attributes": [
            {"name": "a", "type": "integer", "low": 0, "high": 9},
            {"name": "b", "type": "categorical", "values": ["x", "y", "z"]},
        ]
    }
)
CONTINUOUS = parse_domain(
    {
        "attributes": [
            {"name": "u", "type": "real", "low": -1, "high": 1},
            {"name": "v", "type": "real", "low": 0, "high": 2},
        ]
    }
)
FINITE_QUERIES = [
    {"mechanism": "grr", "attribute": "a", "epsilon": 0.7},
    {
        "mechanism": "binary_rr",
        "epsilon": 0.4,
        "predicate": {"attribute": "b", "op": "==", "value": "y"},
    },
    {"mechanism": "grr", "attribute": "b", "epsilon": 1.1},
]
LINEAR = {
    "mechanism": "linear",
    "weights": {"u": 0.3, "v": 0.2},
    "intercept": 0.0,
    "range": [-0.5, 0.7],
    "epsilon": 0.6,
}


@pytest.mark.parametrize("module", [app.engine.pipeline, app.engine.jsonfields])
def test_docstring_examples_run(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0


def test_finite_record_is_pure_and_equals_the_fold() -> None:
    snap = ObjectSnapshot.empty(FINITE, budget=3.0, filter=FilterKind.BAYESIAN)
    entries = []
    for i, raw in enumerate(FINITE_QUERIES * 2):
        mech = parse_query(raw, FINITE)
        output = i % 2
        before = snap.state.logp.copy()  # type: ignore[union-attr]
        decision = evaluate(snap, mech, tight=True)
        after = record(snap, mech, output, decision)
        # the given snapshot is unchanged; the new one has the output's term
        assert np.array_equal(snap.state.logp, before)  # type: ignore[union-attr]
        assert after.basic_total == snap.basic_total + mech.epsilon_exact
        entries.append(HistoryEntry(mech, output))
        snap = after
    folded, basic = fold_history(FINITE, entries)
    assert isinstance(folded, LikelihoodState)
    assert basic == snap.basic_total
    assert np.allclose(folded.logp, snap.state.logp, rtol=0, atol=1e-12)  # type: ignore[union-attr]
    assert snap.loss() == folded.loss(basic)


def count_searches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    maximize = continuous_state.maximize

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return maximize(*args, **kwargs)

    monkeypatch.setattr(continuous_state, "maximize", counted)
    return calls


def test_continuous_record_reuses_the_decision_and_stored_bounds_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = count_searches(monkeypatch)
    mech = parse_query(LINEAR, CONTINUOUS)
    snap = ObjectSnapshot.empty(CONTINUOUS, budget=0.5, filter=FilterKind.BAYESIAN)
    decision = evaluate(snap, mech, tight=True)
    assert decision.candidate.tight
    assert calls[0] == 4  # two searches per output
    after = record(snap, mech, 1, decision)
    assert after.loss() == decision.candidate.searched[1].bounds(after.basic_total)
    assert calls[0] == 4  # the recorded output's bounds came from the decision
    assert snap.state.size == 0  # type: ignore[union-attr]
    assert after.state.size == 1  # type: ignore[union-attr]
    # the same history rebuilt from storage and seeded with the stored bounds needs no search
    folded, basic = fold_history(CONTINUOUS, [HistoryEntry(mech, 1)])
    assert isinstance(folded, continuous_state.ContinuousState)
    seeded = ObjectSnapshot(
        CONTINUOUS, 5.0, FilterKind.BAYESIAN, basic, folded.seeded(after.loss())
    )
    assert seeded.loss() == after.loss()
    evaluate(seeded, mech, tight=False)  # basic composition certifies: nothing computed
    assert calls[0] == 4
    # without a decision, the new history's loss is searched when first read (two searches)
    unseeded = record(seeded, mech, 0, None)
    unseeded.loss()
    assert calls[0] == 6


def test_snapshots_pickle_for_the_worker() -> None:
    mech = parse_query(LINEAR, CONTINUOUS)
    snap = ObjectSnapshot.empty(CONTINUOUS, budget=0.5, filter=FilterKind.SIMPLIFIED)
    snap = record(snap, mech, 0, None)
    copy = pickle.loads(pickle.dumps(snap))  # noqa: S301 - our own bytes
    assert copy.loss() == snap.loss()
    assert evaluate(copy, mech).accepted == evaluate(snap, mech).accepted


def test_the_basic_state_answers_with_basic_composition() -> None:
    mech = parse_query(FINITE_QUERIES[0], FINITE)
    snap = ObjectSnapshot(FINITE, 1.0, FilterKind.BAYESIAN, Fraction(1, 5), BasicState())
    assert snap.loss() == LossBounds(0.0, 0.2)
    decision = evaluate(snap, mech, tight=True)
    assert not decision.candidate.tight
    assert decision.accepted  # 0.2 + 0.7 <= 1
    later = record(snap, mech, 3, decision)
    assert later.basic_total == Fraction(9, 10)
    assert not evaluate(later, mech).accepted  # 1.6 > 1, and nothing tighter is known

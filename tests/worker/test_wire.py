"""Typed engine calls as JSON (:mod:`app.worker.wire`): what a pool process or a Celery worker
receives is plain data, and rebuilding it gives the same answers as the objects themselves."""

from __future__ import annotations

import json
from dataclasses import fields
from fractions import Fraction
from typing import Any

import pytest

from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.domain import parse_domain
from app.engine.filters import CandidateEvaluation, Decision, FilterKind
from app.engine.mechanisms import parse_query
from app.engine.pipeline import (
    ObjectSnapshot,
    evaluate,
    fold_history,
    history_account,
    parse_history,
    realized_loss,
    record,
)
from app.settings import DEFAULT_BOUND_TIME_LIMIT
from app.worker import wire
from app.worker.celery_app import CelerySettings, make_celery
from app.worker.pool import BoundWorker, WorkerSettings

DOMAIN = {
    "attributes": [
        {"name": "a", "type": "real", "low": 0, "high": 1},
        {"name": "b", "type": "real", "low": -2, "high": 3},
        {"name": "k", "type": "integer", "low": 0, "high": 5},
    ]
}
HISTORY = [
    {
        "query": {
            "mechanism": "linear",
            "weights": {"a": 1, "b": 0.25},
            "range": [-1, 2],
            "epsilon": 0.5,
        },
        "output": 2,
    },
    {
        "query": {
            "mechanism": "logistic",
            "weights": {"b": -0.7, "k": 0.3},
            "intercept": 0.2,
            "epsilon": 0.4,
        },
        "output": 1,
    },
    {
        "query": {
            "mechanism": "linear",
            "weights": {"a": 0.5, "a*b": 0.3, "k^2": 0.05},
            "range": [-1, 3],
            "epsilon": 0.3,
        },
        "output": -1,
    },
]
CANDIDATE = {
    "mechanism": "logistic",
    "weights": {"a": 2, "b": 1},
    "intercept": -0.5,
    "epsilon": 0.6,
}
FAST = BnBSettings(tolerance=1e-3, time_limit=5.0)


def _snapshot(history: list[dict[str, Any]], *, delta: float | None = None) -> ObjectSnapshot:
    domain = parse_domain(DOMAIN)
    entries = parse_history(domain, history)
    state, basic = fold_history(domain, entries, bnb=FAST)
    kind = FilterKind.BAYESIAN if delta is None else FilterKind.APPROX_BAYESIAN
    account = history_account(entries, 3.0, delta, domain)
    return ObjectSnapshot(domain, 3.0, kind, basic, state, delta=delta, f0_account=account)


def _through_json(data: Any) -> Any:
    """What a broker delivers: JSON text parsed again (strict: no NaN or Infinity)."""
    return json.loads(json.dumps(data, allow_nan=False))


@pytest.mark.parametrize("delta", [None, 1e-6])
def test_a_rebuilt_snapshot_decides_and_bounds_like_the_original(delta: float | None) -> None:
    snapshot = _snapshot(HISTORY, delta=delta)
    mech = parse_query(CANDIDATE, snapshot.domain)
    request = _through_json(wire.evaluate_request(snapshot, mech))
    rebuilt = wire.snapshot_from_json(request["object"], FAST)
    assert rebuilt.basic_total == snapshot.basic_total
    assert rebuilt.f0_account == snapshot.f0_account
    assert rebuilt.delta == snapshot.delta
    assert wire.snapshot_json(rebuilt) == wire.snapshot_json(snapshot)
    assert realized_loss(rebuilt) == realized_loss(snapshot)
    answer = _through_json(wire.run_call(request))
    decision = wire.decision_from_json(answer["decision"])
    assert decision == evaluate(snapshot, mech, tight=True)
    assert decision.candidate.searched == evaluate(snapshot, mech, tight=True).candidate.searched


def test_a_decision_round_trips_with_every_field() -> None:
    """Every field of Decision and CandidateEvaluation is carried (a new field fails here)."""
    assert {f.name for f in fields(Decision)} == wire.DECISION_FIELDS
    assert {f.name for f in fields(CandidateEvaluation)} == wire.CANDIDATE_FIELDS
    snapshot = _snapshot(HISTORY)
    mech = parse_query(CANDIDATE, snapshot.domain)
    decision = evaluate(snapshot, mech, tight=True)
    again = wire.decision_from_json(_through_json(wire.decision_json(decision)))
    assert again == decision
    assert again.candidate.searched == decision.candidate.searched
    assert again.to_json() == decision.to_json()
    # recording an output reuses the decision's searches: the same snapshot either way
    output = mech.parse_output(1, "output")
    after, after_again = (
        record(snapshot, mech, output, decision),
        record(snapshot, mech, output, again),
    )
    assert wire.snapshot_json(after) == wire.snapshot_json(after_again)


def test_unsearched_loss_after_a_record_travels_and_is_searched_by_the_worker() -> None:
    snapshot = _snapshot(HISTORY)
    mech = parse_query(CANDIDATE, snapshot.domain)
    after = record(snapshot, mech, mech.parse_output(0, "output"), None)
    request = _through_json(wire.realized_loss_request(after))
    assert request["object"]["state"]["cached"] is None
    answer = _through_json(wire.run_call(request))
    assert wire.bounds_from_json(answer["bounds"]) == realized_loss(after)


def test_identical_calls_share_a_key_whatever_their_deadline() -> None:
    snapshot = _snapshot(HISTORY)
    mech = parse_query(CANDIDATE, snapshot.domain)
    request = wire.evaluate_request(snapshot, mech)
    key = wire.call_key(wire.with_bnb(request, stop_at=1.0))
    assert key == wire.call_key(wire.with_bnb(request, stop_at=2.0))
    assert key != wire.call_key(wire.with_bnb(request, time_limit=1.0))
    assert key != wire.call_key(wire.realized_loss_request(snapshot))


def test_only_continuous_snapshots_travel() -> None:
    domain = parse_domain(
        {"attributes": [{"name": "c", "type": "categorical", "values": ["x", "y"]}]}
    )
    finite = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.BAYESIAN)
    with pytest.raises(TypeError):
        wire.snapshot_json(finite)
    assert Fraction(0) == finite.basic_total


def test_a_pool_process_answers_typed_calls_from_json() -> None:
    """The in-process pool sends the same JSON requests as Celery, with the same answers."""
    snapshot = _snapshot(HISTORY)
    mech = parse_query(CANDIDATE, snapshot.domain)
    inline = BoundWorker(WorkerSettings(processes=0, time_limit=5.0))
    with BoundWorker(WorkerSettings(processes=1, time_limit=5.0)) as pooled:
        never = pytest.fail
        decided = pooled.evaluate(snapshot, mech, fallback=lambda: never("fell back"))
        after = record(snapshot, mech, mech.parse_output(1, "output"), None)
        bounds = pooled.realized_loss(after, fallback=lambda: never("fell back"))
    fallback_never = pytest.fail
    assert decided == inline.evaluate(snapshot, mech, fallback=lambda: fallback_never("x"))
    assert bounds == inline.realized_loss(after, fallback=lambda: fallback_never("x"))


def test_celery_accepts_and_sends_json_only() -> None:
    """No pickle anywhere: a message cannot make a worker run code, and root may run one."""
    celery = make_celery(
        CelerySettings(broker_url="redis://127.0.0.1:1/0", result_url="redis://127.0.0.1:1/0")
    )
    conf = celery.conf
    assert conf.task_serializer == "json"
    assert conf.result_serializer == "json"
    assert list(conf.accept_content) == ["json"]
    assert list(conf.result_accept_content) == ["json"]


def test_the_settings_default_time_limit_is_the_engines() -> None:
    """Settings sit below the engine (no import of it): their default must still agree."""
    assert BnBSettings.time_limit == DEFAULT_BOUND_TIME_LIMIT


def test_a_searched_state_that_hit_a_limit_travels_as_strict_json() -> None:
    """Bounds known with the reasons a search stopped (a frozenset) and the limits hit go as
    lists, and come back equal: a state searched under a node limit is what a worker gets."""
    domain = parse_domain(DOMAIN)
    entries = parse_history(domain, HISTORY)
    tiny = BnBSettings(tolerance=1e-12, time_limit=5.0, max_nodes=2)
    state, basic = fold_history(domain, entries, bnb=tiny)
    snapshot = ObjectSnapshot(domain, 3.0, FilterKind.BAYESIAN, basic, state)
    before = realized_loss(snapshot)  # searches, so the state caches bounds and their reasons
    data = _through_json(wire.snapshot_json(snapshot))
    rebuilt = wire.snapshot_from_json(data, tiny)
    assert data["state"]["cached"]["reasons"], data["state"]["cached"]
    assert data["state"]["limits_hit"]
    assert realized_loss(rebuilt) == before
    assert wire.snapshot_json(rebuilt) == wire.snapshot_json(snapshot)

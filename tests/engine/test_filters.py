"""Filter decisions and the odometer: semantics, ties, and that decisions never read the value."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from app.engine.accountant import Accountant, submit
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.mechanisms import parse_query

#: The filters of a pure ε_g budget.
PURE = (FilterKind.BAYESIAN, FilterKind.SIMPLIFIED, FilterKind.BASIC)
BINARY = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 1}]}
RICH = {
    "attributes": [
        {"name": "a", "type": "integer", "low": 0, "high": 9},
        {"name": "b", "type": "categorical", "values": ["u", "v", "w"]},
    ]
}


def _rr(eps: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": eps,
        "predicate": {"attribute": "x", "op": "==", "value": 1},
    }


class ForbiddenValue(Mapping[str, Any]):
    """A value that fails the test if anything reads it."""

    def __getitem__(self, key: str) -> Any:
        raise AssertionError("the filter decision read the true value")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the filter decision read the true value")

    def __len__(self) -> int:
        raise AssertionError("the filter decision read the true value")


def test_basic_composition_is_exact_in_decimals() -> None:
    domain = parse_domain(BINARY)
    acc = Accountant(domain, 1.0, FilterKind.BASIC)
    mech = parse_query(_rr(0.1), domain)
    accepted = sum(submit(acc, mech, {"x": 1}).decision.accepted for _ in range(15))
    assert accepted == 10
    assert acc.odometer().basic_composition == 1.0
    assert acc.rejected == 5


def test_bayesian_accepts_an_exact_tie_of_randomized_response() -> None:
    """Algorithm 2: a worst case equal to the budget is accepted when it is computed exactly."""
    domain = parse_domain(BINARY)
    acc = Accountant(domain, 1.0, FilterKind.BAYESIAN)
    mech = parse_query(_rr(0.5), domain)
    for out in (1, 1, 0):  # loss 0.5, sum of epsilons 1.5
        acc.record(mech, out)
    decision = acc.dry_run(mech)
    assert decision.candidate.exact_worst == 1
    assert decision.worst_case_after == 1.0
    assert decision.accepted
    tighter = Accountant(domain, float(np.nextafter(1.0, 0.0)), FilterKind.BAYESIAN)
    for out in (1, 1, 0):
        tighter.record(mech, out)
    assert not tighter.dry_run(mech).accepted


def test_bayesian_rejects_a_float_tie_where_the_loss_is_not_exact() -> None:
    """The same probabilities as a ``matrix`` query: no exact form, the margin rejects the tie."""
    domain = parse_domain(BINARY)
    acc = Accountant(domain, 1.0, FilterKind.BAYESIAN)
    p = float(np.exp(0.5) / (1 + np.exp(0.5)))
    mech = parse_query(
        {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[p, 1 - p], [1 - p, p]]},
        domain,
    )
    for out in (1, 1, 0):
        acc.record(mech, out)
    decision = acc.dry_run(mech)
    assert decision.candidate.exact_worst is None
    assert decision.worst_case_after == pytest.approx(1.0, abs=1e-9)
    assert not decision.accepted
    looser = Accountant(domain, 1.0 + 1e-6, FilterKind.BAYESIAN)
    for out in (1, 1, 0):
        looser.record(mech, out)
    assert looser.dry_run(mech).accepted


def test_dry_run_changes_nothing() -> None:
    domain = parse_domain(RICH)
    acc = Accountant(domain, 3.0)
    mech = parse_query({"mechanism": "grr", "attribute": "a", "epsilon": 0.7}, domain)
    acc.record(mech, 3)
    before = (acc.state.logp.copy(), acc.basic_total, acc.accepted, acc.rejected, acc.state.err)
    for _ in range(3):
        acc.dry_run(mech)
    np.testing.assert_array_equal(acc.state.logp, before[0])
    assert (acc.basic_total, acc.accepted, acc.rejected, acc.state.err) == before[1:]


@pytest.mark.parametrize("kind", list(FilterKind))
def test_a_rejected_submit_never_reads_the_value(kind: FilterKind) -> None:
    domain = parse_domain(BINARY)
    delta = 1e-6 if kind is FilterKind.APPROX_BAYESIAN else None
    acc = Accountant(domain, 0.3, kind, delta=delta)
    mech = parse_query(_rr(0.5), domain)
    result = submit(acc, mech, ForbiddenValue())
    assert not result.decision.accepted
    assert result.output is None
    assert acc.rejected == 1
    assert acc.accepted == 0


def test_dry_run_of_every_filter_never_reads_the_value() -> None:
    # dry_run takes no value at all; an accepted submit reads it only after deciding.
    domain = parse_domain(BINARY)
    acc = Accountant(domain, 5.0)
    mech = parse_query(_rr(0.5), domain)
    with pytest.raises(AssertionError, match="read the true value"):
        submit(acc, mech, ForbiddenValue())
    assert acc.accepted == 0  # nothing was recorded when sampling failed


def test_bayesian_never_accepts_less_than_basic_and_simplified_implies_bayesian() -> None:
    rng = np.random.default_rng(1)
    domain = parse_domain(RICH)
    queries = [
        {"mechanism": "grr", "attribute": "a", "epsilon": 0.3},
        {"mechanism": "grr", "attribute": "b", "epsilon": 0.5},
        {
            "mechanism": "binary_rr",
            "epsilon": 0.4,
            "predicate": {"attribute": "a", "op": "<", "value": 5},
        },
        {"mechanism": "unary_encoding", "attribute": "b", "epsilon": 0.6},
        {"mechanism": "logistic", "weights": {"a": 0.8}, "intercept": -4, "epsilon": 0.5},
    ]
    mechs = [parse_query(q, domain) for q in queries]
    for _ in range(10):
        acc = Accountant(domain, 2.0, FilterKind.BAYESIAN)
        for _ in range(40):
            mech = mechs[int(rng.integers(len(mechs)))]
            decisions = {}
            for kind in PURE:
                acc.filter = kind
                decisions[kind] = acc.dry_run(mech).accepted
            acc.filter = FilterKind.BAYESIAN
            assert decisions[FilterKind.BAYESIAN] >= decisions[FilterKind.BASIC]
            assert decisions[FilterKind.BAYESIAN] >= decisions[FilterKind.SIMPLIFIED]
            assert decisions[FilterKind.SIMPLIFIED] >= decisions[FilterKind.BASIC]
            submit(acc, mech, {"a": int(rng.integers(10)), "b": "v"})
            assert acc.state.loss().upper <= 2.0


def test_bayesian_filter_keeps_the_loss_within_budget_and_beats_basic() -> None:
    domain = parse_domain(BINARY)
    mech = parse_query(_rr(0.25), domain)
    counts = []
    for _ in range(200):
        acc = Accountant(domain, 1.0)
        while submit(acc, mech, {"x": 1}).decision.accepted:
            assert acc.odometer().realized_loss.upper <= 1.0
        counts.append(acc.accepted)
    assert min(counts) >= 4  # basic composition accepts exactly 1.0 / 0.25 = 4
    assert np.mean(counts) > 6


def test_odometer_and_trajectory() -> None:
    domain = parse_domain(BINARY)
    acc = Accountant(domain, 2.0)
    mech = parse_query(_rr(0.5), domain)
    for out in (1, 1, 0, 0):
        acc.record(mech, out)
    acc.record_rejection()
    odo = acc.odometer().to_json()
    assert set(odo) == {
        "budget",
        "realized_loss",
        "remaining",
        "basic_composition",
        "accepted",
        "rejected",
    }
    assert odo["accepted"] == 4
    assert odo["rejected"] == 1
    assert odo["basic_composition"] == 2.0
    assert odo["realized_loss"]["lower"] <= 1e-12
    assert odo["remaining"] == pytest.approx(2.0, abs=1e-12)
    uppers = [p.realized_loss.upper for p in acc.trajectory]
    assert uppers == pytest.approx([0.5, 1.0, 0.5, 0.0], abs=1e-12)


def test_decision_json_has_the_dry_run_fields() -> None:
    domain = parse_domain(RICH)
    acc = Accountant(domain, 1.0)
    mech = parse_query({"mechanism": "grr", "attribute": "b", "epsilon": 0.4}, domain)
    body = acc.dry_run(mech).to_json()
    for key in ("decision", "reason", "realized_loss", "worst_case_after", "per_output"):
        assert key in body
    assert body["decision"] == "accept"
    assert [o["output"] for o in body["per_output"]] == ["u", "v", "w"]
    assert all(o["upper"] == pytest.approx(0.4, abs=1e-12) for o in body["per_output"])


def test_per_output_listing_is_truncated_to_the_worst_outputs() -> None:
    from app.engine.limits import EngineLimits

    domain = parse_domain({"attributes": [{"name": "a", "type": "integer", "low": 0, "high": 999}]})
    acc = Accountant(domain, 5.0, limits=EngineLimits(max_listed_outputs=16))
    mech = parse_query({"mechanism": "grr", "attribute": "a", "epsilon": 0.5}, domain)
    acc.record(mech, 7)
    decision = acc.dry_run(mech)
    assert len(decision.candidate.per_output) == 16
    assert not decision.candidate.complete
    assert decision.worst_case_after == max(o.upper for o in decision.candidate.per_output)

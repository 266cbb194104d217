"""Exact ties in the decimals as written (contract.md, "(ε, δ) filter and exact ties").

Every ε and budget is the decimal the client wrote; randomized-response losses are sums of
written ε's compared exactly with the written budget, single or mixed ε alike, and reported as
the nearest double of the exact loss with ``"exact": true``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.calculator import compute_loss
from app.engine.domain import Domain, parse_domain
from app.engine.filters import Decision, FilterKind
from app.engine.likelihood import LikelihoodState
from app.engine.mechanisms import Mechanism, Output, parse_query
from app.engine.numerics import decimal_fraction
from app.engine.pipeline import ObjectSnapshot, evaluate, fold_history, history_entry, record

FIVE = {"attributes": [{"name": "a", "type": "integer", "low": 0, "high": 4}]}
BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}


def _binary_rr(eps: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": eps,
        "predicate": {"attribute": "a", "op": "==", "value": 0},
    }


def _ladder(kind: str, eps: float, domain: Domain) -> tuple[Mechanism, list[Output], Output]:
    """A query, outputs that spend 2 or 5 ε without moving the loss, and one that adds ε.

    The cancelling outputs put basic composition above the budget, so the Bayesian rule decides.
    """
    if kind == "binary_rr":
        return parse_query(_binary_rr(eps), domain), [1, 0], 1
    if kind == "grr":
        mech = parse_query({"mechanism": "grr", "attribute": "a", "epsilon": eps}, domain)
        return mech, [0, 1, 2, 3, 4], 0
    variant = kind.split(":")[1]
    query = {"mechanism": "unary_encoding", "attribute": "a", "epsilon": eps, "variant": variant}
    return parse_query(query, domain), [(1, 1, 1, 1, 1)], (1, 0, 0, 0, 0)


KINDS = ["binary_rr", "grr", "unary_encoding:optimized", "unary_encoding:symmetric"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("written", ["0.1", "0.2", "0.05"])
@pytest.mark.parametrize("filter_kind", [FilterKind.BAYESIAN, FilterKind.SIMPLIFIED])
def test_ladders_accept_the_tie_for_every_k(
    kind: str, written: str, filter_kind: FilterKind
) -> None:
    """Budget k·ε as written (k = 1..24), a history at loss (k−1)·ε: the tie is accepted.

    The float rule accepted it only where the floats' product happened not to pass the float
    budget (k ∈ {2, 4, 8, 11} for these ε's).
    """
    domain = parse_domain(FIVE)
    eps = float(written)
    for k in range(1, 25):
        budget = float(k * Fraction(written))
        assert decimal_fraction(budget) == k * Fraction(written)  # the budget as written
        mech, cancelling, up = _ladder(kind, eps, domain)
        snap = ObjectSnapshot.empty(domain, budget=budget, filter=filter_kind)
        for out in [*cancelling, *[up] * (k - 1)]:
            snap = record(snap, mech, out, None)
        decision = evaluate(snap, mech)
        assert decision.accepted, (k, decision.reason)
        assert decision.worst_case_after == budget
        after = record(snap, mech, up, decision)
        assert after.loss().upper == budget
        assert after.loss().exact
        assert not evaluate(after, mech).accepted, k  # and nothing beyond the tie


def test_grr_with_five_values_and_epsilon_0_2_reaches_thirty_queries() -> None:
    """grr, k = 5, ε = 0.2, budget 1.0: the spread of counts may reach 5 = 1.0/0.2 exactly.

    The outputs keep the worst case at exactly the budget again and again (a tie each time the
    spread is 4); the float rule stopped at the first of them, query 6.
    """
    domain = parse_domain(FIVE)
    mech = parse_query({"mechanism": "grr", "attribute": "a", "epsilon": 0.2}, domain)
    outputs = [0] * 4 + [1, 2, 3, 4] * 4 + [0] * 4 + [1, 2, 3, 4] + [1, 2]
    assert len(outputs) == 30
    snap = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.BAYESIAN)
    ties = 0
    for i, out in enumerate(outputs):
        decision = evaluate(snap, mech)
        assert decision.accepted, (i, decision.reason)
        ties += decision.worst_case_after == 1.0
        snap = record(snap, mech, out, decision)
    assert ties == 8
    assert snap.loss().upper == pytest.approx(0.6)
    # the tie is the limit: a spread of 5 (loss 1.0) accepts nothing more
    for out in (0, 0):
        snap = record(snap, mech, out, None)
    assert snap.loss().value == 1
    assert not evaluate(snap, mech).accepted


@pytest.mark.parametrize(
    ("history", "candidate", "budget"),
    [
        # dyadic: 0.5 + 0.25 = 0.75, then a 0.25 tie at 1.0
        ([(0.5, 1), (0.25, 1), (0.25, 1), (0.25, 0)], 0.25, 1.0),
        ([(0.25, 1), (0.25, 1), (0.5, 1), (0.5, 0)], 0.5, 1.0),
        # decimal: 0.1 + 0.2 + 0.3 = 0.6 (the floats sum to 0.6000000000000001)
        ([(0.1, 1), (0.2, 1), (0.3, 1), (0.05, 1), (0.05, 0)], 0.3, 0.9),
        ([(0.2, 1), (0.1, 1), (0.05, 1), (0.05, 1), (0.05, 0)], 0.25, 0.6),
    ],
)
def test_mixed_epsilons_tie_exactly(
    history: list[tuple[float, int]], candidate: float, budget: float
) -> None:
    """Several ε's in one history: no slack, the tie is accepted (both filters)."""
    domain = parse_domain(FIVE)
    for filter_kind in (FilterKind.BAYESIAN, FilterKind.SIMPLIFIED):
        snap = ObjectSnapshot.empty(domain, budget=budget, filter=filter_kind)
        for eps, out in history:
            snap = record(snap, parse_query(_binary_rr(eps), domain), out, None)
        mech = parse_query(_binary_rr(candidate), domain)
        loss = snap.loss().value
        assert loss is not None
        assert loss + decimal_fraction(candidate) == decimal_fraction(budget)
        decision = evaluate(snap, mech)
        assert decision.accepted, (filter_kind, decision.reason)
        assert decision.worst_case_after == budget


def test_a_tie_is_accepted_and_a_hair_above_is_not() -> None:
    """Written decimals a hair apart: 0.3 accepted, 0.30000000000001 refused (loss 0.6)."""
    domain = parse_domain(FIVE)
    snap = ObjectSnapshot.empty(domain, budget=0.9, filter=FilterKind.BAYESIAN)
    for eps, out in [(0.3, 1), (0.3, 0), (0.3, 1), (0.3, 1)]:
        snap = record(snap, parse_query(_binary_rr(eps), domain), out, None)
    assert snap.loss().value == Fraction(6, 10)
    assert evaluate(snap, parse_query(_binary_rr(0.3), domain)).accepted
    assert not evaluate(snap, parse_query(_binary_rr(0.30000000000001), domain)).accepted


def _decision(history: list[tuple[float, int]], candidate: float, budget: float) -> Decision:
    domain = parse_domain(FIVE)
    snap = ObjectSnapshot.empty(domain, budget=budget, filter=FilterKind.BAYESIAN)
    for eps, out in history:
        snap = record(snap, parse_query(_binary_rr(eps), domain), out, None)
    return evaluate(snap, parse_query(_binary_rr(candidate), domain), tight=True)


@pytest.mark.parametrize(
    ("history", "candidate"),
    [([(0.1, 1), (0.1, 1)], 0.1), ([(0.5, 1), (0.25, 0)], 0.25), ([(0.2, 1), (0.1, 1)], 0.3)],
)
def test_per_output_bounds_are_the_nearest_double_of_the_exact_loss(
    history: list[tuple[float, int]], candidate: float
) -> None:
    """No ±slack: each output's ``lower == upper == float(exact)``, ``"exact": true``."""
    decision = _decision(history, candidate, 10.0)
    loss = sum(
        (decimal_fraction(e) if out else -decimal_fraction(e) for e, out in history), Fraction(0)
    )
    c = decimal_fraction(candidate)
    expected = {1: abs(loss + c), 0: abs(loss - c)}
    body = decision.to_json()
    for item in body["per_output"]:
        assert item == {
            "output": item["output"],
            "lower": float(expected[item["output"]]),
            "upper": float(expected[item["output"]]),
            "exact": True,
        }
    assert body["realized_loss"] == {
        "lower": float(abs(loss)),
        "upper": float(abs(loss)),
        "exact": True,
    }
    assert body["worst_case_after"] == float(max(expected.values()))


def test_float_bounds_say_they_are_not_exact() -> None:
    """A history with a ``matrix`` query keeps certified bounds: ``"exact": false``."""
    domain = parse_domain(BINARY)
    matrix = parse_query(
        {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[0.6, 0.4], [0.3, 0.7]]},
        domain,
    )
    snap = record(
        ObjectSnapshot.empty(domain, budget=5.0, filter=FilterKind.BAYESIAN), matrix, 0, None
    )
    bounds = snap.loss()
    assert bounds.value is None
    assert bounds.to_json()["exact"] is False
    assert bounds.lower < bounds.upper
    decision = evaluate(snap, matrix, tight=True)
    assert all(item["exact"] is False for item in decision.to_json()["per_output"])


def test_the_calculator_reports_exact_bounds_and_accepts_decimal_ties() -> None:
    history = [
        {"query": _binary_rr(0.1), "output": out} for out in (1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1)
    ]
    answer = compute_loss(
        {"domain": FIVE, "history": history, "candidate": _binary_rr(0.1), "budget": 1.0}
    )
    assert answer["realized_loss"] == {"lower": 0.9, "upper": 0.9, "exact": True}
    candidate = answer["candidate"]
    assert candidate["worst_case_upper"] == 1.0
    assert candidate["accepted"] == {"bayesian": True, "simplified": True, "basic": False}
    assert {o["output"]: (o["upper"], o["exact"]) for o in candidate["per_output"]} == {
        0: (0.8, True),
        1: (1.0, True),
    }


# ---------------------------------------------------------------------------- "as written"


@settings(max_examples=300, deadline=None)
@given(
    digits=st.integers(min_value=1, max_value=10**15 - 1),
    exponent=st.integers(min_value=-20, max_value=4),
)
def test_a_decimal_of_at_most_15_significant_digits_is_read_as_written(
    digits: int, exponent: int
) -> None:
    """JSON gives a double; its shortest decimal is the written one for <= 15 digits."""
    written = f"{digits}e{exponent}"
    parsed = json.loads(json.dumps({"epsilon": float(written)}))["epsilon"]
    assert decimal_fraction(parsed) == Fraction(written)
    assert decimal_fraction(json.loads(written)) == Fraction(written)


def test_longer_decimals_are_read_as_their_doubles_shortest_decimal() -> None:
    """17 digits that name the same double as ``0.1`` are read as ``0.1`` (documented)."""
    assert decimal_fraction(json.loads("0.10000000000000001")) == Fraction(1, 10)
    assert decimal_fraction(json.loads("0.1000000000000001")) == Fraction("0.1000000000000001")


def test_replay_of_stored_json_gives_the_same_exact_loss() -> None:
    """A history stored as JSON (the service's form) folds to the same decimals and loss."""
    domain = parse_domain(FIVE)
    raw = [(_binary_rr(0.1), 1), (_binary_rr(0.2), 1), (_binary_rr(0.05), 0)]
    stored = [(json.dumps(parse_query(q, domain).to_json()), json.dumps(o)) for q, o in raw]
    state, basic = fold_history(
        domain, [history_entry(domain, json.loads(q), json.loads(o)) for q, o in stored]
    )
    assert isinstance(state, LikelihoodState)
    assert state.exact is not None
    assert state.loss().value == Fraction(25, 100)
    assert basic == Fraction(35, 100)
    assert [g.epsilon for g in state.exact.groups] == [
        Fraction(1, 10),
        Fraction(2, 10),
        Fraction(5, 100),
    ]
    back = LikelihoodState.from_bytes(domain, state.to_bytes(), state.err)
    assert state.exact.same_as(back.exact)


def test_an_exact_part_of_the_first_version_is_not_read() -> None:
    """Version 1 held the floats' values and samplers rounded below e^ε: the float rule decides."""
    domain = parse_domain(FIVE)
    state = LikelihoodState(domain)
    state.apply(parse_query(_binary_rr(0.1), domain).term(1))
    data = state.logp.astype("<f8").tobytes() + b"\x00EXACT1\x00" + b'{"g":[],"n":0,"c":{}}'
    assert LikelihoodState.from_bytes(domain, data, state.err).exact is None

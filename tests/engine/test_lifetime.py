"""Lifetime budgets over data versions (contract.md "Data versions and lifetime budgets").

The life's realized loss is exactly the sum of the versions' losses (product-domain argument,
:mod:`app.engine.lifetime`); a query is accepted only if its version's filter accepts it and
every output keeps ``Σ_{u≠v} L_u + L_v ≤ ε_L``, a worst case exactly at ``ε_L`` accepted when
the losses are exact, rejected at a margin when they are certified bounds.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.lifetime import Lifetime, add_losses
from app.engine.likelihood import LikelihoodState, LossBounds, exact_bounds
from app.engine.mechanisms import parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
PAIR = {
    "attributes": [
        {"name": "a", "type": "integer", "low": 0, "high": 2},
        {"name": "c", "type": "categorical", "values": ["u", "v"]},
    ]
}
BOX = {"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]}


def _rr(eps: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": eps,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }


def _run(snap: ObjectSnapshot, query: dict[str, Any], output: Any = 1) -> tuple[Any, Any]:
    mech = parse_query(query, snap.domain)
    decision = evaluate(snap, mech)
    if decision.accepted:
        snap = record(snap, mech, output, decision)
    return decision, snap


@pytest.mark.parametrize("kind", list(FilterKind))
def test_exact_tie_at_the_lifetime_budget_is_accepted(kind: FilterKind) -> None:
    """Closed 0.5 (exact) + three ε = 0.1 outputs reach 0.8 = ε_L exactly: accepted; the
    fourth would reach 0.9 and is refused ``lifetime-exhausted``, though the version's own
    filter (0.4 ≤ 0.5) accepts it."""
    domain = parse_domain(BINARY)
    delta = 1e-6 if kind is FilterKind.APPROX_BAYESIAN else None
    snap = ObjectSnapshot.empty(domain, budget=0.5, filter=kind, delta=delta)
    snap = replace(snap, lifetime=Lifetime(0.8, exact_bounds(Fraction(1, 2)), versions=2))
    for _ in range(3):
        decision, snap = _run(snap, _rr(0.1))
        assert decision.accepted, decision.reason
    assert snap.loss().value == Fraction(3, 10)
    assert snap.lifetime is not None
    assert snap.lifetime.realized(snap.loss()).value == Fraction(4, 5)
    assert snap.lifetime.remaining(snap.loss()) == 0.0
    decision, _ = _run(snap, _rr(0.1))
    assert not decision.accepted
    assert decision.refusal == "lifetime-exhausted"
    alone = evaluate(replace(snap, lifetime=None), parse_query(_rr(0.1), domain))
    assert alone.accepted  # the version's own filter would accept it


def test_the_version_filter_refuses_first() -> None:
    """A query the version's filter refuses is ``budget-exhausted`` even when the lifetime
    budget would refuse it too."""
    domain = parse_domain(BINARY)
    snap = ObjectSnapshot.empty(domain, budget=0.2, filter=FilterKind.BAYESIAN)
    snap = replace(snap, lifetime=Lifetime(0.5, exact_bounds(Fraction(1, 2)), versions=2))
    decision, _ = _run(snap, _rr(0.3))
    assert not decision.accepted
    assert decision.refusal == "budget-exhausted"


def test_inexact_closed_versions_reject_a_tie() -> None:
    """A closed version known only by certified bounds: the sum is compared with a margin, so
    the tie that the exact form accepts is refused (rounding errs toward rejection)."""
    domain = parse_domain(BINARY)
    snap = ObjectSnapshot.empty(domain, budget=0.5, filter=FilterKind.BAYESIAN)
    snap = replace(snap, lifetime=Lifetime(0.8, LossBounds(0.49, 0.5), versions=2))
    for _ in range(2):
        decision, snap = _run(snap, _rr(0.1))
        assert decision.accepted
    decision, _ = _run(snap, _rr(0.1))  # 0.5 + 0.3 = 0.8 in bounds only: refused
    assert not decision.accepted
    assert decision.refusal == "lifetime-exhausted"


def test_continuous_lifetime_bounds_add_and_refuse_past_the_budget() -> None:
    """A continuous domain: certified bounds of the closed versions plus the candidate's."""
    domain = parse_domain(BOX)
    query = {
        "mechanism": "linear",
        "weights": {"x": 1},
        "intercept": 0,
        "range": [0, 1],
        "epsilon": 0.3,
    }
    snap = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.BAYESIAN)
    roomy = replace(snap, lifetime=Lifetime(1.0, LossBounds(0.2, 0.6), versions=2))
    decision, after = _run(roomy, query)
    assert decision.accepted  # 0.6 + 0.3 ≤ 1
    decision, _ = _run(after, query)
    assert not decision.accepted  # 0.6 + the worst output's loss passes 1
    assert decision.refusal == "lifetime-exhausted"
    assert decision.candidate.worst_case_upper + 0.6 > 1.0 - 1e-9
    alone = evaluate(replace(after, lifetime=None), parse_query(query, domain))
    assert alone.accepted


def test_lifetime_sums_round_outward() -> None:
    """Inexact sums: lower rounded down, upper rounded up; exact sums stay rational."""
    a, b = LossBounds(0.1, 0.2), LossBounds(0.2, 0.30000000000000004)
    total = add_losses(a, b)
    assert Fraction(total.lower) <= Fraction(0.1) + Fraction(0.2)
    assert Fraction(total.upper) >= Fraction(0.2) + Fraction(0.30000000000000004)
    exact = add_losses(exact_bounds(Fraction(1, 10)), exact_bounds(Fraction(2, 10)))
    assert exact.value == Fraction(3, 10)
    assert exact.exact


def test_the_life_loss_over_the_product_domain_is_the_sum() -> None:
    """Brute force over X × X: max − min of log P_1(x_1) + log P_2(x_2) is L_1 + L_2."""
    domain = parse_domain(PAIR)
    rng = random.Random(7)
    for _ in range(20):
        versions = []
        for _v in range(2):
            state = LikelihoodState(domain)
            for _q in range(rng.randint(1, 4)):
                attribute = rng.choice(["a", "c"])
                mech = parse_query(
                    {"mechanism": "grr", "attribute": attribute, "epsilon": rng.choice([0.2, 0.7])},
                    domain,
                )
                state.apply(mech.term(rng.randrange(mech.output_count)))
            versions.append(state)
        flat = [np.asarray(s.logp).ravel() for s in versions]
        product = [x + y for x, y in itertools.product(flat[0], flat[1])]
        life = max(product) - min(product)
        parts = sum(float(f.max() - f.min()) for f in flat)
        assert life == pytest.approx(parts, abs=1e-12)
        exact = [s.loss().value for s in versions]
        assert all(v is not None for v in exact)
        assert life == pytest.approx(float(sum(v for v in exact if v is not None)), abs=1e-9)

"""Algorithm 4 (``approx_bayesian``): F₀'s limit, the phases, and the (ε_g, δ_g) guarantee."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction
from typing import Any

import pytest
from scipy import stats

from app.engine.accountant import Accountant, submit
from app.engine.approx import OutputIndependentFilter, log_term, ordered_pairs, squares_limit
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.mechanisms import parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}


def _rr(eps: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": eps,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }


@pytest.mark.parametrize(("eps_g", "delta"), [(1.0, 1e-6), (0.5, 1e-3), (3.0, 0.2), (1e-3, 1e-9)])
@pytest.mark.parametrize("points", [1, 2, 3, 100, 10**7])
def test_order_and_threshold_are_those_of_advanced_composition(
    eps_g: float, delta: float, points: int
) -> None:
    """L = log(d(d−1)/δ_g); λ = sqrt(2L/V*) with V* solving sqrt(2LV) + V/2 = ε_g; threshold
    just below λε_g − L."""
    log_inv = log_term(delta, ordered_pairs(points))
    assert log_inv == pytest.approx(math.log(max(1, points * (points - 1)) / delta), rel=1e-15)
    v = squares_limit(eps_g, log_inv)
    assert math.sqrt(2 * log_inv * v) + v / 2 == pytest.approx(eps_g, rel=1e-12)
    f0 = OutputIndependentFilter.for_points(eps_g, delta, points)
    assert f0.order == pytest.approx(math.sqrt(2 * log_inv / v), rel=1e-15)
    exact_threshold = f0.order * eps_g - log_inv
    assert Fraction(exact_threshold) * (1 - Fraction(1, 10**10)) < f0.threshold
    assert f0.threshold < Fraction(exact_threshold)


@pytest.mark.parametrize("eps", [1e-6, 1e-3, 0.01, 0.3, 1.0, 5.0, 40.0])
def test_charge_bounds_randomized_response_mgf_and_the_hoeffding_bound(eps: float) -> None:
    """ψ(λ, ε) against a 60-digit evaluation (decimal), and below λε²/2 + λ²ε²/2 (so F₀ ⊇ WRRW)."""
    f0 = OutputIndependentFilter.for_points(1.0, 1e-6, 2)
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        lam, e = decimal.Decimal(f0.order), decimal.Decimal(repr(eps))
        exact = (((1 + lam) * e).exp() + (-lam * e).exp()) / (1 + e.exp())
        exact = exact.ln()
    charge = f0.charge(Fraction(repr(eps)))
    assert charge >= Fraction(exact)
    assert float(charge) == pytest.approx(float(exact), rel=1e-11)
    assert float(charge) <= f0.order * eps**2 / 2 * (1 + f0.order) * (1 + 1e-11)


def test_phase_one_accepts_338_queries_of_0_01_under_1_and_1e_6() -> None:
    """Issue #15's target: >= 300 (basic composition 100); both ordered pairs of the binary
    domain are accounted (L = log(2/δ_g), 354 with the pairwise log(1/δ_g))."""
    domain = parse_domain(BINARY)
    mech = parse_query(_rr(0.01), domain)
    snap = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.APPROX_BAYESIAN, delta=1e-6)
    accepted = 0
    while (decision := evaluate(snap, mech)).phase == "output-independent" and decision.accepted:
        snap = record(snap, mech, mech.sample({"b": 1}), decision)
        accepted += 1
    assert accepted == 338
    assert snap.phase == "output-independent"
    f0 = OutputIndependentFilter.for_points(1.0, 1e-6, 2)
    assert snap.f0_account == 338 * f0.charge(Fraction(1, 100))
    # the next query is the Bayesian filter's (loss after 338 queries is at most 3.38)
    assert decision.phase == ("bayesian" if decision.accepted else "output-independent")


def test_basic_composition_and_the_pure_filter_beside_it() -> None:
    domain = parse_domain(BINARY)
    mech = parse_query(_rr(0.01), domain)
    basic = Accountant(domain, 1.0, FilterKind.BASIC)
    while submit(basic, mech, {"b": 1}).decision.accepted:
        pass
    assert basic.accepted == 100


def test_a_large_query_goes_to_the_bayesian_filter_and_stays_there() -> None:
    domain = parse_domain(BINARY)
    acc = Accountant(domain, 1.0, FilterKind.APPROX_BAYESIAN, delta=1e-6)
    small, large = parse_query(_rr(0.01), domain), parse_query(_rr(0.9), domain)
    assert submit(acc, small, {"b": 1}).decision.phase == "output-independent"
    result = submit(acc, large, {"b": 1})  # beyond F₀'s threshold: the Bayesian filter's
    assert result.decision.accepted
    assert result.decision.phase == "bayesian"
    assert acc.odometer().phase == "bayesian"
    assert acc.odometer().to_json()["delta"] == 1e-6
    # F₀ never accepts again, even a tiny query: the realized loss decides from now on
    assert submit(acc, small, {"b": 1}).decision.phase == "bayesian"


def test_the_bayesian_phase_refuses_once_the_loss_exceeds_the_budget() -> None:
    """Line 14 of Algorithm 4: after F₀, a realized loss above ε_g rejects every query."""
    domain = parse_domain(BINARY)
    mech = parse_query(_rr(0.1), domain)
    # (1, 0.2): F₀ allows 18 queries of 0.1; force 18 outputs of 1 (loss 1.8 > 1)
    snap = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.APPROX_BAYESIAN, delta=0.2)
    for _ in range(18):
        decision = evaluate(snap, mech)
        assert decision.accepted
        assert decision.phase == "output-independent"
        snap = record(snap, mech, 1, decision)
    decision = evaluate(snap, mech)  # F₀'s limit is reached: line 14 decides
    assert not decision.accepted
    assert "already exceeds" in decision.reason
    assert decision.phase == "output-independent"
    tiny = parse_query(_rr(0.001), domain)  # within F₀'s limit: F₀ accepts whatever the loss
    assert evaluate(snap, tiny).accepted


def f0_queries(eps: float, eps_g: float, delta: float, points: int = 2) -> int:
    """How many queries of ``eps`` F₀ accepts on ``points`` points (exact rationals)."""
    f0 = OutputIndependentFilter.for_points(eps_g, delta, points)
    return int(f0.threshold / f0.charge(Fraction(repr(eps))))


def running_max_tail(n: int, eps: float, eps_g: float) -> float:
    """``P[max_{m<=n} |S_m| > ε_g]`` for binary RR of ``eps`` on the binary domain, x = 1.

    ``S_m = ε (#1 − #0)`` is the loss of the pair (1, 0) and ``|S_m|`` the realized loss
    (Definition 4.7's over both ordered pairs); exact dynamic programming over the walk's
    position in steps of ``eps``, absorbing at ``|k| > ε_g/ε``.
    """
    limit = math.floor(eps_g / eps + 1e-9)
    p = math.exp(eps) / (1 + math.exp(eps))
    probs = {0: 1.0}
    out = 0.0
    for _ in range(n):
        nxt: dict[int, float] = {}
        for k, q in probs.items():
            for step, w in ((1, p), (-1, 1 - p)):
                if abs(k + step) > limit:
                    out += q * w
                else:
                    nxt[k + step] = nxt.get(k + step, 0.0) + q * w
        probs = nxt
    return out


@pytest.mark.parametrize(
    ("eps", "eps_g", "delta"),
    [(0.1, 1.0, 0.2), (0.05, 1.0, 0.05), (0.3, 2.0, 0.1), (0.01, 1.0, 1e-6), (0.5, 4.0, 0.01)],
)
def test_f0_tail_is_below_delta_for_fixed_epsilon_streams(
    eps: float, eps_g: float, delta: float
) -> None:
    """The exact probability that the realized loss ever passes ε_g in F₀'s queries is <= δ_g.

    Under x = 1 each output of binary RR adds +ε (prob. e^ε/(1+e^ε)) or −ε to the loss of the
    pair (1, 0); the realized loss is its absolute value (both ordered pairs).
    """
    n = f0_queries(eps, eps_g, delta)
    assert running_max_tail(n, eps, eps_g) <= delta


@pytest.mark.slow
def test_monte_carlo_privacy_loss_tail_within_delta() -> None:
    """Pr[loss of the accepted transcript > ε_g] over objects run to the first rejection.

    Budget (1, 0.2), binary RR ε = 0.1: F₀'s 18 queries, then up to 4 of the Bayesian filter
    (or its first rejection). The transcript's realized loss is ε·|#1 − #0| (both ordered pairs
    of the binary domain); the Bayesian phase never lets it pass ε_g, so it exceeds ε_g only when
    F₀'s blind phase left it there — with the exact binomial probability 0.0088 here, below
    δ_g = 0.2. The empirical frequency must match that within 4 standard errors (and so stay
    below δ_g).
    """
    domain = parse_domain(BINARY)
    mech = parse_query(_rr(0.1), domain)
    objects, above = 300, 0
    for _ in range(objects):
        snap = ObjectSnapshot.empty(
            domain, budget=1.0, filter=FilterKind.APPROX_BAYESIAN, delta=0.2
        )
        ones = zeros = 0
        for _ in range(22):
            decision = evaluate(snap, mech)
            if not decision.accepted:
                break
            out = mech.sample({"b": 1})
            ones, zeros = ones + (out == 1), zeros + (out == 0)
            snap = record(snap, mech, out, decision)
        above += 0.1 * abs(ones - zeros) > 1.0 + 1e-9
    n = f0_queries(0.1, 1.0, 0.2)
    assert n == 18
    p = math.exp(0.1) / (1 + math.exp(0.1))
    # |#1 − #0| > 10 after n = 18: #1 >= 15 or #1 <= 3
    exact = float(stats.binom.sf(14, n, p) + stats.binom.cdf(3, n, p))
    rate = above / objects
    stderr = math.sqrt(exact * (1 - exact) / objects)
    assert abs(rate - exact) <= 4 * stderr, (rate, exact)
    assert rate <= 0.2

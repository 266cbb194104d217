"""Exact ties of randomized-response histories (contract.md "(ε, δ) filter and exact ties")."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from app.engine.calculator import compute_loss
from app.engine.domain import parse_domain
from app.engine.exact import MAX_GROUPS
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, fold_history, history_entry, record

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
RICH = {
    "attributes": [
        {"name": "a", "type": "integer", "low": 0, "high": 4},
        {"name": "c", "type": "categorical", "values": ["u", "v", "w"]},
    ]
}


def _rr(eps: float, attribute: str = "b", value: Any = 1) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": eps,
        "predicate": {"attribute": attribute, "op": "==", "value": value},
    }


def expected_queries(k: int, eps: float) -> float:
    """Theorem D.1, eq. 68: expected accepted queries under a budget of kε (m = 2)."""
    num = -k * math.exp(-2 * k * eps) + 2 * k * math.exp(-k * eps) - k
    den = (math.exp(eps) - 1) / (math.exp(eps) + 1) * (math.exp(-2 * k * eps) - 1)
    return num / den


@pytest.mark.parametrize(("k", "eps", "objects"), [(2, 0.5, 400), (3, 0.5, 300), (4, 0.25, 150)])
def test_theorem_d1_at_exactly_k_epsilon(k: int, eps: float, objects: int) -> None:
    """Binary RR of ε until the first rejection under a budget of exactly kε (eq. 68).

    Each object is decided by :func:`pipeline.evaluate` and advanced by :func:`pipeline.record`
    (the service's road), sampled by the mechanism's own CSPRNG sampler.
    """
    domain = parse_domain(BINARY)
    mech = parse_query(_rr(eps), domain)
    budget = k * eps
    assert Fraction(budget) == k * Fraction(eps)  # the tie is exact in the floats
    counts = []
    for _ in range(objects):
        snap = ObjectSnapshot.empty(domain, budget=budget, filter=FilterKind.BAYESIAN)
        accepted = 0
        while (decision := evaluate(snap, mech)).accepted:
            snap = record(snap, mech, mech.sample({"b": 1}), decision)
            accepted += 1
        assert snap.loss().upper <= budget
        counts.append(accepted)
    mean = float(np.mean(counts))
    stderr = float(np.std(counts, ddof=1)) / math.sqrt(objects)
    assert abs(mean - expected_queries(k, eps)) <= 4 * stderr, (mean, stderr)


def test_theorem_d1_reference_value() -> None:
    """The issue's figure: E(0) = 14.86 for k = 4, ε = 0.25."""
    assert expected_queries(4, 0.25) == pytest.approx(14.8647, abs=1e-4)


def test_calculator_accepts_the_exact_tie() -> None:
    """History 1,0,1,1,1 of binary RR ε = 0.25, the same candidate, budget 1.0."""
    entry = {"query": _rr(0.25), "output": None}
    history = [{**entry, "output": out} for out in (1, 0, 1, 1, 1)]
    answer = compute_loss(
        {"domain": BINARY, "history": history, "candidate": _rr(0.25), "budget": 1.0}
    )
    assert answer["realized_loss"] == {"lower": 0.75, "upper": 0.75, "exact": True}
    candidate = answer["candidate"]
    assert candidate["worst_case_upper"] == 1.0
    assert candidate["accepted"] == {"bayesian": True, "simplified": True, "basic": False}


def _brute_force(domain_json: dict[str, Any], history: list[tuple[Mechanism, Any]]) -> Fraction:
    """max − min over the points of Σ ε·[the output's coefficient], in Fractions, point by point."""
    domain = parse_domain(domain_json)
    totals = []
    for point in itertools.product(*(range(n) for n in domain.shape)):
        total = Fraction(0)
        for mech, out in history:
            term = mech.exact_term(out)
            assert term is not None
            total += term.group.epsilon * int(term.coeff[point[term.axis]])
        totals.append(total)
    return max(totals) - min(totals)


def _random_rr(rng: random.Random, domain: Any, eps_pool: list[float]) -> Mechanism:
    eps = rng.choice(eps_pool)
    kind = rng.randrange(4)
    if kind == 0:
        return parse_query(
            {"mechanism": "grr", "attribute": rng.choice(["a", "c"]), "epsilon": eps}, domain
        )
    if kind == 1:
        return parse_query(_rr(eps, "a", rng.randrange(5)), domain)
    variant = "symmetric" if kind == 2 else "optimized"
    attribute = rng.choice(["a", "c"])
    query = {"mechanism": "unary_encoding", "attribute": attribute, "epsilon": eps}
    return parse_query({**query, "variant": variant}, domain)


def _random_output(rng: random.Random, mech: Mechanism) -> Any:
    if mech.kind == "unary_encoding":
        k = mech.output_count.bit_length() - 1
        return tuple(rng.randrange(2) for _ in range(k))
    return rng.randrange(mech.output_count)


#: ε pools: one ε; several (int64 units); tiny and large together (units beyond int64, so the
#: exact values are Python integers).
POOLS = ([0.5], [0.25, 0.1, 0.7, 1.3], [1e-6, 0.3, 60.0])


@pytest.mark.parametrize("seed", range(9))
def test_exact_losses_match_brute_force_and_floats(seed: int) -> None:
    """Random RR histories (several ε, both UE variants): exact = brute force ≈ float."""
    rng = random.Random(seed)
    domain = parse_domain(RICH)
    pool = POOLS[seed % 3]
    history: list[tuple[Mechanism, Any]] = []
    state = LikelihoodState(domain)
    for _ in range(8):
        mech = _random_rr(rng, domain, pool)
        out = _random_output(rng, mech)
        history.append((mech, out))
        state.apply(mech.term(out))
        assert state.exact is not None
        exact = state.exact.loss()
        assert exact == _brute_force(RICH, history)
        assert abs(float(exact) - state.computed_loss) <= 2 * state.err + 1e-12
        candidate = _random_rr(rng, domain, pool)
        query = candidate.exact_query()
        assert query is not None
        losses = state.exact.candidate_losses(query)
        floats = candidate.candidate_losses(state).losses
        assert len(losses) == floats.size
        for j, loss in enumerate(losses):
            assert float(loss) == pytest.approx(float(floats[j]), abs=1e-9, rel=1e-12)
        if candidate.kind != "unary_encoding":
            for j in range(candidate.output_count):
                assert losses[j] == _brute_force(RICH, [*history, (candidate, j)])


def test_a_mixed_history_is_exact_too() -> None:
    """0.5 and 0.25 together: the samplers draw ``e^ε`` exactly, so no slack widens the loss."""
    domain = parse_domain(BINARY)
    state = LikelihoodState(domain)
    state.apply(parse_query(_rr(0.5), domain).term(1))
    state.apply(parse_query(_rr(0.25), domain).term(1))
    bounds = state.loss()
    assert (bounds.lower, bounds.upper, bounds.exact, bounds.value) == (0.75, 0.75, True, 0.75)


def test_a_query_without_exact_form_ends_exactness() -> None:
    domain = parse_domain(BINARY)
    state = LikelihoodState(domain)
    state.apply(parse_query(_rr(0.5), domain).term(1))
    assert state.exact is not None
    matrix = parse_query(
        {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[0.6, 0.4], [0.4, 0.6]]},
        domain,
    )
    state.apply(matrix.term(0))
    assert state.exact is None
    state.apply(parse_query(_rr(0.5), domain).term(1))
    assert state.exact is None


def test_exact_form_survives_persistence() -> None:
    """``to_bytes``/``from_bytes`` carry the counts; arrays stored without them load without."""
    domain = parse_domain(RICH)
    entries = [
        history_entry(domain, {"mechanism": "grr", "attribute": "c", "epsilon": 0.5}, "v"),
        history_entry(domain, _rr(0.25, "a", 3), 1),
    ]
    state, _ = fold_history(domain, entries)
    assert isinstance(state, LikelihoodState)
    assert state.exact is not None
    back = LikelihoodState.from_bytes(domain, state.to_bytes(), state.err)
    assert state.exact.same_as(back.exact)
    assert np.array_equal(back.logp, state.logp)
    legacy = LikelihoodState.from_bytes(domain, state.logp.astype("<f8").tobytes(), state.err)
    assert legacy.exact is None


def test_simplified_charges_a_constant_query_nothing_exactly() -> None:
    """Algorithm 3 at a loss equal to the budget: a query constant on the domain (tight ε 0)."""
    domain = parse_domain(BINARY)
    rr = parse_query(_rr(0.5), domain)
    snap = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.SIMPLIFIED)
    for out in (1, 1, 1, 0):  # loss 1.0, basic composition 2.0
        snap = record(snap, rr, out, None)
    assert snap.loss().upper == 1.0
    constant = parse_query(
        {**_rr(0.5), "predicate": {"attribute": "b", "op": "in", "value": [0, 1]}}, domain
    )
    assert constant.epsilon_exact == 0
    decision = evaluate(snap, constant)
    assert decision.candidate.exact_charged == 1
    assert decision.accepted
    assert not evaluate(snap, rr).accepted


def test_too_many_distinct_epsilons_end_exactness() -> None:
    domain = parse_domain(BINARY)
    state = LikelihoodState(domain)
    for i in range(MAX_GROUPS):
        state.apply(parse_query(_rr(0.01 * (i + 1)), domain).term(1))
    assert state.exact is not None
    assert len(state.exact.groups) == MAX_GROUPS
    state.apply(parse_query(_rr(0.01), domain).term(0))  # a known ε: still exact
    assert state.exact is not None
    state.apply(parse_query(_rr(0.999), domain).term(0))
    assert state.exact is None


@pytest.mark.parametrize("seed", range(3))
def test_unary_encoding_worst_pattern_without_enumeration(seed: int) -> None:
    """10 values: 1024 outputs, above the listing limit; the closed-form worst is exact."""
    rng = random.Random(seed)
    wide = {"attributes": [{"name": "a", "type": "integer", "low": 0, "high": 9}]}
    domain = parse_domain(wide)
    history: list[tuple[Mechanism, Any]] = []
    state = LikelihoodState(domain)
    for _ in range(6):
        eps = rng.choice(POOLS[seed % 3])
        mech = parse_query({"mechanism": "grr", "attribute": "a", "epsilon": eps}, domain)
        out = rng.randrange(10)
        history.append((mech, out))
        state.apply(mech.term(out))
    ue = parse_query(
        {"mechanism": "unary_encoding", "attribute": "a", "epsilon": 0.7, "variant": "symmetric"},
        domain,
    )
    query = ue.exact_query()
    assert query is not None
    assert not query.enumerate
    assert state.exact is not None
    (worst,) = state.exact.candidate_losses(query)
    patterns = itertools.product((0, 1), repeat=10)
    assert worst == max(_brute_force(wide, [*history, (ue, p)]) for p in patterns)

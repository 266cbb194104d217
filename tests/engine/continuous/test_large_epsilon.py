"""Large ε (up to the engine's limit of 100): bounds stay finite and sound.

Outside the ε ∈ [0.05, 2] of the main bracket tests. With ``E = e^ε - 1`` near 1e17 and beyond,
``log Pr`` of a ``linear`` query is extremely steep where the probability is smallest, and a
rounding-level step of the query value past ``[a, b]`` moves ``1 + t E`` below zero. These
tests pin the engine's behaviour there: single queries whose exact loss is known in closed
form, a short history, the accountant's decision, and random histories checked against the
reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from app.engine.accountant import Accountant
from app.engine.calculator import compute_loss
from app.engine.continuous.branch_and_bound import BnBSettings, Status, maximize
from app.engine.continuous.lp_bound import relax
from app.engine.continuous.problem import Box, TermSet
from app.engine.continuous.univariate import ResponseCurve
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query
from tests.engine.continuous.reference import random_instance, spy_maximize

UNIT = {"attributes": [{"name": "x", "type": "real", "low": 0.0, "high": 1.0}]}


def linear(eps: float, truncate: bool = False) -> dict[str, Any]:
    """``y = x`` on ``[0, 1]`` with range ``[0, 1]``: ``t`` spans ``[0, 1]``, so loss = ε."""
    return {
        "mechanism": "linear",
        "weights": {"x": 1.0},
        "range": [0.0, 1.0],
        "truncate": truncate,
        "epsilon": eps,
    }


@pytest.mark.parametrize("truncate", [False, True], ids=["plain", "truncated"])
@pytest.mark.parametrize("output", [0.0, 1.0], ids=["a", "b"])
@pytest.mark.parametrize("eps", [0.5, 2.0, 10.0, 30.0, 40.0, 100.0])
@pytest.mark.slow
def test_single_linear_query_loses_exactly_epsilon(
    eps: float, output: float, truncate: bool
) -> None:
    """``Pr(a | x=0) / Pr(a | x=1) = e^ε`` (and the mirror for ``b``): the loss is ε."""
    answer = compute_loss(
        {
            "domain": UNIT,
            "history": [{"query": linear(eps, truncate), "output": output}],
            # soundness only, not the gap: a node limit (not a time limit, which would stop the
            # search before it could reach a wrong conclusion) keeps the run short
            "options": {"max_nodes": 1500, "time_limit": 60.0},
        }
    )
    loss = answer["realized_loss"]
    assert math.isfinite(loss["lower"])
    assert math.isfinite(loss["upper"])
    assert loss["upper"] >= eps * (1 - 1e-12), f"upper bound {loss['upper']} below the loss {eps}"
    assert loss["lower"] <= eps * (1 + 1e-12)
    assert loss["lower"] <= loss["upper"]


@pytest.mark.slow
def test_tight_plain_query_at_a_vertex_gives_a_finite_bound() -> None:
    """A plain query whose range is exactly its reach over the box: at the vertex where it meets
    ``a``, rounding of ``θ·x + c`` can land a hair below ``a``, where ``log(1 + tE)`` of the
    affine continuation is undefined once ``|t| E > 1``. The answer must stay a number."""
    domain = {
        "attributes": [
            {"name": "x0", "type": "real", "low": -2.631894934039003, "high": -1.600021375859051},
            {"name": "x1", "type": "real", "low": 3.0127446520639687, "high": 7.400701360405059},
            {"name": "x2", "type": "real", "low": 0.8216203606436778, "high": 5.664228212237934},
        ]
    }
    query = {
        "mechanism": "linear",
        "weights": {"x0": -2.761764, "x1": 2.494353, "x2": 0.153571},
        "intercept": -19.915403,
        "range": [-7.855495843407879, 16.805090293737727],
        "epsilon": 58.461,
    }
    answer = compute_loss(
        {"domain": domain, "history": [{"query": query, "output": query["range"][1]}]}
    )
    loss = answer["realized_loss"]
    assert math.isfinite(loss["lower"]), loss
    assert math.isfinite(loss["upper"]), loss
    assert loss["lower"] <= loss["upper"]


def test_vertex_enumeration_bounds_every_vertex() -> None:
    """max of a convex F is at a vertex: the bound must cover every vertex, not only the best.

    ``-log Pr(a | x)`` for the query above with ε = 40 is 0 at x = 0 and 40 at x = 1; the
    evaluation-error bound at x = 1 is large (the slope there is ~e^40), which must widen the
    upper bound rather than drop the vertex.
    """
    curve = ResponseCurve(logistic=False, high=False, epsilon=40.0, a=0.0, b=1.0)
    terms = TermSet(np.array([[1.0]]), np.array([0.0]), (curve,)).negated()
    box = Box(np.array([0.0]), np.array([1.0]))
    result = maximize(terms, box, BnBSettings())
    assert result.upper >= 40.0 * (1 - 1e-12), result
    if result.status is Status.OPTIMAL:
        assert result.upper - result.lower <= BnBSettings().tolerance, result


@pytest.mark.parametrize("ulps", [1, 2, 4, 8])
def test_relaxation_never_reports_a_nonempty_node_empty(ulps: int) -> None:
    """A node ``z in [1 - (k+2)u, 1 - k u]`` of ``-log Pr(a | x)`` (truncated, ε = 40) holds the
    point ``x = z``; its envelope lines are steep (slope ~e^40), which must not turn the LP's
    answer into "infeasible" (the search would drop the node and its maximum)."""
    curve = ResponseCurve(logistic=False, high=False, epsilon=40.0, a=0.0, b=1.0, truncate=True)
    terms = TermSet(np.array([[1.0]]), np.array([0.0]), (curve,)).negated()
    step = 2.0**-53
    zl, zu = np.array([1.0 - (ulps + 2) * step]), np.array([1.0 - ulps * step])
    rel = relax(terms, np.array([0.0]), np.array([1.0]), zl, zu)
    inside = float(terms.term_values(zl[None, :]).sum())  # F at the feasible point x = zl
    assert rel.bound >= inside - 1e-9, (rel.bound, inside)


def test_large_epsilon_history_gives_finite_sound_bounds() -> None:
    """A plain ``linear`` query at ε = 40 next to a ``logistic`` one (no exception, no NaN)."""
    history = [
        {"query": linear(40.0), "output": 0.0},
        {
            "query": {
                "mechanism": "logistic",
                "weights": {"x": 4.0},
                "intercept": -2.0,
                "epsilon": 1.0,
            },
            "output": 1,
        },
    ]
    answer = compute_loss({"domain": UNIT, "history": history, "options": {"time_limit": 2.0}})
    loss = answer["realized_loss"]
    assert math.isfinite(loss["upper"])
    # exact: log P(x) = log Pr(a | x) + log Pr(1 | x), both monotone, extremes at x = 0 and 1
    e40, e1 = math.exp(40.0), math.exp(1.0)
    sig = [1 / (1 + math.exp(2.0)), 1 / (1 + math.exp(-2.0))]
    logp = [
        math.log(e40 / (1 + e40)) + math.log((1 + sig[0] * (e1 - 1)) / (1 + e1)),
        -math.log1p(e40) + math.log((1 + sig[1] * (e1 - 1)) / (1 + e1)),
    ]
    exact = max(logp) - min(logp)
    assert loss["lower"] <= exact + 1e-9 <= loss["upper"] + 2e-9
    # the ε = 40 query's range is exactly its reach, so rounding puts query values a hair past
    # [a, b]: the bound must use the clipped curve there, not fall back to Σε (40.74)
    assert loss["upper"] <= exact + 1e-3, (loss, exact)


@pytest.mark.slow
def test_accountant_rejects_a_query_that_would_exceed_the_budget() -> None:
    """Budget 50: after one ε = 40 query answered ``a``, the same query answered ``a`` again
    brings the loss to 80, so the Bayesian filter must reject it."""
    domain = parse_domain(UNIT)
    acc = Accountant(domain, 50.0)
    first = parse_query(linear(40.0), domain)
    assert acc.dry_run(first).accepted  # basic composition: 40 <= 50
    acc.record(first, 0)
    assert acc.loss().upper >= 40.0 * (1 - 1e-12), acc.loss()
    decision = acc.dry_run(parse_query(linear(40.0), domain))
    assert decision.worst_case_after >= 80.0 * (1 - 1e-12), decision.to_json()
    assert not decision.accepted


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_large_epsilon_brackets(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random histories with ε in [2, 100]: finite, ordered and sound (limits allowed)."""
    make, search = np.random.default_rng(3000 + seed), np.random.default_rng(4000 + seed)
    for _ in range(4):
        inst = random_instance(make, dim=int(make.integers(1, 4)), size=int(make.integers(1, 6)))
        inst.eps[:] = np.round(make.uniform(2.0, 100.0, size=inst.size), 3)
        with monkeypatch.context() as patch:
            spy = spy_maximize(patch)
            answer = compute_loss(inst.request(time_limit=1.0, max_nodes=2000))
        (_, _, top), (_, _, bottom) = spy.calls
        loss = answer["realized_loss"]
        assert math.isfinite(loss["lower"]), loss
        assert math.isfinite(loss["upper"]), loss
        assert 0.0 <= loss["lower"] <= loss["upper"]
        found_max, _, found_min, _ = inst.search(search)
        assert loss["upper"] >= found_max - found_min - 1e-9, (loss, found_max - found_min)
        true_at_points = float(inst.logp(top.x)[0] - inst.logp(bottom.x)[0])
        assert loss["lower"] <= true_at_points + 1e-9

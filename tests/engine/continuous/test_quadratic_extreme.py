"""Quadratic query values (``x^2``, ``x*y``) together with the extreme-parameter numerics.

The two features meet where ``z`` is evaluated "exactly" (error-free sums, face snapping, the
finite table's ``z - a``, the tight ε from the query's exact reach) and in the one-dimensional
reduction of parallel weights, which must leave histories with a monomial column alone. References
are the standard library's ``decimal`` at 60 digits on exact rationals, or the dense-grid search of
``test_quadratic`` (no engine code).
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from app.engine.calculator import compute_loss
from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.continuous.problem import rank_one
from app.engine.continuous.state import ContinuousState
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query
from app.engine.numerics import exact_lifted_dot
from tests.engine.continuous.test_extreme_parameters import (
    UNIT_INT,
    UNIT_REAL,
    WEIGHT,
    exact_single_loss,
)
from tests.engine.continuous.test_quadratic import Query, extreme, request

PAIRS = ((0, 0), (0, 1), (1, 2))


def exact_lifted(points: np.ndarray, theta: np.ndarray, c: np.ndarray, p: int, i: int) -> Fraction:
    """``θ_i·[x, m(x)] + c_i`` at row ``p`` in rationals."""
    x = [Fraction(float(v)) for v in points[p]]
    lifted = x + [x[a] * x[b] for a, b in PAIRS]
    return sum(
        (Fraction(float(t)) * v for t, v in zip(theta[i], lifted, strict=True)),
        Fraction(float(c[i])),
    )


def test_exact_lifted_dot_bound_is_sound_and_zero_when_exact() -> None:
    """The bound covers the true error (rationals), also where a monomial underflows, and is 0
    when every product and sum was exact."""
    rng = np.random.default_rng(5)
    points = rng.normal(size=(30, 3)) * 10.0 ** rng.integers(-6, 6, size=(30, 3))
    points[:3] = rng.normal(size=(3, 3)) * 1e-170  # x_i x_j < 2^-960: Dekker's error is not exact
    theta = rng.normal(size=(5, 3 + len(PAIRS)))
    c = rng.normal(size=5)
    z, bound = exact_lifted_dot(points, PAIRS, theta, c)
    for p in range(points.shape[0]):
        for i in range(theta.shape[0]):
            exact = exact_lifted(points, theta, c, p, i)
            assert abs(exact - Fraction(float(z[p, i]))) <= Fraction(float(bound[p, i])), (p, i)
    assert np.all(bound[:3] > 0.0)  # the underflowing monomials are charged
    exact_points = np.array([[0.0, 1.0, -2.0], [1.5, -0.5, 4.0]])
    z, bound = exact_lifted_dot(
        exact_points, PAIRS, np.array([[1.0, 2.0, 0.0, 3.0, -1.0, 0.5]]), np.zeros(1)
    )
    assert bound.max() == 0.0
    assert z[:, 0].tolist() == [2.0 + 0.0 - 1.0, 1.5 - 1.0 + 6.75 + 0.75 - 1.0]


@pytest.mark.parametrize(("domain", "output"), [(UNIT_REAL, 0), (UNIT_INT, 1), (UNIT_REAL, 1)])
def test_extreme_epsilon_quadratic_tiny_loss_is_bracketed(
    domain: dict[str, Any], output: int
) -> None:
    """The issue-15 logistic (ε = 100, a loss of 1e-13) with its weight on ``x^2`` instead of
    ``x``: over ``[0, 1]`` (and ``{0, 1}``) ``x^2`` spans the same ``[0, 1]``, so the exact loss
    is the same. The lifted evaluation keeps the cancellation-free log-probabilities and the
    exact ``z`` at the vertices; the finite table its exact ``z``."""
    query = {
        "mechanism": "logistic",
        "weights": {"x^2": WEIGHT},
        "intercept": 2.25,
        "epsilon": 100.0,
    }
    exact = exact_single_loss(output)
    answer = compute_loss({"domain": domain, "history": [{"query": query, "output": output}]})
    loss = answer["realized_loss"]
    assert loss["lower"] <= exact <= loss["upper"], (loss, exact)
    # sound, not vacuous: the lifted search has no exact vertex shortcut, and its LP bounds are
    # certified with ~100 ulp of the log-probabilities (~2.4 nats); before numerics the rounding
    # of log1p(t(e^ε - 1)) - log1p(e^ε) alone was 1e-14 and on the wrong side
    assert loss["upper"] - exact <= (2e-14 if domain is UNIT_INT else 1e-13)
    assert answer["basic_composition"] >= max(exact_single_loss(0), exact_single_loss(1))


def test_finite_grid_quadratic_uses_exact_z() -> None:
    """``0.1 x^2 - 0.2 x`` at ``x = 3`` is ``3 fl(0.1)`` exactly, ``fl(0.3) + 2.8e-17`` — but
    ``0.30000000000000004`` or so in floats; at ε = 100 ``log Pr(b)`` there is ``log t``. One
    output ``b`` on ``x ∈ {3, 4}`` with range ``[0.3, 0.8]``: the certified bracket holds the
    60-digit loss, and the tight ε is not below it."""
    domain = {"attributes": [{"name": "x", "type": "integer", "low": 3, "high": 4}]}
    query = {
        "mechanism": "linear",
        "weights": {"x^2": 0.1, "x": -0.2},
        "range": [0.3, 0.8],
        "epsilon": 100,
    }
    answer = compute_loss({"domain": domain, "history": [{"query": query, "output": 0.8}]})
    a, b = Fraction(0.3), Fraction(0.8)

    def t(x: int) -> Fraction:
        z = Fraction(0.1) * x * x + Fraction(-0.2) * x
        return (min(max(z, a), b) - a) / (b - a)

    with localcontext() as ctx:
        ctx.prec = 60
        big = Decimal(100).exp()

        def log_high(x: int) -> Decimal:
            tx = t(x)
            td = Decimal(tx.numerator) / Decimal(tx.denominator)
            return ((1 + td * (big - 1)) / (big + 1)).ln()

        exact = float(log_high(4) - log_high(3))
    assert 30.0 < exact < 45.0  # t(3) is 2.8e-17 / 0.5: the loss is about -log t
    loss = answer["realized_loss"]
    assert loss["lower"] <= exact <= loss["upper"], (loss, exact)
    assert loss["upper"] - loss["lower"] < 1e-9
    assert answer["basic_composition"] >= exact


def parallel_with_quadratic(eps: float) -> tuple[np.ndarray, np.ndarray, list[Query]]:
    """Six logistic queries with weights ``λ (1, -2)`` and one ``x*y``/``x^2`` query, at ``eps``."""
    lo, hi = np.array([-1.0, 0.0]), np.array([1.0, 1.5])
    history = [
        Query({"x": lam, "y": -2.0 * lam}, c, "logistic", 0.0, 1.0, eps, high)
        for lam, c, high in [
            (1.0, 0.3, True),
            (2.0, -0.5, False),
            (-0.5, 0.1, True),
            (4.0, 1.0, True),
            (1.0, -0.2, False),
            (-2.0, 0.7, False),
        ]
    ]
    history.append(Query({"x*y": 2.5, "x^2": -1.5, "y": 0.5}, 0.2, "logistic", 0.0, 1.0, eps, True))
    return lo, hi, history


def term_sets(lo: np.ndarray, hi: np.ndarray, history: list[Query]) -> list[Any]:
    """The TermSet of the history without and with its last (quadratic) query, and the box."""
    domain = parse_domain(request(lo, hi, history)["domain"])
    state = ContinuousState(domain, BnBSettings())
    sets = []
    for n, q in enumerate(history):
        entry = q.entry()
        state.record(parse_query(entry["query"], domain), int(entry["output"]))
        if n >= len(history) - 2:
            sets.append(state.term_set()[0])
    return [*sets, state.box]


@pytest.mark.parametrize("eps", [1.0, 12.0])
def test_parallel_linear_history_with_a_quadratic_query(eps: float) -> None:
    """Parallel weights reduce to one dimension until a quadratic query joins; the mixed history
    then takes the lifted search, and its bounds bracket the dense-grid reference."""
    lo, hi, history = parallel_with_quadratic(eps)
    linear_only, mixed, box = term_sets(lo, hi, history)
    assert rank_one(linear_only, box) is not None
    assert mixed.lifting is not None
    assert rank_one(mixed, box) is None
    answer = compute_loss(request(lo, hi, history, time_limit=20.0))
    found = answer["realized_loss"]
    top, bottom = extreme(history, lo, hi, 1.0), extreme(history, lo, hi, -1.0)
    reference = top - bottom
    slack = 1e-9 * (1.0 + abs(top) + abs(bottom))
    assert found["upper"] >= reference - slack
    assert found["lower"] <= reference + 1e-7 + slack
    assert answer["status"] == "ok"
    assert found["upper"] - found["lower"] <= 1e-4 + 1e-12
    # the linear part alone: the reduced search brackets its own reference
    linear = compute_loss(request(lo, hi, history[:-1], time_limit=20.0))["realized_loss"]
    ref_linear = extreme(history[:-1], lo, hi, 1.0) - extreme(history[:-1], lo, hi, -1.0)
    assert linear["lower"] - 1e-7 <= ref_linear <= linear["upper"] + slack


def test_parallel_quadratic_rows_are_not_reduced() -> None:
    """Weights ``λ (x^2: 1, y: -1)``: the rows of ``θ`` (monomial column included) are parallel,
    but ``z`` is no function of one ``v·x`` over the box's coordinates; the history takes the
    lifted search and brackets the dense-grid reference."""
    lo, hi = np.array([-1.0, -0.5]), np.array([1.5, 1.0])
    history = [
        Query({"x^2": lam, "y": -lam}, c, "logistic", 0.0, 1.0, 3.0, high)
        for lam, c, high in [(1.0, 0.2, True), (2.0, -0.4, False), (-1.0, 0.5, True)]
    ]
    *_, terms, box = term_sets(lo, hi, history)
    assert terms.lifting is not None
    assert rank_one(terms, box) is None
    answer = compute_loss(request(lo, hi, history, time_limit=20.0))
    found = answer["realized_loss"]
    reference = extreme(history, lo, hi, 1.0) - extreme(history, lo, hi, -1.0)
    assert answer["status"] == "ok"
    assert found["lower"] - 1e-7 <= reference <= found["upper"] + 1e-9
    assert found["upper"] - found["lower"] <= 1e-4 + 1e-12

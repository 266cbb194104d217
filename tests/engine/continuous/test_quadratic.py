"""Quadratic query values (``x^2``, ``x*y`` weights) on continuous domains.

The reference here is written from contract.md's formulas with no engine code: ``z`` is the
polynomial of the weights, ``Pr(high) = t (e^ε - 1)/(e^ε + 1) + 1/(e^ε + 1)``. Its extremes over
a 2-D box come from a dense grid refined by L-BFGS-B around the best grid points; they are values
at points of the box, so ``found_max <= max log P`` and ``found_min >= min log P``: a certified
upper bound of the loss is never below ``found_max - found_min`` and a certified lower bound
(a difference of values at points) never above ``max - min``, which the refinement pins to
within ``1e-7`` of the found loss.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from scipy.optimize import minimize

from app.engine.calculator import compute_loss
from app.engine.continuous.branch_and_bound import BnBSettings, Status, maximize
from app.engine.continuous.state import ContinuousState
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query

TOLERANCE = 1e-4
MONOMIALS = ("x", "y", "x^2", "y^2", "x*y")


def monomial(name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return {"x": x, "y": y, "x^2": x * x, "y^2": y * y, "x*y": x * y}[name]


def monomial_range(name: str, lo: np.ndarray, hi: np.ndarray) -> tuple[float, float]:
    """Interval arithmetic (an outer range) of one monomial over the box."""
    if name in ("x", "y"):
        k = 0 if name == "x" else 1
        return float(lo[k]), float(hi[k])
    if name in ("x^2", "y^2"):
        k = 0 if name == "x^2" else 1
        ends = [lo[k] ** 2, hi[k] ** 2]
        return (0.0 if lo[k] <= 0 <= hi[k] else min(ends)), max(ends)
    corners = [lo[0] * lo[1], lo[0] * hi[1], hi[0] * lo[1], hi[0] * hi[1]]
    return min(corners), max(corners)


@dataclass
class Query:
    weights: dict[str, float]
    intercept: float
    kind: str  # "plain", "truncated", "logistic"
    a: float
    b: float
    eps: float
    high: bool

    def z(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        total = np.full(np.broadcast(x, y).shape, self.intercept)
        for name, w in self.weights.items():
            total = total + w * monomial(name, x, y)
        return total

    def log_prob(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        z = self.z(x, y)
        if self.kind == "logistic":
            t = np.where(
                z >= 0, 1 / (1 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1 + np.exp(-np.abs(z)))
            )
        else:
            t = (np.clip(z, self.a, self.b) - self.a) / (self.b - self.a)
        k, base = math.tanh(self.eps / 2), 1 / (math.exp(self.eps) + 1)
        p_high = t * k + base
        return np.log(p_high if self.high else (1 - t) * k + base)

    def entry(self) -> dict[str, Any]:
        query: dict[str, Any] = {
            "mechanism": "logistic" if self.kind == "logistic" else "linear",
            "weights": self.weights,
            "intercept": self.intercept,
            "epsilon": self.eps,
        }
        if self.kind != "logistic":
            query["range"] = [self.a, self.b]
            query["truncate"] = self.kind == "truncated"
            return {"query": query, "output": self.b if self.high else self.a}
        return {"query": query, "output": int(self.high)}


def random_history(
    rng: np.random.Generator, size: int
) -> tuple[np.ndarray, np.ndarray, list[Query]]:
    lo = np.round(rng.uniform(-2.0, 0.5, size=2), 3)
    hi = np.round(lo + rng.uniform(0.5, 3.0, size=2), 3)
    history = []
    for i in range(size):
        chosen = [m for m in MONOMIALS if rng.uniform() < 0.5] or ["x*y"]
        if not any("^" in m or "*" in m for m in chosen):
            chosen.append(["x^2", "y^2", "x*y"][int(rng.integers(3))])
        weights = {m: float(np.round(rng.normal(scale=1.5), 3)) for m in chosen}
        kind = ["plain", "truncated", "logistic"][i % 3]
        z_lo = z_hi = 0.0
        for m, w in weights.items():
            r = monomial_range(m, lo, hi)
            z_lo, z_hi = z_lo + min(w * r[0], w * r[1]), z_hi + max(w * r[0], w * r[1])
        intercept = float(np.round(-0.5 * (z_lo + z_hi) + rng.normal(), 3))
        z_lo, z_hi = z_lo + intercept, z_hi + intercept
        span = max(z_hi - z_lo, 1e-3)
        if kind == "plain":
            a, b = z_lo - 0.1 * span - 1e-3, z_hi + 0.1 * span + 1e-3
        else:
            a, b = sorted(rng.uniform(z_lo, z_hi, size=2))
            b = max(b, a + 1e-3)
        eps = float(np.round(rng.uniform(0.3, 2.0), 3))
        history.append(
            Query(weights, intercept, kind, float(a), float(b), eps, bool(rng.uniform() < 0.5))
        )
    return lo, hi, history


def log_p(history: list[Query], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return sum((q.log_prob(x, y) for q in history), np.zeros(np.broadcast(x, y).shape))


def extreme(history: list[Query], lo: np.ndarray, hi: np.ndarray, sign: float) -> float:
    """``sign * max(sign * log P)``: a 401² grid, L-BFGS-B from its 8 best local maxima and
    zoomed 21² grids around both start and end (zooming copes with the kinks of truncated
    terms, L-BFGS-B with smooth interior optima)."""
    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], 401), np.linspace(lo[1], hi[1], 401))
    values = sign * log_p(history, gx, gy)
    best = float(values.max())
    padded = np.pad(values, 1, constant_values=-np.inf)
    neighbours = np.max(
        [
            np.roll(np.roll(padded, dx, 0), dy, 1)[1:-1, 1:-1]
            for dx in (-1, 0, 1)
            for dy in (-1, 0, 1)
            if dx or dy
        ],
        axis=0,
    )
    peaks = np.flatnonzero((values >= neighbours).ravel())
    for flat in peaks[np.argsort(values.ravel()[peaks])][-8:]:
        start = np.array([gx.ravel()[flat], gy.ravel()[flat]])
        res = minimize(
            lambda p: -sign * float(log_p(history, p[0], p[1])),
            start,
            method="L-BFGS-B",
            bounds=list(zip(lo, hi, strict=True)),
            options={"ftol": 1e-15, "gtol": 1e-12},
        )
        best = max(best, -float(res.fun))
        for centre in (start, np.asarray(res.x)):
            half = 4.0 * (hi - lo) / 400
            for _ in range(18):
                wx, wy = (
                    np.linspace(
                        max(lo[k], centre[k] - half[k]), min(hi[k], centre[k] + half[k]), 21
                    )
                    for k in (0, 1)
                )
                zx, zy = np.meshgrid(wx, wy)
                local = sign * log_p(history, zx, zy)
                k = int(np.argmax(local))
                centre, half = np.array([zx.ravel()[k], zy.ravel()[k]]), half / 3
                best = max(best, float(local.max()))
    return sign * best


def request(lo: np.ndarray, hi: np.ndarray, history: list[Query], **options: Any) -> dict[str, Any]:
    domain = {
        "attributes": [
            {"name": "x", "type": "real", "low": float(lo[0]), "high": float(hi[0])},
            {"name": "y", "type": "real", "low": float(lo[1]), "high": float(hi[1])},
        ]
    }
    return {
        "domain": domain,
        "history": [q.entry() for q in history],
        "options": {"tolerance": TOLERANCE, **options},
    }


# --- appendix A ---------------------------------------------------------------------------------

APPENDIX_A = [  # (o1, o2, max log Pr, min log Pr, loss) as printed (2 decimals)
    (1, 1, -0.63, -2.04, 1.41),
    (1, 0, -0.94, -2.63, 1.69),
    (-1, 1, -0.63, -2.04, 1.41),
    (-1, 0, -0.94, -2.63, 1.69),
]


@pytest.mark.parametrize(("o1", "o2", "top", "bottom", "loss"), APPENDIX_A)
def test_appendix_a_mean_and_variance_estimators(
    o1: int, o2: int, top: float, bottom: float, loss: float
) -> None:
    """Paper appendix A: x in [-1, 1], ε = 1, the mean (``x``) and variance (``x^2``) queries."""
    domain = {"attributes": [{"name": "x", "type": "real", "low": -1, "high": 1}]}
    history = [
        {
            "query": {"mechanism": "linear", "weights": {"x": 1}, "range": [-1, 1], "epsilon": 1},
            "output": o1,
        },
        {
            "query": {"mechanism": "linear", "weights": {"x^2": 1}, "range": [0, 1], "epsilon": 1},
            "output": o2,
        },
    ]
    answer = compute_loss({"domain": domain, "history": history})
    found = answer["realized_loss"]
    assert answer["status"] == "ok"
    assert found["upper"] - found["lower"] <= TOLERANCE
    assert abs(found["lower"] - loss) <= 0.005 + 1e-9
    assert answer["basic_composition"] == pytest.approx(2.0)
    # the table's extremes themselves, against the engine's two searches
    mean = Query({"x": 1.0}, 0.0, "plain", -1.0, 1.0, 1.0, o1 == 1)
    var = Query({"x^2": 1.0}, 0.0, "plain", 0.0, 1.0, 1.0, o2 == 1)
    grid = np.linspace(-1.0, 1.0, 200_001)
    values = log_p([mean, var], grid, np.zeros_like(grid))
    assert abs(values.max() - top) <= 0.005 + 1e-9
    assert abs(values.min() - bottom) <= 0.005 + 1e-9
    exact = float(values.max() - values.min())
    assert found["lower"] - 1e-9 <= exact <= found["upper"] + 1e-9


# --- random 2-D histories ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(16))
def test_random_2d_quadratic_histories_bracket_the_grid(seed: int) -> None:
    """3-7 queries: plain, truncated and logistic, random monomials and boxes."""
    check_random_history(seed, 3 + seed % 5)


def check_random_history(seed: int, size: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    lo, hi, history = random_history(rng, size)
    answer = compute_loss(request(lo, hi, history, time_limit=20.0))
    found = answer["realized_loss"]
    top, bottom = extreme(history, lo, hi, 1.0), extreme(history, lo, hi, -1.0)
    reference = top - bottom
    slack = 1e-9 * (1.0 + abs(top) + abs(bottom))
    assert found["upper"] >= reference - slack
    assert found["lower"] <= reference + 1e-7 + slack
    if answer["status"] == "ok":
        assert found["upper"] - found["lower"] <= TOLERANCE + 1e-12
        assert found["upper"] - reference <= TOLERANCE + 1e-7


def test_interior_saddle_of_a_product_is_found() -> None:
    """``x*y`` on a box around 0: the maximum of a logistic of ``-x*y - x^2`` is interior in y."""
    lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
    history = [
        Query({"x*y": 3.0, "x^2": -2.0, "y": 0.5}, 0.2, "logistic", 0, 1, 1.5, True),
        Query({"x*y": -2.0, "y^2": 1.0}, -0.1, "logistic", 0, 1, 1.0, False),
        Query({"x": 1.0, "y^2": 1.0}, 0.0, "plain", -1.5, 2.5, 0.7, True),
    ]
    answer = compute_loss(request(lo, hi, history, time_limit=20.0))
    found = answer["realized_loss"]
    reference = extreme(history, lo, hi, 1.0) - extreme(history, lo, hi, -1.0)
    assert answer["status"] == "ok"
    assert found["lower"] - 1e-7 <= reference <= found["upper"] + 1e-9


# --- time limit ----------------------------------------------------------------------------------


def test_time_limit_is_honoured_on_a_quadratic_history() -> None:
    """A 3-D history of 60 quadratic logistic queries stops at a 0.3 s limit, soundly."""
    rng = np.random.default_rng(7)
    names = ["u", "v", "w"]
    domain = parse_domain(
        {"attributes": [{"name": n, "type": "real", "low": -2, "high": 2} for n in names]}
    )
    keys = ["u", "v", "w", "u^2", "v^2", "w^2", "u*v", "u*w", "v*w"]
    state = ContinuousState(domain, BnBSettings(time_limit=0.3))
    for _ in range(60):
        weights = {k: float(rng.normal(scale=2.0)) for k in keys}
        query = {"mechanism": "logistic", "weights": weights, "epsilon": 1.0, "intercept": 0.3}
        state.record(parse_query(query, domain), int(rng.integers(2)))
    terms, _ = state.term_set()
    box = state.box
    for sign in (1.0, -1.0):
        problem = terms if sign > 0 else terms.negated()
        wall = time.perf_counter()
        result = maximize(problem, box, BnBSettings(time_limit=0.3))
        wall = time.perf_counter() - wall
        assert result.status is Status.TIME_LIMIT
        assert wall <= 0.3 + 1.5, f"{wall:.2f}s for a 0.3 s limit"
        assert np.isfinite(result.lower)
        assert result.lower <= result.upper
        points = rng.uniform(box.lo, box.hi, size=(2000, 3))
        values, _ = problem.evaluate_many(points)
        assert result.upper >= float(values.max())
        value, err = problem.evaluate(result.x)
        assert value + err >= result.lower


# --- the lifting itself --------------------------------------------------------------------------


def test_envelope_rows_hold_at_every_point_of_the_box() -> None:
    from app.engine.continuous.lifting import Lifting

    rng = np.random.default_rng(3)
    lifting = Lifting(3, ((0, 0), (0, 1), (1, 2), (2, 2)))
    for _ in range(20):
        lo = rng.uniform(-3, 1, size=3)
        hi = lo + rng.uniform(0, 3, size=3)
        a_mat, b = lifting.envelope_rows(lo, hi)
        points = rng.uniform(lo, hi, size=(500, 3))
        corners = np.array(np.meshgrid(*zip(lo, hi, strict=True))).reshape(3, -1).T
        lifted = lifting.lift(np.vstack([points, corners]))
        assert np.all(lifted @ a_mat.T <= b)
        v_lo, v_hi = lifting.bounds(lo, hi)
        assert np.all(lifted >= v_lo)
        assert np.all(lifted <= v_hi)


@pytest.mark.filterwarnings("error")
def test_plain_linear_range_met_exactly_where_interval_arithmetic_is_wider() -> None:
    """``x^2 + x`` on ``[-1, 1]`` reaches exactly ``[-0.25, 2]`` but interval arithmetic says
    ``[-1, 2]``, where the plain query's affine continuation leaves ``[0, 1]`` (at ε = 2,
    ``1 + tE < 0``: NaN log-probabilities): the search must stay within the query's own range
    (``TermSet.reach``)."""
    lo, hi = np.array([-1.0, 0.0]), np.array([1.0, 1.0])
    history = [
        Query({"x^2": 1.0, "x": 1.0}, 0.0, "plain", -0.25, 2.0, 2.0, True),
        Query({"x*y": 1.5, "y": -0.5}, 0.1, "logistic", 0, 1, 1.0, True),
    ]
    answer = compute_loss(request(lo, hi, history, time_limit=20.0))
    found = answer["realized_loss"]
    reference = extreme(history, lo, hi, 1.0) - extreme(history, lo, hi, -1.0)
    assert answer["status"] == "ok"
    assert math.isfinite(found["lower"])
    assert math.isfinite(found["upper"])
    assert found["lower"] - 1e-7 <= reference <= found["upper"] + 1e-9

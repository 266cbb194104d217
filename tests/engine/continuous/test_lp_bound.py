"""The LP relaxation's certificate (acceptance test 3).

For random nodes — a sub-box of coordinates and a box of query values ``l <= θ·x + c <= u`` — the
certified bound of :func:`relax` is at least the largest ``F`` found by dense sampling of the
node (``F`` from the independent reference), and close to the optimum of the same LP rebuilt
here from the envelope lines and solved by ``scipy.optimize.linprog``. The weak-duality
certificate is also checked with arbitrary non-negative multipliers.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from app.engine.continuous.envelopes import concave_overestimator
from app.engine.continuous.lp_bound import _certify, certified_empty, relax, tighten
from app.engine.continuous.problem import Box, TermSet
from tests.engine.continuous.reference import Instance, random_instance

SAMPLES = 20_000


def random_node(
    inst: Instance, terms: TermSet, rng: np.random.Generator, feasible: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A node as the search makes them: coordinate sub-box and query-value intervals."""
    x_lo, x_hi = inst.lo.copy(), inst.hi.copy()
    for k in range(inst.dim):
        if rng.uniform() < 0.3:
            ends = np.sort(rng.uniform(inst.lo[k], inst.hi[k], size=2))
            x_lo[k], x_hi[k] = ends
    zl, zu = terms.value_ranges(Box(x_lo, x_hi))
    anchor = terms.values(rng.uniform(x_lo, x_hi))
    for i in range(terms.size):
        if rng.uniform() < 0.6:
            if feasible:  # keep the anchor's value inside: the node holds at least one point
                zl[i] = rng.uniform(zl[i], anchor[i])
                zu[i] = rng.uniform(anchor[i], zu[i])
            else:
                zl[i], zu[i] = np.sort(rng.uniform(zl[i], zu[i], size=2))
    return x_lo, x_hi, zl, zu


def dense_max(
    inst: Instance,
    sign: float,
    x_lo: np.ndarray,
    x_hi: np.ndarray,
    zl: np.ndarray,
    zu: np.ndarray,
    rng: np.random.Generator,
) -> float:
    """Largest ``sign * log P`` over sampled points of the node (``-inf`` if none)."""
    inner = Instance(
        x_lo, x_hi, inst.weights, inst.intercept, inst.kinds, inst.a, inst.b, inst.eps, inst.high
    )
    points = np.concatenate(
        [
            inner.grid({1: 4001, 2: 101, 3: 25, 4: 13}[inst.dim]),
            rng.uniform(x_lo, x_hi, size=(SAMPLES, inst.dim)),
        ]
    )
    z = inst.values(points)
    inside = np.all((z >= zl) & (z <= zu), axis=1)
    if not inside.any():
        return -np.inf
    return float((sign * inst.logp(points[inside])).max())


def rebuild_lp(
    terms: TermSet,
    x_lo: np.ndarray,
    x_hi: np.ndarray,
    zl: np.ndarray,
    zu: np.ndarray,
    extra: list[list[float]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``max cost·v  s.t.  A v <= b,  lo <= v <= hi`` over ``v = (x, s)``."""
    n, d = terms.size, x_lo.size
    rows, rhs = [], []
    for i, h in enumerate(terms.curves):
        lines = concave_overestimator(h, float(zl[i]), float(zu[i]), extra[i] if extra else ())
        for alpha, beta in zip(lines.slopes, lines.intercepts, strict=True):
            row = np.zeros(d + n)  # s_i - α θ_i·x <= α c_i + β
            row[:d] = -alpha * terms.theta[i]
            row[d + i] = 1.0
            rows.append(row)
            rhs.append(alpha * terms.c[i] + beta)
        for sign, bound in ((1.0, zu[i] - terms.c[i]), (-1.0, terms.c[i] - zl[i])):
            row = np.zeros(d + n)
            row[:d] = sign * terms.theta[i]
            rows.append(row)
            rhs.append(bound)
    ends = np.array([h.value(np.array([zl[i], zu[i]])) for i, h in enumerate(terms.curves)])
    lo = np.concatenate([x_lo, ends.min(axis=1) - 1e-9])
    hi = np.concatenate([x_hi, ends.max(axis=1)])
    cost = np.concatenate([np.zeros(d), np.ones(n)])
    return np.array(rows), np.array(rhs), cost, lo, hi


def solve(
    A: np.ndarray, b: np.ndarray, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[int, float]:
    res = linprog(
        -cost,
        A_ub=A,
        b_ub=b,
        bounds=np.column_stack([lo, hi]),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    return res.status, (-float(res.fun) if res.status == 0 else np.nan)


@pytest.mark.parametrize("seed", range(12))
def test_relaxation_bounds_the_node_and_matches_linprog(seed: int) -> None:
    rng = np.random.default_rng(300 + seed)
    checked = 0
    for trial in range(5):
        inst = random_instance(rng, dim=int(rng.integers(1, 5)), size=int(rng.integers(1, 7)))
        sign = 1.0 if trial % 2 == 0 else -1.0
        terms = inst.term_set() if sign > 0 else inst.term_set().negated()
        x_lo, x_hi, zl, zu = random_node(inst, terms, rng, feasible=trial != 4)
        rel = relax(terms, x_lo, x_hi, zl, zu)
        best = dense_max(inst, sign, x_lo, x_hi, zl, zu, rng)
        A, b, cost, lo, hi = rebuild_lp(terms, x_lo, x_hi, zl, zu)
        status, optimum = solve(A, b, cost, lo, hi)
        if best > -np.inf:
            assert rel.bound >= best - 1e-9, (rel.bound, best)
            assert status == 0
        if status == 2:  # an empty, well-scaled node is proven empty by its Farkas certificate
            assert rel.bound == -np.inf
            assert certified_empty(terms, x_lo, x_hi, zl, zu)
            continue
        # a node the LP finds non-empty is never reported empty
        assert rel.bound > -np.inf
        assert status == 0
        checked += 1
        scale = 1.0 + abs(optimum)
        assert rel.bound >= optimum - 1e-9 * scale, (rel.bound, optimum)
        assert rel.bound <= optimum + 1e-6 * scale, (rel.bound, optimum)
        if rel.x is not None:
            assert np.all(rel.x >= x_lo)
            assert np.all(rel.x <= x_hi)
            np.testing.assert_allclose(rel.z, terms.values(rel.x))
            assert np.all(rel.gaps >= 0.0)
        # Kelley cuts: tangents at the LP's own z only tighten, and stay above the node's max
        if rel.z is not None:
            extra = [[float(v)] for v in rel.z]
            cut = relax(terms, x_lo, x_hi, zl, zu, extra)
            assert cut.bound >= best - 1e-9
            assert cut.bound <= rel.bound + 1e-6 * scale
            status_cut, optimum_cut = solve(*rebuild_lp(terms, x_lo, x_hi, zl, zu, extra))
            assert status_cut == 0
            assert cut.bound >= optimum_cut - 1e-9 * scale
            # the same cuts added to the node's LP kept in HiGHS (warm start), and with HiGHS
            # holding another model by then (the whole LP solved again): the same LP
            points = {i: float(v) for i, v in enumerate(rel.z)}
            rel_again = relax(terms, x_lo, x_hi, zl, zu)
            for kept in (True, False):
                start = rel_again if kept else rel
                tight = tighten(terms, start, points)
                assert tight is not None
                assert tight.bound >= best - 1e-9
                assert tight.bound >= optimum_cut - 1e-9 * scale, (tight.bound, optimum_cut)
                assert tight.bound <= optimum_cut + 1e-6 * scale, (tight.bound, optimum_cut)
                solved = tight is not start  # (start itself: no point added a row)
                if solved and tight.lp is not None and start.lp is not None:
                    # rows added to the kept model, or a new model for the whole LP
                    assert (tight.lp.model == start.lp.model) == kept
    assert checked >= 3


@pytest.mark.parametrize("seed", range(4))
def test_weak_duality_certificate_with_any_multipliers(seed: int) -> None:
    """``y^T b + Σ max(r lo, r hi) >= max cost·v`` for every ``y >= 0`` (not only optimal duals)."""
    rng = np.random.default_rng(400 + seed)
    for _ in range(5):
        inst = random_instance(rng, dim=int(rng.integers(1, 5)), size=int(rng.integers(1, 7)))
        terms = inst.term_set()
        zl, zu = terms.value_ranges(inst.box())
        A, b, cost, lo, hi = rebuild_lp(terms, inst.lo, inst.hi, zl, zu)
        status, optimum = solve(A, b, cost, lo, hi)
        assert status == 0
        res = linprog(-cost, A_ub=A, b_ub=b, bounds=np.column_stack([lo, hi]), method="highs")
        dual = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
        assert _certify(A, b, cost, lo, hi, dual) >= optimum - 1e-12 * (1 + abs(optimum))
        assert _certify(A, b, cost, lo, hi, dual) <= optimum + 1e-7 * (1 + abs(optimum))
        for scale in (0.0, 1e-3, 1.0, 100.0):
            y = rng.exponential(size=b.size) * scale * (rng.uniform(size=b.size) < 0.5)
            assert _certify(A, b, cost, lo, hi, y) >= optimum - 1e-12 * (1 + abs(optimum))
            perturbed = np.maximum(dual + rng.normal(scale=1e-3, size=b.size), 0.0)
            assert _certify(A, b, cost, lo, hi, perturbed) >= optimum - 1e-12 * (1 + abs(optimum))

r"""Certified ``max G(s)`` over an interval for ``G(s) = const + Σ_i h_i(λ_i s + c_i)``.

The one-dimensional problems that :func:`~app.engine.continuous.problem.rank_one` makes of
histories whose weights are parallel. There the LP relaxation of the general search carries one
variable and several rows per term (a 1,000-query history: an LP of 4,000 rows per node) and
bounds each term on its own query-value interval; here every node is an interval of ``s`` and
all terms are bounded on it at once, by the mean-value form, vectorised over nodes and terms.

Bound of a node ``[a, b]`` with midpoint ``m``. ``G`` is continuous and piecewise smooth, so
``G(s) = G(m) + ∫_m^s G'``; with ``G' ∈ [g_lo, g_hi]`` on the node,

.. math::

    \max_{[a, b]} G \le G(m) + \tfrac{b - a}{2}\,\max(g_{hi}, -g_{lo}, 0).

``G'(s) = Σ_i λ_i h_i'(z_i)`` and each ``h_i'`` is unimodal on a query-value interval
``[l_i, u_i]`` — its extreme is at the inflection point ``z_i^*`` (module docstring of
:mod:`~app.engine.continuous.univariate`; at a kink of truncated ``linear`` the one-sided
derivative from inside ``[a, b]`` is the extreme) — so its range is the hull of ``h_i'(l_i)``,
``h_i'(u_i)`` and, when ``z_i^* ∈ [l_i, u_i]``, ``h_i'(z_i^*)``. Near an interior maximum
``g_hi`` and ``-g_lo`` shrink with the node, so the gap shrinks quadratically with its width.

Rounding: ``G(m)`` comes from :meth:`~app.engine.continuous.problem.TermSet.evaluate_many`
(certified), each derivative is padded by ``64u|h'|`` and the sums by ``(n + 8)u Σ|·|``; the
query-value intervals are padded like :meth:`~app.engine.continuous.problem.TermSet.value_ranges`.
Best-first: the nodes with the largest bounds are split in batches.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

import numpy as np

from app.engine.continuous.problem import Box, TermSet
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray

#: Nodes bounded together in one vectorised pass.
BATCH = 32


@dataclass(frozen=True)
class LineResult:
    """Certified ``lower <= max G <= upper``, the best ``s`` found, how the search ended."""

    lower: float
    upper: float
    s: float
    hit_limit: bool
    nodes: int
    seconds: float


def _bounds(
    terms: TermSet, a: FloatArray, b: FloatArray, z_pad: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Per node: ``G(m) - err`` and an upper bound of ``G`` on ``[a, b]``.

    Both hold for every query value within ``z_pad`` of ``λ s + c`` (the first is achieved at
    ``m`` when the pad is 0).
    """
    lam = terms.theta[:, 0]
    mid = 0.5 * (a + b)
    values, errs = terms.evaluate_many(mid[:, None], z_pad)
    za, zb = np.outer(a, lam) + terms.c, np.outer(b, lam) + terms.c
    pad = 3.0 * UNIT_ROUNDOFF * (np.abs(lam) * np.maximum(np.abs(a), np.abs(b))[:, None])
    pad = pad + 3.0 * UNIT_ROUNDOFF * np.abs(terms.c) + z_pad
    lo, hi = np.minimum(za, zb) - pad, np.maximum(za, zb) + pad
    star = np.array([h.inflection for h in terms.curves])
    inside = (star >= lo) & (star <= hi)
    at_star = np.where(inside, star, lo)
    d = terms.batch.derivs(np.stack([lo, hi, at_star]))
    d_pad = 64.0 * UNIT_ROUNDOFF * np.abs(d) + 1e-300
    d_lo = np.min(d - d_pad, axis=0)
    d_hi = np.max(d + d_pad, axis=0)
    g_lo_terms = np.minimum(lam * d_lo, lam * d_hi)
    g_hi_terms = np.maximum(lam * d_lo, lam * d_hi)
    n = terms.size
    slack = (n + 8) * UNIT_ROUNDOFF * np.abs(lam * np.maximum(np.abs(d_lo), np.abs(d_hi))).sum(1)
    g_hi = g_hi_terms.sum(axis=1) + slack
    g_lo = g_lo_terms.sum(axis=1) - slack
    reach = np.maximum(mid - a, b - mid) * (1.0 + 4.0 * UNIT_ROUNDOFF)
    rise = np.maximum(np.maximum(g_hi, -g_lo), 0.0) * reach * (1.0 + 4.0 * UNIT_ROUNDOFF)
    top = values + errs
    upper = top + rise + 4.0 * UNIT_ROUNDOFF * (np.abs(top) + rise)
    return values - errs, np.asarray(upper, dtype=np.float64)


def maximize_line(
    terms: TermSet,
    interval: Box,
    tolerance: float,
    deadline: float,
    max_nodes: int,
    z_pad: FloatArray | None = None,
) -> LineResult:
    """Certified bounds on ``max G`` over ``interval`` (a one-dimensional box); see module doc.

    Stops when the gap is within ``tolerance``, at ``deadline`` (``time.perf_counter()``) or
    after ``max_nodes`` nodes; the upper bound is sound either way. With ``z_pad`` (per term)
    the upper bound holds for every query value within the pad of ``λ_i s + c_i``; the lower
    bound then only guides the search (the caller evaluates the lifted point).
    """
    pad = np.zeros(terms.size) if z_pad is None else z_pad
    start = time.perf_counter()
    a0, b0 = float(interval.lo[0]), float(interval.hi[0])
    best, best_s = -math.inf, 0.5 * (a0 + b0)
    heap: list[tuple[float, float, float]] = []
    pending_a, pending_b = np.array([a0]), np.array([b0])
    nodes, hit_limit, retired = 0, False, -math.inf
    while True:
        achieved, upper = _bounds(terms, pending_a, pending_b, pad)
        nodes += pending_a.size
        k = int(np.argmax(achieved))
        if achieved[k] > best:
            best, best_s = float(achieved[k]), float(0.5 * (pending_a[k] + pending_b[k]))
        for ub, a, b in zip(upper, pending_a, pending_b, strict=True):
            if ub - best > tolerance:
                heapq.heappush(heap, (-float(ub), float(a), float(b)))
            else:
                retired = max(retired, float(ub))
        if not heap or -heap[0][0] - best <= tolerance:
            break
        if time.perf_counter() >= deadline or nodes >= max_nodes:
            hit_limit = True
            break
        split_a: list[float] = []
        split_b: list[float] = []
        while heap and len(split_a) < 2 * BATCH:
            _, a, b = heapq.heappop(heap)
            m = 0.5 * (a + b)
            if not a < m < b:  # an interval of adjacent floats: its bound stands
                edge = _bounds(terms, np.array([a]), np.array([b]), pad)[1][0]
                retired = max(retired, float(edge))
                continue
            split_a += [a, m]
            split_b += [m, b]
        if not split_a:
            break
        pending_a, pending_b = np.array(split_a), np.array(split_b)
    top = -heap[0][0] if heap else -math.inf
    upper_all = max(top, retired, best)
    return LineResult(best, upper_all, best_s, hit_limit, nodes, time.perf_counter() - start)

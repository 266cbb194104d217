r"""The *bound* role: a certified upper bound of ``max F`` over a node by linear programming.

Relaxation over a node (query-value box :math:`l \le z \le u`, coordinate box
:math:`x^{lo} \le x \le x^{hi}`)::

    maximise  Σ_i s_i
    subject to s_i <= α_ij (θ_i·x + c_i) + β_ij   for every line j of term i's concave
                                                  overestimator on [l_i, u_i]
               l_i <= θ_i·x + c_i <= u_i
               x^lo <= x <= x^hi,  s_i^lo <= s_i <= s_i^hi

with :math:`s_i^{hi} = \max(h_i(l_i), h_i(u_i))` (each term is monotone) and
:math:`s_i^{lo}` the smaller end value, both padded. Every point ``x`` of the node with
:math:`s_i = h_i(z_i)` is feasible, so the LP optimum bounds ``max F`` from above.

Certification (independent of the solver's tolerances). Write the LP as
:math:`\max c^\top v` s.t. :math:`Av \le b`, :math:`v^{lo} \le v \le v^{hi}`. For *any*
:math:`y \ge 0`, with :math:`r = c - A^\top y`,

.. math::

    c^\top v = y^\top A v + r^\top v \le y^\top b + \sum_k \max(r_k v^{lo}_k, r_k v^{hi}_k),

weak duality with explicit bounds (Neumaier & Shcherbina, 2004). We take ``y`` from HiGHS's
duals, clip it to be non-negative, and evaluate the right-hand side in float64 plus a bound on
its rounding error (:math:`γ_m \sum |\cdot|` terms). If HiGHS fails, ``y = 0`` gives the interval
bound :math:`\sum_i s_i^{hi}`, which is always valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from app.engine.continuous.envelopes import Lines, concave_overestimator
from app.engine.continuous.problem import TermSet
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray


@dataclass(frozen=True)
class Relaxation:
    """Outcome of one relaxation solve.

    Attributes
    ----------
    bound:
        Certified upper bound of ``max F`` over the node (``-inf`` if the node is empty).
    x:
        The LP's optimal coordinates (``None`` if the LP failed or the node is empty).
    z:
        ``θ·x + c`` at ``x``.
    gaps:
        Per term, how much the relaxation overestimates the term at ``x`` (branching scores).
    solved:
        Whether HiGHS reported an optimal solution.
    """

    bound: float
    x: FloatArray | None
    z: FloatArray | None
    gaps: FloatArray
    solved: bool


def _certify(
    A: FloatArray, b: FloatArray, cost: FloatArray, lo: FloatArray, hi: FloatArray, y: FloatArray
) -> float:
    """``y^T b + Σ max(r lo, r hi)`` with ``r = cost - A^T y``, plus its rounding error."""
    r = cost - A.T @ y
    main = float(y @ b) + float(np.sum(np.maximum(r * lo, r * hi)))
    m, k = A.shape
    gamma = 2.0 * (m + k + 4) * UNIT_ROUNDOFF
    scale = np.maximum(np.abs(lo), np.abs(hi))
    err = gamma * (
        float(np.abs(y) @ np.abs(b)) + float((np.abs(A).T @ np.abs(y) + np.abs(cost)) @ scale)
    )
    return float(main + 2.0 * err)


def relax(
    terms: TermSet,
    x_lo: FloatArray,
    x_hi: FloatArray,
    l: FloatArray,
    u: FloatArray,
    extra: Sequence[Sequence[float]] | None = None,
    tangents: int = 3,
) -> Relaxation:
    """Solve the relaxation of ``max F`` over one node and certify its bound."""
    n, d = terms.size, x_lo.size
    lines: list[Lines] = [
        concave_overestimator(h, float(l[i]), float(u[i]), extra[i] if extra else (), tangents)
        for i, h in enumerate(terms.curves)
    ]
    ends = terms.batch.values(np.stack([l, u]))
    pad = 256 * UNIT_ROUNDOFF * (1.0 + np.abs(ends).max(axis=0))
    s_hi = ends.max(axis=0) + pad
    s_lo = ends.min(axis=0) - pad
    counts = np.array([ln.slopes.size for ln in lines])
    rows = int(counts.sum())
    owner = np.repeat(np.arange(n), counts)
    alpha = np.concatenate([ln.slopes for ln in lines])
    beta = np.concatenate([ln.intercepts for ln in lines])
    A = np.zeros((rows + 2 * n, d + n))
    A[:rows, :d] = -alpha[:, None] * terms.theta[owner]
    A[np.arange(rows), d + owner] = 1.0
    b = np.empty(rows + 2 * n)
    b[:rows] = alpha * terms.c[owner] + beta
    A[rows : rows + n, :d] = terms.theta
    b[rows : rows + n] = u - terms.c
    A[rows + n :, :d] = -terms.theta
    b[rows + n :] = terms.c - l
    # a line with a non-finite coefficient (slopes overflow at very large ε) is dropped: fewer
    # over-estimating lines only loosen the relaxation, which stays an upper bound
    keep = np.isfinite(b) & np.all(np.isfinite(A), axis=1)
    A, b = A[keep], b[keep]
    cost = np.concatenate([np.zeros(d), np.ones(n)])
    v_lo = np.concatenate([x_lo, s_lo])
    v_hi = np.concatenate([x_hi, s_hi])
    interval_bound = float(np.sum(s_hi)) + 2 * (n + 2) * UNIT_ROUNDOFF * float(np.sum(np.abs(s_hi)))
    if not np.isfinite(interval_bound):
        return Relaxation(np.inf, None, None, np.zeros(n), False)
    const = terms.constant
    res = linprog(-cost, A_ub=A, b_ub=b, bounds=np.column_stack([v_lo, v_hi]), method="highs")
    if res.status == 2:  # infeasible: the node holds no point (see the note on large ε below)
        return Relaxation(-np.inf, None, None, np.zeros(n), True)
    if res.status != 0 or res.x is None:
        y = np.zeros(A.shape[0])
        bound = min(interval_bound, _certify(A, b, cost, v_lo, v_hi, y))
        return Relaxation(bound + const, None, None, np.zeros(n), False)
    y = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
    bound = min(interval_bound, _certify(A, b, cost, v_lo, v_hi, y))
    x = np.clip(np.asarray(res.x[:d], dtype=np.float64), x_lo, x_hi)
    z = terms.values(x)
    s = np.asarray(res.x[d:], dtype=np.float64)
    gaps = np.maximum(s - terms.term_values(z), 0.0)
    return Relaxation(bound + const, x, z, gaps, True)

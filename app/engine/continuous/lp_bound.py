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
duals (:mod:`.highs`), clip it to be non-negative, and evaluate the right-hand side in float64
plus a bound on its rounding error (:math:`γ_m \sum |\cdot|` terms). If HiGHS fails, ``y = 0``
gives the interval bound :math:`\sum_i s_i^{hi}`, which is always valid.

Empty nodes. HiGHS's "infeasible" verdict is not taken on trust: with very steep envelope lines
(slopes near :math:`e^{40}` at large ε) it has called non-empty nodes infeasible, and dropping
such a node loses its maximum. A node is dropped only with a certificate that the system
:math:`l \le θx + c \le u`, :math:`x^{lo} \le x \le x^{hi}` (the rows that decide emptiness:
the :math:`s_i` can always sit at :math:`s_i^{lo}`) has no solution. Farkas: for
:math:`y^+, y^- \ge 0` every feasible ``x`` satisfies

.. math::

    (y^+ - y^-)^\top(θx + c) - {y^+}^\top u + {y^-}^\top l \le 0,

so if the minimum of the left-hand side over the coordinate box is positive, the node is empty.
``y`` comes from the duals of a phase-1 LP (minimise the total violation of those rows) that
involves only ``θ`` and the box, so it is well scaled whatever ε; the minimum over the box is
evaluated in float64 and must exceed a bound on its rounding error. Without a certificate the node
keeps the interval bound.

Quadratic query values (``TermSet.lifting``). ``θ·x`` is then ``θ·v`` over the lifted vector
``v = [x, m(x)]``; the LP gets one variable per monomial, bounded by the monomial's range over the
node's coordinate box, and the envelope rows of :mod:`~app.engine.continuous.lifting` (tangents
and secant of each square, McCormick planes of each product), all satisfied by ``(x, m(x))`` for
every ``x`` of the box, so the optimum still bounds ``max F`` over the node. The emptiness
certificate adds the envelope rows ``E v <= e`` to the system (a multiplier ``y_e >= 0`` each:
``y_e^T(E v - e) <= 0`` at every point of the node) and minimises over the lifted box.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from app.engine.continuous import highs
from app.engine.continuous.envelopes import (
    Lines,
    added_tangents,
    cached_concave_overestimator,
)
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
    lift_gaps:
        Quadratic query values only: per monomial, ``|v_k - m_k(x)|`` at the LP optimum times
        ``Σ_i |θ_ik| g_i``, ``g_i`` the larger of ``|h_i'|`` at the LP's ``z_i`` and the slope of
        the secant of ``h_i`` between the LP's ``z_i`` and the true one at ``x``: the error the
        envelopes of :mod:`.lifting` let the LP exploit (``z`` is then the LP's own
        ``θ·v + c``). Empty otherwise.
    """

    bound: float
    x: FloatArray | None
    z: FloatArray | None
    gaps: FloatArray
    solved: bool
    lift_gaps: FloatArray = field(default_factory=lambda: np.zeros(0))
    #: The LP behind the bound, for :func:`tighten` (``None``: the bound needed no LP).
    lp: NodeLp | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class NodeLp:
    """One node's LP as solved: ``max cost·v`` s.t. ``A v <= b``, ``v_lo <= v <= v_hi``.

    ``A`` holds only the rows given to HiGHS (see :data:`MAX_COEFFICIENT`); ``scale`` the
    column scales (:func:`column_scales`); ``model`` the HiGHS model left by the solve
    (:func:`~app.engine.continuous.highs.add_rows`).
    """

    A: FloatArray
    b: FloatArray
    cost: FloatArray
    v_lo: FloatArray
    v_hi: FloatArray
    scale: FloatArray
    interval_bound: float
    model: int
    x_lo: FloatArray
    x_hi: FloatArray
    l: FloatArray
    u: FloatArray


#: Relative width below which a query value's interval is not split (about 4096 ulps), and
#: within which the LP's gaps are measured (:func:`relax`): rounding, not the envelopes, decides
#: what happens at that scale.
RESOLUTION = 2.0**-40

#: Rows whose largest coefficient (after column scaling) exceeds this are left out of the LP:
#: HiGHS calls a model with entries beyond 1e15 an error, and the relaxation then fell back to
#: the interval bound (tangents of ``log t`` near ``t = 0`` at ε >= 50 have slopes past 1e20).
#: Fewer over-estimating lines only loosen the relaxation; the caps of the ``s_i`` and the other
#: lines still bound every term.
MAX_COEFFICIENT = 1e15


def column_scales(theta: FloatArray) -> FloatArray:
    """A power of two near ``1 / max_i |θ_ik|`` per column whose weights are all tiny or huge.

    HiGHS sees ``x_k = D_k w_k``: on a box 1e100 wide with weights near 1e-100 the products
    ``θ_k D_k`` are of order 1, where HiGHS would drop the raw ``θ_k`` as below its small
    matrix value (1e-9). Multiplying by a power of two is exact, and the duals of the rows do not
    change, so the certificate is computed on the unscaled LP. Columns with weights within
    ``[1e-6, 1e6]`` are left alone (scaling them made HiGHS's points coarser, and the search
    slower, on weights spanning 1e13).
    """
    top = np.max(np.abs(theta), axis=0, initial=0.0) if theta.size else np.zeros(theta.shape[1])
    odd = (top > 0.0) & np.isfinite(top) & ((top < 1e-6) | (top > 1e6))
    exponents = np.where(odd, -np.round(np.log2(np.where(odd, top, 1.0))), 0.0)
    return np.asarray(np.ldexp(1.0, np.clip(exponents, -1000, 1000).astype(np.int64)))


def _scaled_linprog(
    cost: FloatArray,
    A: FloatArray,
    b: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    time_limit: float | None = None,
    scaled: FloatArray | None = None,
) -> tuple[highs.LpResult, FloatArray | None]:
    """HiGHS on the LP with columns scaled by ``scaled`` (see :func:`column_scales`).

    Returns the solver's result and its ``x`` unscaled.
    """
    scale = np.ones(lo.size) if scaled is None else scaled
    res = highs.solve(cost * scale, A * scale, b, lo / scale, hi / scale, time_limit)
    x = None if res.x is None else res.x * scale
    return res, x


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


def certified_empty(
    terms: TermSet, x_lo: FloatArray, x_hi: FloatArray, l: FloatArray, u: FloatArray
) -> bool:
    """Whether ``{x in [x_lo, x_hi] : l <= θx + c <= u}`` is provably empty (module docstring).

    ``False`` means "not proven empty", never "non-empty".
    """
    theta, c = terms.theta, terms.c
    env_a, env_b = (
        terms.lifting.envelope_rows(x_lo, x_hi)
        if terms.lifting is not None
        else (np.zeros((0, theta.shape[1])), np.zeros(0))
    )
    x_lo, x_hi = terms.lifted_bounds(x_lo, x_hi)
    n, d = terms.size, x_lo.size
    # phase 1: min Σ(p + q) s.t. θx - p <= u - c, -θx - q <= c - l, box, p, q >= 0
    # (lifted: also the envelope rows E v <= e, which every point of the node meets)
    k = env_b.size
    A = np.zeros((2 * n + k, d + 2 * n))
    A[:n, :d], A[n : 2 * n, :d] = theta, -theta
    A[np.arange(n), d + np.arange(n)] = -1.0
    A[n + np.arange(n), d + n + np.arange(n)] = -1.0
    A[2 * n :, :d] = env_a
    b = np.concatenate([u - c, c - l, env_b])
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(theta))):
        return False
    cost = np.concatenate([np.zeros(d), np.ones(2 * n)])
    bounds = np.column_stack(
        [np.concatenate([x_lo, np.zeros(2 * n)]), np.concatenate([x_hi, np.full(2 * n, np.inf)])]
    )
    scale = np.concatenate([column_scales(theta), np.ones(2 * n)])
    res, _ = _scaled_linprog(cost, A, b, bounds[:, 0], bounds[:, 1], None, scale)
    if res.status != highs.OPTIMAL or res.row_duals is None:
        return False
    y = np.maximum(-res.row_duals, 0.0)
    y_up, y_down, y_env = y[:n], y[n : 2 * n], y[2 * n :]
    w = y_up - y_down
    r = theta.T @ w + env_a.T @ y_env
    reach = np.minimum(r * x_lo, r * x_hi)
    gap = float(np.sum(reach)) + float(w @ c) - float(y_up @ u) + float(y_down @ l)
    gap -= float(y_env @ env_b)
    gamma = 2.0 * (2 * n + k + d + 4) * UNIT_ROUNDOFF
    scale = np.maximum(np.abs(x_lo), np.abs(x_hi))
    err = gamma * (
        float(np.abs(r) @ scale)
        + float((np.abs(theta).T @ np.abs(w) + np.abs(env_a).T @ y_env) @ scale)
        + float(np.abs(w) @ np.abs(c))
        + float(y_up @ np.abs(u))
        + float(y_down @ np.abs(l))
        + float(y_env @ np.abs(env_b))
    )
    return gap > 2.0 * err


def relax(
    terms: TermSet,
    x_lo: FloatArray,
    x_hi: FloatArray,
    l: FloatArray,
    u: FloatArray,
    extra: Sequence[Sequence[float]] | None = None,
    tangents: int = 3,
    time_limit: float | None = None,
    caps: tuple[FloatArray, FloatArray] | None = None,
) -> Relaxation:
    """Solve the relaxation of ``max F`` over one node and certify its bound.

    ``time_limit`` (seconds) stops HiGHS early; the bound is then the interval bound (or the
    weak-duality bound of whatever duals are available), still certified. ``caps`` (per term,
    certified ``min``/``max`` of ``h_i`` over a box holding the node's,
    :meth:`~app.engine.continuous.problem.TermSet.term_extremes`) narrow the bounds of each
    ``s_i``; a node where they leave no value is empty.
    """
    n = terms.size
    start = time.perf_counter()
    v_lo_x, v_hi_x = terms.lifted_bounds(x_lo, x_hi)
    dim = v_lo_x.size  # columns of θ: d, plus one per monomial when lifted
    ends = terms.batch.values(np.stack([l, u]))
    pad = 256 * UNIT_ROUNDOFF * (1.0 + np.abs(ends).max(axis=0))
    s_hi = ends.max(axis=0) + pad
    s_lo = ends.min(axis=0) - pad
    if caps is not None:
        s_lo, s_hi = np.maximum(s_lo, caps[0]), np.minimum(s_hi, caps[1])
        if np.any(s_lo > s_hi):  # some h_i has no value both in [l_i, u_i] and over the box
            return Relaxation(-np.inf, None, None, np.zeros(n), True)
    interval_bound = float(np.sum(s_hi)) + 2 * (n + 2) * UNIT_ROUNDOFF * float(np.sum(np.abs(s_hi)))
    if not np.isfinite(interval_bound):
        return Relaxation(np.inf, None, None, np.zeros(n), False)
    const = terms.constant
    lines: list[Lines] = []
    for i, h in enumerate(terms.curves):
        # building n envelopes is the root's largest cost on long histories: stop with the
        # (certified) interval bound once the time is up
        if time_limit is not None and i % 64 == 63 and time.perf_counter() - start > time_limit:
            return Relaxation(interval_bound + const, None, None, np.zeros(n), False)
        lines.append(
            cached_concave_overestimator(
                h, float(l[i]), float(u[i]), tuple(extra[i]) if extra else (), tangents
            )
        )
    counts = np.array([ln.slopes.size for ln in lines])
    rows = int(counts.sum())
    owner = np.repeat(np.arange(n), counts)
    alpha = np.concatenate([ln.slopes for ln in lines])
    beta = np.concatenate([ln.intercepts for ln in lines])
    A = np.zeros((rows + 2 * n, dim + n))
    A[:rows, :dim] = -alpha[:, None] * terms.theta[owner]
    A[np.arange(rows), dim + owner] = 1.0
    b = np.empty(rows + 2 * n)
    b[:rows] = alpha * terms.c[owner] + beta
    A[rows : rows + n, :dim] = terms.theta
    b[rows : rows + n] = u - terms.c
    A[rows + n :, :dim] = -terms.theta
    b[rows + n :] = terms.c - l
    if terms.lifting is not None:
        env_a, env_b = terms.lifting.envelope_rows(x_lo, x_hi)
        A = np.vstack([A, np.hstack([env_a, np.zeros((env_a.shape[0], n))])])
        b = np.concatenate([b, env_b])
    # a line with a non-finite coefficient (slopes overflow at very large ε) is dropped: fewer
    # over-estimating lines only loosen the relaxation, which stays an upper bound
    keep = np.isfinite(b) & np.all(np.isfinite(A), axis=1)
    A, b = A[keep], b[keep]
    cost = np.concatenate([np.zeros(dim), np.ones(n)])
    v_lo = np.concatenate([v_lo_x, s_lo])
    v_hi = np.concatenate([v_hi_x, s_hi])
    # rows HiGHS cannot take (see MAX_COEFFICIENT) are left out of the solve and the certificate
    scale = np.concatenate([column_scales(terms.theta), np.ones(n)])
    sane = np.max(np.abs(A) * scale, axis=1, initial=0.0) <= MAX_COEFFICIENT
    A, b = A[sane], b[sane]
    left = None if time_limit is None else time_limit - (time.perf_counter() - start)
    res, solution = _scaled_linprog(
        -cost, A, b, v_lo, v_hi, None if left is None else max(left, 1e-3), scale
    )
    node = NodeLp(A, b, cost, v_lo, v_hi, scale, interval_bound, res.model, x_lo, x_hi, l, u)
    return _outcome(terms, node, res, solution)


def tighten(
    terms: TermSet, rel: Relaxation, points: dict[int, float], time_limit: float | None = None
) -> Relaxation | None:
    """A Kelley round: ``rel``'s LP plus tangents of terms ``i`` at ``points[i]``, solved.

    The same bound as :func:`relax` with each point added to ``extra[i]`` (the tangents are
    :func:`~app.engine.continuous.envelopes.added_tangents`, the lines the overestimator adds
    for those points), but the node's LP is extended rather than built again: HiGHS gets the
    new rows only, when it still holds the node's model, and restarts from its optimum. The
    bound is certified over all the rows, as :func:`relax`'s. ``None`` when ``rel`` has no LP
    (the caller then keeps ``rel``); ``rel`` itself when no point adds a usable row.
    """
    node = rel.lp
    if node is None:
        return None
    n, dim = terms.size, node.v_lo.size - terms.size
    slopes: list[FloatArray] = []
    intercepts: list[FloatArray] = []
    owners: list[int] = []
    for i, p in points.items():
        lines = added_tangents(terms.curves[i], float(node.l[i]), float(node.u[i]), np.array([p]))
        if lines is not None:
            slopes.append(lines.slopes)
            intercepts.append(lines.intercepts)
            owners += [i] * lines.slopes.size
    if not owners:
        return rel
    owner = np.array(owners)
    alpha, beta = np.concatenate(slopes), np.concatenate(intercepts)
    A = np.zeros((owner.size, dim + n))
    A[:, :dim] = -alpha[:, None] * terms.theta[owner]
    A[np.arange(owner.size), dim + owner] = 1.0
    b = alpha * terms.c[owner] + beta
    # the filters of relax: finite rows HiGHS can take
    keep = np.isfinite(b) & np.all(np.isfinite(A), axis=1)
    keep &= np.max(np.abs(A) * node.scale, axis=1, initial=0.0) <= MAX_COEFFICIENT
    if not keep.any():
        return rel
    A, b = A[keep], b[keep]
    limit = None if time_limit is None else max(time_limit, 1e-3)
    res = highs.add_rows(node.model, A * node.scale, b, limit)
    A, b = np.vstack([node.A, A]), np.concatenate([node.b, b])
    if res is None:  # HiGHS holds another model: solve the whole LP
        res, solution = _scaled_linprog(-node.cost, A, b, node.v_lo, node.v_hi, limit, node.scale)
    else:
        solution = None if res.x is None else res.x * node.scale
    return _outcome(terms, replace(node, A=A, b=b, model=res.model), res, solution)


def _outcome(
    terms: TermSet, node: NodeLp, res: highs.LpResult, solution: FloatArray | None
) -> Relaxation:
    """The certified :class:`Relaxation` of a solved node LP."""
    n, d = terms.size, node.x_lo.size
    dim = node.v_lo.size - n
    A, b, cost, v_lo, v_hi = node.A, node.b, node.cost, node.v_lo, node.v_hi
    x_lo, x_hi, l, u = node.x_lo, node.x_hi, node.l, node.u
    interval_bound, const = node.interval_bound, terms.constant
    status = res.status
    if status == highs.INFEASIBLE and certified_empty(terms, x_lo, x_hi, l, u):
        return Relaxation(-np.inf, None, None, np.zeros(n), True)
    if status != highs.OPTIMAL or solution is None or res.row_duals is None:
        y = np.zeros(A.shape[0])
        bound = min(interval_bound, _certify(A, b, cost, v_lo, v_hi, y))
        return Relaxation(bound + const, None, None, np.zeros(n), False)
    y = np.maximum(-res.row_duals, 0.0)
    bound = min(interval_bound, _certify(A, b, cost, v_lo, v_hi, y))
    x = np.clip(solution[:d], x_lo, x_hi)
    s = solution[dim:]
    if terms.lifting is not None:
        v_lo_x, v_hi_x = v_lo[:dim], v_hi[:dim]
        v = np.clip(solution[:dim], v_lo_x, v_hi_x)
        z = np.clip(np.asarray(terms.theta @ v + terms.c, dtype=np.float64), l, u)
        gaps = np.maximum(s - terms.term_values(z), 0.0)
        # how much each term moves between the LP's z and the true z at x, per unit of z (the
        # secant: a flat part of a truncated term hides a kink from the derivative)
        z_true = terms.values(x)
        dz = np.abs(z - z_true)
        moved = np.abs(terms.term_values(z) - terms.term_values(z_true))
        slopes = np.where(dz > 0.0, moved / np.where(dz > 0.0, dz, 1.0), 0.0)
        slopes = np.maximum(slopes, np.abs(terms.batch.derivs(z)))
        violation = np.abs(v[d:] - terms.lifting.lift(x)[d:])
        lift_gaps = violation * (np.abs(terms.theta[:, d:]).T @ slopes)
        lifted = np.asarray(lift_gaps, dtype=np.float64)
        return Relaxation(bound + const, x, z, gaps, True, lifted, node)
    z = terms.values(x)
    # the gap is measured against h's values within a relative RESOLUTION of z: where a term's
    # slope is e^80 (a linear query's t near 0), rounding z alone shows tens of nats of "gap"
    # that no split of the query value can remove (issue 22 item 3)
    delta = RESOLUTION * np.maximum(np.abs(z), u - l)
    below, above, at = terms.term_values(
        np.stack([np.clip(z - delta, l, u), np.clip(z + delta, l, u), z])
    )
    gaps = np.maximum(s - np.maximum(np.maximum(below, above), at), 0.0)
    return Relaxation(bound + const, x, z, gaps, True, lp=node)

r"""Certified branch-and-bound for ``max F`` over a box (paper Algorithm 5, reorganised).

Roles, as in pybnb: the *problem* (:class:`~app.engine.continuous.problem.TermSet` and
:class:`~app.engine.continuous.problem.Box`), the *bound*
(:func:`~app.engine.continuous.lp_bound.relax`, a certified LP relaxation), the *branch* rule
(:func:`choose_branch`), the *queue* (a best-first heap, :class:`NodeQueue`) and the *result*
(:class:`MaxResult` with a :class:`Status`).

Search. Nodes are boxes in the space of query values ``z_i = θ_i·x + c_i`` (the paper's insight:
``F`` is far more sensitive to ``z`` than to ``x``), together with the coordinate box (split only
to enforce integrality). Each node is bounded by the LP; up to ``cut_rounds`` times tangents are
added at the LP's own ``z`` (Kelley cuts) while that tightens the bound. The term whose
relaxation overestimates it most at the LP optimum is split at that point, which removes exactly
the error the LP exploited — tighter in practice than the paper's longest-edge rule.

Incumbents (lower bounds of ``max F``) are values of ``F`` at feasible points: the LP optimum
rounded to the integer coordinates, polished by L-BFGS-B from the root. The upper bound reported
is the largest certified bound among open nodes. The search ends when
``upper - lower <= tolerance`` (:attr:`Status.OPTIMAL`) or a node or time limit is hit
(:attr:`Status.NODE_LIMIT`, :attr:`Status.TIME_LIMIT`) — the bounds are sound either way.

The time limit holds for the whole search, root included: HiGHS gets the time left, Kelley rounds
and L-BFGS-B stop when it runs out, and children that cannot be bounded in time keep their
parent's bound (a valid upper bound of any sub-box). A search overruns its limit by at most one
LP solve's bookkeeping and one objective evaluation.

Quadratic query values. With ``x^2``/``x*y`` weights, ``z_i`` is affine in the lifted vector
``[x, m(x)]`` (:mod:`~app.engine.continuous.lifting`) and the LP relaxes the monomials by their
envelopes, whose gap shrinks only with the coordinate box. The branch rule then also splits a
coordinate (``("c", k, v)``): when the monomial error the LP exploits
(:attr:`~app.engine.continuous.lp_bound.Relaxation.lift_gaps`) exceeds the worst term envelope
error divided by :data:`LIFT_PREFERENCE`, the wider coordinate of the worst monomial is
bisected. A child's query-value box is intersected with the range of each ``z_i`` over its smaller
coordinate box (both contain every value the child can take). The exact fast paths below assume
``z`` affine in ``x`` and are skipped.

Exact fast paths. When every term is convex on its range, ``F`` is convex in ``x`` and its maximum
is at a vertex of the box; with ``2**d`` small the vertices are enumerated. When every term is
concave (histories of plain ``linear`` queries), ``F`` is concave: a local maximum ``x*`` found by
L-BFGS-B is global, and the tangent plane at ``x*`` overestimates ``F`` everywhere, so

.. math::

    \max F \le F(x^*) + \sum_k \max\bigl(g_k(x^{lo}_k - x^*_k),\, g_k(x^{hi}_k - x^*_k)\bigr),
    \qquad g = \nabla F(x^*)

is a certified upper bound in closed form (the Frank–Wolfe gap), within the tolerance of the
maximum when ``x*`` satisfies the optimality conditions. If it does not close the gap (e.g.
integer coordinates), the general search takes over.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from app.engine.continuous.line import maximize_line
from app.engine.continuous.lp_bound import RESOLUTION, Relaxation, relax, tighten
from app.engine.continuous.problem import Box, TermSet, rank_one
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray

#: Relative distance (to the box's width) within which an incumbent's coordinate is also tried
#: on the nearest face (see ``_Search.offer``).
SNAP = 1e-6
#: Relative steps of the nudged incumbents (see ``_Search.offer``), tried when some term's ε is
#: at least ``NUDGE_EPSILON`` (below it a term's slope, at most ``e^ε/(b - a)``, keeps rounding
#: moot).
NUDGES = (1e-12, 1e-9, 1e-6)
NUDGE_EPSILON = 20.0


class Status(Enum):
    """How a search ended."""

    OPTIMAL = "ok"
    NODE_LIMIT = "node-limit"
    TIME_LIMIT = "time-limit"
    #: Rounding-error bounds of the evaluations leave a gap wider than the tolerance.
    PRECISION_LIMIT = "precision-limit"

    @property
    def hit_limit(self) -> bool:
        """True unless the gap was closed."""
        return self is not Status.OPTIMAL


@dataclass(frozen=True)
class BnBSettings:
    """Settings of the search.

    Attributes
    ----------
    tolerance:
        Absolute gap ``upper - lower`` at which the search stops.
    max_nodes:
        Nodes bounded before giving up with :attr:`Status.NODE_LIMIT`.
    time_limit:
        Seconds before giving up with :attr:`Status.TIME_LIMIT`.
    cut_rounds:
        Kelley rounds per node (tangents added at the LP optimum).
    tangents:
        Tangent lines per concave part of each term.
    max_vertices:
        Largest ``2**d`` enumerated by the exact vertex path.
    local_search:
        Polish the root incumbent with L-BFGS-B.
    grouping:
        Appendix B: bound the history in consecutive groups of this many queries and add the
        groups' bounds (``max Σ_g F_g <= Σ_g max F_g``). Cheaper for long histories but looser,
        so the filter accepts fewer queries; ``None`` (the default) bounds the whole history.
    stop_at:
        Wall-clock time (``time.time()``) at which every search stops with
        :attr:`Status.TIME_LIMIT`, whatever its own ``time_limit`` says. The bound worker sets
        it to its caller's deadline: a computation nobody waits for any more ends instead of
        holding a pool process for all of its searches' limits.
    """

    tolerance: float = 1e-4
    max_nodes: int = 20_000
    time_limit: float = 10.0
    cut_rounds: int = 4
    tangents: int = 3
    max_vertices: int = 4096
    local_search: bool = True
    grouping: int | None = None
    stop_at: float | None = None


@dataclass(frozen=True)
class MaxResult:
    """Certified ``lower <= max F <= upper`` and the best point found."""

    lower: float
    upper: float
    x: FloatArray
    status: Status
    nodes: int
    seconds: float


@dataclass(order=True)
class _Node:
    priority: float
    order: int
    x_lo: FloatArray = field(compare=False)
    x_hi: FloatArray = field(compare=False)
    l: FloatArray = field(compare=False)
    u: FloatArray = field(compare=False)
    relaxation: Relaxation = field(compare=False)


class NodeQueue:
    """Best-first queue: the open node with the largest bound comes out first."""

    def __init__(self) -> None:
        self._heap: list[_Node] = []
        self._counter = itertools.count()

    def push(
        self,
        x_lo: FloatArray,
        x_hi: FloatArray,
        l: FloatArray,
        u: FloatArray,
        relaxation: Relaxation,
    ) -> None:
        """Add a bounded node."""
        heapq.heappush(
            self._heap, _Node(-relaxation.bound, next(self._counter), x_lo, x_hi, l, u, relaxation)
        )

    def pop(self) -> _Node:
        """Remove and return the node with the largest bound."""
        return heapq.heappop(self._heap)

    def best_bound(self) -> float:
        """Largest bound among open nodes (``-inf`` if empty)."""
        return -self._heap[0].priority if self._heap else -math.inf

    def __len__(self) -> int:
        return len(self._heap)


def choose_branch(node: _Node, terms: TermSet, integer: np.ndarray) -> tuple[str, int, float]:
    """The *branch* role: what to split and where.

    Returns ``("x", k, v)`` to split integer coordinate ``k`` into ``<= floor(v)`` and
    ``>= ceil(v)``, ``("c", k, v)`` to split coordinate ``k`` at ``v`` (quadratic query values,
    see the module docstring, or when no query value's interval can be split any more),
    ``("z", i, v)`` to split query value ``i`` at ``v``, or ``("none", -1, 0)`` when nothing can
    be split (the node's bound then stands). A
    fractional integer coordinate is split first; otherwise the term the LP overestimates most,
    at the LP's value (kept away from the interval's ends so both children shrink).
    """
    rel = node.relaxation
    if rel.x is not None and integer.any():
        frac = np.abs(rel.x - np.round(rel.x)) * integer
        k = int(np.argmax(frac))
        if frac[k] > 1e-6:
            return "x", k, float(rel.x[k])
    if terms.lifting is not None:
        coordinate = _coordinate_split(node, terms, integer)
        if coordinate is not None:
            return coordinate
    widths = node.u - node.l
    mid = 0.5 * (node.l + node.u)
    # a query value whose interval is a few thousand ulps wide is not split: its children would
    # be the node itself or nearly so, while the LP's z a few ulps off shows a gap of tens of
    # nats where a term's slope is e^60 (issue 22 item 3: the search split such nodes until the
    # node limit instead of the term whose envelope was loose)
    splittable = (node.l < mid) & (mid < node.u) & (widths > RESOLUTION * np.abs(mid))
    gaps = np.where(splittable, rel.gaps, 0.0) if rel.gaps.size == widths.size else rel.gaps
    if rel.z is not None and gaps.size and float(gaps.max()) > 0.0:
        i = int(np.argmax(gaps))
        lo, hi = node.l[i] + 0.1 * widths[i], node.u[i] - 0.1 * widths[i]
        v = float(np.clip(rel.z[i], lo, hi))
        return "z", i, v if node.l[i] < v < node.u[i] else float(mid[i])
    if splittable.any():
        spread = np.where(splittable, widths / np.maximum(np.abs(node.l) + np.abs(node.u), 1.0), -1)
        i = int(np.argmax(spread))
        return "z", i, float(mid[i])
    # no query value can be split: the widest coordinate, if any can (else the node is final)
    x_mid = 0.5 * (node.x_lo + node.x_hi)
    inside = (node.x_lo < x_mid) & (x_mid < node.x_hi) & ~integer
    if inside.any():
        k = int(np.argmax(np.where(inside, node.x_hi - node.x_lo, -1.0)))
        return "c", k, float(x_mid[k])
    return "none", -1, 0.0


#: A coordinate split is preferred unless the monomials' error at the LP optimum is below this
#: fraction of the terms' envelope error. Splitting a coordinate narrows every query value that
#: reads it (:func:`_narrowed`): on 40 random 2-D histories of 3–7 quadratic queries (both
#: sides, tolerance 5e-5) the searches took 14,376 nodes with a preference of 1 and 11,381 with
#: 100 (``bench/quadratic_bench.py``, docs/benchmarks.md).
LIFT_PREFERENCE = 100.0


def _coordinate_split(
    node: _Node, terms: TermSet, integer: np.ndarray
) -> tuple[str, int, float] | None:
    """A coordinate split for quadratic query values, or ``None`` to split a query value.

    At the LP optimum, the monomial with the largest error, unless every monomial's error is
    below ``1/LIFT_PREFERENCE`` of the worst term's envelope error; without an LP point (HiGHS
    failed, or no error is measurable), the widest coordinate. The chosen coordinate (the
    monomial's wider one) is bisected, so that the coordinate box, and with it every envelope,
    keeps shrinking.
    """
    assert terms.lifting is not None  # noqa: S101 - called for lifted terms only
    rel = node.relaxation
    x_width = node.x_hi - node.x_lo
    axis = -1
    if rel.x is not None and rel.lift_gaps.size:
        k = int(np.argmax(rel.lift_gaps))
        envelope = float(rel.gaps.max()) if rel.gaps.size else 0.0
        if float(rel.lift_gaps[k]) * LIFT_PREFERENCE > envelope:
            i, j = terms.lifting.pairs[k]
            axis = i if x_width[i] >= x_width[j] else j
    if axis < 0 and (rel.x is None or not rel.gaps.size or float(rel.gaps.max()) <= 0.0):
        axis = int(np.argmax(x_width))
    if axis < 0 or x_width[axis] <= 0.0 or (integer[axis] and x_width[axis] < 1.0):
        return None
    where = float(0.5 * (node.x_lo[axis] + node.x_hi[axis]))
    if integer[axis]:  # integer split: <= floor(v) and >= floor(v) + 1
        return "x", axis, math.floor(where) + 0.5
    return "c", axis, where


def _narrowed(
    terms: TermSet, x_lo: FloatArray, x_hi: FloatArray, l: FloatArray, u: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """A child's query-value box intersected with the range of each ``z_i`` over its box."""
    r_lo, r_hi = terms.value_ranges(Box(x_lo, x_hi))
    return np.maximum(l, r_lo), np.minimum(u, r_hi)


def _same_rows(terms: TermSet) -> np.ndarray:
    """Label of each term's row ``(theta_i, c_i)``: equal labels, identical rows."""
    if terms.size == 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.column_stack([terms.theta, terms.c])
    _, labels = np.unique(rows, axis=0, return_inverse=True)
    return np.asarray(labels, dtype=np.int64).reshape(-1)


def split_value(
    l: FloatArray, u: FloatArray, same: np.ndarray, v: float
) -> tuple[FloatArray, FloatArray]:
    """The *branch* role's split of a query value at ``v``: left child's ``u``, right's ``l``.

    Every term marked in ``same`` has a row identical to the split term's, hence the same value
    ``y = theta @ x + c`` (computed by the same floating-point operations) at every x: the left
    child has ``y <= v`` for all of them, the right child ``y >= v``. Splitting them together is
    sound and is what lets a history of one repeated query converge: split one at a time, each
    split tightened one of n identical envelopes and the search stalled (measured: 32 repeated
    logistic queries on a 1-D box hit the 10 s limit in 4 of 6 random histories).
    """
    left_u, right_l = u.copy(), l.copy()
    left_u[same] = np.minimum(u[same], v)
    right_l[same] = np.maximum(l[same], v)
    return left_u, right_l


class _Search:
    def __init__(self, terms: TermSet, box: Box, settings: BnBSettings) -> None:
        self.terms, self.box, self.settings = terms, box, settings
        self.integer = box.integer_mask()
        #: terms with the same row ``(theta_i, c_i)`` (a repeated query) have the same value
        #: ``y_i`` at every x: a split of one is a split of all of them (see :func:`split_value`)
        self.same_value = _same_rows(terms)
        self.best = -math.inf
        self.best_x = 0.5 * (box.lo + box.hi)
        self.nodes = 0
        #: Largest bound of any node discarded without being explored (it still counts).
        self.pruned = -math.inf
        self.deadline = time.perf_counter() + settings.time_limit
        if settings.stop_at is not None:
            self.deadline = min(self.deadline, time.perf_counter() + settings.stop_at - time.time())
        #: nudged incumbents only where some term is steep (their cost grows with d and n)
        self._steep = bool(terms.size) and float(terms.batch.epsilon.max()) >= NUDGE_EPSILON
        #: directions of :meth:`offer`'s nudges: ± every axis and every sign pattern (at most 8)
        d = box.dim
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=min(d, 3))))
        diagonal = np.zeros((signs.shape[0], d))
        diagonal[:, : signs.shape[1]] = signs
        self._directions = np.concatenate([np.eye(d), -np.eye(d), diagonal]) if d else diagonal
        #: certified extremes of every term over the box (see ``TermSet.term_extremes``)
        self.caps = terms.term_extremes(box)
        # one evaluated point before anything can run out of time: a search stopped by its
        # limit before its first relaxation still has a finite lower bound (it had -inf)
        if terms.size:
            self.offer(self.best_x)

    def remaining(self) -> float:
        """Seconds left before the time limit (negative once it has passed)."""
        return self.deadline - time.perf_counter()

    def offer(self, x: FloatArray, *, nudge: bool = False) -> None:
        """Consider a point as incumbent (rounded to integers and clipped to the box).

        Coordinates within :data:`SNAP` of the box's width from a face are also tried on the
        face: local searches stop a hair inside the box (L-BFGS-B: 7e-9), where at large ε
        ``F`` can be tens of nats below its value on the face, and on a face with
        representable coordinates ``z`` is often exact, so its error bound is zero.

        ``nudge`` also tries the point moved by :data:`NUDGES` of the box's width along
        :attr:`_directions`: an LP optimum sits on the kinks of steep terms, where ``F`` at the
        rounded point is tens of nats below its value a hair inside the flat side (issue 22
        item 3: two truncated terms at ε ≈ 80 whose flat sides meet in a wedge).
        """
        point = np.where(self.integer, np.round(x), x)
        point = np.clip(point, self.box.lo, self.box.hi)
        reach = SNAP * (self.box.hi - self.box.lo)
        snapped = np.where(point - self.box.lo <= reach, self.box.lo, point)
        snapped = np.where(self.box.hi - snapped <= reach, self.box.hi, snapped)
        candidates = np.stack([point, snapped]) if np.any(snapped != point) else point[None, :]
        if nudge:
            width = self.box.hi - self.box.lo
            moved = [point + step * width * self._directions for step in NUDGES]
            moved_points = np.clip(np.concatenate(moved), self.box.lo, self.box.hi)
            moved_points = np.where(self.integer, point, moved_points)
            candidates = np.concatenate([candidates, moved_points])
        values, errs = self.terms.evaluate_many(candidates)
        k = int(np.argmax(values - errs))
        if values[k] - errs[k] > self.best:
            self.best, self.best_x = float(values[k] - errs[k]), candidates[k]

    def bound(self, x_lo: FloatArray, x_hi: FloatArray, l: FloatArray, u: FloatArray) -> Relaxation:
        """Relaxation with Kelley rounds; feeds incumbents.

        Each round adds tangents at the LP's own ``z`` of the terms it overestimates most to the
        node's LP (:func:`~app.engine.continuous.lp_bound.tighten`), which keeps every earlier
        row; the best certified bound of the rounds is the node's.
        """
        tangents = self.settings.tangents
        rel = relax(self.terms, x_lo, x_hi, l, u, None, tangents, self.remaining(), self.caps)
        last = rel  # the LP the next round extends (it holds every round's rows)
        self.nodes += 1
        for _ in range(self.settings.cut_rounds):
            if rel.x is None or rel.z is None or self.remaining() <= 0.0:
                break
            self.offer(rel.x)
            if rel.bound - self.best <= self.settings.tolerance:
                break
            worst = rel.gaps > 1e-3 * self.settings.tolerance / max(1, self.terms.size)
            if not worst.any():
                break
            points = {int(i): float(rel.z[i]) for i in np.flatnonzero(worst)}
            tighter = tighten(self.terms, last, points, self.remaining())
            if tighter is None or tighter is last:
                break
            self.nodes += 1
            last = tighter
            improved = rel.bound - tighter.bound
            rel = tighter if tighter.bound <= rel.bound else rel
            if improved < 0.1 * self.settings.tolerance:
                break
        if rel.x is not None:
            self.offer(rel.x, nudge=self._steep)
        return rel

    def polish(self, *, centre: bool = True) -> None:
        """L-BFGS-B on the relaxed (continuous) problem from the incumbent and the box centre.

        ``centre=False`` starts from the incumbent only: the branch-and-bound's root, whose
        incumbent is already the root LP's optimum, where the second start cost as much as the
        first and, on the paper's appendix F table, improved no search (its 32 searches took the
        same 821 LPs with and without it).

        In the box's unit coordinates ``x = m + r w``, ``w in [-1, 1]^d``: on a box 1e100 wide
        the gradient in ``x`` (1e-100 per unit) is below any tolerance and the search stopped at
        its start.
        """
        terms = self.terms
        mid = 0.5 * (self.box.lo + self.box.hi)
        half = 0.5 * (self.box.hi - self.box.lo)
        if not np.all(np.isfinite(half)):  # a box wider than the largest float: the raw one
            mid, half = np.zeros(self.box.dim), np.ones(self.box.dim)
        half = np.where(half > 0.0, half, 1.0)

        def negative(w: FloatArray) -> tuple[float, FloatArray]:
            x = mid + half * w
            values, slopes = terms.batch.values_and_derivs(terms.values(x))
            value = float(values.sum())
            grad = terms.theta.T @ slopes
            if terms.lifting is not None:
                grad = terms.lifting.chain(x, grad)
            return -value, -grad * half

        def out_of_time(intermediate_result: object) -> None:
            if self.remaining() <= 0.0:
                raise StopIteration

        bounds = list(zip((self.box.lo - mid) / half, (self.box.hi - mid) / half, strict=True))
        for start in (self.best_x.copy(), mid.copy())[: 2 if centre else 1]:
            if self.remaining() <= 0.0:
                break
            # imported on first use, as highs._scipy imports linprog (process start-up time)
            from scipy.optimize import minimize

            try:
                res = minimize(
                    negative,
                    np.clip((start - mid) / half, -1.0, 1.0),
                    jac=True,
                    method="L-BFGS-B",
                    bounds=bounds,
                    callback=out_of_time,
                    options={"maxiter": 500, "ftol": 1e-15, "gtol": 1e-12},
                )
            except (ValueError, FloatingPointError):  # pragma: no cover - defensive
                continue
            if np.all(np.isfinite(res.x)):
                self.offer(np.asarray(mid + half * res.x, dtype=np.float64))

    def concave(self, l: FloatArray, u: FloatArray) -> MaxResult | None:
        """Certified maximum of a concave ``F`` by local search plus the tangent-plane bound."""
        if not self.terms.concave_on(l, u):
            return None
        start = time.perf_counter()
        self.polish()
        x = self.best_x
        if self.integer.any():
            return None
        value, err = self.terms.evaluate(x)
        grad, grad_err = self.terms.gradient(x)
        reach_lo, reach_hi = self.box.lo - x, self.box.hi - x
        rise = np.maximum(grad * reach_lo, grad * reach_hi)
        slack = grad_err * np.maximum(np.abs(reach_lo), np.abs(reach_hi))
        terms_err = (x.size + 4) * UNIT_ROUNDOFF * float(np.sum(np.abs(rise)))
        upper = value + err + float(np.sum(rise)) + float(np.sum(slack)) + terms_err
        if upper - self.best > self.settings.tolerance:
            return None
        return MaxResult(self.best, upper, x, Status.OPTIMAL, 1, time.perf_counter() - start)

    def vertices(self, l: FloatArray, u: FloatArray) -> MaxResult | None:
        """Exact maximum at a vertex when ``F`` is convex and the box is small."""
        if 2**self.box.dim > self.settings.max_vertices or not self.terms.convex_on(l, u):
            return None
        start = time.perf_counter()
        corners = self.box.vertices()
        values, errs = self.terms.evaluate_many(corners)
        k = int(np.argmax(values - errs))
        if values[k] - errs[k] > self.best:
            self.best, self.best_x = float(values[k] - errs[k]), corners[k]
        # every vertex's true value is at most its computed value plus its own error bound;
        # the maximum is at some vertex, so the largest of those is a certified upper bound
        upper = max(float(np.max(values + errs)), self.best)
        return MaxResult(
            self.best,
            upper,
            self.best_x,
            (
                Status.OPTIMAL
                if upper - self.best <= self.settings.tolerance
                else Status.PRECISION_LIMIT
            ),
            2**self.box.dim,
            time.perf_counter() - start,
        )


def maximize(terms: TermSet, box: Box, settings: BnBSettings | None = None) -> MaxResult:
    """Certified bounds on ``max_{x in box} F(x)``; see the module docstring.

    A history whose weights are all exact multiples of one direction ``v`` (and has no quadratic
    query value) is searched in one dimension, ``s = v·x``
    (:func:`~app.engine.continuous.problem.rank_one`), by
    :func:`~app.engine.continuous.line.maximize_line`; the best ``s`` is lifted back to a point
    of the box where ``F`` is evaluated for the lower bound.
    """
    settings = settings or BnBSettings()
    reduction = rank_one(terms, box)
    if reduction is None:
        return _maximize(terms, box, settings)
    deadline = time.perf_counter() + settings.time_limit
    if settings.stop_at is not None:
        deadline = min(deadline, time.perf_counter() + settings.stop_at - time.time())
    inner = maximize_line(
        reduction.reduced,
        reduction.interval,
        settings.tolerance,
        deadline,
        settings.max_nodes,
        reduction.pad,
    )
    x = reduction.lift(inner.s, box)
    value, err = terms.evaluate(x)
    lower = min(value - err, inner.upper)
    status = Status.TIME_LIMIT if inner.hit_limit else Status.OPTIMAL
    if not inner.hit_limit and inner.upper - lower > settings.tolerance:
        status = Status.PRECISION_LIMIT
    return MaxResult(lower, inner.upper, x, status, inner.nodes, inner.seconds)


def _maximize(terms: TermSet, box: Box, settings: BnBSettings) -> MaxResult:
    start = time.perf_counter()
    search = _Search(terms, box, settings)
    if terms.size == 0:
        value = terms.constant
        return MaxResult(value, value, search.best_x, Status.OPTIMAL, 0, 0.0)
    l0, u0 = terms.value_ranges(box)
    exact = search.vertices(l0, u0) or search.concave(l0, u0)
    if exact is not None:
        return exact
    queue = NodeQueue()
    root = search.bound(box.lo, box.hi, l0, u0)
    if settings.local_search:
        search.polish(centre=False)
    if root.bound > -math.inf:
        queue.push(box.lo, box.hi, l0, u0, root)
    status = Status.OPTIMAL
    while len(queue):
        if queue.best_bound() - search.best <= settings.tolerance:
            break
        if search.nodes >= settings.max_nodes:
            status = Status.NODE_LIMIT
            break
        if search.remaining() <= 0.0:
            status = Status.TIME_LIMIT
            break
        node = queue.pop()
        if node.relaxation.bound - search.best <= settings.tolerance:
            search.pruned = max(search.pruned, node.relaxation.bound)
            continue
        what, k, v = choose_branch(node, terms, search.integer)
        if what == "none":  # nothing left to split: the node's bound stands
            search.pruned = max(search.pruned, node.relaxation.bound)
            continue
        children = []
        if what in ("x", "c"):
            left_hi, right_lo = node.x_hi.copy(), node.x_lo.copy()
            if what == "x":
                left_hi[k], right_lo[k] = math.floor(v), math.ceil(v)
            else:
                left_hi[k], right_lo[k] = v, v
            children = [
                (node.x_lo, left_hi, *_narrowed(terms, node.x_lo, left_hi, node.l, node.u)),
                (right_lo, node.x_hi, *_narrowed(terms, right_lo, node.x_hi, node.l, node.u)),
            ]
        else:
            left_u, right_l = split_value(
                node.l, node.u, search.same_value == search.same_value[k], v
            )
            children = [
                (node.x_lo, node.x_hi, node.l, left_u),
                (node.x_lo, node.x_hi, right_l, node.u),
            ]
        for x_lo, x_hi, l, u in children:
            if np.any(x_lo > x_hi) or np.any(l > u):
                continue
            if search.remaining() <= 0.0:  # no time to bound it: the parent's bound covers it
                search.pruned = max(search.pruned, node.relaxation.bound)
                status = Status.TIME_LIMIT
                continue
            rel = search.bound(x_lo, x_hi, l, u)
            if rel.bound - search.best > settings.tolerance:
                queue.push(x_lo, x_hi, l, u, rel)
            else:
                search.pruned = max(search.pruned, rel.bound)
    if root.bound - search.best <= settings.tolerance:
        search.pruned = max(search.pruned, root.bound)
    upper = max(queue.best_bound(), search.pruned, search.best)
    return MaxResult(
        search.best, upper, search.best_x, status, search.nodes, time.perf_counter() - start
    )

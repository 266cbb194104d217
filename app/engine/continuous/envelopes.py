r"""Certified linear over- and under-estimators of a univariate term on an interval.

For a term :math:`h` on :math:`[l, u]` the functions here return lines
:math:`L_j(z) = α_j z + β_j` with

* :func:`concave_overestimator`: :math:`\min_j L_j(z) \ge h(z)` for all :math:`z \in [l, u]`;
* :func:`convex_underestimator`: :math:`\max_j L_j(z) \le h(z)` for all :math:`z \in [l, u]`.

Why the lines are valid (for a CV term, convex on :math:`(-\infty, z^*]` and concave on
:math:`[z^*, \infty)`; a CC term is handled as the negation of a CV term):

*Overestimators.* If :math:`u \le z^*` :math:`h` is convex on the interval and the secant through
the end points lies above it. If :math:`l \ge z^*` :math:`h` is concave there and every tangent lies
above it. Otherwise a tangent at :math:`p \in [z^*, u]` lies above :math:`h` on the concave part;
on the convex part :math:`h - L_p` is convex, so its maximum over :math:`[l, z^*]` is at
:math:`l` or
at :math:`z^*` (where it is :math:`\le 0`): the tangent is valid iff
:math:`g(p) = L_p(l) - h(l) \ge 0`. Since :math:`g'(p) = h''(p)(l - p) \ge 0` on the concave part,
the valid tangent points form an interval :math:`[p_0, u]`, found by bisection; if even
:math:`g(u) < 0` the secant is valid (then :math:`h'(u)` exceeds the secant slope, so
:math:`h - \text{secant}` is increasing on the concave part and :math:`\le 0`).

*Underestimators* mirror this: tangents on the convex part, valid on the whole interval iff
:math:`L_p(u) \le h(u)`; the secant when :math:`h` is concave on the interval or no tangent is
valid.

Rounding. Every intercept is moved outward by
:math:`δ = 256u\,(1 + |h|_{\max} + |α|(|l| + |u| + 1))`, :math:`u = 2^{-53}`, which covers the error
of evaluating :math:`h`, :math:`h'` and the line in float64 (a few ulp each) and of the bisection's
float test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from app.engine.continuous.univariate import ResponseCurve, Shape
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray

#: Tangent points placed in the valid range of a concave (or convex) part by default.
DEFAULT_TANGENTS = 3
#: Points per round of the vectorised bisection, and rounds (63**9 > 2**53).
_GRID = 64
_BISECTION_ROUNDS = 9


@dataclass(frozen=True)
class Lines:
    """Lines ``slopes[j] * z + intercepts[j]``."""

    slopes: FloatArray
    intercepts: FloatArray

    def negated(self) -> Lines:
        """The lines of ``-h``."""
        return Lines(-self.slopes, -self.intercepts)

    def evaluate(self, z: FloatArray) -> FloatArray:
        """Every line at every ``z``: shape ``(len(z), n_lines)``."""
        return np.asarray(np.outer(z, self.slopes) + self.intercepts, dtype=np.float64)


@lru_cache(maxsize=1 << 16)
def _end_magnitude(h: ResponseCurve, l: float, u: float) -> float:
    """``max(|h(l)|, |h(u)|)``, memoised: every Kelley round's tangents on ``[l, u]`` read it."""
    return float(np.max(np.abs(h.value(np.array([l, u])))))


def _slack(h: ResponseCurve, l: float, u: float, slopes: FloatArray) -> FloatArray:
    hmax = _end_magnitude(h, l, u)
    return np.asarray(
        256.0 * UNIT_ROUNDOFF * (1.0 + hmax + np.abs(slopes) * (abs(l) + abs(u) + 1.0)),
        dtype=np.float64,
    )


def _tangents(h: ResponseCurve, points: FloatArray) -> tuple[FloatArray, FloatArray]:
    values, slopes = h.value_and_deriv(points)
    return slopes, values - slopes * points


def _secant(h: ResponseCurve, l: float, u: float) -> tuple[FloatArray, FloatArray]:
    hl, hu = h.value(np.array([l, u]))
    slope = (hu - hl) / (u - l)
    return np.array([slope]), np.array([hl - slope * l])


def _spread(lo: float, hi: float, extra: Sequence[float], count: int) -> FloatArray:
    base = np.linspace(lo, hi, count) if hi > lo else np.array([lo])
    chosen = np.concatenate([base, np.clip(np.asarray(extra, dtype=np.float64), lo, hi)])
    return np.unique(chosen)


@lru_cache(maxsize=1 << 16)
def _bisect(h: ResponseCurve, lo: float, hi: float, anchor: float, want_left: bool) -> float:
    """Boundary of the valid tangent points in ``[lo, hi]`` (see module docstring).

    With ``want_left`` False we look for the smallest ``p`` whose tangent passes ``g(p) >= 0`` at
    ``anchor`` (overestimators, ``g`` increasing); with True the largest ``p`` whose tangent passes
    ``L_p(anchor) <= h(anchor)`` (underestimators, increasing in ``p`` too). The returned end of the
    bracket always satisfies the test (checked here in float, like any other point).

    The bracket is narrowed by a factor of ``_GRID - 1`` per round: the test is evaluated on
    ``_GRID`` points at once (one vectorised evaluation instead of one per halving). The result
    is memoised: it does not depend on the extra tangent points a node asks for, and a
    branch-and-bound child keeps every term's interval but one.
    """
    h_anchor = float(h.value(np.array([anchor]))[0])

    def passing(points: FloatArray) -> np.ndarray:
        slopes, intercepts = _tangents(h, points)
        at_anchor = slopes * anchor + intercepts
        return np.asarray(at_anchor <= h_anchor if want_left else at_anchor >= h_anchor)

    # invariant: `good` passes (the caller checked the bracket's passing end), `bad` may not
    good, bad = (lo, hi) if want_left else (hi, lo)
    for _ in range(_BISECTION_ROUNDS):
        grid = np.linspace(good, bad, _GRID)
        ok = passing(grid)
        ok[0] = True
        # the test is monotone in p, so the passing points are a prefix of the grid; take the
        # last of that prefix (a non-monotone rounding blip only ends the search earlier)
        k = int(np.argmin(ok)) - 1 if not ok.all() else _GRID - 1
        new_good, new_bad = float(grid[k]), float(grid[min(k + 1, _GRID - 1)])
        if (new_good, new_bad) == (good, bad) or new_good == new_bad:
            good = new_good
            break
        good, bad = new_good, new_bad
    return good


def _tangent_at(h: ResponseCurve, p: float, anchor: float) -> tuple[float, float]:
    """The tangent of ``h`` at ``p`` evaluated at ``anchor``, and ``h(anchor)``.

    One evaluation at both points (the same floats as :func:`_tangents` and ``h.value``).
    """
    values, slopes = h.value_and_deriv(np.array([p, anchor]))
    line = slopes[0] * anchor + (values[0] - slopes[0] * p)
    return float(line), float(values[1])


def _passes_over(h: ResponseCurve, p: float, l: float) -> bool:
    line, value = _tangent_at(h, p, l)
    return line >= value


def _passes_under(h: ResponseCurve, p: float, u: float) -> bool:
    line, value = _tangent_at(h, p, u)
    return line <= value


def _flat_side(h: ResponseCurve) -> str:
    """Which side of the kink a truncated ``linear`` CV curve is flat on (``""``: neither).

    The high output (``z* = a``) is flat left of ``a`` (its convex side), the negated low output
    (``z* = b``) right of ``b`` (its concave side). Both are increasing.
    """
    if h.logistic or not h.truncate or h.shape is not Shape.CV:
        return ""
    return "left" if h.inflection == h.a else "right"


def _with_chord(
    h: ResponseCurve, lines: tuple[FloatArray, FloatArray], p: float, q: float
) -> tuple[FloatArray, FloatArray]:
    """``lines`` plus the chord of ``h`` between ``p`` and ``q`` when its slope is ``>= 0``."""
    slope, intercept = _secant(h, p, q)
    if not (np.isfinite(slope[0]) and slope[0] >= 0.0 and np.isfinite(intercept[0])):
        return lines
    return np.concatenate([lines[0], slope]), np.concatenate([lines[1], intercept])


@lru_cache(maxsize=1 << 16)
def _over_cv_reach(h: ResponseCurve, l: float, u: float) -> tuple[float, float] | None:
    """Where :func:`_over_cv` places its tangent points; ``None`` when it uses one line."""
    z_star = h.inflection
    if u - l <= 0.0 or u <= z_star or (l < z_star and not _passes_over(h, u, l)):
        return None
    if l >= z_star:
        return l, u
    return _bisect(h, z_star, u, l, want_left=False), u


@lru_cache(maxsize=1 << 16)
def _under_cv_reach(h: ResponseCurve, l: float, u: float) -> tuple[float, float] | None:
    """Where :func:`_under_cv` places its tangent points; ``None`` when it uses one line."""
    z_star = h.inflection
    if u - l <= 0.0 or l >= z_star or (u > z_star and not _passes_under(h, l, u)):
        return None
    if u <= z_star:
        return l, u
    return l, _bisect(h, l, z_star, u, want_left=True)


def _over_cv(h: ResponseCurve, l: float, u: float, extra: Sequence[float], count: int) -> Lines:
    z_star = h.inflection
    reach = _over_cv_reach(h, l, u)
    if u - l <= 0.0:
        slopes, intercepts = np.zeros(1), h.value(np.array([l]))
    elif reach is None:
        slopes, intercepts = _secant(h, l, u)
    else:
        slopes, intercepts = _tangents(h, _spread(*reach, extra, count))
    if l < z_star < u and _flat_side(h) == "right":
        # a kink: the tangents of the flat side are flat; the chord from l to the kink is above h
        # on the convex side and, increasing, above the flat side (issue 22 item 3: without it
        # the envelope of a low output at ε = 54 was its maximum, 54 nats, everywhere)
        slopes, intercepts = _with_chord(h, (slopes, intercepts), l, z_star)
    return Lines(slopes, intercepts + _slack(h, l, u, slopes))


def _under_cv(h: ResponseCurve, l: float, u: float, extra: Sequence[float], count: int) -> Lines:
    z_star = h.inflection
    reach = _under_cv_reach(h, l, u)
    if u - l <= 0.0:
        slopes, intercepts = np.zeros(1), h.value(np.array([l]))
    elif reach is None:
        slopes, intercepts = _secant(h, l, u)
    else:
        slopes, intercepts = _tangents(h, _spread(*reach, extra, count))
    if l < z_star < u and _flat_side(h) == "left":
        # the mirror image: the chord from the kink to u is below h on the concave side and,
        # increasing, below the flat side
        slopes, intercepts = _with_chord(h, (slopes, intercepts), z_star, u)
    return Lines(slopes, intercepts - _slack(h, l, u, slopes))


def added_tangents(h: ResponseCurve, l: float, u: float, points: FloatArray) -> Lines | None:
    """The lines ``concave_overestimator(h, l, u, extra=points)`` has for its ``points``.

    Tangents at the points moved into the range where a tangent is valid, with the same slack
    (the Kelley rounds of the branch-and-bound add these to a node's LP instead of building its
    envelopes again); ``None`` where the overestimator is a single line and ignores ``extra``.
    """
    if h.shape is Shape.CV:
        reach = _over_cv_reach(h, l, u)
        if reach is None:
            return None
        slopes, intercepts = _tangents(h, np.clip(points, *reach))
        return Lines(slopes, intercepts + _slack(h, l, u, slopes))
    g = h.negated()
    reach = _under_cv_reach(g, l, u)
    if reach is None:
        return None
    slopes, intercepts = _tangents(g, np.clip(points, *reach))
    return Lines(slopes, intercepts - _slack(g, l, u, slopes)).negated()


def concave_overestimator(
    h: ResponseCurve, l: float, u: float, extra: Sequence[float] = (), count: int = DEFAULT_TANGENTS
) -> Lines:
    """Lines whose minimum is ``>= h`` on ``[l, u]``.

    As ``count`` grows they approach the concave envelope of ``h``.

    ``extra`` asks for tangents at further points (e.g. where a relaxation's optimum sits); they
    are moved into the valid range.
    """
    if h.shape is Shape.CV:
        return _over_cv(h, l, u, extra, count)
    return _under_cv(h.negated(), l, u, extra, count).negated()


@lru_cache(maxsize=1 << 16)
def cached_concave_overestimator(
    h: ResponseCurve, l: float, u: float, extra: tuple[float, ...], count: int
) -> Lines:
    """:func:`concave_overestimator`, memoised (the returned arrays are read-only).

    A branch-and-bound child changes the interval of one term only, so the lines of every other
    term (and their bisections) are reused from the parent: the cost of bounding a node no
    longer grows with the work of building ``n`` envelopes.
    """
    lines = concave_overestimator(h, l, u, extra, count)
    lines.slopes.setflags(write=False)
    lines.intercepts.setflags(write=False)
    return lines


def convex_underestimator(
    h: ResponseCurve, l: float, u: float, extra: Sequence[float] = (), count: int = DEFAULT_TANGENTS
) -> Lines:
    """Lines whose maximum is ``<= h`` on ``[l, u]``."""
    if h.shape is Shape.CV:
        return _under_cv(h, l, u, extra, count)
    return _over_cv(h.negated(), l, u, extra, count).negated()

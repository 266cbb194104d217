"""The bounding problem: ``F(x) = const + Σ_i h_i(θ_i·x + c_i)`` over a box.

With quadratic query values, ``x`` in ``θ_i·x`` is the lifted vector ``[x, m(x)]`` of
:mod:`~app.engine.continuous.lifting` (``TermSet.lifting``): ``θ`` then has a column per
monomial after the box's coordinates.

This module holds the *problem* role of the branch-and-bound (pybnb's split): the terms, the
box, evaluation of ``F``, and the query-value boxes (``[l_i, u_i] ∋ θ_i·x + c_i``) that the search
branches on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import numpy as np

from app.engine.continuous.lifting import Lifting
from app.engine.continuous.univariate import CurveBatch, ResponseCurve, Shape
from app.engine.numerics import (
    UNIT_ROUNDOFF,
    FloatArray,
    exact_dot,
    exact_lifted_dot,
    split_dot,
    two_product,
)


@dataclass(frozen=True)
class Box:
    """An axis-aligned box; ``integer[k]`` marks coordinates restricted to integers."""

    lo: FloatArray
    hi: FloatArray
    integer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def dim(self) -> int:
        """Number of coordinates."""
        return int(self.lo.size)

    def integer_mask(self) -> np.ndarray:
        """Boolean mask of the integer coordinates (all False when unspecified)."""
        if self.integer.size == self.dim:
            return self.integer
        return np.zeros(self.dim, dtype=bool)

    def vertices(self) -> FloatArray:
        """All ``2**dim`` vertices, shape ``(2**dim, dim)``."""
        corners = np.array(
            np.meshgrid(*[[a, b] for a, b in zip(self.lo, self.hi, strict=True)], indexing="ij")
        )
        return np.asarray(corners.reshape(self.dim, -1).T, dtype=np.float64)


@dataclass(frozen=True)
class TermSet:
    """``F(x) = constant + Σ_i curves[i](theta[i] @ v + c[i])``, ``v`` = ``x`` or ``lift(x)``."""

    theta: FloatArray
    c: FloatArray
    curves: tuple[ResponseCurve, ...]
    constant: float = 0.0
    #: The monomials of quadratic query values (``None``: every ``z_i`` is affine in ``x``).
    lifting: Lifting | None = None
    #: Lifted only: an interval known to hold each ``z_i`` over the whole box (the query's exact
    #: range); :meth:`value_ranges` intersects its interval arithmetic with it.
    reach: tuple[FloatArray, FloatArray] | None = None

    @property
    def size(self) -> int:
        """Number of terms."""
        return len(self.curves)

    def negated(self) -> TermSet:
        """``-F``."""
        return TermSet(
            self.theta,
            self.c,
            tuple(h.negated() for h in self.curves),
            -self.constant,
            self.lifting,
            self.reach,
        )

    def subset(self, index: np.ndarray) -> TermSet:
        """The terms at ``index`` (no constant)."""
        return TermSet(
            self.theta[index],
            self.c[index],
            tuple(self.curves[i] for i in index),
            lifting=self.lifting,
            reach=None if self.reach is None else (self.reach[0][index], self.reach[1][index]),
        )

    def lift(self, points: FloatArray) -> FloatArray:
        """The vectors ``θ`` multiplies: ``points`` themselves, or with their monomials."""
        return points if self.lifting is None else self.lifting.lift(points)

    def lifted_bounds(self, lo: FloatArray, hi: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Bounds of :meth:`lift` over the box ``[lo, hi]``."""
        return (lo, hi) if self.lifting is None else self.lifting.bounds(lo, hi)

    def values(self, x: FloatArray) -> FloatArray:
        """``z_i = θ_i·x + c_i`` for one point ``x``."""
        return np.asarray(self.theta @ self.lift(x) + self.c, dtype=np.float64)

    @cached_property
    def batch(self) -> CurveBatch:
        """The curves packed for vectorised evaluation."""
        return CurveBatch.of(self.curves)

    def term_values(self, z: FloatArray) -> FloatArray:
        """``h_i(z_i)`` for every term (``z`` may carry leading point axes)."""
        return self.batch.values(z)

    def evaluate_many(
        self, points: FloatArray, z_pad: FloatArray | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """``F`` at each row of ``points`` and a bound on each value's rounding error.

        The error covers the sum (``n`` roundings of partial sums) and the error of each term
        (a few ulp of ``|h_i|``: :func:`~app.engine.numerics.response_log_prob` does not cancel),
        both charged as ``(n + 16) u Σ|h_i|``, and the error of ``z = θ·x + c`` itself.
        ``z`` comes from :func:`split_dot` as an unrounded double-double ``hi + lo`` (lifted:
        :func:`~app.engine.numerics.exact_lifted_dot`, each monomial split error-free, ``lo = 0``)
        with a bound ``δ_i`` on its error that is zero when the float operations were exact (a
        vertex of a box with representable ends usually is) and otherwise of order ``u^2|z|``
        (issue 22 item 3: rounding ``z`` to one float cost up to 28 nats at ε = 65 where a
        ``linear`` term's ``z`` sits on ``a``); where it is not zero, ``h_i`` is monotone, so its
        value at the exact ``z`` lies between its values at ``lo ± δ_i`` (rounded outward), and
        the larger distance to them is charged — not ``|h_i'(z)| δ_i``, which near a slope of
        ``e^80`` certifies nothing (issue 15 item 5). ``z_pad`` (per term) widens each ``δ_i``:
        the value then bounds ``h_i`` over ``[z_i - pad_i, z_i + pad_i]`` from both sides.
        """
        z, z_lo, z_err = self.split_values(points)
        if z_pad is not None:
            z_err = z_err + z_pad
        terms, up, down = self._moved_values(z, z_lo, z_err)
        n = self.size
        total = terms.sum(axis=1) + self.constant
        abs_sum = np.abs(terms).sum(axis=1) + abs(self.constant)
        # (n + 16) u Σ|h_i| for the sum and each term; 8u per term for the relative error of t
        err = (n + 16) * UNIT_ROUNDOFF * abs_sum + 8.0 * n * UNIT_ROUNDOFF
        # logistic terms read the high part of z only (so the moves below leave them in place):
        # their slope is below 1, so they err by at most |z_lo| + δ_i
        err = err + np.where(self.batch.logistic, np.abs(z_lo) + z_err, 0.0).sum(axis=-1)
        if up is not None and down is not None:
            moved = np.where(z_err > 0.0, np.maximum(np.abs(up - terms), np.abs(terms - down)), 0.0)
            ends = np.where(z_err > 0.0, np.abs(up) + np.abs(down), 0.0)
            err = err + (1.0 + 4.0 * UNIT_ROUNDOFF) * moved.sum(axis=1)
            err = err + 16.0 * UNIT_ROUNDOFF * ends.sum(axis=1)
        # a bound that is not a number (a bracket end outside a continuation's domain) is none
        err = np.where(np.isnan(err), np.inf, err)
        return np.asarray(total, dtype=np.float64), np.asarray(err, dtype=np.float64)

    def _moved_values(
        self, z: FloatArray, z_lo: FloatArray, z_err: FloatArray
    ) -> tuple[FloatArray, FloatArray | None, FloatArray | None]:
        """The terms at ``z + z_lo`` and, where some ``z_err > 0``, at ``z + z_lo ± z_err``.

        The low parts moved by ``± z_err`` are rounded outward; the three evaluations are one
        call on stacked arrays (the same floats as three calls). ``None`` for the moved values
        when every ``z_err`` is zero.
        """
        if not np.any(z_err > 0.0):
            return self.batch.values(z, z_lo), None, None
        lows = np.stack(
            [z_lo, np.nextafter(z_lo + z_err, np.inf), np.nextafter(z_lo - z_err, -np.inf)]
        )
        terms, up, down = self.batch.values(np.broadcast_to(z, lows.shape), lows)
        return terms, up, down

    def term_enclosures(self, points: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Per term ``i``, certified ``[lo, hi]`` holding ``h_i`` at ``points[i]`` (affine ``z``).

        The per-term version of :meth:`evaluate_many`'s error bound (same charges, not summed).
        """
        z, z_lo, z_err = split_dot(points, self.theta, self.c, paired=True)
        terms, up, down = self._moved_values(z, z_lo, z_err)
        err = 16.0 * UNIT_ROUNDOFF * np.abs(terms) + 8.0 * UNIT_ROUNDOFF
        err = err + np.where(self.batch.logistic, np.abs(z_lo) + z_err, 0.0)
        if up is not None and down is not None:
            moved = np.where(z_err > 0.0, np.maximum(np.abs(up - terms), np.abs(terms - down)), 0.0)
            ends = np.where(z_err > 0.0, np.abs(up) + np.abs(down), 0.0)
            err = err + (1.0 + 4.0 * UNIT_ROUNDOFF) * moved + 16.0 * UNIT_ROUNDOFF * ends
        err = np.where(np.isnan(err), np.inf, err) * (1.0 + 4.0 * UNIT_ROUNDOFF)
        return np.asarray(terms - err, dtype=np.float64), np.asarray(terms + err, dtype=np.float64)

    def term_extremes(self, box: Box) -> tuple[FloatArray, FloatArray] | None:
        """Certified ``min`` and ``max`` of each term ``h_i(θ_i·x + c_i)`` over ``box``.

        Each ``h_i`` is monotone and (affine ``z``) ``θ_i·x`` is extreme at the box's vertex
        ``lo``/``hi`` chosen by the signs of ``θ_i``, where ``z_i`` is evaluated as a
        double-double (:meth:`term_enclosures`). Unlike an interval of floats for ``z_i``, whose
        one-ulp pad reaches past a ``linear`` query's ``a`` when its range is exactly the query's
        reach, this resolves ``t`` near 0, where ``log t`` has a slope of ``e^ε`` (issue 22 item
        3). ``None`` with quadratic query values (``z`` is not affine in ``x``).
        """
        if self.lifting is None and self.size:
            low_vertex = np.where(self.theta > 0.0, box.lo, box.hi)
            high_vertex = np.where(self.theta > 0.0, box.hi, box.lo)
            lo_a, hi_a = self.term_enclosures(low_vertex)
            lo_b, hi_b = self.term_enclosures(high_vertex)
            return np.minimum(lo_a, lo_b), np.maximum(hi_a, hi_b)
        return None

    def split_values(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``z`` at each row of ``points`` as a double-double ``hi + lo`` and a bound on its error.

        Affine query values: :func:`split_dot`, whose error is of order ``u^2 |z|`` — ``z - a``
        of a ``linear`` term keeps its relative precision even where ``z`` rounds to ``a``.
        Lifted: :meth:`exact_values` with a zero low part.
        """
        if self.lifting is None:
            return split_dot(points, self.theta, self.c)
        z, err = self.exact_values(points)
        return z, np.zeros_like(z), err

    def exact_values(self, points: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``z`` at each row of ``points`` and a bound on its error (0 where it is exact)."""
        if self.lifting is None:
            return exact_dot(points, self.theta, self.c)
        return exact_lifted_dot(points, self.lifting.pairs, self.theta, self.c)

    def evaluate(self, x: FloatArray) -> tuple[float, float]:
        """``F(x)`` and a bound on its rounding error (see :meth:`evaluate_many`)."""
        total, err = self.evaluate_many(x.reshape(1, -1))
        return float(total[0]), float(err[0])

    def gradient(self, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``∇F(x)`` and a bound on the rounding error of each component."""
        slopes = self.batch.derivs(self.values(x))
        grad = self.theta.T @ slopes
        err = (self.size + 16) * UNIT_ROUNDOFF * (np.abs(self.theta).T @ np.abs(slopes))
        if self.lifting is not None:  # chain rule; the error bound of the exact paths is not kept
            grad = self.lifting.chain(x, grad)
            err = self.lifting.chain(np.abs(x), err) * (1 + 4 * UNIT_ROUNDOFF)
        return np.asarray(grad, dtype=np.float64), np.asarray(err, dtype=np.float64)

    def value_ranges(self, box: Box) -> tuple[FloatArray, FloatArray]:
        """``[l_i, u_i]``: the range of each ``θ_i·x + c_i`` over the box (rounded outward).

        Lifted: an outer bound, each monomial taken over its own range (interval arithmetic),
        intersected with :attr:`reach` (interval arithmetic alone can leave the range a plain
        ``linear`` query was checked against, where its curve is not defined).
        """
        v_lo, v_hi = self.lifted_bounds(box.lo, box.hi)
        pos, neg = np.maximum(self.theta, 0.0), np.minimum(self.theta, 0.0)
        lo = pos @ v_lo + neg @ v_hi + self.c
        hi = pos @ v_hi + neg @ v_lo + self.c
        pad = (
            (self.theta.shape[1] + 2 + (self.lifting is not None))
            * UNIT_ROUNDOFF
            * (np.abs(self.theta) @ np.maximum(np.abs(v_lo), np.abs(v_hi)) + np.abs(self.c))
        )
        lo, hi = lo - pad, hi + pad
        if self.reach is not None:
            lo, hi = np.maximum(lo, self.reach[0]), np.minimum(hi, self.reach[1])
        return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)

    def concave_on(self, l: FloatArray, u: FloatArray) -> bool:
        """Whether every term is concave on its interval (then ``F`` is concave in ``x``).

        Always False with quadratic query values: ``z`` is then not affine in ``x``.
        """
        if self.lifting is not None:
            return False
        for h, li, ui in zip(self.curves, l, u, strict=True):
            z_star = h.inflection
            if not (
                (h.shape is Shape.CV and li >= z_star) or (h.shape is Shape.CC and ui <= z_star)
            ):
                return False
        return True

    def convex_on(self, l: FloatArray, u: FloatArray) -> bool:
        """Whether every term is convex on its interval (then ``F`` is convex in ``x``).

        Always False with quadratic query values: ``z`` is then not affine in ``x``.
        """
        if self.lifting is not None:
            return False
        for h, li, ui in zip(self.curves, l, u, strict=True):
            z_star = h.inflection
            if not (
                (h.shape is Shape.CV and ui <= z_star) or (h.shape is Shape.CC and li >= z_star)
            ):
                return False
        return True


@dataclass(frozen=True)
class RankOneReduction:
    """``θ_i = λ_i v`` exactly for every term: ``F(x) = G(v·x)`` with ``G(s) = Σ h_i(λ_i s + c_i)``.

    The image of the box under ``s = v·x`` is an interval; ``interval`` contains it (its ends are
    ``exact_dot`` values widened by their error bounds). So ``max G`` over ``interval`` bounds
    ``max F`` from above, and a point ``s`` maps back (:meth:`lift`) to a point ``x`` of the box
    with ``v·x`` close to ``s``, where ``F`` itself is evaluated for a certified lower bound.
    Parallel weights — many queries along one direction — make a one-dimensional problem whose
    nodes bound every term on the same ``s``-interval (issue 15 item 5).
    """

    direction: FloatArray
    reduced: TermSet
    interval: Box
    #: Per term, a bound on ``|θ_i·x - λ_i v·x|`` over the box (0 for exact multiples).
    pad: FloatArray

    def lift(self, s: float, box: Box) -> FloatArray:
        """A point ``x`` of ``box`` with ``v·x`` as close to ``s`` as a greedy walk gets."""
        v = self.direction
        x = np.where(v > 0, box.lo, box.hi).astype(np.float64)
        remaining = s - float(v @ x)
        for k in np.argsort(-np.abs(v) * (box.hi - box.lo)):
            if v[k] == 0.0 or remaining <= 0.0:
                continue
            span = box.hi[k] - box.lo[k]
            step = min(remaining / abs(v[k]), span)
            x[k] = x[k] + step if v[k] > 0 else x[k] - step
            remaining -= step * abs(v[k])
        return np.clip(x, box.lo, box.hi)


def _exact_multiples(theta: FloatArray, v: FloatArray, lam: FloatArray) -> bool:
    """Whether ``lam[i] * v == theta[i]`` holds exactly, in rationals, for every row."""
    # necessary (an exact product is a float, so rounding it changes nothing) and cheap: general
    # histories stop here
    if not np.array_equal(lam[:, None] * v, theta):
        return False
    exact_v = [Fraction(float(a)) for a in v]
    for row, scale in zip(theta, lam, strict=True):
        f = Fraction(float(scale))
        if any(f * vk != Fraction(float(t)) for vk, t in zip(exact_v, row, strict=True)):
            return False
    return True


#: Rows whose entries are within this relative distance of ``λ_i v`` count as parallel up to
#: rounding (``fl(λ v)``): the difference is carried as a per-term pad on the query value.
PARALLEL_RTOL = 1e-12


def _residual_pad(theta: FloatArray, v: FloatArray, lam: FloatArray, box: Box) -> FloatArray | None:
    """``ρ_i >= |(θ_i - λ_i v)·x|`` over the box, or ``None`` if the rows are not that close.

    ``λ_i v_k = p + e`` exactly (Dekker); with ``θ_ik`` within a factor 2 of ``p`` the difference
    ``θ_ik - p`` is exact (Sterbenz), so ``|θ_ik - λ_i v_k| <= |θ_ik - p| + |e|``.
    """
    p, e = two_product(lam[:, None], v[None, :])
    if not np.all(np.abs(theta - p) <= PARALLEL_RTOL * np.abs(p)):
        return None
    reach = np.maximum(np.abs(box.lo), np.abs(box.hi))
    residual = (np.abs(theta - p) + np.abs(e)) @ reach
    d = theta.shape[1]
    return np.asarray(residual * (1.0 + 4.0 * (d + 2) * UNIT_ROUNDOFF), dtype=np.float64)


def rank_one(terms: TermSet, box: Box) -> RankOneReduction | None:
    """The reduction of :class:`RankOneReduction`, if every row is an exact multiple of one.

    Exactness is checked in rationals (``λ_i v_k == θ_ik`` for every ``k``), so ``λ_i s`` is the
    same real number as ``θ_i·x``. Rows that are multiples only up to rounding (within
    :data:`PARALLEL_RTOL`, e.g. ``fl(3 v)``) are reduced too, with the residual ``(θ_i - λ_i v)·x``
    bounded by a per-term pad that the one-dimensional search adds to each query value. Boxes
    with an integer coordinate that the direction uses are not reduced (their image is not an
    interval), nor are histories with quadratic query values (``terms.lifting``): their ``θ``
    has a column per monomial, so parallel rows would not make ``z`` a function of ``v·x``.
    """
    if terms.size < 2 or box.dim < 2 or terms.lifting is not None:
        # quadratic histories: θ has a column per monomial and z is not a function of one v·x
        return None
    k0 = int(np.argmax(np.abs(terms.theta).max(axis=0)))
    column = np.abs(terms.theta[:, k0])
    nonzero = np.flatnonzero(column)
    if nonzero.size == 0:
        return None
    # the direction is one of the rows; the multiples are exact floats more often when it is the
    # row with the smallest entry (λ = 2, 4, 6 rather than 1/2, 2/3 ...), else the largest
    found = None
    pivots = (nonzero[np.argmin(column[nonzero])], nonzero[np.argmax(column[nonzero])])
    for pivot in pivots:
        v = terms.theta[pivot]
        lam = terms.theta[:, k0] / v[k0]
        if _exact_multiples(terms.theta, v, lam):
            found = (v, lam, np.zeros(terms.size))
            break
    if found is None:
        v = terms.theta[pivots[0]]
        lam = terms.theta[:, k0] / v[k0]
        pad = _residual_pad(terms.theta, v, lam, box)
        if pad is None:
            return None
        found = (v, lam, pad)
    v, lam, pad = found
    if np.any(box.integer_mask() & (v != 0.0)):
        return None
    ends = np.stack([np.where(v > 0, box.lo, box.hi), np.where(v > 0, box.hi, box.lo)])
    s, err = exact_dot(ends, v.reshape(1, -1), np.zeros(1))
    lo = np.nextafter(s[0] - err[0], -np.inf)
    hi = np.nextafter(s[1] + err[1], np.inf)
    reduced = TermSet(lam.reshape(-1, 1), terms.c, terms.curves, terms.constant)
    return RankOneReduction(v, reduced, Box(lo, hi), pad)

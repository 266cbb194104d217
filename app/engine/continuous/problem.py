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
from functools import cached_property

import numpy as np

from app.engine.continuous.lifting import Lifting
from app.engine.continuous.univariate import CurveBatch, ResponseCurve, Shape
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray


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

    def evaluate_many(self, points: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``F`` at each row of ``points`` and a bound on each value's rounding error.

        The error covers the sum (``n`` roundings of partial sums), the error of each term
        (a few ulp) and the error of ``z = θ·x + c`` itself (``d`` roundings, one more for the
        monomials of a lifted ``x``) propagated through ``|h_i'|``.
        """
        lifted = self.lift(points)
        z = lifted @ self.theta.T + self.c
        terms = self.batch.values(z)
        slopes = np.abs(self.batch.derivs(z))
        n, d = self.size, lifted.shape[1] + (self.lifting is not None)
        z_err = (d + 2) * UNIT_ROUNDOFF * (np.abs(lifted) @ np.abs(self.theta).T + np.abs(self.c))
        total = terms.sum(axis=1) + self.constant
        abs_sum = np.abs(terms).sum(axis=1) + abs(self.constant)
        err = (n + 10) * UNIT_ROUNDOFF * abs_sum + (slopes * z_err).sum(axis=1)
        return np.asarray(total, dtype=np.float64), np.asarray(err, dtype=np.float64)

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

"""The bounding problem: ``F(x) = const + Σ_i h_i(θ_i·x + c_i)`` over a box.

This module holds the *problem* role of the branch-and-bound (pybnb's split): the terms, the
box, evaluation of ``F``, and the query-value boxes (``[l_i, u_i] ∋ θ_i·x + c_i``) that the search
branches on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

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
    """``F(x) = constant + Σ_i curves[i](theta[i] @ x + c[i])``."""

    theta: FloatArray
    c: FloatArray
    curves: tuple[ResponseCurve, ...]
    constant: float = 0.0

    @property
    def size(self) -> int:
        """Number of terms."""
        return len(self.curves)

    def negated(self) -> TermSet:
        """``-F``."""
        return TermSet(self.theta, self.c, tuple(h.negated() for h in self.curves), -self.constant)

    def subset(self, index: np.ndarray) -> TermSet:
        """The terms at ``index`` (no constant)."""
        return TermSet(self.theta[index], self.c[index], tuple(self.curves[i] for i in index))

    def values(self, x: FloatArray) -> FloatArray:
        """``z_i = θ_i·x + c_i`` for one point ``x``."""
        return np.asarray(self.theta @ x + self.c, dtype=np.float64)

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
        (a few ulp) and the error of ``z = θ·x + c`` itself (``d`` roundings) propagated through
        ``|h_i'|``.
        """
        z = points @ self.theta.T + self.c
        terms = self.batch.values(z)
        slopes = np.abs(self.batch.derivs(z))
        n, d = self.size, points.shape[1]
        z_err = (d + 2) * UNIT_ROUNDOFF * (np.abs(points) @ np.abs(self.theta).T + np.abs(self.c))
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
        return np.asarray(grad, dtype=np.float64), np.asarray(err, dtype=np.float64)

    def value_ranges(self, box: Box) -> tuple[FloatArray, FloatArray]:
        """``[l_i, u_i]``: the range of each ``θ_i·x + c_i`` over the box (rounded outward)."""
        pos, neg = np.maximum(self.theta, 0.0), np.minimum(self.theta, 0.0)
        lo = pos @ box.lo + neg @ box.hi + self.c
        hi = pos @ box.hi + neg @ box.lo + self.c
        pad = (
            (self.theta.shape[1] + 2)
            * UNIT_ROUNDOFF
            * (np.abs(self.theta) @ np.maximum(np.abs(box.lo), np.abs(box.hi)) + np.abs(self.c))
        )
        return np.asarray(lo - pad, dtype=np.float64), np.asarray(hi + pad, dtype=np.float64)

    def concave_on(self, l: FloatArray, u: FloatArray) -> bool:
        """Whether every term is concave on its interval (then ``F`` is concave in ``x``)."""
        for h, li, ui in zip(self.curves, l, u, strict=True):
            z_star = h.inflection
            if not (
                (h.shape is Shape.CV and li >= z_star) or (h.shape is Shape.CC and ui <= z_star)
            ):
                return False
        return True

    def convex_on(self, l: FloatArray, u: FloatArray) -> bool:
        """Whether every term is convex on its interval (then ``F`` is convex in ``x``)."""
        for h, li, ui in zip(self.curves, l, u, strict=True):
            z_star = h.inflection
            if not (
                (h.shape is Shape.CV and ui <= z_star) or (h.shape is Shape.CC and li >= z_star)
            ):
                return False
        return True

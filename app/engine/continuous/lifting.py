r"""Quadratic query values lifted to linear ones: ``z = θ·[x, m(x)] + c``.

A query value of degree 2 (``x^2`` and ``x*y`` weights) is affine in the *lifted* vector
``v = [x, m(x)]`` whose extra coordinates are the monomials ``m_k(x) = x_i x_j`` used by the
history. The bounding machinery keeps working on affine ``z = θ·v + c``; what changes is that
``v`` ranges over the (non-convex) graph ``{(x, m(x)) : x ∈ box}``, which the linear program
replaces by a polyhedron containing it (:meth:`Lifting.envelope_rows`):

* ``w = x_i²`` (convex): every tangent lies below, ``w >= 2p x_i - p²`` since
  ``(x_i - p)² >= 0``; the secant lies above on ``[lo, hi]``, ``w <= (lo + hi) x_i - lo·hi``
  since ``(x_i - lo)(x_i - hi) <= 0`` there;
* ``v = x_i x_j`` (McCormick): ``(x_i - lo_i)(x_j - lo_j) >= 0``,
  ``(hi_i - x_i)(hi_j - x_j) >= 0``, ``(x_i - lo_i)(hi_j - x_j) >= 0`` and
  ``(hi_i - x_i)(x_j - lo_j) >= 0`` expand to two lower and two upper planes;
* each monomial's own range over the box bounds its variable.

Every point of the node's box with its true monomials satisfies these rows, so the LP optimum
still bounds ``max F`` over the node. Each row's right-hand side is widened by
``16u (Σ|a_k| max|v_k| + |b|)`` — the rounding of its coefficients (``lo + hi``, ``lo·hi``,
``p²``) — so the stored float rows hold in exact arithmetic. The gap of these envelopes is at most
``(hi - lo)²/4`` per square and ``(hi_i - lo_i)(hi_j - lo_j)/4`` per product; the
branch-and-bound closes it by splitting the original coordinates
(:func:`~app.engine.continuous.branch_and_bound.choose_branch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.numerics import UNIT_ROUNDOFF, FloatArray

#: Tangent points of each square's lower envelope: these fractions of its interval.
TANGENT_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Lifting:
    """Monomials ``x_i x_j`` (``i <= j``, indices of the box's coordinates) after ``x``."""

    dim: int
    pairs: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        """Length of the lifted vector ``[x, m(x)]``."""
        return self.dim + len(self.pairs)

    def lift(self, points: FloatArray) -> FloatArray:
        """``[x, m(x)]`` for each row of ``points`` (or for one point)."""
        left = np.array([i for i, _ in self.pairs], dtype=np.int64)
        right = np.array([j for _, j in self.pairs], dtype=np.int64)
        monomials = points[..., left] * points[..., right]
        return np.asarray(np.concatenate([points, monomials], axis=-1), dtype=np.float64)

    def chain(self, x: FloatArray, grad: FloatArray) -> FloatArray:
        """The gradient in ``x`` of a function whose gradient in ``v = [x, m(x)]`` is ``grad``."""
        out = np.array(grad[: self.dim], dtype=np.float64)
        for k, (i, j) in enumerate(self.pairs):
            g = grad[self.dim + k]
            out[i] += g * x[j]
            out[j] += g * x[i]
        return out

    def bounds(self, lo: FloatArray, hi: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Bounds of ``[x, m(x)]`` over the box ``[lo, hi]`` (each monomial's range, padded)."""
        m_lo, m_hi = np.empty(len(self.pairs)), np.empty(len(self.pairs))
        for k, (i, j) in enumerate(self.pairs):
            corners = [lo[i] * lo[j], lo[i] * hi[j], hi[i] * lo[j], hi[i] * hi[j]]
            low = min(corners)
            if i == j and lo[i] <= 0.0 <= hi[i]:
                low = 0.0
            m_lo[k], m_hi[k] = low, max(corners)
        pad = 4 * UNIT_ROUNDOFF * np.maximum(np.abs(m_lo), np.abs(m_hi))
        return (
            np.asarray(np.concatenate([lo, m_lo - pad]), dtype=np.float64),
            np.asarray(np.concatenate([hi, m_hi + pad]), dtype=np.float64),
        )

    def envelope_rows(self, lo: FloatArray, hi: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Rows ``A v <= b`` on the lifted vector, met by ``(x, m(x))`` for every ``x`` in the box.

        See the module docstring for the rows and why they are valid and rounded safely.
        """
        rows: list[FloatArray] = []
        rhs: list[float] = []

        def add(coef: dict[int, float], b: float) -> None:
            row = np.zeros(self.size)
            for col, a in coef.items():
                row[col] += a
            rows.append(row)
            rhs.append(b)

        for k, (i, j) in enumerate(self.pairs):
            w = self.dim + k
            if i == j:
                width = hi[i] - lo[i]
                for frac in TANGENT_FRACTIONS:
                    p = float(lo[i] + frac * width) if frac < 1.0 else float(hi[i])
                    add({i: 2.0 * p, w: -1.0}, p * p)  # w >= 2p x - p²
                add({w: 1.0, i: -(lo[i] + hi[i])}, -lo[i] * hi[i])  # secant
            else:
                add({i: lo[j], j: lo[i], w: -1.0}, lo[i] * lo[j])
                add({i: hi[j], j: hi[i], w: -1.0}, hi[i] * hi[j])
                add({w: 1.0, i: -hi[j], j: -lo[i]}, -lo[i] * hi[j])
                add({w: 1.0, i: -lo[j], j: -hi[i]}, -hi[i] * lo[j])
        if not rows:
            return np.zeros((0, self.size)), np.zeros(0)
        a_mat, b = np.array(rows), np.array(rhs)
        v_lo, v_hi = self.bounds(lo, hi)
        reach = np.abs(a_mat) @ np.maximum(np.abs(v_lo), np.abs(v_hi))
        b = b + 16 * UNIT_ROUNDOFF * (reach + np.abs(b)) + 1e-300
        return np.asarray(a_mat, dtype=np.float64), np.asarray(b, dtype=np.float64)

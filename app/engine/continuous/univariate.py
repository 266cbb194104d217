r"""The univariate log-likelihood terms of ``linear`` and ``logistic`` queries.

For query value ``z = θ·x + c`` and response ``t(z) ∈ [0, 1]`` the log-probability of the high
output is :math:`h(z) = \log(1 + t(z)E) - N` and of the low output
:math:`\ell(z) = \log(1 + (1 - t(z))E) - N`, with :math:`E = e^\varepsilon - 1`,
:math:`N = \log(1 + e^\varepsilon)`.

Shape (what the envelopes rely on). Every term is monotone and has one inflection point
:math:`z^*`: either **CV** — convex on :math:`(-\infty, z^*]`, concave on :math:`[z^*, \infty)` —
or **CC** — concave on :math:`(-\infty, z^*]`, convex on :math:`[z^*, \infty)`:

* ``linear`` without truncation: :math:`\log` of an affine function, concave everywhere (CV with
  :math:`z^* = -\infty`);
* truncated ``linear``, high output: flat, then concave increasing from the kink at ``a``: CV with
  :math:`z^* = a`; low output: concave decreasing until the kink at ``b``, then flat: CC with
  :math:`z^* = b`;
* ``logistic`` (``t = σ(z)``), high output: with :math:`s = σ(z)`,
  :math:`h'' ∝ 1 - 2s - E s^2`, which vanishes at :math:`s = 1/(1 + e^{ε/2})`, i.e.
  :math:`z^* = -ε/2`; convex left of it, concave right: CV. The low output is the mirror image
  :math:`\ell(z) = h(-z)`: CC with :math:`z^* = ε/2`.

Derivatives at the kinks of truncated ``linear`` are taken from the inside of ``[a, b]``; the
envelope constructions only use them where that one-sided derivative is a valid super- or
sub-gradient (see :mod:`~app.engine.continuous.envelopes`).

A plain ``linear`` query may reach a hair beyond ``[a, b]`` (its range is accepted up to a
relative ``1e-9`` of rounding, e.g. ``‖θ‖₁ = 1`` normalised in floating point), where the mechanism
clips ``t``. Its curve here uses the affine ``t`` instead — the concave continuation — and the
caller adds the difference, at most ``|h'| × excess``, to the loss bounds
(:mod:`~app.engine.continuous.state`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt
from scipy.special import expit

from app.engine.numerics import FloatArray, response_log_prob

BoolArray = npt.NDArray[np.bool_]


class Shape(Enum):
    """Curvature pattern of a univariate term around its inflection point."""

    CV = "convex-then-concave"
    CC = "concave-then-convex"


@dataclass(frozen=True)
class ResponseCurve:
    """``sign * log Pr(output | z)`` for a ``linear`` or ``logistic`` query.

    Attributes
    ----------
    logistic:
        ``t = σ(z)`` when True, else ``t = (clip(z, a, b) - a)/(b - a)``.
    high:
        The high output (``b`` / ``1``) when True, the low one otherwise.
    epsilon, a, b, truncate:
        The query's parameters (``a``, ``b``, ``truncate`` unused for logistic).
    sign:
        ``+1`` for the log-likelihood itself, ``-1`` for its negation (used to turn a
        minimisation into a maximisation).
    """

    logistic: bool
    high: bool
    epsilon: float
    a: float = 0.0
    b: float = 1.0
    truncate: bool = False
    sign: float = 1.0

    @classmethod
    def logistic_output(cls, epsilon: float, *, high: bool) -> ResponseCurve:
        """The curve of a ``logistic`` query's high (``1``) or low (``0``) output."""
        return cls(logistic=True, high=high, epsilon=epsilon)

    @classmethod
    def linear_output(
        cls, epsilon: float, a: float, b: float, *, high: bool, truncate: bool
    ) -> ResponseCurve:
        """The curve of a ``linear`` query's high (``b``) or low (``a``) output."""
        return cls(logistic=False, high=high, epsilon=epsilon, a=a, b=b, truncate=truncate)

    @property
    def expm1_eps(self) -> float:
        """``E = e^ε - 1``."""
        return math.expm1(self.epsilon)

    def negated(self) -> ResponseCurve:
        """The same curve with the opposite sign."""
        return ResponseCurve(
            self.logistic, self.high, self.epsilon, self.a, self.b, self.truncate, -self.sign
        )

    @property
    def shape(self) -> Shape:
        """CV or CC (see the module docstring); negation swaps them."""
        base = Shape.CV if (self.high or not (self.logistic or self.truncate)) else Shape.CC
        if self.sign > 0:
            return base
        return Shape.CC if base is Shape.CV else Shape.CV

    @property
    def inflection(self) -> float:
        """The inflection point ``z*`` (``±inf`` when the curve has a single curvature)."""
        if self.logistic:
            return -self.epsilon / 2.0 if self.high else self.epsilon / 2.0
        if not self.truncate:
            # concave everywhere: CV with z* = -inf (or, negated, CC with z* = -inf: convex)
            return -math.inf
        return self.a if self.high else self.b

    def _response(self, z: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(t, 1 - t, dt/dz)``, the derivative taken from inside ``[a, b]`` at the kinks."""
        if self.logistic:
            t = np.asarray(expit(z), dtype=np.float64)
            one_minus_t = np.asarray(expit(-z), dtype=np.float64)
            return t, one_minus_t, t * one_minus_t
        width = self.b - self.a
        if not self.truncate:  # affine t: the concave continuation beyond [a, b] (see module doc)
            return (z - self.a) / width, (self.b - z) / width, np.full_like(z, 1.0 / width)
        y = np.clip(z, self.a, self.b)
        inside = (z >= self.a) & (z <= self.b)
        return (y - self.a) / width, (self.b - y) / width, np.where(inside, 1.0 / width, 0.0)

    def value(self, z: FloatArray) -> FloatArray:
        """``sign * log Pr(output | z)``."""
        t, one_minus_t, _ = self._response(np.asarray(z, dtype=np.float64))
        own, other = (t, one_minus_t) if self.high else (one_minus_t, t)
        core = response_log_prob(own, other, self.epsilon)
        return np.asarray(self.sign * core, dtype=np.float64)

    def deriv(self, z: FloatArray) -> FloatArray:
        """``d/dz`` of :meth:`value` (one-sided from inside ``[a, b]`` at kinks)."""
        t, one_minus_t, dt = self._response(np.asarray(z, dtype=np.float64))
        big_e = self.expm1_eps
        if self.high:
            core = big_e * dt / (1.0 + t * big_e)
        else:
            core = -big_e * dt / (1.0 + one_minus_t * big_e)
        return np.asarray(self.sign * core, dtype=np.float64)


@dataclass(frozen=True)
class CurveBatch:
    """Many :class:`ResponseCurve` evaluated together: ``z[..., i]`` goes to curve ``i``.

    The same formulas as :meth:`ResponseCurve.value`/:meth:`ResponseCurve.deriv`, vectorised
    over curves so that evaluating ``F`` at many points costs a few numpy passes.
    """

    logistic: BoolArray
    high: BoolArray
    big_e: FloatArray
    epsilon: FloatArray
    a: FloatArray
    b: FloatArray
    width: FloatArray
    truncate: BoolArray
    sign: FloatArray

    @classmethod
    def of(cls, curves: tuple[ResponseCurve, ...]) -> CurveBatch:
        """Pack curves into parameter arrays."""

        def arr(values: list[float]) -> FloatArray:
            return np.asarray(values, dtype=np.float64)

        return cls(
            logistic=np.array([h.logistic for h in curves], dtype=bool),
            high=np.array([h.high for h in curves], dtype=bool),
            big_e=arr([h.expm1_eps for h in curves]),
            epsilon=arr([h.epsilon for h in curves]),
            a=arr([h.a for h in curves]),
            b=arr([h.b for h in curves]),
            width=arr([h.b - h.a for h in curves]),
            truncate=np.array([h.truncate for h in curves], dtype=bool),
            sign=arr([h.sign for h in curves]),
        )

    def _response(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(t_own, dt_own/dz)``: the response of each curve's own output and its derivative."""
        own, _other, dt = self._responses(z)
        return own, dt

    def _responses(
        self, z: FloatArray, z_lo: FloatArray | None = None
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(t_own, 1 - t_own, dt_own/dz)``, ``1 - t_own`` formed without cancellation.

        ``z_lo`` (optional) is the low part of a double-double query value ``z + z_lo``: a
        ``linear`` term's ``t`` is then ``((z - a) + z_lo)/(b - a)``, whose numerator is exact up
        to one rounding (Sterbenz: ``z - a`` is exact near ``a``), so ``t`` keeps its relative
        precision where ``z`` rounds to ``a`` — where ``log t`` has a slope of ``e^ε``. Logistic
        terms read ``z`` only (their slope is below 1: the caller charges ``|z_lo|``).
        """
        with np.errstate(over="ignore"):
            sig = np.asarray(expit(z), dtype=np.float64)
            sig_neg = np.asarray(expit(-z), dtype=np.float64)
        lo = 0.0 if z_lo is None else z_lo
        from_a = (z - self.a) + lo
        from_b = (self.b - z) - lo
        clipped_a = np.clip(from_a, 0.0, self.width)
        clipped_b = np.clip(from_b, 0.0, self.width)
        t_lin = np.where(self.truncate, clipped_a, from_a) / self.width
        t_lin_low = np.where(self.truncate, clipped_b, from_b) / self.width
        inside = (z >= self.a) & (z <= self.b)
        dt_lin = np.where(inside | ~self.truncate, 1.0 / self.width, 0.0)
        t_high = np.where(self.logistic, sig, t_lin)
        t_low = np.where(self.logistic, sig_neg, t_lin_low)
        dt = np.where(self.logistic, sig * sig_neg, dt_lin)
        own = np.where(self.high, t_high, t_low)
        other = np.where(self.high, t_low, t_high)
        return own, other, np.where(self.high, dt, -dt)

    def values(self, z: FloatArray, z_lo: FloatArray | None = None) -> FloatArray:
        """``h_i(z[..., i])`` for every curve (cancellation-free, see ``response_log_prob``).

        ``z_lo``: low parts of double-double query values (see :meth:`_responses`).
        """
        own, other, _ = self._responses(z, z_lo)
        return np.asarray(self.sign * response_log_prob(own, other, self.epsilon), dtype=np.float64)

    def derivs(self, z: FloatArray) -> FloatArray:
        """``h_i'(z[..., i])`` for every curve."""
        own, dt = self._response(z)
        return np.asarray(self.sign * self.big_e * dt / (1.0 + own * self.big_e), dtype=np.float64)

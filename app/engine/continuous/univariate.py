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

from app.engine.numerics import (
    FloatArray,
    expit,
    response_coefficients,
    response_log_prob,
    response_log_prob_with,
)

BoolArray = npt.NDArray[np.bool_]
#: ``(t_own, 1 - t_own, dt_own/dz)`` of a batch of curves.
Responses = tuple[FloatArray, FloatArray, FloatArray]


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
        return self._value(*self._response(np.asarray(z, dtype=np.float64)))

    def deriv(self, z: FloatArray) -> FloatArray:
        """``d/dz`` of :meth:`value` (one-sided from inside ``[a, b]`` at kinks)."""
        return self._deriv(*self._response(np.asarray(z, dtype=np.float64)))

    def value_and_deriv(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """:meth:`value` and :meth:`deriv` at once (one pass over the response)."""
        response = self._response(np.asarray(z, dtype=np.float64))
        return self._value(*response), self._deriv(*response)

    def _value(self, t: FloatArray, one_minus_t: FloatArray, _dt: FloatArray) -> FloatArray:
        own, other = (t, one_minus_t) if self.high else (one_minus_t, t)
        core = response_log_prob(own, other, self.epsilon)
        return np.asarray(self.sign * core, dtype=np.float64)

    def _deriv(self, t: FloatArray, one_minus_t: FloatArray, dt: FloatArray) -> FloatArray:
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
    over curves so that evaluating ``F`` at many points costs a few numpy passes. The search
    evaluates a handful of curves at a few points at a time, where each numpy call costs more
    than its arithmetic: :meth:`of` therefore folds each curve's output into signed parameters
    (the high output reads ``z - a``, the low one ``-(z - b)``) and records which kinds are
    present, so that a batch of logistic curves never computes the ``linear`` response and the
    other way round (the results are the same floats either way).
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
    #: ``+1`` for a high output, ``-1`` for a low one (``other_side``: the opposite).
    side: FloatArray
    #: Where each curve's own response is 0 (``a`` for the high output, ``b`` for the low one)
    #: and the other output's.
    own_zero: FloatArray
    other_zero: FloatArray
    other_side: FloatArray
    #: ``±1/(b - a)``: ``dt_own/dz`` of a ``linear`` curve inside ``[a, b]``.
    slope: FloatArray
    #: ``response_log_prob``'s coefficients ``tanh(ε/2)`` and ``1/(e^ε + 1)``.
    k: FloatArray
    q: FloatArray
    any_logistic: bool
    any_linear: bool
    #: Whether every ``linear`` curve is truncated (clipped), and whether some is.
    all_truncated: bool
    any_truncated: bool

    @classmethod
    def of(cls, curves: tuple[ResponseCurve, ...]) -> CurveBatch:
        """Pack curves into parameter arrays."""

        def arr(values: list[float]) -> FloatArray:
            return np.asarray(values, dtype=np.float64)

        logistic = np.array([h.logistic for h in curves], dtype=bool)
        high = np.array([h.high for h in curves], dtype=bool)
        a, b = arr([h.a for h in curves]), arr([h.b for h in curves])
        width = arr([h.b - h.a for h in curves])
        truncate = np.array([h.truncate for h in curves], dtype=bool)
        epsilon = arr([h.epsilon for h in curves])
        k, q = response_coefficients(epsilon)
        linear_truncate = truncate[~logistic]
        return cls(
            logistic=logistic,
            high=high,
            big_e=arr([h.expm1_eps for h in curves]),
            epsilon=epsilon,
            a=a,
            b=b,
            width=width,
            truncate=truncate,
            sign=arr([h.sign for h in curves]),
            side=np.where(high, 1.0, -1.0),
            other_side=np.where(high, -1.0, 1.0),
            own_zero=np.where(high, a, b),
            other_zero=np.where(high, b, a),
            slope=np.where(high, 1.0 / width, -1.0 / width),
            k=np.asarray(k, dtype=np.float64),
            q=np.asarray(q, dtype=np.float64),
            any_logistic=bool(logistic.any()),
            any_linear=bool((~logistic).any()),
            all_truncated=bool(linear_truncate.all()),
            any_truncated=bool(linear_truncate.any()),
        )

    def _linear(self, z: FloatArray, z_lo: FloatArray | None, slopes: bool) -> Responses:
        """``(t_own, 1 - t_own, dt_own/dz)`` of the ``linear`` curves (see :meth:`_responses`).

        ``(z - a) + lo`` for the high output and ``-((z - b) + lo)``, the same float as
        ``(b - z) - lo`` (rounding to nearest is symmetric), for the low one. Without
        ``slopes`` the third array is ``z`` itself (not computed).
        """
        own = z - self.own_zero
        other = z - self.other_zero
        if z_lo is not None:
            own = own + z_lo
            other = other + z_lo
        own = own * self.side
        other = other * self.other_side
        if self.any_truncated:
            own_clipped = np.minimum(np.maximum(own, 0.0), self.width)
            other_clipped = np.minimum(np.maximum(other, 0.0), self.width)
            if self.all_truncated:
                own, other = own_clipped, other_clipped
            else:
                own = np.where(self.truncate, own_clipped, own)
                other = np.where(self.truncate, other_clipped, other)
        dt = z
        if slopes and self.any_truncated:
            inside = (z >= self.a) & (z <= self.b)
            flat = inside if self.all_truncated else inside | ~self.truncate
            dt = np.where(flat, self.slope, 0.0)
        elif slopes:
            dt = np.broadcast_to(self.slope, z.shape)
        return own / self.width, other / self.width, dt

    def _logistic(self, z: FloatArray, slopes: bool) -> Responses:
        """``(σ(±z), σ(∓z), ±σ(z)σ(-z))`` of the logistic curves, ``+`` for the high output."""
        signed = z * self.side
        with np.errstate(over="ignore"):
            own = np.asarray(expit(signed), dtype=np.float64)
            other = np.asarray(expit(-signed), dtype=np.float64)
        return own, other, own * other * self.side if slopes else z

    def _responses(
        self, z: FloatArray, z_lo: FloatArray | None = None, slopes: bool = True
    ) -> Responses:
        """``(t_own, 1 - t_own, dt_own/dz)``, ``1 - t_own`` formed without cancellation.

        ``z_lo`` (optional) is the low part of a double-double query value ``z + z_lo``: a
        ``linear`` term's ``t`` is then ``((z - a) + z_lo)/(b - a)``, whose numerator is exact up
        to one rounding (Sterbenz: ``z - a`` is exact near ``a``), so ``t`` keeps its relative
        precision where ``z`` rounds to ``a`` — where ``log t`` has a slope of ``e^ε``. Logistic
        terms read ``z`` only (their slope is below 1: the caller charges ``|z_lo|``).
        Without ``slopes`` the third array is not computed (it is ``z`` or a mix with it).
        """
        z = np.asarray(z, dtype=np.float64)
        if not self.any_linear:
            return self._logistic(z, slopes)
        if not self.any_logistic:
            return self._linear(z, z_lo, slopes)
        lin_own, lin_other, lin_dt = self._linear(z, z_lo, slopes)
        log_own, log_other, log_dt = self._logistic(z, slopes)
        return (
            np.where(self.logistic, log_own, lin_own),
            np.where(self.logistic, log_other, lin_other),
            np.where(self.logistic, log_dt, lin_dt) if slopes else z,
        )

    def _log_prob(self, own: FloatArray, other: FloatArray) -> FloatArray:
        return np.asarray(
            self.sign * response_log_prob_with(own, other, self.k, self.q), dtype=np.float64
        )

    def _slope(self, own: FloatArray, dt: FloatArray) -> FloatArray:
        return np.asarray(self.sign * self.big_e * dt / (1.0 + own * self.big_e), dtype=np.float64)

    def values(self, z: FloatArray, z_lo: FloatArray | None = None) -> FloatArray:
        """``h_i(z[..., i])`` for every curve (cancellation-free, see ``response_log_prob``).

        ``z_lo``: low parts of double-double query values (see :meth:`_responses`).
        """
        own, other, _ = self._responses(z, z_lo, slopes=False)
        return self._log_prob(own, other)

    def derivs(self, z: FloatArray) -> FloatArray:
        """``h_i'(z[..., i])`` for every curve."""
        own, _, dt = self._responses(z)
        return self._slope(own, dt)

    def values_and_derivs(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """:meth:`values` and :meth:`derivs` at once (one pass over the responses)."""
        own, other, dt = self._responses(z)
        return self._log_prob(own, other), self._slope(own, dt)

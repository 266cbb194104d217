"""Log-space helpers, rational conversions and the rounding-error model of the engine.

Rounding model
--------------
Every log-likelihood array is float64. With unit roundoff ``u = 2**-53`` each elementary
operation on numbers of magnitude at most ``R`` errs by at most ``u * R``. The engine keeps, for
every likelihood state, a running bound ``err`` on ``|computed log P(x) - exact log P(x)|`` (both
up to one common additive constant, which cancels in ``max - min``), and reports the realized
loss as ``[loss - 2 err, loss + 2 err]``. Each update adds :func:`update_error` to ``err``: the
addition and the renormalisation (:data:`OPS_PER_UPDATE` roundings of numbers no larger than the
range of the state plus the range of the term), the error of the log-probability term itself
(computed with ``log1p``/``logaddexp``/``expm1``, a few ulp of ``1 + |term|``) and the deviation of
the sampler's exact rational probabilities from the float ones (a few ulp, see
:mod:`app.engine.sampling`).

Filter decisions then compare the certified upper bound against the budget minus
:data:`DECISION_MARGIN`; the margin keeps a mathematical tie (``loss after == budget``) on the
rejecting side, because in floating point it cannot be told apart from a value a hair above.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

#: Unit roundoff of float64.
UNIT_ROUNDOFF = 2.0**-53
#: Roundings charged per update of a likelihood state (add, subtract max, reductions).
OPS_PER_UPDATE = 4
#: Ulps charged for evaluating one log-probability with log1p/expm1/logaddexp.
ULPS_PER_LOGPROB = 8
#: Ulps charged for the sampler's rational probabilities versus the float log-probabilities.
ULPS_SAMPLER = 8
#: Absolute margin subtracted from the budget before comparing a certified upper bound with it.
#: Ties (upper bound equal to the budget up to this margin) are rejected.
DECISION_MARGIN = 1e-9


def update_error(state_range: float, term_range: float) -> float:
    r"""Rounding error added to a likelihood state by one update.

    .. math::

        \Delta_{err} = u\,\bigl(c_{ops}(R_P + R_t) + c_{log}(1 + R_t) + c_{smp}\bigr)

    where :math:`R_P` is the largest magnitude in the state, :math:`R_t` the largest magnitude of
    the log-probability term, :math:`u = 2^{-53}`, and the constants are
    :data:`OPS_PER_UPDATE`, :data:`ULPS_PER_LOGPROB` and :data:`ULPS_SAMPLER`.
    """
    return UNIT_ROUNDOFF * (
        OPS_PER_UPDATE * (state_range + term_range)
        + ULPS_PER_LOGPROB * (1.0 + term_range)
        + ULPS_SAMPLER
    )


def log1p_exp(x: float) -> float:
    r"""Return :math:`\log(1 + e^x)` without overflow."""
    return float(np.logaddexp(0.0, x))


def exact_fraction(x: float) -> Fraction:
    """The exact rational value of a float (a dyadic rational)."""
    return Fraction(*x.as_integer_ratio())


def decimal_fraction(x: float) -> Fraction:
    """The rational a user wrote: ``0.1`` -> ``1/10`` (the shortest decimal that round-trips).

    Used for declared ε and budgets so that basic composition of ten queries of ε = 0.1 sums to
    exactly 1.
    """
    return Fraction(repr(float(x)))


def certified_upper(x: float) -> Fraction:
    """A rational that is certainly not below the exact quantity ``x`` approximates.

    ``x`` is assumed to be computed with a relative error of at most 64 ulp; the result adds that
    much and rounds up.
    """
    bumped = x + 64.0 * UNIT_ROUNDOFF * max(1.0, abs(x))
    return exact_fraction(math.nextafter(bumped, math.inf))


def round_up_dyadic(x: Fraction, bits: int) -> Fraction:
    """The smallest multiple of ``2**-bits`` that is not below ``x``.

    Bounds the denominator of an exact upper bound without ever lowering it:

    >>> round_up_dyadic(Fraction(1, 3), 4)
    Fraction(3, 8)
    >>> round_up_dyadic(Fraction(1, 10**200), 64) == Fraction(1, 2**64)
    True
    """
    scale = 1 << bits
    return Fraction(-((-x.numerator * scale) // x.denominator), scale)


def float_up(x: Fraction) -> float:
    """The smallest float not below the rational ``x`` (integer cross-multiplication)."""
    num, den = x.numerator, x.denominator
    f = num / den  # correctly rounded
    a, b = f.as_integer_ratio()
    return f if a * den >= num * b else math.nextafter(f, math.inf)


def exp_lower(x: float) -> Fraction:
    """A rational ``r`` with ``0 < r <= e**x`` (the float exp rounded one ulp down).

    The randomised-response samplers use ``r`` in place of ``e**ε`` so that the privacy ratio of
    the distribution they actually sample is exactly ``r``, never above ``e**ε``.
    """
    return exact_fraction(math.nextafter(math.exp(x), 0.0))

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

Log-probabilities of two-output responses (``linear``, ``logistic``) are computed by
:func:`response_log_prob` as ``log(t k + q)`` with ``k = tanh(ε/2)``, ``q = 1/(e^ε + 1)``, never as
``log1p(t (e^ε - 1)) - log1p(e^ε)``: at ε = 100 the latter subtracts two ~100-nat numbers and errs
by a few ulp *of ε*, which swamps a loss of 1e-13 (issue 15 item 4). The form used here errs by
a few ulp of the result, so "a few ulp of ``1 + |term|``" above holds at every ε.

Filter decisions then compare the certified upper bound against the budget minus
:data:`DECISION_MARGIN`; the margin keeps a mathematical tie (``loss after == budget``) on the
rejecting side, because in floating point it cannot be told apart from a value a hair above.
Randomized-response histories are decided exactly instead (:mod:`app.engine.exact`), and their
samplers' probabilities are bracketed by :func:`exp_bracket`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, overload

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


def written_epsilon_error(magnitude: float) -> float:
    r"""How far a randomized-response log-probability from the float ε can be from the sampled one.

    The samplers draw with the ε the client wrote, ``ε_w`` (:func:`decimal_fraction`); the
    float ε is its nearest double, so :math:`|ε_w - ε_f| \le 2^{-53} ε`. Every log-probability
    of ``grr``, ``binary_rr`` and ``unary_encoding`` moves by at most :math:`|Δε|` (derivatives
    in ``[-1, 1]``) and has a magnitude of at least ``ε - 1`` (``ε/2`` and half the move for
    symmetric unary encoding), so the move is at most :math:`u (1 + |term|)`: the rounding error
    a term of that magnitude adds to the float rule, beyond the computation's own.
    """
    return UNIT_ROUNDOFF * (1.0 + magnitude)


@overload
def update_error(state_range: float, term_range: float) -> float: ...
@overload
def update_error(state_range: FloatArray, term_range: FloatArray) -> FloatArray: ...
def update_error(state_range: Any, term_range: Any) -> Any:
    r"""Rounding error added to a likelihood state by one update (elementwise on arrays).

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


def response_log_prob(
    own: FloatArray, other: FloatArray, epsilon: float | FloatArray
) -> FloatArray:
    r"""``log Pr`` of an output whose response is ``own`` (``other = 1 - own``, formed directly).

    .. math::

        \Pr = \frac{1 + t(e^\varepsilon - 1)}{e^\varepsilon + 1} = t\,k + q,\qquad
        k = \tanh(\varepsilon/2),\; q = \frac{1}{e^\varepsilon + 1},

    computed as ``log(own k + q)`` when that probability is at most 1/2 and as
    ``log1p(-(other k + q))`` otherwise. Both arguments are sums of non-negative products with a
    relative error of a few ulp (for ``own``, ``other`` in ``[0, 1]``), so the result errs by a
    few ulp of ``1 + |result|`` whatever ε — no two large numbers cancel.
    """
    k, q = response_coefficients(epsilon)
    return response_log_prob_with(own, other, k, q)


def response_coefficients(epsilon: float | FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(k, q) = (tanh(ε/2), 1/(e^ε + 1))``, the coefficients of :func:`response_log_prob`."""
    eps = np.asarray(epsilon, dtype=np.float64)
    return np.tanh(0.5 * eps), 1.0 / (1.0 + np.exp(eps))


def response_log_prob_with(
    own: FloatArray, other: FloatArray, k: FloatArray, q: FloatArray
) -> FloatArray:
    """:func:`response_log_prob` with its coefficients (:func:`response_coefficients`) given.

    Callers that evaluate the same curves many times (the continuous search) compute ``k`` and
    ``q`` once.
    """
    p_own = own * k + q
    p_other = other * k + q
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.log(p_own)
        large = np.log1p(-p_other)
    return np.asarray(np.where(p_own <= 0.5, small, large), dtype=np.float64)


def _split(a: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Veltkamp's split ``a = hi + lo`` with 26-bit halves (exact for ``|a| < 1e300``)."""
    c = 134217729.0 * a
    hi = c - (c - a)
    return hi, a - hi


def two_product(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Dekker's ``p = fl(a b)`` and the exact ``e = a b - p`` (no overflow or underflow)."""
    prod = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    return prod, a_lo * b_lo - (((prod - a_hi * b_hi) - a_lo * b_hi) - a_hi * b_lo)


def _two_sum(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Knuth's ``s = fl(a + b)`` and the exact ``e = a + b - s``."""
    total = a + b
    back = total - a
    return total, (a - (total - back)) + (b - back)


def exact_dot(
    points: FloatArray, theta: FloatArray, c: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``z = points @ theta.T + c`` and a bound on ``|z - exact z|`` that is 0 when ``z`` is exact.

    ``z`` is accumulated term by term with error-free transformations (Dekker's product, Knuth's
    sum): the exact value is ``s + Σ e_j`` with ``s`` the float sum and every ``e_j`` a float
    computed exactly. The result is ``fl(s + fl(Σ e_j))`` — as accurate as a sum in twice the
    precision — and the bound is the exact error of that last addition plus ``γ Σ|e_j|`` for
    the float sum of the ``e_j`` (zero when every operation was exact, e.g. at a vertex with
    representable coordinates). Products of non-zero factors that might underflow
    (``|p| < 2^-960``) add ``2^-1070`` each. Inputs are assumed finite with magnitudes below
    ``1e150`` (the engine's limit), so nothing overflows.

    Where the a priori bound ``(d + 2) u Σ|θ_k x_k|`` charges every evaluation, this one is zero
    at the points that matter most, where a term of slope ``e^80`` would otherwise turn one ulp
    of ``z`` into 1e19 nats (issue 15 item 5). The extra precision matters for finite domains
    too: ``3 × 0.1 - 0.3`` is ``2.8e-17`` exactly and ``5.6e-17`` in floats, and at ε = 100 a
    ``linear`` query's log-probability there is ``log t`` — 0.69 nats apart.
    """
    z, lo, bound = split_dot(points, theta, c)
    # |z - exact| <= |lo| + bound, the sum rounded up (zero when every operation was exact)
    return z, (np.abs(lo) + bound) * (1.0 + 4.0 * UNIT_ROUNDOFF)


def split_dot(
    points: FloatArray, theta: FloatArray, c: FloatArray, *, paired: bool = False
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``z = points @ theta.T + c`` as ``hi + lo`` (double-double) and a bound on its error.

    ``paired``: row ``i`` of ``points`` with row ``i`` of ``theta`` only (``z`` of shape ``(n,)``).

    :func:`exact_dot` without its final rounding: the exact value is
    ``s + Σ e_j`` (Dekker products, Knuth sums, every ``e_j`` a float), ``corr = fl(Σ e_j)``
    errs by at most ``γ Σ|e_j|`` and ``hi + lo = s + corr`` exactly (Knuth). The bound is 0 when
    every operation was exact; products that might underflow add ``2^-1070`` each.
    """
    p_count, d = points.shape
    shape = (p_count,) if paired else (p_count, theta.shape[0])
    s = np.broadcast_to(np.asarray(c, dtype=np.float64), shape).copy()
    corr = np.zeros_like(s)
    abs_err = np.zeros_like(s)
    # every product at once, coordinate first (the sums below must run in order, the products
    # need not): the same floats as one two_product per coordinate, in a few numpy calls
    a = points.T if paired else points.T[:, :, None]
    b = theta.T if paired else theta.T[:, None, :]
    prods, prod_errs = two_product(a, b)
    underflow = (np.abs(prods) < 2.0**-960) & (a != 0.0) & (b != 0.0)
    pads = np.where(underflow, 2.0**-1070, 0.0)
    abs_prod_errs = np.abs(prod_errs)
    for k in range(d):
        s, sum_err = _two_sum(s, prods[k])
        corr += prod_errs[k] + sum_err
        abs_err += abs_prod_errs[k] + np.abs(sum_err) + pads[k]
    hi, lo = _two_sum(s, corr)
    bound = abs_err * (4.0 * (2 * d + 2) * UNIT_ROUNDOFF) * (1.0 + 4.0 * UNIT_ROUNDOFF)
    bound = np.where(abs_err > 0.0, bound + 2.0**-1074, 0.0)
    return (
        np.asarray(hi, dtype=np.float64),
        np.asarray(lo, dtype=np.float64),
        np.asarray(bound, dtype=np.float64),
    )


def exact_lifted_dot(
    points: FloatArray,
    pairs: Sequence[tuple[int, int]],
    theta: FloatArray,
    c: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """``z = [x, m(x)] @ theta.T + c`` with ``m_k(x) = x_i x_j`` (``pairs``), as :func:`exact_dot`.

    ``theta`` has a column per coordinate of ``points`` and then one per monomial. Each monomial
    is split error-free (Dekker) into ``p + e = x_i x_j``, and both halves enter
    :func:`exact_dot` with the monomial's weight, so ``z`` is as accurate as for an affine query
    and the bound is again 0 when every operation was exact (a vertex with representable
    coordinates and products). Where a product may underflow (``|p| < 2^-960``) Dekker's ``e``
    is not exact: ``e`` is dropped and ``|θ_k| (u |p| + 2^-1074)`` charged instead. Without
    monomials this is :func:`exact_dot`. Monomials beyond ``1e290`` in magnitude (the split
    would overflow) fall back to the a priori bound ``(d + 3) u (|v|·|θ| + |c|)`` on the
    plain float sum.
    """
    if not pairs:
        return exact_dot(points, theta, c)
    d = points.shape[1]
    left = np.array([i for i, _ in pairs], dtype=np.int64)
    right = np.array([j for _, j in pairs], dtype=np.int64)
    a, b = points[:, left], points[:, right]
    weights = theta[:, d:]
    if not np.all(np.abs(a * b) < 1e290):
        lifted = np.hstack([points, a * b])
        z = lifted @ theta.T + c
        size = lifted.shape[1] + 3
        with np.errstate(invalid="ignore", over="ignore"):
            bound = size * UNIT_ROUNDOFF * (np.abs(lifted) @ np.abs(theta).T + np.abs(c))
            bound = bound * (1.0 + 4.0 * UNIT_ROUNDOFF)
        bound = np.where(np.isfinite(bound) & np.isfinite(z), bound, np.inf)
        return np.asarray(z, dtype=np.float64), np.asarray(bound, dtype=np.float64)
    prod, prod_err = two_product(a, b)
    underflow = (np.abs(prod) < 2.0**-960) & (a != 0.0) & (b != 0.0)
    prod_err = np.where(underflow, 0.0, prod_err)
    split = np.hstack([points, prod, prod_err])
    z, bound = exact_dot(split, np.hstack([theta, weights]), c)
    if np.any(underflow):
        lost = np.where(underflow, UNIT_ROUNDOFF * np.abs(prod) + 2.0**-1074, 0.0)
        extra = (lost @ np.abs(weights).T) * (1.0 + 4.0 * (len(pairs) + 2) * UNIT_ROUNDOFF)
        bound = np.where(extra > 0.0, np.nextafter(bound + extra, np.inf) + 2.0**-1074, bound)
    return z, bound


def log1p_exp(x: float) -> float:
    r"""Return :math:`\log(1 + e^x)` without overflow."""
    return float(np.logaddexp(0.0, x))


def exact_fraction(x: float) -> Fraction:
    """The exact rational value of a float (a dyadic rational)."""
    return Fraction(*x.as_integer_ratio())


def decimal_fraction(x: float) -> Fraction:
    """The rational a user wrote: ``0.1`` -> ``1/10`` (the shortest decimal that round-trips).

    Used for declared ε and budgets so that basic composition of ten queries of ε = 0.1 sums to
    exactly 1. Memoised by the float (a single submit asks it of the same ε and budget several
    times; a ``Fraction`` is immutable, so the cached one is shared).
    """
    return _decimal_of(float(x))


@lru_cache(maxsize=4096)
def _decimal_of(x: float) -> Fraction:
    return Fraction(repr(x))


@lru_cache(maxsize=4096)
def fraction_text(text: str) -> Fraction:
    """``Fraction(text)`` of a stored exact number (``"7/2"``, ``"0"``), parsed once per text.

    The ``objects`` row keeps ``Σ ε`` and F₀'s account as such texts, read by every decision;
    the parse is exact and the result immutable, so a cached one is the same number.
    """
    return Fraction(text)


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


def exact_affine(c: float, weights: Sequence[float], point: Sequence[float]) -> Fraction:
    """``c + Σ w_k x_k`` exactly, as a rational (floats are dyadic: one common power of two)."""
    parts = [c.as_integer_ratio()]
    for w, x in zip(weights, point, strict=True):
        wn, wd = w.as_integer_ratio()
        xn, xd = x.as_integer_ratio()
        parts.append((wn * xn, wd * xd))
    denominator = max(d for _, d in parts)
    return Fraction(sum(n * (denominator // d) for n, d in parts), denominator)


def float_down(x: Fraction) -> float:
    """The largest float not above the rational ``x``."""
    return -float_up(-x)


def exp_bracket(x: Fraction, bits: int) -> tuple[Fraction, Fraction]:
    r"""Rationals ``lo <= e**x <= hi`` with ``hi - lo <= 2**-bits * e**x`` (``x >= 0``).

    Integer arithmetic only, every rounding directed: ``x = y·2**s`` with ``y <= 1/2``; the
    Taylor series of ``e**y`` in fixed point with ``P`` fraction bits, each term rounded down for
    ``lo`` and up for ``hi`` (all terms are positive), the tail after the last term ``T_n``
    bounded by ``T_n`` itself (``Σ_{j>n} y^j/j! <= T_n Σ_i 2^-i``); then ``s`` squarings,
    rounded down and up. Each rounding costs one unit of ``2**-P`` and each squaring at most
    doubles the relative width, so ``P = bits + s + 24`` leaves the width below ``2**-bits``
    relative for any series shorter than 2**22 terms.

    >>> from decimal import Decimal, localcontext
    >>> with localcontext() as ctx:  # e**0.1 to 60 digits (error below 1e-59)
    ...     ctx.prec = 60
    ...     e = Fraction(Decimal("0.1").exp())
    >>> lo, hi = exp_bracket(Fraction(1, 10), 64)
    >>> slack = Fraction(1, 10**59)
    >>> lo <= e + slack and e - slack <= hi and hi - lo <= e / 2**64
    True
    """
    if x < 0:
        raise ValueError("x must be non-negative")
    s = 0
    while x > Fraction(1 << s, 2):
        s += 1
    y = x / (1 << s)
    prec = bits + s + 24
    a, b = y.numerator, y.denominator
    one = 1 << prec
    lo = hi = lo_t = hi_t = one
    k = 0
    while hi_t > 1:
        k += 1
        lo_t = lo_t * a // (b * k)
        hi_t = -((-hi_t * a) // (b * k))
        lo += lo_t
        hi += hi_t
    hi += hi_t  # the tail
    for _ in range(s):
        lo = (lo * lo) >> prec
        hi = -((-hi * hi) >> prec)
    return Fraction(lo, one), Fraction(hi, one)


def expit(x: Any) -> Any:
    """``scipy.special.expit(x)`` (the logistic ``1/(1 + e^-x)``), scipy.special imported on use.

    Importing scipy.special at module level added about 0.2 s of CPU to the start of every
    process that imports the engine (each CLI command, server worker and test process), most of
    which never evaluate a logistic; after the first call the import is a dictionary lookup.
    """
    from scipy.special import expit as scipy_expit

    return scipy_expit(x)

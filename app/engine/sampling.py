"""Exact sampling with a cryptographically secure generator.

All randomness comes from :mod:`secrets`; no ``random`` and no ``numpy.random``. A probability is
always an exact rational, and a Bernoulli draw compares a uniform integer drawn with
``secrets.randbelow`` against the rational's numerator, so the distribution sampled is *exactly*
the rational one (no ``random() < p`` on floats).

Where a mechanism's probabilities are floats (``linear``, ``logistic``, ``matrix``), each float is
turned into its exact dyadic value and the draw is exact for those values; the difference to the
real-valued probabilities (a few ulp) is charged to the rounding error of the likelihood state
(:mod:`app.engine.numerics`). The randomised-response mechanisms instead build their
probabilities from a rational ``r <= e**ε`` so that their sampled ratio never exceeds ``e**ε``.

Timing: draws do the same work whatever the true value — they walk every threshold rather than
stopping at the first match — so the time taken does not depend on the private value.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from fractions import Fraction


def bernoulli(p: Fraction) -> bool:
    """Return True with probability exactly ``p`` (``0 <= p <= 1``)."""
    # integer comparisons (a Fraction's denominator is positive): comparing Fractions goes
    # through the numbers ABCs, measured at a tenth of a survey member's sampling time
    if not 0 <= p.numerator <= p.denominator:
        raise ValueError("probability must lie in [0, 1]")
    return secrets.randbelow(p.denominator) < p.numerator


def bernoulli_and_index(p: Fraction, n: int) -> tuple[bool, int]:
    """An independent Bernoulli(``p``) draw and uniform index on ``0..n-1``, from one draw.

    ``u`` uniform on ``0..D·n-1`` (``D`` = p's denominator) makes ``(u mod D, u div D)`` uniform on
    ``0..D-1 × 0..n-1``, so the two parts are independent and each exactly distributed; one call
    to the operating system's generator instead of two.

    >>> from fractions import Fraction
    >>> keep, index = bernoulli_and_index(Fraction(1, 3), 4)
    >>> isinstance(keep, bool) and 0 <= index < 4
    True
    """
    if not 0 <= p.numerator <= p.denominator or n < 1:
        raise ValueError("probability must lie in [0, 1] and n be positive")
    u = secrets.randbelow(p.denominator * n)
    return u % p.denominator < p.numerator, u // p.denominator


def uniform_index(n: int) -> int:
    """Return an integer uniformly distributed on ``0..n-1``."""
    return secrets.randbelow(n)


def dyadic_weights(probabilities: Sequence[float]) -> list[int]:
    """Integer weights proportional to the exact values of non-negative floats.

    Each float is the dyadic rational ``m / 2**k``; scaling by the largest ``2**k`` gives integers
    whose ratios are exactly the floats' ratios.
    """
    ratios = [float(p).as_integer_ratio() for p in probabilities]
    if any(n < 0 for n, _ in ratios):
        raise ValueError("weights must be non-negative")
    scale = max(d for _, d in ratios)
    return [n * (scale // d) for n, d in ratios]


def categorical(weights: Sequence[int]) -> int:
    """Draw index ``i`` with probability ``weights[i] / sum(weights)``, exactly.

    Every threshold is compared (no early exit), so the work does not depend on the outcome.
    """
    total = sum(weights)
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    u = secrets.randbelow(total)
    index = 0
    cumulative = 0
    for w in weights[:-1]:
        cumulative += w
        index += u >= cumulative
    return index

"""Exact sampling with a cryptographically secure generator.

All randomness comes from :mod:`secrets`; no ``random`` and no ``numpy.random``. A probability is
always an exact rational, and a Bernoulli draw compares a uniform integer drawn with
``randbelow`` (below) against the rational's numerator, so the distribution sampled is *exactly*
the rational one (no ``random() < p`` on floats).

Where a mechanism's probabilities are floats (``linear``, ``logistic``, ``matrix``), each float is
turned into its exact dyadic value and the draw is exact for those values; the difference to the
real-valued probabilities (a few ulp) is charged to the rounding error of the likelihood state
(:mod:`app.engine.numerics`). The randomised-response mechanisms instead build their
probabilities from a rational ``r <= e**ε`` so that their sampled ratio never exceeds ``e**ε``.

Timing: draws do the same work whatever the true value — they walk every threshold rather than
stopping at the first match — so the time taken does not depend on the private value.

Uniform integers come from :func:`randbelow`: the operating system's generator read through
``secrets.token_bytes`` in blocks of :data:`BLOCK` bytes (one system call per block instead of one
per draw: a survey draws a million times, and the per-draw calls were a quarter of its Python
time in a profile), with rejection sampling on exactly as many bits as needed, as
``secrets.randbelow`` does.
Each thread has its own block, and a forked child discards what it inherited (two processes never
share bytes).
"""

from __future__ import annotations

import os
import secrets
import struct
import threading
from collections.abc import Sequence
from fractions import Fraction

#: Bytes read from the operating system's generator at a time (512 words of 64 bits).
BLOCK = 4096
_WORDS = struct.Struct(f"<{BLOCK // 8}Q")


class _Entropy(threading.local):
    """Unread 64-bit words from ``secrets.token_bytes``, one list per thread."""

    def __init__(self) -> None:
        self.words: list[int] = []

    def word(self) -> int:
        """The next unread word (a new block when these run out)."""
        if not self.words:
            self.words = list(_WORDS.unpack(secrets.token_bytes(BLOCK)))
        return self.words.pop()


_entropy = _Entropy()


def _forget_inherited_entropy() -> None:
    """In a forked child: drop the parent's unread words (the child must draw its own)."""
    global _entropy
    _entropy = _Entropy()


os.register_at_fork(after_in_child=_forget_inherited_entropy)


def randbelow(n: int) -> int:
    """An integer uniformly distributed on ``0..n-1``, exactly (``n >= 1``).

    Takes ``(n - 1).bit_length()`` random bits (the top bits of as many 64-bit words as needed)
    and rejects values ``>= n`` (fewer than two tries on average), like ``secrets.randbelow``.

    >>> all(0 <= randbelow(6) < 6 for _ in range(100)), randbelow(1)
    (True, 0)
    """
    if n < 1:
        raise ValueError("n must be positive")
    bits = (n - 1).bit_length()
    if bits == 0:
        return 0
    entropy = _entropy
    while True:
        if bits <= 64:
            u = entropy.word() >> (64 - bits)
        else:
            u, have = 0, 0
            while have < bits:
                u, have = (u << 64) | entropy.word(), have + 64
            u >>= have - bits
        if u < n:
            return u


def bernoulli(p: Fraction) -> bool:
    """Return True with probability exactly ``p`` (``0 <= p <= 1``)."""
    # integer comparisons (a Fraction's denominator is positive): comparing Fractions goes
    # through the numbers ABCs, measured at a tenth of a survey member's sampling time
    if not 0 <= p.numerator <= p.denominator:
        raise ValueError("probability must lie in [0, 1]")
    return randbelow(p.denominator) < p.numerator


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
    u = randbelow(p.denominator * n)
    return u % p.denominator < p.numerator, u // p.denominator


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
    u = randbelow(total)
    index = 0
    cumulative = 0
    for w in weights[:-1]:
        cumulative += w
        index += u >= cumulative
    return index

"""Exact sampling with a cryptographically secure generator.

All randomness comes from :mod:`secrets`; no ``random`` and no ``numpy.random``. A probability is
always an exact rational, and a Bernoulli draw compares a uniform integer drawn with
``randbelow`` (below) against the rational's numerator, so the distribution sampled is *exactly*
the rational one (no ``random() < p`` on floats).

Where a mechanism's probabilities are floats (``linear``, ``logistic``, ``matrix``), each float is
turned into its exact dyadic value and the draw is exact for those values; the difference to the
real-valued probabilities (a few ulp) is charged to the rounding error of the likelihood state
(:mod:`app.engine.numerics`). The randomised-response mechanisms instead sample their real
probabilities exactly, irrational as they are (:class:`RealProbability`): ``e^ε/(c + e^ε)`` for
the ε the client wrote, so the log-likelihood ratio actually sampled *is* the written ε.

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
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from app.engine.numerics import exp_bracket

U64 = npt.NDArray[np.uint64]

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


def words(count: int) -> U64:
    """``count`` independent uniform 64-bit words from **one** ``secrets.token_bytes`` call.

    For a survey chunk's draws at once (:func:`randbelow_array`, :meth:`RealProbability.draw_many`):
    each word is 8 bytes of the operating system's generator, every byte uniform and
    independent, so each word is uniform on ``[0, 2^64)`` and the words are independent of
    each other and of every other draw (no byte is read twice).
    """
    if count < 0:
        raise ValueError("count must be non-negative")
    return np.frombuffer(secrets.token_bytes(8 * count), dtype="<u8").astype(np.uint64)


def randbelow_array(n: int, count: int) -> U64:
    """``count`` independent integers, each uniform on ``0..n-1`` exactly (``1 <= n <= 2^63``).

    :func:`randbelow`'s rejection sampling, vectorised: each try takes the top
    ``b = (n - 1).bit_length()`` bits of a fresh word from :func:`words`, uniform on
    ``[0, 2^b)``, and keeps it if below ``n``. Conditioned on being kept a try is uniform on
    ``[0, n)`` (every kept value has probability ``2^-b`` before conditioning), the tries are
    independent, and a position's result is its first kept try (``2^b < 2n``: fewer than two
    tries on average; the positions still rejected draw again, all in one call). Whether a
    position is kept depends only on its own word, never on another position's value.
    """
    if not 1 <= n <= 1 << 63:
        raise ValueError("n must lie in [1, 2^63]")
    out = np.zeros(count, dtype=np.uint64)
    bits = (n - 1).bit_length()
    if bits == 0:
        return out
    todo = np.arange(count)
    shift, bound = np.uint64(64 - bits), np.uint64(n)
    while todo.size:
        tries = words(todo.size) >> shift
        kept = tries < bound
        out[todo[kept]] = tries[kept]
        todo = todo[~kept]
    return out


def bernoulli(p: Fraction) -> bool:
    """Return True with probability exactly ``p`` (``0 <= p <= 1``)."""
    # integer comparisons (a Fraction's denominator is positive): comparing Fractions goes
    # through the numbers ABCs, measured at a tenth of a survey member's sampling time
    if not 0 <= p.numerator <= p.denominator:
        raise ValueError("probability must lie in [0, 1]")
    return randbelow(p.denominator) < p.numerator


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


#: Bits of a :class:`RealProbability`'s first comparison (one 64-bit word).
FIRST_BITS = 64
#: A probability's bracket at ``bits``: integers ``lo <= p·2**bits <= hi``.
Bracket = Callable[[int], tuple[int, int]]


class RealProbability:
    r"""A probability ``p`` (rational or not) known through certified brackets of any precision.

    :meth:`draw` returns True with probability exactly ``p``: it reveals a uniform real ``U`` in
    ``[0, 1)`` 64 bits at a time — after ``n`` bits ``U ∈ [u/2^n, (u+1)/2^n)`` — and compares it
    with a bracket ``[lo, hi]/2^n`` of ``p``: ``U < p`` is certain when ``u + 1 <= lo``, and
    ``U >= p`` when ``u >= hi``; otherwise both are refined by 64 bits. ``Pr(U < p) = p``, and
    the loop ends with probability 1 (a step is undecided with probability about
    ``(hi - lo + 1)/2^n``, here a few times ``2**-64``). The first bracket is computed once, so a
    draw is one 64-bit word and two integer comparisons, the same work for any ``p``.
    """

    def __init__(self, bracket: Bracket) -> None:
        self._bracket = bracket
        self.first = bracket(FIRST_BITS)

    @classmethod
    def rational(cls, p: Fraction) -> RealProbability:
        """An exact rational ``p`` in ``[0, 1]``."""
        if not 0 <= p <= 1:
            raise ValueError("probability must lie in [0, 1]")
        return cls(lambda bits: (_floor(p, bits), _ceil(p, bits)))

    def bracket(self, bits: int) -> tuple[int, int]:
        """Integers ``lo <= p·2**bits <= hi``."""
        return self.first if bits == FIRST_BITS else self._bracket(bits)

    def draw(self) -> bool:
        """True with probability exactly ``p``."""
        return self._settle(randbelow(1 << FIRST_BITS))

    def draw_many(self, count: int) -> npt.NDArray[np.bool_]:
        """``count`` independent draws (each True with probability exactly ``p``), at once.

        The first 64 bits of every draw's ``U`` are one word of a single :func:`words` call;
        each draw is then settled exactly as :meth:`draw` settles it (the first-bracket
        comparisons vectorised: ``U < p`` when ``word < lo``, ``U >= p`` when ``word >= hi``),
        and the rare word inside the bracket is refined with fresh words by the same loop, so
        each result has :meth:`draw`'s distribution and the draws are independent.
        """
        lo, hi = self.first
        first = words(count)
        top = 1 << FIRST_BITS  # lo and hi lie in [0, 2^64]; a word lies below 2^64
        below = first < np.uint64(lo) if lo < top else np.ones(count, dtype=bool)
        above = first >= np.uint64(hi) if hi < top else np.zeros(count, dtype=bool)
        drawn = below.copy()
        for i in np.flatnonzero(~(below | above)).tolist():
            drawn[i] = self._settle(int(first[i]))
        return drawn

    def _settle(self, u: int) -> bool:
        """``U < p`` for ``U``'s first 64 bits ``u``, drawing more bits while undecided."""
        lo, hi = self.first
        bits = FIRST_BITS
        while True:
            if u + 1 <= lo:
                return True
            if u >= hi:
                return False
            bits += FIRST_BITS
            u = (u << FIRST_BITS) | randbelow(1 << FIRST_BITS)
            lo, hi = self._bracket(bits)


def _floor(x: Fraction, bits: int) -> int:
    return (x.numerator << bits) // x.denominator


def _ceil(x: Fraction, bits: int) -> int:
    return -((-x.numerator << bits) // x.denominator)


@lru_cache(maxsize=1024)
def rr_probability(epsilon: Fraction, others: int) -> RealProbability:
    """``e^ε / (others + e^ε)``: the "report the truth" probability of randomized response.

    Memoised by ``(ε, others)`` (as :func:`rr_complement`): a :class:`RealProbability` is
    immutable (its first bracket and the bracket function), so one per pair serves every
    mechanism that asks — a single submit parses its query anew and would bracket ``e^ε`` again.
    """
    if others < 0 or epsilon < 0:
        raise ValueError("needs epsilon >= 0 and others >= 0")

    def bracket(bits: int) -> tuple[int, int]:
        # increasing in e^ε; a relative width 2**-(bits+4) of e^ε moves p by at most 2**-(bits+6)
        lo, hi = exp_bracket(epsilon, bits + 4)
        return _floor(lo / (others + lo), bits), _ceil(hi / (others + hi), bits)

    return RealProbability(bracket)


@lru_cache(maxsize=1024)
def rr_complement(epsilon: Fraction, others: int) -> RealProbability:
    """``others / (others + e^ε)``: one minus :func:`rr_probability` (its complement event)."""
    if others < 0 or epsilon < 0:
        raise ValueError("needs epsilon >= 0 and others >= 0")

    def bracket(bits: int) -> tuple[int, int]:
        lo, hi = exp_bracket(epsilon, bits + 4)  # decreasing in e^ε
        return _floor(others / (others + hi), bits), _ceil(others / (others + lo), bits)

    return RealProbability(bracket)

"""Decode ``olh`` and ``hadamard`` reports on the client: the hash, the Hadamard sign, estimators.

The gatekeeper's ``olh`` outputs are ``{"seed": "<decimal>", "bucket": b}`` and its ``hadamard``
outputs are column numbers; this module recomputes what they say about each value, exactly as
the server does (docs/oracles.md of the server repository), so a client can check a survey's
estimate or decode reports it stored itself. Pure Python (no numpy needed); the server decodes
millions of reports vectorised.

>>> olh_hash(12345, 0, 4), olh_hash(12345, 3, 4)
(2, 3)
>>> [hadamard_sign(3, column) for column in range(4)]
[1, -1, -1, 1]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Frequency",
    "default_g",
    "estimate_frequencies",
    "hadamard_columns",
    "hadamard_sign",
    "olh_hash",
    "support_counts",
]

#: The Mersenne prime of the olh hash.
PRIME = (1 << 61) - 1
_MASK = (1 << 64) - 1
#: The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054


def _splitmix64(state: int) -> tuple[int, int]:
    out = []
    for _ in range(2):
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        out.append(z ^ (z >> 31))
    return out[0], out[1]


def olh_hash(seed: int | str, index: int, g: int) -> int:
    """``h_seed(index)``: the bucket of the value with 0-based ``index``.

    ``seed`` may be the decimal string of an output.
    """
    first, second = _splitmix64(int(seed))
    a, b = first % (PRIME - 1) + 1, second % PRIME
    return ((a * index + b) % PRIME) % g


def default_g(epsilon: float, k: int) -> int:
    """The server's default ``g``: ``round(e^ε) + 1`` within ``[2, max(2, k)]``."""
    return max(2, min(round(math.exp(min(epsilon, 700.0))) + 1, max(2, k)))


def hadamard_columns(k: int) -> int:
    """``K``: the smallest power of 2 above ``k``."""
    return 1 << k.bit_length()


def hadamard_sign(row: int, column: int) -> int:
    """``H[row, column] = (−1)^popcount(row & column)``; value ``i`` owns row ``i + 1``."""
    return -1 if bin(row & column).count("1") % 2 else 1


def support_counts(mechanism: Mapping[str, Any], outputs: Iterable[Any], k: int) -> list[int]:
    """Per value index, how many of ``outputs`` it supports.

    ``mechanism`` is the query as sent (``{"mechanism": "olh", "epsilon": ...}``, with or without
    ``g``: the server's default when absent) or ``{"mechanism": "hadamard", ...}``; ``olh``
    outputs are ``{"seed", "bucket"}`` objects, ``hadamard`` outputs column numbers.
    """
    counts = [0] * k
    kind = mechanism["mechanism"]
    g = _g(mechanism, k)
    for output in outputs:
        for v in range(k):
            if kind == "olh":
                hit = olh_hash(output["seed"], v, g) == int(output["bucket"])
            elif kind == "hadamard":
                hit = hadamard_sign(v + 1, int(output)) == 1
            else:
                raise ValueError(f"not a frequency oracle: {kind}")
            counts[v] += hit
    return counts


def _g(mechanism: Mapping[str, Any], k: int) -> int:
    """An ``olh`` query's ``g``: as sent, or the server's default for ``k`` values."""
    if mechanism.get("g") is not None:
        return int(mechanism["g"])
    return default_g(float(mechanism["epsilon"]), k)


@dataclass(frozen=True)
class Frequency:
    """One value's estimated frequency, its plug-in standard error and 95% Wilson interval."""

    value: float
    stderr: float
    ci95: tuple[float, float]


def estimate_frequencies(
    mechanism: Mapping[str, Any], counts: list[int], n: int
) -> list[Frequency]:
    """Unbiased per-value frequencies from support counts, as the server's survey ``estimate``.

    ``counts`` has one entry per value of the attribute, in its order (``k = len(counts)``).

    ``(c_v/n − q)/(p − q)`` with ``p = E/(E+g−1), q = 1/g`` (olh) or ``p = E/(1+E), q = 1/2``
    (hadamard), ``E = e^ε``; never clipped.
    """
    eps = float(mechanism["epsilon"])
    tail = math.exp(-eps)
    if mechanism["mechanism"] == "olh":
        g = _g(mechanism, len(counts))
        gap, q = -math.expm1(-eps) * (g - 1) / (g * (1.0 + (g - 1) * tail)), 1.0 / g
    else:
        gap, q = -math.expm1(-eps) / (1.0 + tail) / 2.0, 0.5
    z2 = Z95 * Z95
    found = []
    for count in counts:
        share = count / n
        centre = (share + z2 / (2 * n)) / (1 + z2 / n)
        half = Z95 * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
        low, high = max(0.0, centre - half), min(1.0, centre + half)
        found.append(
            Frequency(
                (share - q) / gap,
                math.sqrt(share * (1 - share) / n) / gap,
                ((low - q) / gap, (high - q) / gap),
            )
        )
    return found

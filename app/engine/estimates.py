"""Unbiased population estimates from a survey's randomized answers (paper §2.4, appendix E).

Every estimator here inverts a randomized response: a member reports a 0/1 indicator ``Y`` whose
mean given its true value is ``q + (p − q)·T``, where ``T`` ∈ {0, 1} is the truth of interest
and ``p > q`` the mechanism's report probabilities. Over ``n`` accepted members with sample mean
``π̂ = Σ Y / n``::

    θ̂ = (π̂ − q) / (p − q)        E[θ̂] = mean of T        (unbiased, never clipped)

* ``binary_rr`` — ``T`` = the predicate's truth; ``p = E/(1+E)``, ``q = 1/(1+E)`` (``E = e^ε``);
* ``grr`` — per value ``v``: ``T = [x = v]``; ``p = E/(k−1+E)``, ``q = 1/(k−1+E)`` (eqs. 73–76);
* ``unary_encoding`` — per value ``v``: ``Y`` = bit ``v``; optimized ``p = 1/2, q = 1/(E+1)``,
  symmetric ``p = e^{ε/2}/(e^{ε/2}+1), q = 1 − p``;
* ``linear`` — output ``b`` is reported with probability ``q + (p − q)·t``, ``t = (y−a)/(b−a)``
  (eq. 8), so the mean of ``y`` is ``a + (b − a)·θ̂`` with the binary ``p, q``; this is eq. 9,
  which prints ``a + b(…)`` — right only when ``a = 0`` (docs/surveys.md derives it);
* ``logistic`` — ``t`` = the sigmoid; the mean of the sigmoid is ``θ̂``;
* ``olh`` — per value ``v``: ``Y = [h_seed(v) = bucket]`` (``v`` *supports* the report); ``p =
  E/(E+g−1)``, ``q = 1/g`` (Wang et al. 2017: for ``x ≠ v`` the pair collides with probability
  ``1/g`` over the random seed, and then the reported bucket is ``h(x)`` with ``p``, another with
  ``(1−p)/(g−1)``: ``p/g + (1 − 1/g)(1−p)/(g−1) = 1/g``; the seeds' ``mod p`` reduction and the
  SplitMix64 derivation bias this by less than ``2^-55``, far below any survey's error);
* ``hadamard`` — per value ``v``: ``Y = [H[v+1, j] = +1]``; ``p = E/(1+E)``, ``q = 1/2`` (for
  ``x ≠ v`` the rows are orthogonal: half of either sign's columns of row ``x+1`` are +1 in row
  ``v+1``). Support counts of all values at once: ``Σ_j c_j H[v+1, j] = (H c)[v+1]`` by one fast
  Walsh–Hadamard transform of the per-column counts ``c`` (O(K log K)).

``stderr`` is the plug-in ``scale·sqrt(π̂(1−π̂)/n)/(p−q)``; ``ci95`` maps the Wilson score
interval of ``π`` through the same affine map (it stays sensible for small ``n`` and for
``π̂`` at 0 or 1, where the plug-in standard error is 0). Intervals of a histogram are per
value, not simultaneous. ``p − q`` is computed from ``e^{−ε}`` and ``expm1``, so no ε
overflows.

>>> from app.engine.domain import parse_domain
>>> from app.engine.mechanisms import parse_query
>>> domain = parse_domain({"attributes": [{"name": "sick", "type": "integer", "low": 0,
...                                        "high": 1}]})
>>> rr = parse_query({"mechanism": "binary_rr", "epsilon": 1.0,
...                   "predicate": {"attribute": "sick", "op": "==", "value": 1}}, domain)
>>> found = estimate(rr, 1000, {"1": 400, "0": 600})
>>> found.value["kind"], round(found.value["value"], 4), round(found.value["stderr"], 4)
('proportion', 0.2836, 0.0335)
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine.mechanisms import Mechanism, Output
from app.engine.mechanisms.base import output_bits
from app.engine.mechanisms.matrix import MatrixMechanism
from app.engine.mechanisms.oracles import (
    HASH_PRIME,
    HadamardResponse,
    OptimizedLocalHashing,
    hash_coefficients_array,
)
from app.engine.mechanisms.randomized_response import BinaryRR, GeneralizedRR
from app.engine.mechanisms.regression import LinearQuery, LogisticQuery
from app.engine.mechanisms.unary_encoding import UnaryEncoding

#: The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A survey's estimate as JSON (``value``), or ``None`` and why (``reason``)."""

    value: dict[str, Any] | None
    reason: str | None


def tally_keys(mechanism: Mechanism, output: Output) -> tuple[str, ...]:
    """The counters one accepted output increments.

    The output's JSON text; for ``unary_encoding`` one key per bit that is 1, named by the JSON
    text of the value it encodes (so a survey keeps ``k`` counts, never one per bit vector); for
    ``olh`` and ``hadamard`` one key per value the output supports (:func:`tally_outputs`
    decodes batches faster).
    """
    if isinstance(mechanism, (OptimizedLocalHashing, HadamardResponse)):
        return tuple(tally_outputs(mechanism, [output]))
    if isinstance(mechanism, UnaryEncoding):
        attribute = mechanism.attribute
        bits = output_bits(output)
        return tuple(json.dumps(attribute.value_at(i)) for i, bit in enumerate(bits) if bit)
    return (json.dumps(mechanism.output_json(output)),)


#: Reports decoded per block by :func:`olh_support_counts` (the block's hash state is
#: ``block × 3`` uint64 words: cache-sized, and memory stays flat however many reports).
OLH_BLOCK = 1 << 16


def olh_support_counts(
    seeds: npt.NDArray[np.uint64], buckets: npt.NDArray[np.int64], k: int, g: int
) -> npt.NDArray[np.int64]:
    """How many reports each value supports: ``#{r : h_{seed_r}(v) = bucket_r}`` per value.

    Vectorised over blocks of reports (on every core: numpy releases the GIL), one pass per
    value, with no division in the loop:

    * ``x_v = a·v + b (mod p)`` advances by ``a`` from one value to the next: an add and the
      wrap-around ``min(x, x − p)`` in uint64;
    * ``x mod g = bucket`` iff ``g`` divides ``y = x + g − bucket`` (``< 2^62``). With
      ``g = o·2^s``, ``o`` odd: ``g | y`` iff ``rotr(y·o⁻¹ mod 2^64, s) <= ⌊(2^64−1)/g⌋``
      (Granlund and Montgomery; Warren, *Hacker's Delight* §10-17) — a multiply, a rotation
      and a compare instead of a 64-bit remainder (measured 2× faster per value).

    >>> import numpy as np
    >>> from app.engine.mechanisms.oracles import olh_hash_value
    >>> seeds = np.array([3, 99, 2**63], dtype=np.uint64)
    >>> for g in (4, 6, 7):
    ...     buckets = np.array([olh_hash_value(3, 2, g), 1, 0])
    ...     counts = olh_support_counts(seeds, buckets, 5, g)
    ...     assert counts.tolist() == [
    ...         sum(olh_hash_value(int(s), v, g) == b for s, b in zip(seeds, buckets))
    ...         for v in range(5)]
    """
    blocks = range(0, len(seeds), OLH_BLOCK)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        parts = pool.map(
            lambda start: _olh_block(
                np.asarray(seeds[start : start + OLH_BLOCK], dtype=np.uint64),
                np.asarray(buckets[start : start + OLH_BLOCK], dtype=np.uint64),
                k,
                g,
            ),
            blocks,
        )
        return np.sum(list(parts), axis=0, dtype=np.int64) if blocks else np.zeros(k, np.int64)


def _olh_block(
    seeds: npt.NDArray[np.uint64], buckets: npt.NDArray[np.uint64], k: int, g: int
) -> npt.NDArray[np.int64]:
    """:func:`olh_support_counts` of one block of reports."""
    counts = np.zeros(k, dtype=np.int64)
    prime = np.uint64(HASH_PRIME)
    s = (g & -g).bit_length() - 1
    odd = g >> s
    inverse = np.uint64(pow(odd, -1, 1 << 64))
    limit = np.uint64(((1 << 64) - 1) // g)
    right, left = np.uint64(s), np.uint64((64 - s) % 64)
    a, x = hash_coefficients_array(seeds)  # x = a·0 + b
    shift = np.uint64(g) - buckets
    y, spare = np.empty_like(x), np.empty_like(x)
    hit = np.empty(x.shape, dtype=bool)
    with np.errstate(over="ignore"):
        for v in range(k):
            np.add(x, shift, out=y)
            if odd != 1:
                np.multiply(y, inverse, out=y)
            if s:
                np.right_shift(y, right, out=spare)
                np.left_shift(y, left, out=y)
                np.bitwise_or(y, spare, out=y)
            np.less_equal(y, limit, out=hit)
            counts[v] = np.count_nonzero(hit)
            np.add(x, a, out=x)
            np.subtract(x, prime, out=spare)
            np.minimum(x, spare, out=x)
    return counts


def hadamard_support_counts(
    columns: npt.NDArray[np.int64], k: int, size: int
) -> npt.NDArray[np.int64]:
    """``#{r : H[v+1, j_r] = +1}`` per value from the reported columns (``size`` = K).

    >>> import numpy as np
    >>> hadamard_support_counts(np.array([0, 1, 3, 3]), 3, 4).tolist()
    [1, 2, 3]
    """
    transformed = np.bincount(np.asarray(columns, dtype=np.int64), minlength=size)
    h = 1
    while h < size:  # fast Walsh–Hadamard transform, in place: (x, y) -> (x + y, x - y)
        view = transformed.reshape(-1, 2 * h)
        left = view[:, :h].copy()
        view[:, :h] += view[:, h:]
        view[:, h:] = left - view[:, h:]
        h *= 2
    n = len(columns)
    return np.asarray((n + transformed[1 : k + 1]) // 2, dtype=np.int64)


def tally_outputs(
    mechanism: Mechanism, outputs: Sequence[Output], counts: Sequence[int] | None = None
) -> Counter[str]:
    """The counters a batch of accepted outputs increments (:func:`tally_keys` of each).

    ``counts`` (optional): how many members gave each output (a survey's decision group has them
    already: ``outputs`` are then distinct). ``olh`` and ``hadamard`` are decoded for the whole
    batch at once: per value, the number of reports it supports, named by the value's JSON text
    (a survey keeps ``k`` counts).
    """
    weights = [1] * len(outputs) if counts is None else list(counts)
    if isinstance(mechanism, (OptimizedLocalHashing, HadamardResponse)) and outputs:
        if isinstance(mechanism, OptimizedLocalHashing):
            pairs = np.repeat(np.array(outputs, dtype=np.uint64).reshape(-1, 2), weights, axis=0)
            support = olh_support_counts(
                pairs[:, 0], pairs[:, 1].astype(np.int64), mechanism.k, mechanism.g
            )
        else:
            cols = np.repeat(np.array(outputs, dtype=np.int64), weights)
            support = hadamard_support_counts(cols, mechanism.k, mechanism.output_count)
        attribute = mechanism.attribute
        return Counter(
            {json.dumps(attribute.value_at(i)): int(c) for i, c in enumerate(support) if c}
        )
    distinct: Counter[Output] = Counter()
    for output, weight in zip(outputs, weights, strict=True):
        distinct[output] += weight
    tally: Counter[str] = Counter()
    for output, count in distinct.items():  # each distinct output's keys once
        for key in tally_keys(mechanism, output):
            tally[key] += count
    return tally


def output_histogram(mechanism: Mechanism, counts: Mapping[str, int]) -> dict[str, int]:
    """The raw counts by output (JSON text of the output; per value for unary encoding)."""
    if isinstance(
        mechanism, (GeneralizedRR, UnaryEncoding, OptimizedLocalHashing, HadamardResponse)
    ):
        attribute = mechanism.attribute
        keys = [json.dumps(attribute.value_at(i)) for i in range(mechanism.k)]
        return {key: int(counts.get(key, 0)) for key in keys}
    return {key: int(count) for key, count in sorted(counts.items())}


def _binary_pq(eps: float) -> tuple[float, float]:
    """``p − q`` and ``q`` of binary randomized response, ``E = e^ε``, overflow-free."""
    tail = math.exp(-eps)  # 1/E
    return -math.expm1(-eps) / (1.0 + tail), tail / (1.0 + tail)


def _grr_pq(eps: float, k: int) -> tuple[float, float]:
    tail = math.exp(-eps)
    return -math.expm1(-eps) / (1.0 + (k - 1) * tail), tail / (1.0 + (k - 1) * tail)


def _olh_pq(eps: float, g: int) -> tuple[float, float]:
    """``p − q`` and ``q = 1/g`` of OLH: ``p = E/(E+g−1)``, so ``p − q = (E−1)(g−1)/(g(E+g−1))``."""
    tail = math.exp(-eps)
    return -math.expm1(-eps) * (g - 1) / (g * (1.0 + (g - 1) * tail)), 1.0 / g


def _ue_pq(eps: float, variant: str) -> tuple[float, float]:
    if variant == "symmetric":
        half = math.exp(-eps / 2.0)
        return -math.expm1(-eps / 2.0) / (1.0 + half), half / (1.0 + half)
    q = math.exp(-eps) / (1.0 + math.exp(-eps))  # 1/(E+1)
    return 0.5 - q, q


def _wilson(share: float, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of a binomial proportion."""
    z2 = Z95 * Z95
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class _Inverted:
    value: float
    stderr: float
    ci95: list[float]


def _invert(count: int, n: int, gap: float, q: float, low: float, width: float) -> _Inverted:
    """``low + width·(π̂ − q)/(p − q)`` with its plug-in stderr and mapped Wilson interval."""
    share = count / n
    scale = width / gap
    lo, hi = _wilson(share, n)
    return _Inverted(
        low + scale * (share - q),
        scale * math.sqrt(share * (1 - share) / n),
        [low + scale * (lo - q), low + scale * (hi - q)],
    )


def estimate(mechanism: Mechanism, n: int, counts: Mapping[str, int]) -> Estimate:
    """The population estimate of contract.md's table from ``n`` accepted outputs.

    ``counts`` are the tally (:func:`tally_keys`). Every estimate carries ``n``, ``stderr``
    and ``ci95``; ``matrix`` has none (no generic estimator), nor has an empty survey.
    """
    if isinstance(mechanism, MatrixMechanism):
        return Estimate(None, "no generic estimator for a matrix mechanism")
    if n <= 0:
        return Estimate(None, "no accepted members")
    if isinstance(mechanism, BinaryRR):
        gap, q = _binary_pq(mechanism.eps)
        found = _invert(int(counts.get("1", 0)), n, gap, q, 0.0, 1.0)
        return Estimate(_scalar("proportion", found, n), None)
    if isinstance(mechanism, LinearQuery):
        gap, q = _binary_pq(mechanism.eps)
        high = json.dumps(mechanism.output_json(1))
        found = _invert(int(counts.get(high, 0)), n, gap, q, mechanism.a, mechanism.b - mechanism.a)
        return Estimate(_scalar("mean", found, n), None)
    if isinstance(mechanism, LogisticQuery):
        gap, q = _binary_pq(mechanism.eps)
        found = _invert(int(counts.get("1", 0)), n, gap, q, 0.0, 1.0)
        return Estimate(_scalar("mean", found, n), None)
    if isinstance(
        mechanism, (GeneralizedRR, UnaryEncoding, OptimizedLocalHashing, HadamardResponse)
    ):
        if isinstance(mechanism, GeneralizedRR):
            gap, q = _grr_pq(mechanism.eps, mechanism.k)
        elif isinstance(mechanism, OptimizedLocalHashing):
            gap, q = _olh_pq(mechanism.eps, mechanism.g)
        elif isinstance(mechanism, HadamardResponse):
            # p − 1/2 = E/(1+E) − 1/2 = (E−1)/(2(E+1)): half binary RR's p − q
            gap, q = _binary_pq(mechanism.eps)[0] / 2.0, 0.5
        else:
            gap, q = _ue_pq(mechanism.eps, mechanism.variant)
        if mechanism.k < 2 or gap <= 0.0:
            return Estimate(None, "the attribute has a single value: nothing to estimate")
        values: dict[str, float] = {}
        stderr: dict[str, float] = {}
        ci95: dict[str, list[float]] = {}
        for i in range(mechanism.k):
            label = str(mechanism.attribute.value_at(i))
            found = _invert(
                int(counts.get(json.dumps(mechanism.attribute.value_at(i)), 0)), n, gap, q, 0.0, 1.0
            )
            values[label], stderr[label], ci95[label] = found.value, found.stderr, found.ci95
        return Estimate(
            {"kind": "histogram", "values": values, "n": n, "stderr": stderr, "ci95": ci95}, None
        )
    return Estimate(None, f"no estimator for {mechanism.kind}")  # pragma: no cover


def _scalar(kind: str, found: _Inverted, n: int) -> dict[str, Any]:
    return {"kind": kind, "value": found.value, "n": n, "stderr": found.stderr, "ci95": found.ci95}

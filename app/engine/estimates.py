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
* ``logistic`` — ``t`` = the sigmoid; the mean of the sigmoid is ``θ̂``.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.mechanisms import Mechanism, Output
from app.engine.mechanisms.base import output_bits
from app.engine.mechanisms.matrix import MatrixMechanism
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
    text of the value it encodes (so a survey keeps ``k`` counts, never one per bit vector).
    """
    if isinstance(mechanism, UnaryEncoding):
        attribute = mechanism.attribute
        bits = output_bits(output)
        return tuple(json.dumps(attribute.value_at(i)) for i, bit in enumerate(bits) if bit)
    return (json.dumps(mechanism.output_json(output)),)


def output_histogram(mechanism: Mechanism, counts: Mapping[str, int]) -> dict[str, int]:
    """The raw counts by output (JSON text of the output; per value for unary encoding)."""
    if isinstance(mechanism, (GeneralizedRR, UnaryEncoding)):
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
    if isinstance(mechanism, (GeneralizedRR, UnaryEncoding)):
        if isinstance(mechanism, GeneralizedRR):
            gap, q = _grr_pq(mechanism.eps, mechanism.k)
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

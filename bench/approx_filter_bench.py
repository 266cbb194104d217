"""Algorithm 4's output-independent filter F₀: accepted counts by domain size, and around it.

Setting of issue #15: a budget (ε_g, δ_g) = (1, 1e-6), ``binary_rr`` queries of ε = 0.01 sent
until the first rejection. Printed:

* **F₀ by domain size** (issue 22) — how many such queries each output-independent filter
  accepts on a domain of ``d`` points, d = 2, 3, 100, 10^4 (deterministic counts: the queries'
  ε are known). Definition 4.7 bounds the realized loss over all ``d(d−1)`` ordered pairs, so a
  pairwise filter at ``δ_g`` becomes one at ``δ_g/(d(d−1))``:

  - ``F₀ (engine)``: :mod:`app.engine.approx`, counted by its own exact rule — a Rényi filter
    (Feldman and Zrnic 2021) charging randomized response's exact log-MGF at the order of the
    WRRW filter, ``L = log(d(d−1)/δ_g)``;
  - ``wrrw2023``: Whitehouse, Ramdas, Rogers, Wu (2023), the advanced-composition filter
    ``sqrt(2 L Σε²) + Σε²/2 <= ε_g`` at the same ``L``;
  - ``rruv2016``: Rogers, Roth, Ullman, Vadhan (2016), "Privacy odometers and filters",
    Theorem 5.1 (its formula as written in docs/engine.md) at ``δ_g/(d(d−1))``;
  - ``pairwise F₀ (before issue 22)``: the engine's rule with ``L = log(1/δ_g)`` whatever ``d``
    — it bounds one ordered pair's loss, not Definition 4.7's;
  - ``basic``: ``Σ ε <= ε_g``.

  And, for the binary domain, the **adaptive ceiling**: the largest ``n`` such that ``n``
  queries of ε = 0.01 keep ``P[max_{m<=n} L_m > ε_g] <= δ_g`` — exact dynamic programming over
  the walk ``S_m = ε(#1 − #0)`` under the true value 1. No valid filter accepts more of these
  queries. Definition 4.7's ``L_m = |S_m|`` (both ordered pairs) gives 404; the pair (1, 0)
  alone (``L_m = S_m``, what a pairwise guarantee bounds) 412.

* **Filters through the engine** (``pipeline.evaluate``/``record``, CSPRNG outputs, the object's
  value 1), mean accepted queries over ``--objects`` objects on the binary domain: ``basic``,
  ``approx_bayesian`` (with how many of its queries F₀ accepted) and the pure ``bayesian``
  filter with budget ε_g.

Run::

    .venv/bin/python bench/approx_filter_bench.py [--objects 5] [--cap 40000]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

from app.engine.approx import OutputIndependentFilter, log_term, ordered_pairs
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.mechanisms import parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record

EPS_G, DELTA, EPS = 1.0, 1e-6, 0.01
#: Domain sizes of the first table.
POINTS = (2, 3, 100, 10_000)
BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
QUERY = {
    "mechanism": "binary_rr",
    "epsilon": EPS,
    "predicate": {"attribute": "b", "op": "==", "value": 1},
}


def count_while(ok: Callable[[int], bool]) -> int:
    """The largest k such that ``ok(k)`` holds for 1..k (``ok`` is monotone)."""
    k = 0
    while ok(k + 1):
        k += 1
    return k


def rruv2016(delta: float) -> Callable[[int], bool]:
    """RRUV 2016 Thm 5.1 at ``delta``: continue while the bound with the next query fits."""

    def ok(k: int) -> bool:
        log_inv = math.log(1 / delta)
        h = EPS_G**2 / (28.04 * log_inv)
        sq = k * EPS**2
        mean = k * EPS * (math.exp(EPS) - 1) / 2
        spread = math.sqrt(2 * (sq + h) * (1 + 0.5 * math.log(sq / h + 1)) * math.log(2 / delta))
        return mean + spread <= EPS_G

    return ok


def wrrw2023(log_inv: float) -> Callable[[int], bool]:
    """WRRW 2023 at ``L``: ``sqrt(2 L Σε²) + Σε²/2 <= ε_g`` (floats)."""
    return lambda k: math.sqrt(2 * log_inv * k * EPS**2) + k * EPS**2 / 2 <= EPS_G


def engine_f0(f0: OutputIndependentFilter) -> Callable[[int], bool]:
    """An F₀ of the engine: k exact charges within its exact threshold."""
    charge = f0.charge(Fraction(repr(EPS)))
    return lambda k: k * charge <= f0.threshold


def basic(k: int) -> bool:
    """Basic composition (ε as written, like the engine)."""
    return k * Fraction(repr(EPS)) <= Fraction(repr(EPS_G))


def adaptive_ceiling(*, both_pairs: bool) -> int:
    """The largest n with ``P[max_{m<=n} L_m > ε_g] <= δ_g`` for n queries of ε, binary domain.

    Exact dynamic programming over ``k = #1 − #0`` under the true value 1 (``+1`` with
    probability ``e^ε/(1+e^ε)``): ``L_m = ε|k|`` (``both_pairs``, Definition 4.7) or ``ε k``
    (the pair (1, 0) alone); a walk that passes ``ε_g`` is absorbed.
    """
    limit = math.floor(EPS_G / EPS + 1e-9)
    p = math.exp(EPS) / (1 + math.exp(EPS))
    probs: dict[int, float] = {0: 1.0}
    passed, n = 0.0, 0
    while True:
        nxt: dict[int, float] = {}
        for k, q in probs.items():
            for step, w in ((1, p), (-1, 1 - p)):
                j = k + step
                if j > limit or (both_pairs and j < -limit):
                    passed += q * w
                else:
                    nxt[j] = nxt.get(j, 0.0) + q * w
        if passed > DELTA:
            return n
        probs, n = nxt, n + 1


def run_engine(kind: FilterKind, cap: int) -> tuple[int, int, float]:
    """One object until the first rejection (or ``cap``): accepted, F₀'s share, seconds."""
    domain = parse_domain(BINARY)
    mech = parse_query(QUERY, domain)
    delta = DELTA if kind is FilterKind.APPROX_BAYESIAN else None
    snap = ObjectSnapshot.empty(domain, budget=EPS_G, filter=kind, delta=delta)
    accepted = f0 = 0
    start = time.perf_counter()
    while accepted < cap:
        decision = evaluate(snap, mech)
        if not decision.accepted:
            break
        f0 += decision.phase == "output-independent"
        snap = record(snap, mech, mech.sample({"b": 1}), decision)
        accepted += 1
    return accepted, f0, time.perf_counter() - start


def main() -> None:
    """Print both tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=5)
    parser.add_argument("--cap", type=int, default=40_000)
    args = parser.parse_args()
    print(f"# (ε_g, δ_g) = ({EPS_G}, {DELTA}), binary_rr ε = {EPS}; load {os.getloadavg()}")
    print(
        "\n| d | F₀ (engine) | order 1 + λ | wrrw2023 | rruv2016 | pairwise F₀ (before) | basic |"
        "\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    pairwise = OutputIndependentFilter(EPS_G, DELTA, 1)
    for d in POINTS:
        f0 = OutputIndependentFilter.for_points(EPS_G, DELTA, d)
        pairs = ordered_pairs(d)
        row = [
            count_while(engine_f0(f0)),
            f"{1 + f0.order:.3f}",
            count_while(wrrw2023(log_term(DELTA, pairs))),
            count_while(rruv2016(DELTA / pairs)),
            count_while(engine_f0(pairwise)),
            count_while(basic),
        ]
        print(f"| {d:,} | " + " | ".join(str(c) for c in row) + " |")
    print(
        "\nadaptive ceiling, binary domain (exact DP): "
        f"{adaptive_ceiling(both_pairs=True)} (Definition 4.7, both ordered pairs), "
        f"{adaptive_ceiling(both_pairs=False)} (the pair (1, 0) alone)"
    )
    print(
        f"\n| filter (engine, binary domain, {args.objects} objects) | mean accepted | min | max "
        "| of them by F₀ | ms per query |\n|---|---:|---:|---:|---:|---:|"
    )
    for kind in (FilterKind.BASIC, FilterKind.APPROX_BAYESIAN, FilterKind.BAYESIAN):
        runs = [run_engine(kind, args.cap) for _ in range(args.objects)]
        counts = [r[0] for r in runs]
        per_query = 1000 * sum(r[2] for r in runs) / max(1, sum(counts))
        f0 = statistics.mean(r[1] for r in runs) if kind is FilterKind.APPROX_BAYESIAN else "-"
        print(
            f"| {kind.value} | {statistics.mean(counts):.1f} | {min(counts)} | {max(counts)} "
            f"| {f0} | {per_query:.3f} |"
        )


if __name__ == "__main__":
    main()

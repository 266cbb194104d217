"""Algorithm 4's output-independent filter F₀: candidates compared, and the filters around it.

Setting of issue #15: a binary object, a budget (ε_g, δ_g) = (1, 1e-6), ``binary_rr`` queries of
ε = 0.01 sent until the first rejection. Printed:

* **F₀ candidates alone** — how many such queries each output-independent (ε_g, δ_g) filter for
  fully adaptive composition accepts (a deterministic count: the queries' ε are known):

  - ``rruv2016``: Rogers, Roth, Ullman, Vadhan (2016), "Privacy odometers and filters",
    Theorem 5.1 (its formula as written in docs/engine.md);
  - ``wrrw2023``: Whitehouse, Ramdas, Rogers, Wu (2023), the advanced-composition filter
    ``sqrt(2 log(1/δ) Σε²) + Σε²/2 <= ε_g``;
  - ``renyi_rr``: the engine's F₀ (:mod:`app.engine.approx`, counted by its own exact rule): a
    Rényi filter (Feldman and Zrnic 2021) charging randomized response's exact log-MGF at the
    order of ``wrrw2023`` (every ε-DP mechanism is a post-processing of randomized response, so
    its divergence bounds theirs; it accepts every sequence ``wrrw2023`` accepts);
  - ``advanced (fixed k)``: Kairouz–Oh–Viswanath / Dwork–Rothblum–Vadhan advanced composition
    ``sqrt(2k log(1/δ)) ε + k ε (e^ε − 1) <= ε_g`` with k fixed in advance — not a filter
    (no adaptive ε), the reference the issue quotes;
  - ``basic``: ``Σ ε <= ε_g``.

* **Filters through the engine** (``pipeline.evaluate``/``record``, CSPRNG outputs, the object's
  value 1), mean accepted queries over ``--objects`` objects: ``basic``, ``approx_bayesian``
  (with how many of its queries F₀ accepted) and the pure ``bayesian`` filter with budget ε_g.

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

from app.engine.approx import OutputIndependentFilter
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.mechanisms import parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record

EPS_G, DELTA, EPS = 1.0, 1e-6, 0.01
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


def rruv2016(k: int) -> bool:
    """RRUV 2016 Thm 5.1: continue while the bound with the next query is within ε_g."""
    log_inv = math.log(1 / DELTA)
    h = EPS_G**2 / (28.04 * log_inv)
    sq = k * EPS**2
    mean = k * EPS * (math.exp(EPS) - 1) / 2
    spread = math.sqrt(2 * (sq + h) * (1 + 0.5 * math.log(sq / h + 1)) * math.log(2 / DELTA))
    return mean + spread <= EPS_G


def wrrw2023(k: int) -> bool:
    """WRRW 2023: ``sqrt(2 L Σε²) + Σε²/2 <= ε_g`` (floats)."""
    sq = k * EPS**2
    return math.sqrt(2 * math.log(1 / DELTA) * sq) + sq / 2 <= EPS_G


_F0 = OutputIndependentFilter(EPS_G, DELTA)
_LAMBDA = _F0.order


def renyi_rr(k: int) -> bool:
    """The engine's F₀: k exact charges within its exact threshold."""
    return k * _F0.charge(Fraction(repr(EPS))) <= _F0.threshold


def advanced_fixed(k: int) -> bool:
    """Advanced composition for k queries fixed in advance (not a filter)."""
    return math.sqrt(2 * k * math.log(1 / DELTA)) * EPS + k * EPS * math.expm1(EPS) <= EPS_G


def basic(k: int) -> bool:
    """Basic composition (ε as written, like the engine)."""
    return k * Fraction(repr(EPS)) <= Fraction(repr(EPS_G))


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
    print("\n| F₀ candidate | accepted queries |\n|---|---:|")
    for name, rule in [
        ("rruv2016 (RRUV 2016 Thm 5.1)", rruv2016),
        ("wrrw2023 (WRRW 2023 advanced-composition filter)", wrrw2023),
        (f"renyi_rr (engine's F₀, order α = {1 + _LAMBDA:.3f})", renyi_rr),
        ("advanced composition, k fixed (not a filter)", advanced_fixed),
        ("basic composition", basic),
    ]:
        print(f"| {name} | {count_while(rule)} |")
    print(
        f"\n| filter (engine, {args.objects} objects) | mean accepted | min | max "
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

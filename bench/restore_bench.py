"""Restoring a finite object's accountant from its stored state, old way against new (issue #12).

Every finite submit restores the accountant from the stored likelihood array. The old
``Accountant.restore`` first built an empty accountant (allocating and scanning a zero array of
the domain's size) and then replaced its state with ``LikelihoodState.from_bytes``; the new one
hands the stored array to the constructor. Printed side by side, in the same run, with
``from_bytes`` alone as the floor:

    .venv/bin/python bench/restore_bench.py [--points 1000000] [--repeats 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from app.engine.accountant import Accountant
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState


def old_restore(domain: object, logp: bytes) -> Accountant:
    """The former ``Accountant.restore``: an empty accountant, then its state replaced."""
    acc = Accountant(domain, 4.0, FilterKind.BAYESIAN)  # type: ignore[arg-type]
    acc.state = LikelihoodState.from_bytes(domain, logp, 1e-12)  # type: ignore[arg-type]
    acc.basic_total, acc.accepted, acc.rejected = Fraction(1), 3, 0
    return acc


def new_restore(domain: object, logp: bytes) -> Accountant:
    """The stored array handed to the constructor (the former ``Accountant.restore``)."""
    return Accountant(
        domain,  # type: ignore[arg-type]
        4.0,
        FilterKind.BAYESIAN,
        basic_total=Fraction(1),
        accepted=3,
        rejected=0,
        initial_state=LikelihoodState.from_bytes(domain, logp, 1e-12),  # type: ignore[arg-type]
    )


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds of each call (after two warm-up calls)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return times


def main() -> None:
    """Print median and p90 of each way, interleaved so machine noise hits all alike."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    side = round(args.points ** (1 / 2))
    domain = parse_domain(
        {
            "attributes": [
                {"name": "a", "type": "integer", "low": 0, "high": side - 1},
                {"name": "b", "type": "integer", "low": 0, "high": side - 1},
            ]
        }
    )
    rng = np.random.default_rng(7)  # benchmark data only, not a sampler
    logp = -rng.random(domain.shape)
    logp -= logp.max()
    stored = LikelihoodState(domain, logp, 1e-12).to_bytes()
    ways: dict[str, Callable[[], object]] = {
        "from_bytes alone": lambda: LikelihoodState.from_bytes(domain, stored, 1e-12),
        "old restore": lambda: old_restore(domain, stored),
        "new restore": lambda: new_restore(domain, stored),
    }
    results: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(3):  # interleave rounds
        for name, fn in ways.items():
            results[name] += timed(fn, args.repeats // 3)
    print(f"restore at {domain.size:,} points ({args.repeats} calls each, ms)")
    print(f"{'way':<18} {'median':>8} {'p90':>8}")
    for name, times in results.items():
        p90 = statistics.quantiles(times, n=10)[-1]
        print(f"{name:<18} {statistics.median(times):>8.2f} {p90:>8.2f}")


if __name__ == "__main__":
    main()

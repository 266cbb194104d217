"""Per-value extremes of ``log P`` (``LikelihoodState.extremes_over``): three ways side by side.

A finite decision takes, for each value of the attributes a query reads, the max and min of
``log P`` over all the other attributes: two reductions over the whole state. numpy is fast when
the reduced axes lead and slow when a short axis behind a kept one must be reduced (a strided
inner loop). Printed in the same run, on the engine benchmark's 10**6-point shape
``(100, 16, 125, 5)`` (``age`` x ``sector`` x ``score`` x ``region``), for every set of kept axes a
query of one or two attributes has:

* ``numpy`` — ``array.max(axis=others)``;
* ``before`` — the engine's former ``_reduce_to`` (leading and trailing axes collapsed first);
* ``staged`` — the current :func:`app.engine.likelihood._reduce_to` (runs with kept axes behind
  them first, the trailing run last, on what is left).

All three are checked bit-identical. Run::

    .venv/bin/python bench/reduce_bench.py [--repeats 40]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.engine.likelihood import _reduce_to

SHAPE = (100, 16, 125, 5)
NAMES = ("age", "sector", "score", "region")


def before(array: Any, keep: tuple[int, ...], fn: Any) -> Any:
    """The former ``_reduce_to`` (commit c42246b), kept here for the comparison."""
    if not keep:
        return np.asarray(fn(array), dtype=np.float64).reshape(())
    last, first = keep[-1], keep[0]
    if last < array.ndim - 1:
        array = fn(array.reshape((*array.shape[: last + 1], -1)), axis=-1)
    if first > 0:
        array = fn(array.reshape((-1, *array.shape[first:])), axis=0)
    middle = tuple(i for i in range(array.ndim) if i + first not in keep)
    if middle:
        array = fn(array, axis=middle)
    return np.asarray(array, dtype=np.float64)


def plain(array: Any, keep: tuple[int, ...], fn: Any) -> Any:
    """numpy's own multi-axis reduction."""
    others = tuple(i for i in range(array.ndim) if i not in keep)
    return fn(array, axis=others)


def timed(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and p90 milliseconds of ``call`` (after two warm-up calls)."""
    call()
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    array = np.random.default_rng(7).normal(size=SHAPE)
    print(f"max + min over a {SHAPE} float64 array, {args.repeats} calls each (ms)")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'kept':18} {'numpy':>14} {'before':>14} {'staged':>14}   (median / p90)")
    for size in (1, 2):
        for keep in itertools.combinations(range(len(SHAPE)), size):
            results = []
            for way in (plain, before, _reduce_to):
                expected = (plain(array, keep, np.max), plain(array, keep, np.min))
                got = (way(array, keep, np.max), way(array, keep, np.min))
                if not all(np.array_equal(e, g) for e, g in zip(expected, got, strict=True)):
                    raise SystemExit(f"{way.__name__} differs from numpy keeping {keep}")
                median, p90 = timed(
                    lambda way=way, keep=keep: (
                        way(array, keep, np.max),
                        way(array, keep, np.min),
                    ),
                    args.repeats,
                )
                results.append(f"{median:6.2f} / {p90:5.2f}")
            label = ",".join(NAMES[a] for a in keep)
            print(f"{label:18} {results[0]:>14} {results[1]:>14} {results[2]:>14}")


if __name__ == "__main__":
    main()

"""Uniform draws: ``secrets.randbelow`` (one system call a draw) against ``sampling.randbelow``
(4 KiB of ``secrets.token_bytes`` per 512 draws), side by side in the same run.

How to run::

    .venv/bin/python bench/sampling_bench.py                 # 200,000 draws, 5 rounds
    .venv/bin/python bench/sampling_bench.py --draws 50000 --rounds 3

Each round times both on the same ranges (a grr keep-and-index range of ~63 bits, and a small
one), alternating which goes first; the table gives the median and the best µs per draw and the
ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine import sampling

RANGES = {"grr keep x index (63 bits)": 15 * 2**59 + 7, "small (6)": 6}


def per_draw(draw: Callable[[int], int], n: int, draws: int) -> float:
    """Microseconds per call of ``draw(n)``."""
    start = time.perf_counter()
    for _ in range(draws):
        draw(n)
    return (time.perf_counter() - start) / draws * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}; {args.draws} draws x {args.rounds} rounds")
    print("| range | secrets.randbelow µs (median / best) | sampling.randbelow µs | ratio |")
    print("|---|---|---|---|")
    for name, n in RANGES.items():
        old: list[float] = []
        new: list[float] = []
        for i in range(args.rounds):
            pair = [(secrets.randbelow, old), (sampling.randbelow, new)]
            for draw, times in pair if i % 2 == 0 else pair[::-1]:
                times.append(per_draw(draw, n, args.draws))
        ratio = statistics.median(old) / statistics.median(new)
        print(
            f"| {name} | {statistics.median(old):.3f} / {min(old):.3f} | "
            f"{statistics.median(new):.3f} / {min(new):.3f} | {ratio:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

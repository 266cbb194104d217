"""Adversarial continuous cases of issue 22 item 3: width and time of the certified bounds.

Usage (from the repository root)::

    PYTHONPATH=.:clients/python/src OPENBLAS_NUM_THREADS=1 \\
        .venv/bin/python bench/tight_bench.py [--only eps-0] [--time-limit 10]

Runs every case of :mod:`tests.engine.continuous.adversarial` through the calculator
(:func:`app.engine.calculator.compute_loss`, default options) and prints one row per case: the
reference loss (engine-free, :func:`~tests.engine.continuous.adversarial.reference_loss`), the
certified ``lower``/``upper`` (the candidate cases: the per-output bound of the checked output),
``upper - lower``, whether ``lower <= reference <= upper`` holds, the answer's status (and
``reason``, if any) and the wall time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from app.engine.calculator import compute_loss
from tests.engine.continuous.adversarial import Case, all_cases, reference_loss


def run(case: Case, options: dict[str, Any]) -> tuple[float, float, str, float]:
    """``(lower, upper, status, seconds)`` of one case through the calculator."""
    request = case.request()
    if options:
        request["options"] = options
    start = time.perf_counter()
    answer = compute_loss(request)
    seconds = time.perf_counter() - start
    status = answer["status"]
    if "reason" in answer:
        status += f" ({answer['reason']})"
    if case.candidate:
        out = case.checked_output()
        row = next(o for o in answer["candidate"]["per_output"] if o["output"] == out)
        return row["lower"], row["upper"], status, seconds
    loss = answer["realized_loss"]
    return loss["lower"], loss["upper"], status, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="run the cases whose name starts with this")
    parser.add_argument("--time-limit", type=float, default=None)
    args = parser.parse_args()
    options: dict[str, Any] = {}
    if args.time_limit is not None:
        options["time_limit"] = args.time_limit
    print(
        f"{'case':<16} {'reference':>11} {'lower':>11} {'upper':>11} {'width':>9} "
        f"{'holds':>5} {'s':>6}  status"
    )
    for case in all_cases():
        if not case.name.startswith(args.only):
            continue
        ref = reference_loss(case)
        lower, upper, status, seconds = run(case, options)
        holds = lower <= ref + 1e-6 and upper >= ref - 1e-9
        print(
            f"{case.name:<16} {ref:>11.5f} {lower:>11.5f} {upper:>11.5f} {upper - lower:>9.2e} "
            f"{'yes' if holds else 'NO':>5} {seconds:>6.2f}  {status}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""The paper's appendix F health table: 16 rows, 4 queries on a 4-D box, both LP solvers.

How to run (from the project root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/appendix_f.py [--repeat 3]

Four regressions of the paper's appendix F, table 1 (heart disease, stroke and diabetes as
``logistic``, sleep duration as a ``linear`` query truncated to [0, 12]), ε = 1 each, over age
[10, 100] (real), sex {0, 1} (integer), blood pressure [50, 200] and BMI [10, 50] (real). Each of
the 16 output combinations is a history whose realized loss the calculator computes
(:func:`app.engine.calculator.compute_loss`, in process, default tolerance 1e-4), once with the
LPs of the branch-and-bound solved by ``highspy`` directly and once through
``scipy.optimize.linprog(method="highs")`` (:mod:`app.engine.continuous.highs`), row by row in
the same run. Every row's ``upper − lower`` is certified within the tolerance (``status: ok``),
i.e. within 1e-4 of the global optimum, and checked against :data:`REFERENCE` (each row's loss
certified within 1e-8 by the engine as of commit ``57a4e10``, before the search was reworked
for speed): both intervals hold the true loss, so they must overlap, and each end of the row's
must be within 1e-4 of the reference's far end. The table prints the bounds and, per solver, the
best wall-clock and CPU (``time.process_time``) seconds of ``--repeat`` runs per row: on a shared
machine the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import Any

from app.engine.calculator import compute_loss
from app.engine.continuous import highs

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "real", "low": 10, "high": 100},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "bp", "type": "real", "low": 50, "high": 200},
        {"name": "bmi", "type": "real", "low": 10, "high": 50},
    ]
}


def _weights(*values: float) -> dict[str, float]:
    return {n: v for n, v in zip(("age", "sex", "bp", "bmi"), values, strict=True) if v != 0}


QUERIES: list[dict[str, Any]] = [
    {"mechanism": "logistic", "weights": _weights(-0.059, -1.456, -0.0134, 0),
     "intercept": 6.177, "epsilon": 1},
    {"mechanism": "logistic", "weights": _weights(0.0761, 0.0952, 0, 0.0163),
     "intercept": -7.989, "epsilon": 1},
    {"mechanism": "linear", "weights": _weights(0.0855, 0.4617, -0.07, 0), "intercept": 12.323,
     "range": [0, 12], "truncate": True, "epsilon": 1},
    {"mechanism": "logistic", "weights": _weights(0.0491, 0, -0.0091, 0.1039),
     "intercept": -5.07, "epsilon": 1},
]  # fmt: skip
OUTPUTS = [(0, 1), (0, 1), (0, 12), (0, 1)]
#: Tolerance of the rows (the calculator's default) and of the check against REFERENCE.
TOLERANCE = 1e-4
#: Each row's realized loss, certified by ``compute_loss`` with ``options.tolerance`` 1e-8 at
#: commit 57a4e10 (two rows stopped at a search limit, 1.0e-8 and 1.5e-8 wide).
REFERENCE: dict[tuple[int, ...], tuple[float, float]] = {
    (0, 0, 0, 0): (2.356357579888674, 2.3563575848648175),
    (0, 0, 0, 1): (2.293134704942022, 2.293134707812729),
    (0, 0, 12, 0): (1.7013486857061175, 1.7013486954301635),
    (0, 0, 12, 1): (2.5765870615117947, 2.5765870647711298),
    (0, 1, 0, 0): (2.561650013042387, 2.5616500158370985),
    (0, 1, 0, 1): (3.0308914191392913, 3.030891419140544),
    (0, 1, 12, 0): (2.349852378403, 2.3498523825515383),
    (0, 1, 12, 1): (3.6040774020862454, 3.6040774020888584),
    (1, 0, 0, 0): (3.35823171806567, 3.358231718555905),
    (1, 0, 0, 1): (2.1484899196906424, 2.148489923635915),
    (1, 0, 12, 0): (2.621769104499223, 2.621769104531544),
    (1, 0, 12, 1): (2.0925772733903565, 2.0925772836654284),  # stopped at a search limit
    (1, 1, 0, 0): (2.232725167055031, 2.23272517199026),
    (1, 1, 0, 1): (1.5862711772131521, 1.5862711921723278),  # stopped at a search limit
    (1, 1, 12, 0): (1.8047392768360448, 1.8047392816328545),
    (1, 1, 12, 1): (2.3833521216561926, 2.3833521246166622),
}


def _row(outputs: tuple[int, ...]) -> tuple[dict[str, Any], float, float]:
    history = [{"query": q, "output": o} for q, o in zip(QUERIES, outputs, strict=True)]
    start, cpu = time.perf_counter(), time.process_time()
    answer = compute_loss({"domain": DOMAIN, "history": history})
    return answer, time.perf_counter() - start, time.process_time() - cpu


def check(outputs: tuple[int, ...], answer: dict[str, Any]) -> None:
    """Exit unless the row is certified within the tolerance and agrees with REFERENCE."""
    loss, (ref_lower, ref_upper) = answer["realized_loss"], REFERENCE[outputs]
    lower, upper = loss["lower"], loss["upper"]
    if answer["status"] != "ok" or upper - lower > TOLERANCE:
        raise SystemExit(f"{outputs}: not certified within {TOLERANCE}: {answer}")
    if lower > ref_upper or upper < ref_lower:  # both hold the true loss
        raise SystemExit(f"{outputs}: [{lower}, {upper}] misses the reference {REFERENCE[outputs]}")
    if upper - ref_lower > TOLERANCE or ref_upper - lower > TOLERANCE:
        raise SystemExit(f"{outputs}: [{lower}, {upper}] not within {TOLERANCE} of the reference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| o1 o2 o3 o4 | lower | upper | status | highspy s | cpu s | scipy linprog s | cpu s |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    solvers = ("highspy", "scipy")
    totals = {(solver, clock): 0.0 for solver in solvers for clock in ("wall", "cpu")}
    for outputs in itertools.product(*OUTPUTS):
        best: dict[tuple[str, str], float] = {}
        answers: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeat):
            for solver in solvers:
                highs.SOLVER = solver  # type: ignore[assignment]
                answer, seconds, cpu = _row(outputs)
                check(outputs, answer)
                answers[solver] = answer
                for clock, value in (("wall", seconds), ("cpu", cpu)):
                    best[solver, clock] = min(best.get((solver, clock), float("inf")), value)
        for key, seconds in best.items():
            totals[key] += seconds
        loss = answers["highspy"]["realized_loss"]
        times = " | ".join(f"{best[key]:.3f}" for key in totals)
        print(f"| {' '.join(map(str, outputs))} | {loss['lower']:.6f} | {loss['upper']:.6f} | "
              f"{answers['highspy']['status']} | {times} |")  # fmt: skip
    sums = " | ".join(f"**{seconds:.2f}**" for seconds in totals.values())
    print(f"| **all 16** | | | | {sums} |")
    highs.SOLVER = "highspy"


if __name__ == "__main__":
    main()

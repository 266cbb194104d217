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
i.e. within 1e-4 of the global optimum; the table prints the bounds and the best time of
``--repeat`` runs per row and solver.
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


def _row(outputs: tuple[int, ...]) -> tuple[dict[str, Any], float]:
    history = [{"query": q, "output": o} for q, o in zip(QUERIES, outputs, strict=True)]
    start = time.perf_counter()
    answer = compute_loss({"domain": DOMAIN, "history": history})
    return answer, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| o1 o2 o3 o4 | lower | upper | status | highspy s | scipy linprog s |")
    print("|---|---:|---:|---|---:|---:|")
    totals = {"highspy": 0.0, "scipy": 0.0}
    for outputs in itertools.product(*OUTPUTS):
        best: dict[str, float] = {}
        answers: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeat):
            for solver in ("highspy", "scipy"):
                highs.SOLVER = solver  # type: ignore[assignment]
                answer, seconds = _row(outputs)
                answers[solver] = answer
                best[solver] = min(best.get(solver, float("inf")), seconds)
        for solver, seconds in best.items():
            totals[solver] += seconds
        loss = answers["highspy"]["realized_loss"]
        other = answers["scipy"]["realized_loss"]
        if max(abs(loss["lower"] - other["lower"]), abs(loss["upper"] - other["upper"])) > 1e-4:
            raise SystemExit(f"solvers disagree on {outputs}: {loss} vs {other}")
        status = answers["highspy"]["status"]
        print(f"| {' '.join(map(str, outputs))} | {loss['lower']:.6f} | {loss['upper']:.6f} | "
              f"{status} | {best['highspy']:.3f} | {best['scipy']:.3f} |")  # fmt: skip
    print(f"| **all 16** | | | | **{totals['highspy']:.2f}** | **{totals['scipy']:.2f}** |")
    highs.SOLVER = "highspy"


if __name__ == "__main__":
    main()

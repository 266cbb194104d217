"""Certified bounds for quadratic query values (``x^2``, ``x*y`` weights) on a 2-D box.

Prints, for each coordinate-split preference (``branch_and_bound.LIFT_PREFERENCE``), the
branch-and-bound work on random histories of 3-7 ``linear``/``logistic`` queries with random
quadratic weights over random boxes (both searches of each history, tolerance 5e-5 each as the
calculator's default 1e-4 splits), then appendix A's four histories at the default settings.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/quadratic_bench.py [histories]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np

from app.engine.calculator import compute_loss
from app.engine.continuous import branch_and_bound
from app.engine.continuous.branch_and_bound import BnBSettings, maximize
from app.engine.continuous.state import ContinuousState
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query

MONOMIALS = ("x", "y", "x^2", "y^2", "x*y")


def random_request(rng: np.random.Generator, size: int) -> dict[str, Any]:
    """A random 2-D history; plain ``linear`` ranges cover the query's reach (checked by parse)."""
    lo = np.round(rng.uniform(-2.0, 0.5, size=2), 3)
    hi = np.round(lo + rng.uniform(0.5, 3.0, size=2), 3)
    domain = {
        "attributes": [
            {"name": n, "type": "real", "low": float(a), "high": float(b)}
            for n, a, b in zip("xy", lo, hi, strict=True)
        ]
    }
    parsed = parse_domain(domain)
    history = []
    for i in range(size):
        chosen = [m for m in MONOMIALS if rng.uniform() < 0.5] or ["x*y"]
        if not any("^" in m or "*" in m for m in chosen):
            chosen.append(["x^2", "y^2", "x*y"][int(rng.integers(3))])
        weights = {m: float(np.round(rng.normal(scale=1.5), 3)) for m in chosen}
        probe = parse_query({"mechanism": "logistic", "weights": weights, "epsilon": 1}, parsed)
        z_lo, z_hi = probe.z_min, probe.z_max  # type: ignore[attr-defined]
        intercept = float(np.round(-0.5 * (z_lo + z_hi) + rng.normal(), 3))
        z_lo, z_hi = z_lo + intercept, z_hi + intercept
        span = max(z_hi - z_lo, 1e-3)
        eps = float(np.round(rng.uniform(0.3, 2.0), 3))
        high = bool(rng.uniform() < 0.5)
        query: dict[str, Any] = {"weights": weights, "intercept": intercept, "epsilon": eps}
        kind = i % 3
        if kind == 2:
            history.append({"query": {"mechanism": "logistic", **query}, "output": int(high)})
            continue
        if kind == 0:
            a, b = z_lo - 0.1 * span - 1e-3, z_hi + 0.1 * span + 1e-3
        else:
            a, b = sorted(rng.uniform(z_lo, z_hi, size=2))
            b = max(b, a + 1e-3)
        query.update(mechanism="linear", range=[float(a), float(b)], truncate=kind == 1)
        history.append({"query": query, "output": float(b) if high else float(a)})
    return {"domain": domain, "history": history}


def searches(request: dict[str, Any]) -> tuple[int, float, bool]:
    """Nodes, seconds and whether a limit was hit, both sides of the history."""
    domain = parse_domain(request["domain"])
    state = ContinuousState(domain)
    for entry in request["history"]:
        mechanism = parse_query(entry["query"], domain)
        state.record(mechanism, mechanism.parse_output(entry["output"], "output"))
    terms, _ = state.term_set()
    nodes, seconds, limit = 0, 0.0, False
    for problem in (terms, terms.negated()):
        result = maximize(problem, state.box, BnBSettings(tolerance=5e-5, time_limit=20.0))
        nodes, seconds = nodes + result.nodes, seconds + result.seconds
        limit = limit or result.status.hit_limit
    return nodes, seconds, limit


def main() -> None:
    """Print the two tables."""
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    requests = [random_request(np.random.default_rng(1000 + s), 3 + s % 5) for s in range(count)]
    print(f"{count} random 2-D quadratic histories (3-7 queries), both searches each")
    print("| LIFT_PREFERENCE | nodes | worst nodes | median s | max s | limits |")
    print("|---|---|---|---|---|---|")
    for preference in (1.0, 100.0):
        branch_and_bound.LIFT_PREFERENCE = preference
        runs = [searches(r) for r in requests]
        nodes = [n for n, _, _ in runs]
        seconds = [s for _, s, _ in runs]
        print(
            f"| {preference:g} | {sum(nodes)} | {max(nodes)} | {statistics.median(seconds):.2f} "
            f"| {max(seconds):.2f} | {sum(lim for _, _, lim in runs)} |"
        )
    print()
    print("Appendix A (x in [-1, 1], eps = 1): the paper prints 1.41 and 1.69")
    print("| o1 | o2 | lower | upper | status | s |")
    print("|---|---|---|---|---|---|")
    domain = {"attributes": [{"name": "x", "type": "real", "low": -1, "high": 1}]}
    for o1, o2 in ((1, 1), (1, 0), (-1, 1), (-1, 0)):
        mean = {"mechanism": "linear", "weights": {"x": 1}, "range": [-1, 1], "epsilon": 1}
        var = {"mechanism": "linear", "weights": {"x^2": 1}, "range": [0, 1], "epsilon": 1}
        history = [{"query": mean, "output": o1}, {"query": var, "output": o2}]
        start = time.perf_counter()
        answer = compute_loss({"domain": domain, "history": history})
        took = time.perf_counter() - start
        loss = answer["realized_loss"]
        print(
            f"| {o1} | {o2} | {loss['lower']:.6f} | {loss['upper']:.6f} | {answer['status']} "
            f"| {took:.3f} |"
        )


if __name__ == "__main__":
    main()

"""Certified bounds at extreme parameters (issue 15 items 4 and 5): bracket, gap and time.

Usage::

    .venv/bin/python bench/extreme_bench.py [--repeats 3]

Cases (through the calculator, default options, tolerance 1e-4):

* ``eps100-real-0`` / ``eps100-int-1`` / ``eps100-x1000``: ``logistic`` weight ``2^-40``,
  intercept 2.25, ε = 100 on ``x ∈ [0, 1]`` (real or integer), output 0 / 1 / 0 repeated 1000
  times; the exact loss is computed in 60-digit ``decimal``.
* ``steep-linear``: ``linear`` (w = 1, range [0, 1], ε = 80) output 0 and ``logistic`` (w = 3,
  c = -1, ε = 1) output 1 on ``x ∈ [0, 1]``; exact 79.458226 (both extremes at vertices).
* ``parallel-1000``: 1000 ``logistic`` queries (ε = 0.5) on ``[0, 1]^3`` with weights
  ``λ_i (1, 2, -0.5)``; reference: a 200,001-point grid of ``s = v·x`` (within 1e-6 of the
  extremes), so ``exact`` is approximate there and ``holds`` allows 1e-6. ``parallel-fl``: the
  same with weights ``fl(λ_i (0.1, 0.2, -0.05))``, parallel only up to rounding.

Prints one row per case: exact, lower, upper, whether the bracket holds, gap, status and the
median wall time over ``--repeats`` runs.

``--paper N`` instead replays fixed histories of the paper's experiments (sections 6.3/6.4:
queries from ``bench/continuous_common.draw_query``, outputs drawn from the same seeded
generator, not from the CSPRNG sampler, so two commits see identical histories) and prints the
certified loss bounds and the time of one bound computation for prefixes of ``N`` queries. Run it
at two commits (``PYTHONPATH=<checkout>``) to compare bounds and times before and after.
"""

from __future__ import annotations

import argparse
import statistics
import time
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.special import expit

from app.engine.calculator import compute_loss

WEIGHT = 2.0**-40


def log_prob(z: Fraction, eps: float, *, high: bool, logistic: bool = True) -> Decimal:
    """``log Pr(output | z)`` in 60-digit decimal (paper eqs. 37, 45)."""
    with localcontext() as ctx:
        ctx.prec = 60
        e = Decimal(Fraction(eps).numerator) / Decimal(Fraction(eps).denominator)
        zd = Decimal(z.numerator) / Decimal(z.denominator)
        t = 1 / (1 + (-zd).exp()) if logistic else min(max(zd, Decimal(0)), Decimal(1))
        own = t if high else 1 - t
        return ((1 + own * (e.exp() - 1)) / (e.exp() + 1)).ln()


def unit(kind: str) -> dict[str, Any]:
    """``x ∈ [0, 1]``."""
    return {"attributes": [{"name": "x", "type": kind, "low": 0, "high": 1}]}


def eps100(output: int, kind: str, repeats: int) -> tuple[dict[str, Any], float]:
    """The item-4 request and its exact loss."""
    query = {"mechanism": "logistic", "weights": {"x": WEIGHT}, "intercept": 2.25, "epsilon": 100}
    z0 = Fraction(2.25)
    step = log_prob(z0 + Fraction(WEIGHT), 100.0, high=output == 1) - log_prob(
        z0, 100.0, high=output == 1
    )
    request = {"domain": unit(kind), "history": [{"query": query, "output": output}] * repeats}
    return request, float(abs(step)) * repeats


def steep_linear() -> tuple[dict[str, Any], float]:
    """The item-5 two-query history."""
    linear = {"mechanism": "linear", "weights": {"x": 1.0}, "range": [0, 1], "epsilon": 80.0}
    logistic = {"mechanism": "logistic", "weights": {"x": 3.0}, "intercept": -1.0, "epsilon": 1}
    history = [{"query": linear, "output": 0}, {"query": logistic, "output": 1}]
    values = [
        log_prob(x, 80.0, high=False, logistic=False) + log_prob(3 * x - 1, 1.0, high=True)
        for x in (Fraction(0), Fraction(1))
    ]
    return {"domain": unit("real"), "history": history}, float(max(values) - min(values))


def parallel(
    n: int = 1000, eps: float = 0.5, seed: int = 0, *, rounded: bool = False
) -> tuple[dict[str, Any], float]:
    """``n`` logistic queries with parallel weights on ``[0, 1]^3`` and a grid reference.

    ``rounded``: weights ``fl(λ_i (0.1, 0.2, -0.05))`` with ``λ_i`` in ``{0.7, 1.3, 2.9, -1.1,
    3.7}`` — parallel only up to rounding.
    """
    rng = np.random.default_rng(seed)
    v = np.array([0.1, 0.2, -0.05]) if rounded else np.array([1.0, 2.0, -0.5])
    scales = [0.7, 1.3, 2.9, -1.1, 3.7] if rounded else [0.5, 1.0, 2.0, -1.0, 4.0]
    lam = rng.choice(scales, size=n)
    c = rng.normal(size=n)
    high = rng.integers(2, size=n).astype(bool)
    history = [
        {
            "query": {
                "mechanism": "logistic",
                "weights": {name: float(li * vk) for name, vk in zip("xyz", v, strict=True)},
                "intercept": float(ci),
                "epsilon": eps,
            },
            "output": int(hi),
        }
        for li, ci, hi in zip(lam, c, high, strict=True)
    ]
    s = np.linspace(float(np.minimum(v, 0).sum()), float(np.maximum(v, 0).sum()), 200_001)
    values = np.zeros_like(s)
    for li, ci, hi in zip(lam, c, high, strict=True):
        t = expit(li * s + ci)
        own = t if hi else 1.0 - t
        values += np.log((1.0 + own * np.expm1(eps)) / (np.exp(eps) + 1.0))
    domain = {"attributes": [{"name": k, "type": "real", "low": 0, "high": 1} for k in "xyz"]}
    return {"domain": domain, "history": history}, float(values.max() - values.min())


def paper_histories(lengths: list[int], seeds: int) -> None:
    """Certified bounds and times on fixed histories of the paper's experiments."""
    from continuous_common import domain_json, draw_query

    print(f"{'kind':<9} {'seed':>4} {'n':>4} {'lower':>10} {'upper':>10} {'status':>6} {'s':>7}")
    for kind, n in (("linear", lengths[0]), ("logistic", lengths[1])):
        for seed in range(1, seeds + 1):
            rng = np.random.default_rng(seed)
            history = [{"query": draw_query(kind, rng), "output": 0} for _ in range(n)]
            for entry in history:
                high = bool(rng.integers(2))
                if kind == "linear":
                    entry["output"] = entry["query"]["range"][1 if high else 0]
                else:
                    entry["output"] = int(high)
            start = time.perf_counter()
            answer = compute_loss({"domain": domain_json(), "history": history})
            seconds = time.perf_counter() - start
            loss = answer["realized_loss"]
            print(
                f"{kind:<9} {seed:>4} {n:>4} {loss['lower']:>10.6f} {loss['upper']:>10.6f} "
                f"{answer['status']:>6} {seconds:>7.2f}"
            )


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paper", type=str, default=None, help="LINEAR_N,LOGISTIC_N")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if args.paper:
        paper_histories([int(v) for v in args.paper.split(",")], args.seeds)
        return
    cases = {
        "eps100-real-0": eps100(0, "real", 1),
        "eps100-int-1": eps100(1, "integer", 1),
        "eps100-x1000": eps100(0, "real", 1000),
        "steep-linear": steep_linear(),
        "parallel-1000": parallel(),
        "parallel-fl": parallel(rounded=True),
    }
    print(
        f"{'case':<15} {'exact':>14} {'lower':>14} {'upper':>14} {'holds':>5} "
        f"{'gap':>9} {'status':>6} {'seconds':>8}"
    )
    for name, (request, exact) in cases.items():
        times, answer = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            answer = compute_loss(request)
            times.append(time.perf_counter() - start)
        assert answer is not None  # noqa: S101 - at least one repeat
        loss = answer["realized_loss"]
        # the grid reference of parallel-1000 is within 1e-6 of the extremes (below them)
        slack = 1e-6 if name.startswith("parallel") else 0.0
        holds = loss["lower"] <= exact + slack and exact - slack <= loss["upper"]
        gap = loss["upper"] - loss["lower"]
        print(
            f"{name:<15} {exact:>14.8g} {loss['lower']:>14.8g} {loss['upper']:>14.8g} "
            f"{'yes' if holds else 'NO':>5} {gap:>9.2e} {answer['status']:>6} "
            f"{statistics.median(times):>8.3f}"
        )


if __name__ == "__main__":
    main()

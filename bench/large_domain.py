"""Large-domain frequency oracles (``olh``, ``hadamard``) against ``grr``: decode, accuracy, engine.

How to run (from the project root)::

    .venv/bin/python bench/large_domain.py                 # the issue's sizes (n = 10^6)
    .venv/bin/python bench/large_domain.py --n 100000      # quicker

Prints three tables:

1. **decode** — :func:`app.engine.estimates.olh_support_counts` on ``n`` OLH reports over ``k``
   values (``g`` = round(e^ε) + 1) and :func:`hadamard_support_counts` on ``n`` HR reports, with
   wall time and the process's peak RSS growth;
2. **accuracy** — one population of ``n`` members drawn from Zipf(1.1) over ``k`` values, each
   member answering once per mechanism with the engine's own exact CSPRNG samplers; the
   empirical mean squared error of the per-value estimates (averaged over the ``k`` values)
   beside the variance formula ``Σ_v Var(θ̂_v) / k`` with
   ``Var(θ̂_v) = (q(1−q) + f_v(p−q)(1−p−q)) / (n (p−q)²)``, and the per-report variance at
   ``f = 0``, ``q(1−q)/(p−q)²`` (the figures the issue quotes: 338.9, 3.68, 4.68 at k = 1,000);
3. **engine** — dry-run + submit (:class:`app.engine.accountant.Accountant`, the pipeline the
   service runs) of an ``olh`` query on an object whose history holds ``--history`` earlier
   ``olh`` reports over ``--engine-k`` values: median and p90 over ``--repeat`` submits;
4. **survey** (``--survey N``, PostgreSQL reachable) — ``gatekeeper serve`` on a fresh database,
   ``N`` objects over one attribute of ``--k`` values imported through ``POST /v1/imports``, then
   the surveys of ``--mechanisms`` (ε = 1 each; default a ``grr`` then an ``olh``) over all of
   them in turn, each timed from ``POST /v1/surveys`` to ``done``, with the likelihood states
   stored and the database's size after it.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import secrets
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

from app.engine.accountant import Accountant, submit
from app.engine.domain import Domain, parse_domain
from app.engine.estimates import (
    estimate,
    hadamard_support_counts,
    olh_support_counts,
    tally_outputs,
)
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.mechanisms.oracles import default_g


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _domain(k: int) -> Domain:
    return parse_domain({"attributes": [{"name": "v", "type": "integer", "low": 0,
                                         "high": k - 1}]})  # fmt: skip


def decode(n: int, k: int, eps: float) -> None:
    g = default_g(eps, k)
    size = 1 << k.bit_length()
    seeds = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64).copy()
    buckets = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64) % np.uint64(g)
    columns = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64) % np.uint64(size)
    print(f"\n## decode: n = {n:,} reports, k = {k:,} values, ε = {eps} (g = {g}, K = {size})")
    print("| oracle | seconds | peak RSS growth (MiB) |\n|---|---:|---:|")
    for name, run in (
        ("olh", lambda: olh_support_counts(seeds, buckets.astype(np.int64), k, g)),
        ("hadamard", lambda: hadamard_support_counts(columns.astype(np.int64), k, size)),
    ):
        before = _rss_mib()
        start = time.perf_counter()
        run()
        print(f"| {name} | {time.perf_counter() - start:.2f} | {_rss_mib() - before:.0f} |")


def _pq(mech: Mechanism, k: int) -> tuple[float, float]:
    e = math.exp(mech.eps)  # type: ignore[attr-defined]
    if mech.kind == "grr":
        return e / (e + k - 1), 1 / (e + k - 1)
    if mech.kind == "olh":
        g = mech.g  # type: ignore[attr-defined]
        return e / (e + g - 1), 1 / g
    return e / (1 + e), 0.5


def accuracy(n: int, k: int, eps: float) -> None:
    rng = np.random.default_rng(int.from_bytes(secrets.token_bytes(8), "big"))
    weights = 1.0 / np.arange(1, k + 1) ** 1.1
    values = rng.choice(k, size=n, p=weights / weights.sum())
    truth = np.bincount(values, minlength=k) / n
    domain = _domain(k)
    print(f"\n## accuracy: n = {n:,}, k = {k:,}, Zipf(1.1), ε = {eps}, one population")
    print("| mechanism | sampling s | decode s | empirical MSE | formula MSE | "
          "per-report variance at f=0 |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    mse: dict[str, float] = {}
    for kind in ("grr", "olh", "hadamard"):
        mech = parse_query({"mechanism": kind, "attribute": "v", "epsilon": eps}, domain)
        start = time.perf_counter()
        outputs = [mech.sample({"v": int(v)}) for v in values]
        sampled = time.perf_counter() - start
        start = time.perf_counter()
        tally: Counter[str] = tally_outputs(mech, outputs)
        found = estimate(mech, n, tally).value
        decoded = time.perf_counter() - start
        if found is None:
            raise SystemExit(f"{kind}: no estimate")
        est = np.array([found["values"][str(v)] for v in range(k)])
        mse[kind] = float(np.mean((est - truth) ** 2))
        p, q = _pq(mech, k)
        var = (q * (1 - q) + truth * (p - q) * (1 - p - q)) / (n * (p - q) ** 2)
        print(f"| {kind} | {sampled:.1f} | {decoded:.2f} | {mse[kind]:.3e} | "
              f"{float(np.mean(var)):.3e} | {q * (1 - q) / (p - q) ** 2:.2f} |")  # fmt: skip
    print(f"\nMSE ratio grr / olh = {mse['grr'] / mse['olh']:.1f}, "
          f"grr / hadamard = {mse['grr'] / mse['hadamard']:.1f}")  # fmt: skip


def engine(k: int, history: int, repeat: int, eps: float) -> None:
    domain = _domain(k)
    query: dict[str, Any] = {"mechanism": "olh", "attribute": "v", "epsilon": eps}
    acc = Accountant(domain, 1e6)
    for _ in range(history):
        submit(acc, parse_query(query, domain), {"v": 7})
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        mech = parse_query(query, domain)
        acc.dry_run(mech)
        submit(acc, mech, {"v": 7})
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    print(f"\n## engine: olh dry-run + submit, k = {k:,}, {history:,} earlier olh reports")
    print("| repeats | median ms | p90 ms |\n|---:|---:|---:|")
    print(f"| {repeat} | {np.median(ms):.2f} | {np.percentile(ms, 90):.2f} |")


def survey(n: int, k: int, mechanisms: list[str]) -> None:
    import tempfile
    from pathlib import Path

    import httpx
    import psycopg

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.service_load import ADMIN_KEY, Server, fresh_database

    domain = {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": k - 1}]}
    rng = np.random.default_rng(int.from_bytes(secrets.token_bytes(8), "big"))
    weights = 1.0 / np.arange(1, k + 1) ** 1.1
    values = rng.choice(k, size=n, p=weights / weights.sum())
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    print(f"\n## survey: {n:,} objects over k = {k:,} values, PostgreSQL, one web worker")
    print("| survey | seconds | members/s | likelihood states | database MiB |")
    print("|---|---:|---:|---:|---:|")
    with fresh_database() as (url, name), tempfile.TemporaryDirectory() as tmp:
        server = Server(url, workers=1, bound=0, log_path=Path(tmp) / "serve.log")
        try:
            with httpx.Client(base_url=server.url, headers=headers, timeout=600) as client:
                for start in range(0, n, 10_000):
                    batch = [
                        {"id": f"o{i:07d}", "domain": domain, "value": {"v": int(values[i])},
                         "budget": {"epsilon": 4}, "labels": {"study": "oracles"}}
                        for i in range(start, min(n, start + 10_000))
                    ]  # fmt: skip
                    client.post("/v1/imports", json={"objects": batch}).raise_for_status()
                for mechanism in mechanisms:
                    body = {
                        "name": mechanism,
                        "query": {"mechanism": mechanism, "attribute": "v", "epsilon": 1.0},
                        "cohort": {"labels": {"study": "oracles"}},
                    }
                    began = time.perf_counter()
                    created = client.post("/v1/surveys", json=body)
                    created.raise_for_status()
                    while True:
                        found = client.get(f"/v1/surveys/{created.json()['id']}").json()
                        if found["status"] not in ("queued", "running"):
                            break
                        time.sleep(0.5)
                    took = time.perf_counter() - began
                    with psycopg.connect(url.replace("+psycopg", "")) as conn:
                        states = conn.execute("SELECT count(*) FROM likelihood_states").fetchone()
                        size = conn.execute(f"SELECT pg_database_size('{name}')").fetchone()
                    print(f"| {mechanism} ({found['status']}) | {took:.1f} | {n / took:,.0f} | "
                          f"{states[0] if states else '?'} | "
                          f"{(size[0] if size else 0) / 2**20:.0f} |")  # fmt: skip
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--engine-k", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--skip", default="", help="comma list of decode,accuracy,engine")
    parser.add_argument("--survey", type=int, default=0, help="objects of the service survey")
    parser.add_argument("--mechanisms", default="grr,olh", help="the surveys, in order")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if "decode" not in skip:
        decode(args.n, args.k, args.epsilon)
    if "accuracy" not in skip:
        accuracy(args.n, args.k, args.epsilon)
    if "engine" not in skip:
        engine(args.engine_k, args.history, args.repeat, args.epsilon)
    if args.survey:
        survey(args.survey, args.k, args.mechanisms.split(","))


if __name__ == "__main__":
    main()

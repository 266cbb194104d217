"""Reuse of identical answers: a second identical survey with ``"reuse": true``, side by side
with the first survey, on PostgreSQL.

For each population size (``--objects``, several allowed), in one run: a fresh database,
``gatekeeper import`` of N objects (``bench.survey_load``'s population), ``gatekeeper serve``
(one web worker, surveys in process), then timed from ``POST /v1/surveys`` to ``done``:

1. the first survey (``grr`` ε = 1 on ``region``): every member decided, sampled and recorded;
2. the identical survey with ``"reuse": true``: every member answered by its stored answer —
   nothing sampled, charged or recorded on the objects (the objects table's size is printed
   before and after it, and the number of accepted answers in the history is unchanged).

Prints a table::

    .venv/bin/python bench/reuse_bench.py --objects 100000 200000
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import ADMIN_KEY, Server, fresh_database  # noqa: E402
from bench.survey_load import KEY_FILE, SURVEYS, cli, sql, write_population  # noqa: E402


def run_survey_body(
    http: httpx.Client, headers: dict[str, str], query: dict[str, Any], study: str, *, reuse: bool
) -> tuple[dict[str, Any], float]:
    """Create a survey of ``study`` asking ``query`` and wait for it: its view and seconds."""
    start = time.perf_counter()
    body = {"name": "bench reuse", "query": query, "cohort": {"labels": {"study": study}}}
    r = http.post("/v1/surveys", headers=headers, json={**body, "reuse": reuse})
    r.raise_for_status()
    survey_id = r.json()["id"]
    while True:
        view = http.get(f"/v1/surveys/{survey_id}", headers=headers).json()
        if view["status"] not in ("queued", "running"):
            return view, time.perf_counter() - start
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[100_000, 200_000])
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("GATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/3"),
    )
    args = parser.parse_args(argv)
    from cryptography.fernet import Fernet

    KEY_FILE.write_text(Fernet.generate_key().decode())
    print(f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()}", flush=True)
    results = []
    try:
        for n in args.objects:
            results.append(_one(n, args))
    finally:
        KEY_FILE.unlink(missing_ok=True)
    print()
    print(
        f"{'members':>9} | {'first survey s':>14} {'members/s':>10} | {'reuse survey s':>14} "
        f"{'members/s':>10} {'reused':>9} | {'objects table MiB before/after reuse':>36} "
        f"| history rows"
    )
    ok = True
    for n, first, reuse, reused, before, after, rows_before, rows_after in results:
        print(
            f"{n:>9,} | {first:>14.1f} {n / first:>10,.0f} | {reuse:>14.1f} {n / reuse:>10,.0f} "
            f"{reused:>9,} | {before / 2**20:>17.1f} / {after / 2**20:<16.1f} "
            f"| {rows_before:,} -> {rows_after:,}"
        )
        ok &= reused == n and rows_before == rows_after
    print(f"load after: {os.getloadavg()}")
    return 0 if ok else 1


def _one(n: int, args: argparse.Namespace) -> tuple[int, float, float, int, int, int, int, int]:
    query = SURVEYS[0]
    with fresh_database() as (url, _name), tempfile.TemporaryDirectory() as tmp:
        population = Path(tmp) / "population.ndjson"
        write_population(population, n, args.seed)
        done = cli(url, "import", str(population), "--quiet")
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        env = {
            "GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE),
            "BOUND_PROCESSES": "1",
            "REDIS_URL": args.redis_url,
        }
        server = Server(url, 1, 1, Path(tmp) / "server.log", env)
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
                view, first = run_survey_body(http, headers, query, "bench", reuse=False)
                _check_done(view)
                answers = _answers(url)
                before = int(sql(url, "SELECT pg_total_relation_size('objects')"))
                view, reuse = run_survey_body(http, headers, query, "bench", reuse=True)
                _check_done(view)
                after = int(sql(url, "SELECT pg_total_relation_size('objects')"))
                reused = int(view["progress"]["reused"])
                print(
                    f"{n:,} members: first {first:.1f} s, reuse {reuse:.1f} s "
                    f"(reused {reused:,}, accepted {view['progress']['accepted']:,})",
                    flush=True,
                )
        finally:
            server.stop()
        return n, first, reuse, reused, before, after, answers, _answers(url)


def _check_done(view: dict[str, Any]) -> None:
    if view["status"] != "done":
        raise SystemExit(f"survey {view['id']} ended {view['status']}: {view.get('error')}")


def _answers(url: str) -> int:
    """Accepted answers recorded on the objects (Σ accepted: every history entry)."""
    return int(sql(url, "SELECT coalesce(sum(accepted), 0) FROM objects"))


if __name__ == "__main__":
    raise SystemExit(main())

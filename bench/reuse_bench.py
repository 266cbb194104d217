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

``--baseline DIR``: side by side with another tree (a worktree of main) on the same data. The
reuse survey is then run ``--rounds`` times per tree in ABBA order (baseline, this tree, this
tree, baseline, …), each by a fresh ``gatekeeper serve`` of that tree, and deleted afterwards
(so each finds only the first survey's answers); wall seconds, the server process's CPU
seconds and the load average are printed per run::

    .venv/bin/python bench/reuse_bench.py --objects 200000 --baseline /work/wt/main-base
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
    parser.add_argument("--baseline", type=Path, default=None, help="another tree, side by side")
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds with --baseline")
    parser.add_argument("--database", default=None, help="the database's name (default: random)")
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
        f"{'members':>9} | {'first survey s':>14} {'members/s':>10} | {'tree':>8} "
        f"{'reuse survey s':>14} {'server CPU s':>12} {'members/s':>10} {'reused':>9} "
        f"{'load':>5} | {'objects table MiB before/after reuse':>36} | history rows"
    )
    ok = True
    for n, first, runs, before, after, rows_before, rows_after in results:
        for tree, reuse, cpu, reused, load in runs:
            print(
                f"{n:>9,} | {first:>14.1f} {n / first:>10,.0f} | {tree:>8} {reuse:>14.1f} "
                f"{cpu:>12.1f} {n / reuse:>10,.0f} {reused:>9,} {load:>5.1f} "
                f"| {before / 2**20:>17.1f} / {after / 2**20:<16.1f} "
                f"| {rows_before:,} -> {rows_after:,}"
            )
            ok &= reused == n
        ok &= rows_before == rows_after and before == after
    print(f"load after: {os.getloadavg()}")
    return 0 if ok else 1


Run = tuple[str, float, float, int, float]


def _one(n: int, args: argparse.Namespace) -> tuple[int, float, list[Run], int, int, int, int]:
    query = SURVEYS[0]
    trees = [("this", ROOT)]
    if args.baseline is not None:
        this, base = ("this", ROOT), ("baseline", args.baseline.resolve())
        trees = [tree for _ in range(args.rounds) for tree in (base, this, this, base)]
    with (
        fresh_database(name=args.database) as (url, _name),
        tempfile.TemporaryDirectory() as tmp,
    ):
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
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        server = Server(url, 1, 1, Path(tmp) / "server.log", env)
        try:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                view, first = run_survey_body(http, headers, query, "bench", reuse=False)
                _check_done(view)
        finally:
            server.stop()
        answers = _answers(url)
        before = int(sql(url, "SELECT pg_total_relation_size('objects')"))
        runs: list[Run] = []
        for label, tree in trees:
            server = Server(url, 1, 1, Path(tmp) / f"{label}.log", env, tree=tree)
            try:
                with httpx.Client(base_url=server.url, timeout=120) as http:
                    cpu = server.cpu()
                    view, reuse = run_survey_body(http, headers, query, "bench", reuse=True)
                    cpu = server.cpu() - cpu
                    load = os.getloadavg()[0]
                    _check_done(view)
            finally:
                server.stop()
            reused = int(view["progress"]["reused"])
            runs.append((label, reuse, cpu, reused, load))
            print(
                f"{n:,} members, {label}: first {first:.1f} s, reuse {reuse:.1f} s, "
                f"server CPU {cpu:.1f} s (reused {reused:,}, accepted "
                f"{view['progress']['accepted']:,}), load {load:.1f}",
                flush=True,
            )
            if len(trees) > 1:  # the next run finds only the first survey's answers
                _delete_survey(url, int(view["id"]))
        after = int(sql(url, "SELECT pg_total_relation_size('objects')"))
        return n, first, runs, before, after, answers, _answers(url)


def _delete_survey(url: str, survey_id: int) -> None:
    """Delete a reuse survey (its chunks and row) so the next run finds what this one found."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM survey_chunks WHERE survey_id = %s", (survey_id,))
        conn.execute("DELETE FROM surveys WHERE id = %s", (survey_id,))


def _check_done(view: dict[str, Any]) -> None:
    if view["status"] != "done":
        raise SystemExit(f"survey {view['id']} ended {view['status']}: {view.get('error')}")


def _answers(url: str) -> int:
    """Accepted answers recorded on the objects (Σ accepted: every history entry)."""
    return int(sql(url, "SELECT coalesce(sum(accepted), 0) FROM objects"))


if __name__ == "__main__":
    raise SystemExit(main())

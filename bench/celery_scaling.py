"""Distributed worker module (Celery): survey members/s and continuous bounds/s with 1 and 2
worker processes, the scaling ratio, and the in-process default side by side.

How to run (from the project root; PostgreSQL and Redis reachable, as for the tests)::

    .venv/bin/python bench/celery_scaling.py                   # 3 cohorts of 30,000, 48 bounds
    .venv/bin/python bench/celery_scaling.py --objects 5000 --bounds 16   # a quick look
    .venv/bin/python bench/celery_scaling.py --broker amqp://guest:guest@127.0.0.1:5672//

What it does
------------
1. A fresh PostgreSQL database; ``gatekeeper import`` of three cohorts of ``--objects`` finite
   objects each (labels ``study: s0``, ``s1``, ``s2``; the domain of ``bench/survey_load.py``).
2. **Surveys**: ``grr`` ε = 1 on ``region`` over one cohort per configuration, timed from
   ``POST /v1/surveys`` to ``status: done`` through ``gatekeeper serve`` (one web worker):
   in process (no broker, ``SURVEY_THREADS`` 2), then with ``BROKER_URL`` and one
   ``gatekeeper worker --queues surveys --concurrency P`` for P = 1, 2. ``SURVEY_CHUNK_SIZE``
   is ``--chunk`` (1,000: 30 ranges per survey to spread).
3. **Continuous bounds**: ``--bounds`` *distinct* calculator requests (3 real attributes in
   [-1, 1], 4 ``logistic`` queries with seeded random weights; each search completes, none is
   stopped by a time limit, so wall time measures CPU) sent by 8 client threads through the
   service's own :class:`~app.worker.remote.CeleryBoundWorker` to
   ``gatekeeper worker --queues bounds --concurrency P``, P = 1, 2; and the same requests
   through the in-process pool (:class:`~app.worker.pool.BoundWorker`, ``processes=P``).
4. **Parallelism check** (rows ``limited``): 8 requests whose searches are stopped by a 0.5 s
   time limit (wall-clock bound, so independent of free CPU) on 1 and 2 Celery processes: two
   processes must halve the time even on a saturated machine.

Prints one table: per row the rate, the CPU the computing processes spent per unit (the worker
command's whole session for Celery — nodes and pool processes, not PostgreSQL; the server's
session for the in-process survey; this process and its pool for the in-process bounds), and
the 1-minute load average before it ran. The machine is shared: the CPU per unit is the figure
that does not depend on what else runs; rates and ratios do.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import ADMIN_KEY, REDIS_URL, Server, fresh_database  # noqa: E402
from bench.survey_load import DOMAIN, KEY_FILE, REGIONS, cli, run_survey  # noqa: E402


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


_TICK = os.sysconf("SC_CLK_TCK")


def session_cpu(sid: int) -> float:
    """CPU seconds (user + system) of the live processes of session ``sid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat, counted after the command
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def write_cohorts(path: Path, n: int, cohorts: int, seed: int) -> None:
    """``cohorts`` x ``n`` finite objects, labelled ``study: s<k>``."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for k in range(cohorts):
            for i in range(n):
                value = {
                    "age": rng.randrange(10),
                    "sex": rng.randrange(2),
                    "region": REGIONS[min(int(rng.expovariate(0.3)), 14)],
                }
                body = {
                    "id": f"s{k}-{i:07d}",
                    "domain": DOMAIN,
                    "value": value,
                    "budget": {"epsilon": 4.0},
                    "labels": {"study": f"s{k}"},
                }
                out.write(json.dumps(body) + "\n")


def drop_namespace(namespace: str) -> None:
    """Remove this run's keys from Redis (statistics, results, queue bindings)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for pattern in (
        f"gatekeeper:celery:{namespace}:*",
        f"celery-task-meta-{namespace}:*",
        f"_kombu.binding.{namespace}.*",
        f"_kombu.binding_permanent.{namespace}.*",
    ):
        for key in client.scan_iter(match=pattern):
            client.delete(key)
    client.close()


def bound_request(i: int) -> dict[str, Any]:
    """A distinct continuous calculator request (seeded by ``i``)."""
    rng = random.Random(i)
    names = ["x0", "x1", "x2"]
    history = []
    for _ in range(4):
        weights = {name: round(rng.uniform(-1, 1), 3) for name in names}
        query = {
            "mechanism": "logistic",
            "weights": weights,
            "intercept": round(rng.uniform(-1, 1), 3),
            "epsilon": 0.5,
        }
        history.append({"query": query, "output": rng.randrange(2)})
    domain = {"attributes": [{"name": n, "type": "real", "low": -1, "high": 1} for n in names]}
    return {"domain": domain, "history": history}


@contextmanager
def worker(env: dict[str, str], queue: str, processes: int, log: Path) -> Iterator[int]:
    """A ``gatekeeper worker`` with one node (``queue``), waited for until it heartbeats."""
    import redis

    full = {**os.environ, **env}  # JSON tasks: the worker runs as root too
    with log.open("w") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "app.cli", "worker", "--queues", queue, "-c", str(processes)],
            cwd=ROOT,
            env=full,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        client = redis.Redis.from_url(env["REDIS_URL"])
        pattern = f"gatekeeper:celery:{env['BROKER_NAMESPACE']}:workers:*"
        try:
            deadline = time.monotonic() + 60
            while not list(client.scan_iter(match=pattern)):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(log.read_text()[-2000:])
                time.sleep(0.2)
            time.sleep(1.0)  # the pool processes fork after the heartbeat starts
            yield proc.pid  # its session: the command, its nodes and their pool processes
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            for key in client.scan_iter(match=pattern):
                client.delete(key)
            client.close()


def survey_rate(
    url: str, env: dict[str, str], study: str, log: Path, sid: int | None
) -> tuple[int, float, float]:
    """(members, seconds, CPU seconds) of one survey through a one-worker ``gatekeeper serve``.

    CPU is that of session ``sid`` (a worker command), or the server's when None.
    """
    server = Server(url, 1, 0, log, extra_env=env)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
            query = {"mechanism": "grr", "attribute": "region", "epsilon": 1.0}
            session = server.process.pid if sid is None else sid
            cpu = session_cpu(session)
            view, seconds = run_survey(http, headers, query, study)
            cpu = session_cpu(session) - cpu
            if view["status"] != "done":
                raise RuntimeError(f"survey ended {view['status']}: {view.get('error')}")
            return int(view["progress"]["decided"]), seconds, cpu
    finally:
        server.stop()


def row_sizes(url: str) -> dict[str, tuple[int, float]]:
    """Rows and stored bytes per row of the tables that grow with objects and queries."""
    import psycopg

    sizes = {}
    with psycopg.connect(url) as conn:
        for table in ("objects", "queries", "survey_chunks"):
            row = conn.execute(
                f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}"  # noqa: S608
            ).fetchone()
            assert row is not None  # noqa: S101 - count(*) returns a row
            sizes[table] = (int(row[0]), row[1] / max(1, row[0]))
    return sizes


def bounds_rate(compute: Callable[[dict[str, Any]], Any], n: int, offset: int) -> float:
    """Seconds for ``n`` distinct requests sent by 8 threads."""
    requests = [bound_request(offset + i) for i in range(n)]
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(compute, requests))
    seconds = time.perf_counter() - start
    limited = sum(1 for a in answers if a.get("status") != "ok")
    if limited:
        print(f"warning: {limited} answers hit a limit or fell back", file=sys.stderr)
    return seconds


def surveys(
    url: str, common: dict[str, str], celery_env: dict[str, str], tmp: Path, rounds: int
) -> list[tuple[str, str, int, float, float, float]]:
    """The survey rows: in process, then Celery with 1 and 2 processes, ``rounds`` times
    alternating (one cohort each)."""
    rows = []
    before = load()
    members, seconds, cpu = survey_rate(url, common, "s0", tmp / "serve0.log", None)
    rows.append(("survey", "in process (2 threads)", 0, members / seconds, cpu / members, before))
    for k, processes in enumerate((1, 2) * rounds, start=1):
        with worker(celery_env, "surveys", processes, tmp / f"w{k}.log") as sid:
            before = load()
            members, seconds, cpu = survey_rate(
                url, celery_env, f"s{k}", tmp / f"serve{k}.log", sid
            )
        rows.append(("survey", "celery", processes, members / seconds, cpu / members, before))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--objects", type=int, default=30_000, help="members per cohort")
    parser.add_argument("--bounds", type=int, default=48, help="distinct bound requests")
    parser.add_argument("--chunk", type=int, default=1000, help="SURVEY_CHUNK_SIZE")
    parser.add_argument("--broker", default=REDIS_URL, help="BROKER_URL (default: test Redis)")
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--no-surveys", action="store_true", help="bounds only")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the 1- and 2-process runs, alternating"
    )
    args = parser.parse_args(argv)

    from app.bootstrap import celery_settings
    from app.settings import Settings
    from app.worker.celery_app import make_celery
    from app.worker.pool import BoundWorker, WorkerSettings
    from app.worker.remote import CeleryBoundWorker

    rows: list[tuple[str, str, int, float, float, float]] = []
    sizes: dict[str, tuple[int, float]] = {}
    namespace = "bench" + secrets.token_hex(3)
    tmp = Path(tempfile.mkdtemp(prefix="gk-celery-bench-"))
    with fresh_database() as (url, _name):
        common = {
            "DATABASE_URL": url,
            "REDIS_URL": REDIS_URL,
            "GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE),
            "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "SURVEY_CHUNK_SIZE": str(args.chunk),
            "BOUND_TIME_LIMIT": "30",
        }
        celery_env = {**common, "BROKER_URL": args.broker, "BROKER_NAMESPACE": namespace}
        if not args.no_surveys:
            population = tmp / "cohorts.ndjson"
            write_cohorts(population, args.objects, 1 + 2 * args.rounds, args.seed)
            imported = cli(url, "import", str(population), "--quiet")
            if imported.returncode != 0:
                raise RuntimeError(imported.stderr)
            rows += surveys(url, common, celery_env, tmp, args.rounds)
            sizes = row_sizes(url)
        settings = Settings(
            database_url=url,
            redis_url=REDIS_URL,
            broker_url=args.broker,
            broker_namespace=namespace,
            bound_time_limit=30,
        )
        cfg = celery_settings(settings)
        app = make_celery(cfg)
        offset = 0
        for processes in (1, 2) * args.rounds:
            pool = BoundWorker(WorkerSettings(processes=processes, time_limit=30))
            pool.compute(bound_request(10**6))  # the pool's processes start (imports)
            before = load()
            cpu = session_cpu(os.getsid(0))
            seconds = bounds_rate(pool.compute, args.bounds, offset)
            cpu = session_cpu(os.getsid(0)) - cpu
            offset += args.bounds
            pool.close()
            rate = args.bounds / seconds
            rows.append(("bounds", "in-process pool", processes, rate, cpu / args.bounds, before))
        for processes in (1, 2) * args.rounds:
            remote = CeleryBoundWorker(
                WorkerSettings(processes=0, time_limit=30), None, celery=app, cfg=cfg
            )
            with worker(celery_env, "bounds", processes, tmp / f"b{offset}.log") as sid:
                before = load()
                cpu = session_cpu(sid)
                seconds = bounds_rate(remote.compute, args.bounds, offset)
                cpu = session_cpu(sid) - cpu
            offset += args.bounds
            rate = args.bounds / seconds
            rows.append(("bounds", "celery", processes, rate, cpu / args.bounds, before))

        # parallelism independent of free CPU: searches stopped by a 0.5 s time limit take
        # their wall time whatever the load, so P processes should divide the total by P
        for processes in (1, 2):
            remote = CeleryBoundWorker(
                WorkerSettings(processes=0, time_limit=30), None, celery=app, cfg=cfg
            )
            requests = []
            for i in range(8):
                request = bound_request(offset + i)
                request["options"] = {"tolerance": 1e-14, "time_limit": 0.5}
                requests.append(request)
            offset += 8
            with worker(celery_env, "bounds", processes, tmp / f"t{processes}.log"):
                before = load()
                start = time.perf_counter()
                with ThreadPoolExecutor(8) as clients:
                    list(clients.map(remote.compute, requests))
                seconds = time.perf_counter() - start
            rows.append(("limited", "celery", processes, 8 / seconds, 0.0, before))
    drop_namespace(namespace)
    print(f"\n{args.objects} members per survey, chunks of {args.chunk}; {args.bounds} bounds")
    print(
        f"{'work':<7} {'engine':<24} {'processes':>9} {'per second':>11} "
        f"{'CPU ms each':>11} {'load':>5}"
    )
    for work, engine, processes, rate, cpu_each, before in rows:
        shown = str(processes) if processes else "-"
        print(
            f"{work:<7} {engine:<24} {shown:>9} {rate:>11,.1f} {cpu_each * 1000:>11.2f} "
            f"{before:>5.1f}"
        )
    print("table            rows   bytes/row (heap + indexes + TOAST)")
    for table, (count, per_row) in sizes.items():
        print(f"{table:<15} {count:>8,} {per_row:>8,.0f}")
    for work, engine in (
        ("survey", "celery"),
        ("bounds", "celery"),
        ("bounds", "in-process pool"),
        ("limited", "celery"),
    ):
        one = [r for w, e, p, r, _, _ in rows if w == work and e == engine and p == 1]
        two = [r for w, e, p, r, _, _ in rows if w == work and e == engine and p == 2]
        if one and two:
            ratio = statistics.median(two) / statistics.median(one)
            print(f"scaling 2/1 processes (medians), {work} on {engine}: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

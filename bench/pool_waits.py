"""Who waits for a pooled connection while submits and an in-process survey run together.

How to run (from the project root, PostgreSQL and Redis reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/pool_waits.py \\
        --runs main=/work/wt/base,nokeep=/work/wt/base:nokeep,new=. --rounds 3

A web process's request threads keep up to half of its pool (``DB_POOL_SIZE`` 5 +
``DB_MAX_OVERFLOW`` 5) checked out across their submits (:mod:`app.store.base`), so the
process's other users — the in-process survey runner and its chunk threads, the sweeper,
housekeeping — share the other half with the request threads' other check-outs. This script
measures whether they then wait for a connection, and how long.

1. A fresh PostgreSQL database (``bench.service_load.fresh_database``, ``--db-prefix``), and a
   population of ``--members`` objects per run imported once by ``gatekeeper import`` (300-point
   domain; each run's survey gets a group of its own, label ``study: gN``, so every survey
   starts from the same fresh histories).
2. Per run (``NAME=TREE[:nokeep]``; the order rotates by round) a child process on ``TREE``'s
   code builds the app in process (:func:`app.bootstrap.create_app`, pool 5 + 5, five request
   threads, surveys in process with ``SURVEY_THREADS`` 2, no bound-worker processes) and
   drives it through Starlette's ``TestClient``: ``--clients`` threads each submit to an object
   of their own (``grr`` ε = 0.5), one after the other, while one survey (``grr`` ε = 0.5 on the
   group) runs from ``POST /v1/surveys`` to done. ``nokeep`` runs the same tree with the kept
   connections off (``app.store.base._kept`` answers None: every block checks its own out).
3. Every wait in the pool's queue (SQLAlchemy's ``QueuePool`` waits there only when its size
   and overflow are all checked out: a blocking get on an empty queue) is timed per thread:
   request threads (``request_N``), the survey's (``survey-runner``, ``survey_N``), the rest
   (sweeper, housekeeping, the loop). A wait of ``pool_timeout`` (10 s) would fail its caller.

It prints per run the survey's seconds, the answers per second beside it (submits and reads,
``--readers`` threads reading an object each in a loop), per kind of thread the check-outs, how
many waited, the waits over 10 ms, the longest and the total, the share of 2 ms samples in
which the pool had every connection out (any check-out then waits), with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("request", "survey", "other")


def kind_of(thread_name: str) -> str:
    if thread_name.startswith("request"):
        return "request"
    if thread_name.startswith("survey") and thread_name != "survey-sweeper":
        return "survey"
    return "other"


def child(args: argparse.Namespace) -> None:
    """Run in the tree's code: the app under load with a survey, print one JSON line."""
    import threading

    from sqlalchemy.pool import QueuePool
    from sqlalchemy.util import queue as sqla_queue
    from starlette.testclient import TestClient

    from app.bootstrap import create_app
    from app.settings import Settings

    if args.nokeep:
        from app.store import base

        base._kept = lambda db: None

    guard = threading.Lock()
    gets: dict[str, int] = defaultdict(int)
    waits: dict[str, list[float]] = defaultdict(list)
    measuring = threading.Event()
    real_do_get = QueuePool._do_get
    real_get = sqla_queue.Queue.get

    pools: list[QueuePool] = []  # the app's pool (Engine.dispose() would make another)

    def do_get(self: QueuePool) -> Any:
        if self not in pools:
            pools.append(self)
        if measuring.is_set():
            with guard:
                gets[kind_of(threading.current_thread().name)] += 1
        return real_do_get(self)

    def get(self: Any, block: bool = True, timeout: float | None = None) -> Any:
        if not (block and measuring.is_set() and self.empty()):  # a get that waits
            return real_get(self, block, timeout)
        start = time.perf_counter()
        try:
            return real_get(self, block, timeout)
        finally:
            waited = time.perf_counter() - start
            with guard:
                waits[kind_of(threading.current_thread().name)].append(waited)

    QueuePool._do_get = do_get  # type: ignore[method-assign]
    sqla_queue.Queue.get = get  # type: ignore[method-assign]

    settings = Settings(
        database_url=args.url,
        redis_url=args.redis,
        gatekeeper_bootstrap_admin_key=args.admin_key,
        bound_processes=0,
    )
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    domain = {"attributes": [{"name": "a", "type": "integer", "low": 0, "high": 9}]}
    with TestClient(create_app(settings)) as client:
        objects = []
        for i in range(args.clients):
            oid = f"pw-{args.group}-{i}"
            body = {"id": oid, "domain": domain, "value": {"a": i % 10}}
            body["budget"] = {"epsilon": 10_000.0}
            r = client.post("/v1/objects", json=body, headers=admin)
            r.raise_for_status()
            objects.append(oid)
        r = client.post("/v1/keys", json={"role": "analyst"}, headers=admin)
        r.raise_for_status()
        analyst = {"Authorization": f"Bearer {r.json()['key']}"}
        query = {"query": {"mechanism": "grr", "attribute": "a", "epsilon": 0.5}}
        for oid in objects:  # warm: each object's first decision, untimed
            client.post(f"/v1/objects/{oid}/queries", json=query, headers=analyst)
        stop = threading.Event()
        statuses: dict[int, int] = defaultdict(int)

        def submitter(oid: str) -> None:
            while not stop.is_set():
                status = client.post(
                    f"/v1/objects/{oid}/queries", json=query, headers=analyst
                ).status_code
                with guard:
                    statuses[status] += 1

        def reader(oid: str) -> None:
            while not stop.is_set():
                status = client.get(f"/v1/objects/{oid}", headers=analyst).status_code
                with guard:
                    statuses[status] += 1

        full = [0, 0]  # samples of the pool with every connection out, samples

        def sample() -> None:  # every 2 ms: is the pool exhausted (a check-out would wait)?
            while not stop.is_set():
                pool = pools[-1]
                out = pool.checkedout()
                with guard:
                    full[0] += out >= pool.size() + pool._max_overflow
                    full[1] += 1
                time.sleep(0.002)

        measuring.set()
        threads = [threading.Thread(target=submitter, args=(oid,)) for oid in objects]
        threads += [
            threading.Thread(target=reader, args=(objects[i % len(objects)],))
            for i in range(args.readers)
        ]
        started = time.perf_counter()
        threads.append(threading.Thread(target=sample))
        for thread in threads:
            thread.start()
        survey = {
            "name": "pool waits",
            "query": {"mechanism": "grr", "attribute": "region", "epsilon": 0.5},
            "cohort": {"labels": {"study": f"g{args.group}"}},
        }
        r = client.post("/v1/surveys", json=survey, headers=analyst)
        r.raise_for_status()
        survey_id = r.json()["id"]
        while True:
            view = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
            if view["status"] not in ("queued", "running"):
                break
            if time.perf_counter() - started > args.time_limit:
                break
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        stop.set()
        for thread in threads:
            thread.join()
        measuring.clear()
    out: dict[str, Any] = {
        "status": view["status"],
        "decided": view.get("progress", {}).get("decided"),
        "seconds": seconds,
        "statuses": dict(statuses),
        "full": full[0] / max(full[1], 1),
    }
    for kind in KINDS:
        got = sorted(waits[kind])
        out[kind] = {
            "gets": gets[kind],
            "waited": len(got),
            "over_10ms": sum(1 for w in got if w > 0.01),
            "max_ms": 1000 * got[-1] if got else 0.0,
            "total_s": sum(got),
        }
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", required=True, help="NAME=TREE[:nokeep],... (two or more)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--members", type=int, default=5000, help="survey members per run")
    parser.add_argument("--clients", type=int, default=16, help="submitting threads")
    parser.add_argument("--readers", type=int, default=0, help="threads reading objects")
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--db-prefix", default="gk_bench_")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nokeep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--admin-key", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(ROOT))
    from cryptography.fernet import Fernet

    from bench import survey_load

    runs = []
    for spec in args.runs.split(","):
        name, _, where = spec.partition("=")
        tree, _, flag = where.partition(":")
        runs.append((name, str(Path(tree).resolve()), flag == "nokeep"))
    survey_load.KEY_FILE.write_text(Fernet.generate_key().decode())
    try:
        measure(args, runs)
    finally:
        survey_load.KEY_FILE.unlink(missing_ok=True)


def measure(args: argparse.Namespace, runs: list[tuple[str, str, bool]]) -> None:
    """The runs, on a fresh database with the population imported once."""
    from bench import survey_load
    from bench.service_load import ADMIN_KEY, REDIS_URL, fresh_database

    groups = args.rounds * len(runs)
    print(f"pool_waits: {args.members} members per survey, {args.clients} submitting threads")
    with (
        fresh_database(prefix=args.db_prefix) as (url, _name),
        tempfile.TemporaryDirectory() as tmp,
    ):
        population = Path(tmp) / "population.ndjson"
        survey_load.write_population(population, args.members * groups, 27)
        with population.open() as src, (Path(tmp) / "grouped.ndjson").open("w") as dst:
            for i, line in enumerate(src):
                body = json.loads(line)
                body["labels"] = {"study": f"g{i % groups}"}
                dst.write(json.dumps(body) + "\n")
        done = survey_load.cli(url, "import", str(Path(tmp) / "grouped.ndjson"), "--quiet")
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        header = f"{'run':<8} round {'survey s':>8} {'submits/s':>9}"
        for kind in KINDS:
            header += f" | {kind}: gets waited >10ms max_ms total_s"
        print(header + " | full % | load")
        group = 0
        for round_ in range(args.rounds):
            order = runs[round_ % len(runs) :] + runs[: round_ % len(runs)]
            for name, tree, nokeep in order:
                env = dict(
                    os.environ,
                    PYTHONPATH=f"{tree}:{tree}/clients/python/src",
                    GATEKEEPER_ENCRYPTION_KEY_FILE=str(survey_load.KEY_FILE),
                )
                command = [sys.executable, str(Path(__file__).resolve()), "--child"]
                command += ["--runs", args.runs, "--group", str(group), "--url", url]
                command += ["--redis", REDIS_URL, "--admin-key", ADMIN_KEY]
                command += ["--clients", str(args.clients), "--readers", str(args.readers)]
                command += ["--time-limit", str(args.time_limit)]
                if nokeep:
                    command.append("--nokeep")
                group += 1
                done = subprocess.run(  # noqa: S603 - this script
                    command, env=env, cwd=tree, capture_output=True, text=True, check=False
                )
                if done.returncode != 0:
                    print(done.stderr[-3000:])
                    raise SystemExit(f"{name}: the child failed")
                got = json.loads(done.stdout.strip().splitlines()[-1])
                submits = sum(got["statuses"].values())
                line = f"{name:<8} {round_ + 1:>5} {got['seconds']:8.1f} "
                line += f"{submits / got['seconds']:9.1f}"  # answers: submits and reads
                for kind in KINDS:
                    k = got[kind]
                    line += f" | {k['gets']:>6} {k['waited']:>6} {k['over_10ms']:>5}"
                    line += f" {k['max_ms']:8.1f} {k['total_s']:7.2f}"
                line += f" | {100 * got['full']:6.1f}"
                print(f"{line} | {os.getloadavg()[0]:.2f}", flush=True)
                if got["status"] != "done" or set(got["statuses"]) - {"201", "200"}:
                    print(f"   survey {got['status']}, decided {got['decided']}, {got['statuses']}")


if __name__ == "__main__":
    main()

"""Interleaved A/B of a whole single submit without HTTP: two trees, blocks alternated.

How to run (from the project root, PostgreSQL and Redis reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/submit_ab.py --trees BASE,NEW --blocks 40

``bench/submit_cpu.py --direct`` runs one tree after the other, and on this shared 2-core
machine the load moves between the runs by more than a change of 10% of a submit's CPU
(docs/benchmarks.md). Here each tree has a child process of its own, started together on one
fresh PostgreSQL database (dropped at the end), each with the app built from its tree
(:func:`app.bootstrap.create_app`, Redis locks on) and ``--objects`` objects of
``service_load``'s ``grr`` scenario (a 1,000-point domain, ε = 0.5, a fresh
``Idempotency-Key`` each). After ``--warmup`` submits each, the parent asks the children in turn
for ``--block`` submits at a time through the service's own ``submit`` (no HTTP, no ASGI, one at
a time), ``--blocks`` times each, the order within a pair alternating: the load drifts over both
alike. Per block a child reports its CPU (``time.process_time``: user + system, all its threads)
and the CPU of its pool's PostgreSQL backends (``/proc``, in clock ticks: summed over the
blocks); the table gives each tree's median and interquartile range of its CPU per submit, its
backends' mean, and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import service_load as sl  # type: ignore[import-not-found]  # noqa: E402

ADMIN_KEY = "bench-admin-" + "a" * 40


def child(args: argparse.Namespace) -> None:
    """In the tree's code: build the app, then answer ``N`` lines with one JSON line each."""
    import asyncio
    import random

    import httpx
    import psycopg
    from service_load import GRR_DOMAIN, SCENARIOS, grr_value  # type: ignore[import-not-found]

    from app.bootstrap import create_app
    from app.services import queries as query_service
    from app.services.auth import authenticate
    from app.services.errors import BudgetExhausted
    from app.settings import Settings

    app = create_app(
        Settings(
            database_url=args.url,
            redis_url=args.redis,
            gatekeeper_bootstrap_admin_key=ADMIN_KEY,
            bound_processes=0,
        )
    )
    queries = SCENARIOS["grr"][3](None)
    rng = random.Random(args.seed)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    async def setup() -> tuple[list[str], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ab") as client:
            r = await client.post("/v1/keys", json={"role": "analyst"}, headers=admin)
            secret = r.json()["key"]
            ids = []
            for _ in range(args.objects):
                oid = "ab-" + secrets.token_hex(6)
                body = {
                    "id": oid,
                    "domain": GRR_DOMAIN,
                    "value": grr_value(rng),
                    "budget": {"epsilon": args.budget},
                    "filter": "bayesian",
                }
                r = await client.post("/v1/objects", json=body, headers=admin)
                assert r.status_code == 201, r.text  # noqa: S101 - a bench's own check
                ids.append(oid)
        found = authenticate(engine=runtime.engine, secret=secret)
        assert found is not None  # noqa: S101 - the key was just made
        return ids, found[0].id

    runtime: Any = None  # the app's runtime, made when its lifespan starts

    async def start() -> None:
        nonlocal runtime
        async with app.router.lifespan_context(app):
            runtime = app.state.runtime
            ids, owner = await setup()
            await _serve(ids, owner)

    async def _serve(ids: list[str], owner: int) -> None:
        count = 0

        def run(n: int) -> int:
            """``n`` submits; how many were rejected (409)."""
            nonlocal count
            rejected = 0
            for _ in range(n):
                try:
                    query_service.submit(
                        engine=runtime.engine,
                        worker=runtime.worker,
                        locks=runtime.locks,
                        object_id=ids[count % len(ids)],
                        query=queries[count % len(queries)],
                        idempotency_key=secrets.token_hex(16),
                        analyst_key_id=owner,
                        limits=runtime.limits,
                        attempts=runtime.settings.submit_attempts,
                    )
                except BudgetExhausted:
                    rejected += 1
                count += 1
            return rejected

        run(args.warmup)
        with psycopg.connect(args.url, autocommit=True) as conn:
            pids = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND (client_port = ANY(%s) "
                    "OR application_name = %s)",
                    (_client_ports(runtime.engine), _application_name(args.url)),
                )
            ]
        print(json.dumps({"ready": True, "backends": len(pids)}), flush=True)
        for line in sys.stdin:
            n = int(line)
            if n <= 0:
                break
            cpu0, pg0 = time.process_time(), sl.procs_cpu(pids)
            rejected = run(n)
            cpu1, pg1 = time.process_time(), sl.procs_cpu(pids)
            print(
                json.dumps({"cpu": cpu1 - cpu0, "pg": pg1 - pg0, "rejected": rejected}), flush=True
            )

    asyncio.run(start())


def _application_name(url: str) -> str:
    """The ``application_name`` the parent gave this child's URL ("" if none).

    A request thread keeps its pooled connection across submits (h/conn), so the pool's idle
    queue may hold none of the child's connections: its backends are found by this name.
    """
    query = url.partition("?")[2]
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == "application_name":
            return value
    return ""


def _client_ports(engine: Any) -> list[int]:
    """The local ports of the pool's open connections (to find their backends)."""
    ports = []
    pool = engine.pool
    for record in list(getattr(pool, "_pool").queue):  # noqa: B009 - the pool's idle records
        raw = record.dbapi_connection
        if raw is not None:
            import socket

            sock = socket.socket(fileno=os.dup(raw.pgconn.socket))
            try:
                ports.append(sock.getsockname()[1])
            finally:
                sock.close()
    return ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", help="two comma-separated source folders: A,B")
    parser.add_argument("--blocks", type=int, default=40, help="blocks per tree (40)")
    parser.add_argument("--block", type=int, default=25, help="submits per block (25)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed submits first (100)")
    parser.add_argument("--objects", type=int, default=10)
    parser.add_argument(
        "--budget",
        type=float,
        default=10_000.0,
        help="each object's ε budget (10000: all accepted; 0.6: one accepted, then rejections)",
    )
    parser.add_argument("--seed", type=int, default=1)
    sl.add_scratch_args(parser, db_prefix="submit_ab_")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import psycopg

    sys.path.insert(0, str(ROOT))
    from app.db.migrate import upgrade

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    if len(trees) != 2:
        parser.error("--trees takes two folders")
    name = args.db_prefix + secrets.token_hex(4)
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    children: list[subprocess.Popen[str]] = []
    keys = tempfile.TemporaryDirectory(prefix="submit_ab_keys_")
    try:
        upgrade(url)
        for i, tree in enumerate(trees):
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                *("--child", "--url", f"{url}?application_name=submit_ab_{i}"),
                *("--redis", args.redis),
                *("--warmup", str(args.warmup), "--objects", str(args.objects)),
                *("--budget", str(args.budget)),
                *("--seed", str(args.seed + i)),
            ]
            env = {
                **os.environ,
                # not the tree's data/ folder (a baseline tree stays as it is)
                "GATEKEEPER_ENCRYPTION_KEY_FILE": str(Path(keys.name) / f"key{i}"),
                "PYTHONPATH": f"{tree}:{tree / 'clients' / 'python' / 'src'}",
                "OPENBLAS_NUM_THREADS": "1",
            }
            children.append(
                subprocess.Popen(  # noqa: S603 - our own script
                    command,
                    cwd=tree,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for process in children:
            assert process.stdout is not None  # noqa: S101 - a pipe was asked for
            line = process.stdout.readline()
            while line and not line.startswith("{"):  # the app's own messages
                line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"a child failed (exit {process.wait()})")
        load0 = Path("/proc/loadavg").read_text().split()[0]
        results: list[list[dict[str, float]]] = [[], []]
        for b in range(args.blocks):
            for i in (0, 1) if b % 2 == 0 else (1, 0):
                process = children[i]
                assert process.stdin is not None  # noqa: S101
                assert process.stdout is not None  # noqa: S101
                process.stdin.write(f"{args.block}\n")
                process.stdin.flush()
                results[i].append(json.loads(process.stdout.readline()))
        load1 = Path("/proc/loadavg").read_text().split()[0]
        n = args.block
        print(
            f"submit_ab: grr, {args.blocks} blocks of {n} submits per tree, alternated "
            f"({args.warmup} warm-up, {args.objects} objects); load {load0} -> {load1}"
        )
        print(
            f"{'tree':<14} {'cpu ms/submit: median':>22} {'IQR':>13} {'pg ms: mean':>12} "
            f"{'rejected':>9}"
        )
        for tree, rows in zip(trees, results, strict=True):
            cpu = [1000 * r["cpu"] / n for r in rows]
            # the backends' CPU comes in clock ticks (10 ms): summed over all blocks
            pg = 1000 * sum(r["pg"] for r in rows) / (n * len(rows))
            q = statistics.quantiles(cpu, n=4)
            print(
                f"{tree.name:<14} {statistics.median(cpu):>22.3f} "
                f"{q[0]:>6.3f}-{q[2]:<6.3f} {pg:>12.3f} "
                f"{sum(r['rejected'] for r in rows) / (n * len(rows)):>9.0%}"
            )
        ratios = [b["cpu"] / a["cpu"] for a, b in zip(*results, strict=True)]
        print(
            f"{trees[1].name} / {trees[0].name}: median per-pair CPU ratio "
            f"{statistics.median(ratios):.3f}"
        )
    finally:
        for process in children:
            if process.stdin is not None and not process.stdin.closed:
                try:
                    process.stdin.write("0\n")
                    process.stdin.close()
                except BrokenPipeError:
                    pass
            process.wait(timeout=60)
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        keys.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

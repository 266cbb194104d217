"""CPU per single submit of source trees side by side, in process (no HTTP server, no sockets).

How to run (from the project root, PostgreSQL and Redis reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/submit_cpu.py --trees BASE,NEW --rounds 3
    .venv/bin/python bench/submit_cpu.py --trees BASE,NEW --scenario binary_rr --submits 400

``bench/service_load.py`` measures the service as clients see it, but on a machine whose two cores
are shared with other work its rates and even its CPU per submit move by half between rounds of the
same code. This script measures what a code change does to one submit's CPU in the server process
with fewer moving parts: for each tree (a folder of the code, put first on ``PYTHONPATH`` of a child
process; the order alternates by round) a child builds the app (:func:`app.bootstrap.create_app`,
the server's composition root, Redis locks on) on one PostgreSQL database (``submit_cpu_<random>``,
migrated, dropped at the end), registers ``--objects`` objects of ``service_load``'s scenario (a
1,000-point domain, ε = 0.5 ``grr`` or ``binary_rr`` queries), sends ``--warmup`` untimed submits
and then ``--submits`` timed ones through the whole ASGI app (``httpx.ASGITransport``:
authentication, middleware, the JSON access log at INFO, the thread hand-off, the submit,
serialisation — not uvicorn's HTTP parsing), ``--clients`` at a time, each with a fresh
``Idempotency-Key``. It reports per timed submit: the child's CPU (``time.process_time``, all
threads, user + system), the CPU of the database's backends (from ``/proc``, the pool's connections)
and the wall time, and the load average beside each round. ``loop ms`` is the CPU of the event
loop's thread alone (``time.thread_time``): the HTTP side — middleware, routing, dependencies,
serialisation, the hand-off — plus this script's client, which is the same for every tree; the
submit's synchronous part runs in the request threads and is not in it.

``--direct`` leaves HTTP out: the child calls the service's submit
(:func:`app.services.queries.submit`, with the app's own engine, bound worker and locks) one at a
time, so the CPU per submit is the service layer's and the database access's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import service_load as sl  # type: ignore[import-not-found]  # noqa: E402

ADMIN_KEY = "bench-admin-" + "s" * 40


def child(args: argparse.Namespace) -> None:
    """Run in the tree's code: build the app, submit, print one JSON line."""
    import httpx
    import psycopg
    from service_load import GRR_DOMAIN, SCENARIOS, grr_value  # type: ignore[import-not-found]

    from app.bootstrap import create_app
    from app.settings import Settings

    settings = Settings(
        database_url=args.url,
        redis_url=args.redis,
        gatekeeper_bootstrap_admin_key=ADMIN_KEY,
        bound_processes=0,
    )
    app = create_app(settings)
    queries = SCENARIOS[args.scenario][3](None) if args.scenario in SCENARIOS else None
    assert queries, f"unknown scenario {args.scenario}"  # noqa: S101 - a bench's own check
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    rng = __import__("random").Random(args.seed)

    async def run() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://bench") as client,
        ):
            r = await client.post("/v1/keys", json={"role": "analyst"}, headers=admin)
            key = {"Authorization": f"Bearer {r.json()['key']}"}
            ids = []
            for _ in range(args.objects):
                oid = "cpu-" + secrets.token_hex(6)
                body = {
                    "id": oid,
                    "domain": GRR_DOMAIN,
                    "value": grr_value(rng),
                    "budget": {"epsilon": 10_000.0},
                    "filter": "bayesian",
                }
                r = await client.post("/v1/objects", json=body, headers=admin)
                assert r.status_code == 201, r.text  # noqa: S101
                ids.append(oid)
            counter = iter(range(10**9))

            from app.services import queries as query_service

            runtime = app.state.runtime
            owner = None
            if args.direct:
                from app.services.auth import authenticate

                found = authenticate(engine=runtime.engine, secret=key["Authorization"].split()[1])
                assert found is not None  # noqa: S101 - the key was just made
                owner = found[0].id

            async def one(worker: int) -> None:
                i = next(counter)
                oid = ids[(worker + i) % len(ids)]
                if args.direct:  # the service's submit, in this thread: no HTTP, no hand-off
                    query_service.submit(
                        engine=runtime.engine,
                        worker=runtime.worker,
                        locks=runtime.locks,
                        object_id=oid,
                        query=queries[i % len(queries)],
                        idempotency_key=secrets.token_hex(16),
                        analyst_key_id=owner,
                        limits=runtime.limits,
                        attempts=runtime.settings.submit_attempts,
                    )
                    return
                headers = {**key, "Idempotency-Key": secrets.token_hex(16)}
                body = {"query": queries[i % len(queries)]}
                r = await client.post(f"/v1/objects/{oid}/queries", json=body, headers=headers)
                assert r.status_code == 201, r.text  # noqa: S101

            async def clients(total: int) -> None:
                async def loop(worker: int, n: int) -> None:
                    for _ in range(n):
                        await one(worker)

                share = [
                    total // args.clients + (w < total % args.clients) for w in range(args.clients)
                ]
                await asyncio.gather(*(loop(w, n) for w, n in enumerate(share)))

            await clients(args.warmup)
            with psycopg.connect(args.url, autocommit=True) as conn:
                pids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()"
                    )
                ]
            cpu0, pg0, wall0 = time.process_time(), sl.procs_cpu(pids), time.perf_counter()
            loop0 = time.thread_time()
            await clients(args.submits)
            loop1 = time.thread_time()
            cpu1, pg1, wall1 = time.process_time(), sl.procs_cpu(pids), time.perf_counter()
            n = args.submits
            return {
                "cpu_ms": 1000 * (cpu1 - cpu0) / n,
                "loop_ms": 1000 * (loop1 - loop0) / n,
                "pg_ms": 1000 * (pg1 - pg0) / n,
                "wall_ms": 1000 * (wall1 - wall0) / n,
                "backends": len(pids),
            }

    print(json.dumps(asyncio.run(run())), flush=True)


def child_command(
    args: argparse.Namespace, tree: Path, url: str, submits: int, seed: int
) -> list[str]:
    """The command line of a child that measures ``tree``."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        *("--url", url, "--redis", args.redis, "--trees", str(tree)),
        *("--submits", str(submits), "--warmup", str(args.warmup)),
        *("--objects", str(args.objects), "--clients", str(args.clients)),
        *("--scenario", args.scenario, "--seed", str(seed)),
        *(["--direct"] if args.direct else []),
    ]


def child_env(tree: Path) -> dict[str, str]:
    """The environment of a child: ``tree``'s code first on the path."""
    return {
        **os.environ,
        "PYTHONPATH": f"{tree}:{tree / 'clients' / 'python' / 'src'}",
        "OPENBLAS_NUM_THREADS": "1",
    }


def syscalls(args: argparse.Namespace, tree: Path, url: str, submits: int) -> dict[str, int]:
    """System calls of a child's whole run (all threads), by name, from ``strace -f -c``."""
    with tempfile.NamedTemporaryFile(suffix=".strace") as out:
        subprocess.run(  # noqa: S603 - our own script under strace
            [
                *("strace", "-f", "-c", "-o", out.name),
                *child_command(args, tree, url, submits, args.seed),
            ],
            env=child_env(tree),
            cwd=tree,
            capture_output=True,
            check=True,
        )
        counts = {}
        for line in Path(out.name).read_text().splitlines():
            fields = line.split()
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                counts[fields[-1]] = int(fields[3])
        return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", required=True, help="comma-separated source folders")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--submits", type=int, default=600, help="timed submits per run (600)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed submits first (100)")
    parser.add_argument("--objects", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4, help="submits in flight at once (4)")
    parser.add_argument("--scenario", default="grr", help="grr or binary_rr")
    parser.add_argument("--seed", type=int, default=1)
    sl.add_scratch_args(parser, db_prefix="submit_cpu_")
    parser.add_argument(
        "--strace",
        action="store_true",
        help="instead: system calls per submit, each tree's child under strace -f -c, once with "
        "--submits and once with twice as many (the difference over --submits)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="call the service's submit directly, one at a time (no HTTP, no ASGI, no threads)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import psycopg

    from app.db.migrate import upgrade

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    name = args.db_prefix + secrets.token_hex(4)
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    rows = []
    try:
        upgrade(url)
        print(
            f"submit_cpu: {args.scenario}, {args.submits} timed submits per run "
            f"({args.warmup} warm-up), {args.clients} in flight, {args.objects} objects; "
            f"database {name}",
            flush=True,
        )
        if args.strace:
            for tree in trees:
                counts = [
                    syscalls(args, tree, url, submits)
                    for submits in (args.submits, 2 * args.submits)
                ]
                per = {
                    name: (counts[1].get(name, 0) - counts[0].get(name, 0)) / args.submits
                    for name in set(counts[0]) | set(counts[1])
                }
                shown = ", ".join(
                    f"{name} {per[name]:.1f}"
                    for name in sorted(per, key=lambda n: -per[n])
                    if per[name] >= 0.5
                )
                print(f"{tree.name:<12} per submit: {sum(per.values()):.1f} calls: {shown}")
            return 0
        print(
            f"{'tree':<12} {'round':>5} {'cpu ms':>7} {'loop ms':>7} {'pg ms':>6} {'wall ms':>7}"
            "  loadavg"
        )
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for tree in order:
                out = subprocess.run(  # noqa: S603 - our own script
                    child_command(args, tree, url, args.submits, args.seed + r),
                    env=child_env(tree),
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    return 1
                result = json.loads(out.stdout.strip().splitlines()[-1])
                load = Path("/proc/loadavg").read_text().split()[0]
                rows.append((tree.name, result))
                print(
                    f"{tree.name:<12} {r + 1:>5} {result['cpu_ms']:7.2f} {result['loop_ms']:7.2f} "
                    f"{result['pg_ms']:6.2f} "
                    f"{result['wall_ms']:7.2f}  {load}",
                    flush=True,
                )
        for tree in trees:
            mine = [res for label, res in rows if label == tree.name]
            cpu = sorted(res["cpu_ms"] for res in mine)
            pg = sorted(res["pg_ms"] for res in mine)
            loop = sorted(res["loop_ms"] for res in mine)
            print(
                f"{tree.name:<12} cpu ms/submit {cpu[0]:.2f}-{cpu[-1]:.2f} "
                f"(median {cpu[len(cpu) // 2]:.2f}), event loop {loop[0]:.2f}-{loop[-1]:.2f} "
                f"(median {loop[len(loop) // 2]:.2f}), database {pg[0]:.2f}-{pg[-1]:.2f}"
            )
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

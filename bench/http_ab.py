"""Interleaved A/B of a whole single submit through HTTP: two trees' servers, blocks alternated.

How to run (from the project root, PostgreSQL and Redis reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/http_ab.py --trees BASE,NEW --blocks 40

``bench/service_load.py --trees`` runs one tree's server after the other, and on this shared
2-core machine the load moves between runs by more than a change of 5% of a submit's CPU
(docs/benchmarks.md). ``bench/submit_ab.py`` alternates blocks but without HTTP. Here both
trees' servers (``gatekeeper serve``, ``--workers`` each, Redis locks on) run at once on one fresh
PostgreSQL database (dropped at the end), each with ``--objects`` objects of ``service_load``'s
``grr`` scenario of its own and an analyst key; after ``--warmup`` submits each, blocks of
``--block`` submits (``--clients`` keep-alive connections, a fresh ``Idempotency-Key`` each) go to
one server and then the other, ``--blocks`` times, the order within a pair alternating, so the
load drifts over both alike. Per block: the server's process tree's CPU (``/proc``, in clock
ticks) per submit. The table gives each tree's median and interquartile range, the median of the
per-pair ratios (second tree / first), the ratio of the two trees' total CPU and in how many pairs
the second was lower, and the share of each tree's CPU spent in the kernel (system time: the
sockets, the threads' wake-ups). The CPU comes in clock ticks (10 ms): a block of 200 submits at
≈ 2.7 ms each is ≈ 54 ticks, so one pair's ratio moves in steps of ≈ 2%.

``--b-env NAME=VALUE`` (repeatable) gives the second tree's server extra environment: with the
same folder twice it compares one setting against the default in one run, e.g. the Redis lock
(its two of a submit's four round trips)::

    .venv/bin/python bench/http_ab.py --trees /work/wt/base,/work/wt/base --b-env REDIS_LOCKS=false

``--databases`` puts each tree's server on a database of its own, migrated by that tree's code,
so a change of the schema (a migration: a trigger, an index) is compared side by side too; the
table then adds each tree's PostgreSQL CPU per submit (its database's client backends, from
``/proc/PID/schedstat``, over the same blocks) and its ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import service_load as sl


def split_cpu(server: sl.Server) -> tuple[float, float]:
    """User and system CPU seconds of the server's process tree."""
    user = system = 0.0
    for pid in sl.descendants(server.process.pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        user += int(fields[11]) / sl.CLK_TCK
        system += int(fields[12]) / sl.CLK_TCK
    return user, system


#: Migrates a database with the code on ``PYTHONPATH`` and stores the bootstrap admin key.
_MIGRATE = (
    "import sys\n"
    "from app.db.migrate import upgrade\n"
    "from app.db.session import make_engine\n"
    "from app.services.auth import ensure_bootstrap_admin\n"
    "upgrade(sys.argv[1])\n"
    "engine = make_engine(sys.argv[1])\n"
    "ensure_bootstrap_admin(engine=engine, secret=sys.argv[2])\n"
    "engine.dispose()\n"
)


@contextlib.contextmanager
def tree_database(tree: Path, prefix: str) -> Iterator[tuple[str, str]]:
    """A fresh database migrated by ``tree``'s own code (dropped afterwards)."""
    with sl.fresh_database(prefix=prefix, migrate=False) as (url, name):
        path = f"{tree}{os.pathsep}{tree / 'clients' / 'python' / 'src'}"
        subprocess.run(  # noqa: S603 - our own code
            [sys.executable, "-c", _MIGRATE, url, sl.ADMIN_KEY],
            cwd=tree,  # its own ``app`` first (``-c`` puts the folder first on sys.path)
            env={**os.environ, "PYTHONPATH": path},
            check=True,
        )
        yield url, name


def schedstat_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU (0 if it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def backends_meter(name: str) -> Callable[[], dict[int, int]]:
    """A reading of the client backends of database ``name``: pid -> CPU ns so far."""
    import psycopg

    admin = sl.POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    conn = psycopg.connect(admin, autocommit=True)

    def read() -> dict[int, int]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'",
            (name,),
        ).fetchall()
        return {int(r[0]): schedstat_ns(int(r[0])) for r in rows}

    return read


def used_ns(before: dict[int, int], after: dict[int, int]) -> int:
    """CPU ns the backends used between two readings (a new backend counts from 0)."""
    return sum(ns - before.get(pid, 0) for pid, ns in after.items())


async def block(
    server: sl.Server,
    ids: list[str],
    analyst: str,
    count: int,
    clients: int,
    body: bytes,
    meter: Callable[[], dict[int, int]] | None = None,
) -> tuple[float, float, dict[int, int], float, float]:
    """``count`` submits over ``clients`` connections: server CPU seconds, wall, statuses,
    the CPU's system seconds and (with ``meter``) the database backends' CPU seconds."""
    conns = [sl.Connection("127.0.0.1", server.port) for _ in range(clients)]
    statuses: dict[int, int] = {}
    left = list(range(count))

    async def client(conn: sl.Connection) -> None:
        while left:
            n = left.pop()
            headers = {"Authorization": f"Bearer {analyst}", "Idempotency-Key": uuid.uuid4().hex}
            status, _ = await conn.post(f"/v1/objects/{ids[n % len(ids)]}/queries", body, headers)
            statuses[status] = statuses.get(status, 0) + 1

    # connections opened before the CPU is read (a connection per block, as a client pool would)
    for conn in conns:
        await conn._open()
    pg0 = meter() if meter else {}
    (user0, sys0), t0 = split_cpu(server), time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    (user1, sys1), wall = split_cpu(server), time.perf_counter() - t0
    pg = used_ns(pg0, meter()) / 1e9 if meter else 0.0
    for conn in conns:
        await conn.close()
    return (user1 - user0) + (sys1 - sys0), wall, statuses, sys1 - sys0, pg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", required=True, help="two comma-separated source folders: A,B")
    parser.add_argument("--blocks", type=int, default=40, help="blocks per tree (40)")
    parser.add_argument("--block", type=int, default=100, help="submits per block (100)")
    parser.add_argument("--clients", type=int, default=4, help="connections per block (4)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers per server (1)")
    parser.add_argument("--objects", type=int, default=20, help="objects per server (20)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed submits first (200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--db-prefix", default="gk_httpab_", help="the database's name prefix")
    parser.add_argument(
        "--databases",
        action="store_true",
        help="each tree on a database of its own, migrated by its own code (a schema change "
        "side by side); prints the PostgreSQL CPU per submit too",
    )
    parser.add_argument(
        "--b-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the second tree's server only, e.g. REDIS_LOCKS=false "
        "(repeatable; with the same folder twice: one setting against the default)",
    )
    args = parser.parse_args(argv)
    b_env = dict(item.split("=", 1) for item in args.b_env)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    if len(trees) != 2:
        parser.error("--trees takes two folders")
    names = [t.name for t in trees]
    if b_env:
        names[1] += "+" + ",".join(args.b_env)
    rng = random.Random(args.seed)
    body = json.dumps({"query": sl.grr_queries(rng)[0]}).encode()
    load0 = os.getloadavg()[0]
    logs = Path(tempfile.mkdtemp(prefix="gk_httpab_"))
    with contextlib.ExitStack() as stack:
        if args.databases:
            made = [stack.enter_context(tree_database(t, args.db_prefix)) for t in trees]
        else:
            made = [stack.enter_context(sl.fresh_database(prefix=args.db_prefix))] * 2
        meters = [backends_meter(name) for _, name in made] if args.databases else [None, None]
        servers = []
        try:
            for n, tree in enumerate(trees):
                extra = b_env if n == 1 else None
                servers.append(
                    sl.Server(
                        made[n][0],
                        args.workers,
                        1,
                        logs / f"server{n}.log",
                        tree=tree,
                        extra_env=extra,
                    )
                )
            setups = [sl.register_objects(s, "grr", "bayesian", args.objects, rng) for s in servers]
            cpu: list[list[float]] = [[], []]
            pg: list[list[float]] = [[], []]
            wall: list[float] = [0.0, 0.0]
            statuses: list[dict[int, int]] = [{}, {}]
            system: list[float] = [0.0, 0.0]
            for k, s in enumerate(servers):
                asyncio.run(block(s, *setups[k], args.warmup, args.clients, body))
            for b in range(args.blocks):
                order = (0, 1) if b % 2 == 0 else (1, 0)
                for k in order:
                    used, took, seen, kernel, database = asyncio.run(
                        block(servers[k], *setups[k], args.block, args.clients, body, meters[k])
                    )
                    cpu[k].append(used / args.block * 1000)
                    pg[k].append(database / args.block * 1000)
                    wall[k] += took
                    system[k] += kernel
                    for status, count in seen.items():
                        statuses[k][status] = statuses[k].get(status, 0) + count
        finally:
            for s in servers:
                s.stop()
    load1 = os.getloadavg()[0]
    print(
        f"http_ab: grr through HTTP, {args.blocks} blocks of {args.block} submits per tree "
        f"({args.clients} connections, {args.workers} worker(s) each), alternated; "
        f"load {load0:.2f} -> {load1:.2f}"
    )
    print(f"{'tree':<14} server cpu ms/submit: median           IQR  submits/s  system  statuses")
    for k in (0, 1):
        q = statistics.quantiles(cpu[k], n=4)
        rate = args.block * args.blocks / wall[k]
        print(
            f"{names[k]:<14} {statistics.median(cpu[k]):>28.3f}  {q[0]:.3f}-{q[2]:.3f}"
            f"  {rate:>9.1f}  {system[k] / (sum(cpu[k]) * args.block / 1000):>6.1%}"
            f"  {dict(sorted(statuses[k].items()))}"
        )
    ratios = [b / a for a, b in zip(cpu[0], cpu[1], strict=True) if a > 0]
    lower = sum(b < a for a, b in zip(cpu[0], cpu[1], strict=True))
    print(
        f"{names[1]} / {names[0]}: median per-pair CPU ratio {statistics.median(ratios):.3f}, "
        f"ratio of the totals {sum(cpu[1]) / sum(cpu[0]):.3f}, "
        f"{names[1]} lower in {lower} of {len(ratios)} pairs"
    )
    if args.databases:
        for k in (0, 1):
            q = statistics.quantiles(pg[k], n=4)
            print(
                f"{names[k]:<14} PostgreSQL cpu ms/submit: median {statistics.median(pg[k]):.3f}"
                f"  IQR {q[0]:.3f}-{q[2]:.3f}"
            )
        pg_ratios = [b / a for a, b in zip(pg[0], pg[1], strict=True) if a > 0]
        pg_lower = sum(b < a for a, b in zip(pg[0], pg[1], strict=True))
        print(
            f"{names[1]} / {names[0]}: median per-pair PostgreSQL CPU ratio "
            f"{statistics.median(pg_ratios):.3f}, ratio of the totals "
            f"{sum(pg[1]) / sum(pg[0]):.3f}, {names[1]} lower in {pg_lower} of "
            f"{len(pg_ratios)} pairs"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

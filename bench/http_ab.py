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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
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


async def block(
    server: sl.Server, ids: list[str], analyst: str, count: int, clients: int, body: bytes
) -> tuple[float, float, dict[int, int], float]:
    """``count`` submits over ``clients`` connections: server CPU seconds, wall, statuses and
    the CPU's system seconds."""
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
    (user0, sys0), t0 = split_cpu(server), time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    (user1, sys1), wall = split_cpu(server), time.perf_counter() - t0
    for conn in conns:
        await conn.close()
    return (user1 - user0) + (sys1 - sys0), wall, statuses, sys1 - sys0


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
    with sl.fresh_database(prefix=args.db_prefix) as (url, _name):
        servers = []
        try:
            for n, tree in enumerate(trees):
                extra = b_env if n == 1 else None
                servers.append(
                    sl.Server(
                        url, args.workers, 1, logs / f"server{n}.log", tree=tree, extra_env=extra
                    )
                )
            setups = [sl.register_objects(s, "grr", "bayesian", args.objects, rng) for s in servers]
            cpu: list[list[float]] = [[], []]
            wall: list[float] = [0.0, 0.0]
            statuses: list[dict[int, int]] = [{}, {}]
            system: list[float] = [0.0, 0.0]
            for k, s in enumerate(servers):
                asyncio.run(block(s, *setups[k], args.warmup, args.clients, body))
            for b in range(args.blocks):
                order = (0, 1) if b % 2 == 0 else (1, 0)
                for k in order:
                    used, took, seen, kernel = asyncio.run(
                        block(servers[k], *setups[k], args.block, args.clients, body)
                    )
                    cpu[k].append(used / args.block * 1000)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Client CPU of the per-object Redis lock: redis-py's commands against the hand-sent ones.

How to run (from the project root, Redis reachable)::

    .venv/bin/python bench/lock_cost.py --rounds 4 --pairs 3000

One acquire + release of a lock is ``SET key token NX PX timeout`` and the compare-and-delete
script. ``client`` runs them through redis-py's ``Redis.set`` and the registered script object
(``EVALSHA``; main before ``h/submitdb``); ``pooled`` sends each command by hand on a connection
checked out of the client's pool and back (main from ``h/submitdb`` to ``h/submit4``);
``hand-sent`` is this tree's :class:`app.services.locks.ObjectLocks` path (``_command`` and
``_release_now``: since ``h/submit4`` on the thread's own connection). The ways alternate by
round in one process, on one key; the table gives the process CPU (``time.process_time``) and
the wall time per pair.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3000, help="acquire + release per round")
    parser.add_argument(
        "--redis",
        default=os.environ.get("GATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
    )
    args = parser.parse_args(argv)
    import redis

    from app.services.locks import ObjectLocks

    client = redis.Redis.from_url(args.redis)
    locks = ObjectLocks(client, timeout=30)
    assert locks._release is not None  # noqa: S101 - made with the client
    script = locks._release
    name = "gatekeeper:lock:bench-lock-cost"

    def with_client() -> None:
        token = os.urandom(16).hex()
        if not client.set(name, token, nx=True, px=30_000):
            raise RuntimeError("the bench's lock is held")
        script(keys=[name], args=[token])

    def pooled_command(*command: object) -> object:
        pool = client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_command(*command)
            return connection.read_response()
        finally:
            pool.release(connection)

    def pooled() -> None:
        token = os.urandom(16).hex()
        if not pooled_command("SET", name, token, "NX", "PX", 30_000):
            raise RuntimeError("the bench's lock is held")
        pooled_command("EVALSHA", script.sha, 1, name, token)

    def hand_sent() -> None:
        token = os.urandom(16).hex()
        if not locks._command("SET", name, token, "NX", "PX", 30_000):
            raise RuntimeError("the bench's lock is held")
        locks._release_now(name, token)

    ways: dict[str, Callable[[], None]] = {
        "client": with_client,
        "pooled": pooled,
        "hand-sent": hand_sent,
    }
    for way in ways.values():  # load the script, open the pool's connection
        way()
    print(f"{'way':<10} {'round':>5} {'cpu ms/pair':>12} {'wall ms/pair':>13}  loadavg")
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(ways)[::-1]
        for label in order:
            way = ways[label]
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(args.pairs):
                way()
            cpu = 1000 * (time.process_time() - cpu0) / args.pairs
            wall = 1000 * (time.perf_counter() - wall0) / args.pairs
            load = Path("/proc/loadavg").read_text().split()[0]
            print(f"{label:<10} {r + 1:>5} {cpu:>12.3f} {wall:>13.3f}  {load}")
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

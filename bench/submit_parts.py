"""CPU of two small parts of a single submit, each beside what it replaced, in one process.

How to run (from the project root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/submit_parts.py --rounds 4 --calls 20000

Too small for ``bench/http_ab.py`` to resolve one by one (each is well under 1% of a submit's
server CPU), so each is timed here against its former code, the two alternating by round:

- ``handoff``: :func:`app.api.deps.in_thread` against the former ``loop.run_in_executor`` on the
  same ``ThreadPoolExecutor`` (5 threads), on uvloop (the server's loop), awaiting a function
  that returns at once; process CPU and the event loop thread's CPU per call.
- ``params``: DirectRoute's planned parameters (:func:`app.api.direct._read_params`) against
  FastAPI's ``request_params_to_args`` for the submit route's path and header parameters (the
  ``Headers`` built from the raw headers each time, as a request does).

Process CPU per call (``time.process_time``), median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _time(call: Callable[[], Any], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        call()
    return 1e6 * (time.process_time() - start) / calls


def handoff(rounds: int, calls: int) -> dict[str, list[float]]:
    import uvloop

    from app.api.deps import in_thread

    class Runtime:
        threads = ThreadPoolExecutor(5)

    def work() -> int:
        return 1

    async def by_executor() -> int:
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, work)
        return await loop.run_in_executor(Runtime.threads, call)

    async def by_in_thread() -> int:
        return await in_thread(Runtime, work)  # type: ignore[arg-type]

    ways = {"run_in_executor": by_executor, "in_thread": by_in_thread}
    found: dict[str, list[float]] = {name: [] for name in ways}
    loop_found: dict[str, list[float]] = {name + " (loop thread)": [] for name in ways}

    async def main() -> None:
        for way in ways.values():  # warm
            for _ in range(300):
                await way()
        for r in range(rounds):
            for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                way = ways[name]
                cpu0, loop0 = time.process_time(), time.thread_time()
                for _ in range(calls):
                    await way()
                found[name].append(1e6 * (time.process_time() - cpu0) / calls)
                loop_found[name + " (loop thread)"].append(
                    1e6 * (time.thread_time() - loop0) / calls
                )

    uvloop.run(main())
    Runtime.threads.shutdown()
    return {**found, **loop_found}


def params(rounds: int, calls: int) -> dict[str, list[float]]:
    from fastapi.dependencies.utils import request_params_to_args
    from starlette.datastructures import Headers

    from app.api import direct
    from app.api.routes import objects

    route = next(r for r in objects.router.routes if getattr(r, "name", "") == "submit")
    plan = route._make(route)
    path = {"object_id": "obj-123"}
    raw = [
        (b"host", b"127.0.0.1"),
        (b"authorization", b"Bearer gk_" + b"a" * 43),
        (b"idempotency-key", b"0123456789abcdef0123456789abcdef"),
        (b"content-type", b"application/json"),
        (b"content-length", b"70"),
    ]
    fields = plan.dependant

    def fastapi() -> None:
        request_params_to_args(fields.path_params, path)
        request_params_to_args(fields.header_params, Headers(raw=raw))

    def planned() -> None:
        direct._read_params(plan.params[0], path)
        direct._read_params(plan.params[2], Headers(raw=raw))

    return _alternate({"request_params_to_args": fastapi, "planned": planned}, rounds, calls)


def _alternate(
    ways: dict[str, Callable[[], Any]], rounds: int, calls: int
) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():
        _time(way, 200)
    for r in range(rounds):
        for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
            found[name].append(_time(ways[name], calls))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    print(f"submit_parts: {args.calls} calls per round, {args.rounds} rounds, alternated")
    print(f"{'part':<10} {'way':<34} {'us/call (median)':>16}  rounds")
    parts = (("handoff", handoff), ("params", params))
    for part, measure in parts:
        for way, values in measure(args.rounds, args.calls).items():
            shown = " ".join(f"{v:.1f}" for v in values)
            print(f"{part:<10} {way:<34} {statistics.median(values):>16.2f}  {shown}")
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"load {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

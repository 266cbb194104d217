"""Interleaved A/B of an accepted submit's write (``record_accepted``): this tree's and another's.

How to run (from the project root, PostgreSQL and Redis reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/record_ab.py --baseline DIR --submits 1000

Through HTTP on a shared 2-core machine a change worth a few percent of a submit's CPU is below
the noise of ``bench/service_load.py`` and even of ``bench/submit_cpu.py``. This measures only
the write, in one process and one thread, alternating the two versions call by call so that the
machine's load drifts over both alike: it makes a fresh PostgreSQL database (dropped at the end),
builds the app from this tree, registers 10 objects of ``service_load``'s 1,000-point ``grr``
scenario, and runs ``--submits`` submits through the service's own ``submit``, whose
``app.store.submits.record_accepted`` is, on alternate calls, this tree's and the one loaded
from ``DIR/app/store/submits.py`` (a tree such as ``git archive COMMIT | tar -x -C DIR``). It
prints each version's median and mean thread CPU (``time.thread_time``) per call, the first 20
calls of each left out.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import service_load as sl  # type: ignore[import-not-found]  # noqa: E402

ADMIN_KEY = "record-ab-" + "k" * 40


def _load(path: Path) -> Any:
    """The module at ``path`` under a name of its own (its imports resolve in this tree)."""
    spec = importlib.util.spec_from_file_location("baseline_submits", path)
    assert spec is not None  # noqa: S101 - a file we name
    assert spec.loader is not None  # noqa: S101
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_submits"] = module
    spec.loader.exec_module(module)
    return module


async def _run(url: str, redis: str, submits: int, versions: dict[str, Callable[..., Any]]) -> Any:
    import httpx
    from service_load import GRR_DOMAIN, grr_value  # type: ignore[import-not-found]

    from app.bootstrap import create_app
    from app.services import queries as query_service
    from app.settings import Settings

    app = create_app(
        Settings(
            database_url=url,
            redis_url=redis,
            bound_processes=0,
            gatekeeper_bootstrap_admin_key=ADMIN_KEY,
        )
    )
    times: dict[str, list[float]] = {name: [] for name in versions}
    current = [next(iter(versions))]

    def timed(conn: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        result = versions[current[0]](conn, **kwargs)
        times[current[0]].append(time.thread_time() - start)
        return result

    query_service.submit_store.record_accepted = timed  # type: ignore[assignment]
    rng = random.Random(1)
    async with app.router.lifespan_context(app):
        runtime = app.state.runtime
        transport = httpx.ASGITransport(app=app)
        ids = []
        async with httpx.AsyncClient(transport=transport, base_url="http://ab") as client:
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            for _ in range(10):
                oid = "ab-" + secrets.token_hex(5)
                body = {
                    "id": oid,
                    "domain": GRR_DOMAIN,
                    "value": grr_value(rng),
                    "budget": {"epsilon": 10_000.0},
                }
                r = await client.post("/v1/objects", json=body, headers=admin)
                assert r.status_code == 201, r.text  # noqa: S101
                ids.append(oid)
        names = list(versions)
        for i in range(submits):
            current[0] = names[i % len(names)]
            query_service.submit(
                engine=runtime.engine,
                worker=runtime.worker,
                locks=runtime.locks,
                object_id=ids[i % len(ids)],
                query={"mechanism": "grr", "attribute": "abc"[i % 3], "epsilon": 0.5},
                idempotency_key=secrets.token_hex(8),
                analyst_key_id=None,
                limits=runtime.limits,
                attempts=5,
            )
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other tree's folder")
    parser.add_argument("--submits", type=int, default=1000)
    sl.add_scratch_args(parser, db_prefix="record_ab_")
    args = parser.parse_args(argv)
    import psycopg

    from app.db.migrate import upgrade
    from app.store import submits

    baseline = _load(args.baseline / "app" / "store" / "submits.py")
    versions = {"baseline": baseline.record_accepted, "this tree": submits.record_accepted}
    name = args.db_prefix + secrets.token_hex(4)
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        upgrade(url)
        times = asyncio.run(_run(url, args.redis, args.submits, versions))
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    load = Path("/proc/loadavg").read_text().split()[:3]
    for label, values in times.items():
        kept = values[20:]
        print(
            f"{label:<10} record_accepted: {len(kept)} calls, thread CPU median "
            f"{1000 * statistics.median(kept):.3f} ms, mean {1000 * statistics.mean(kept):.3f} ms"
        )
    print("loadavg at the end: " + " ".join(load))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

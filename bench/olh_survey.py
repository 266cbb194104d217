"""Large-domain surveys run in process: where a survey's time goes (issue 26), CPU beside wall.

How to run (from the project root, PostgreSQL reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/olh_survey.py --n 200000
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/olh_survey.py --n 200000 --profile olh
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/olh_survey.py --n 2000 --mechanisms olh,olh,grr

What it does: a database named ``--database`` (default ``olh_bench``; dropped and created, and
dropped again at the end unless ``--keep``), ``--n`` objects over one integer attribute of
``--k`` values (Zipf(1.1) values, budget ``--budget``, default 4: basic composition certifies
two surveys; 1.5 leaves the second to the Bayesian filter) registered through the import use
case, then the surveys of ``--mechanisms`` (ε = 1 each) over all of them in turn. Each survey is
created by the use case and its chunks decided by :func:`app.services.survey_runs.run_chunk` one
after the other in this thread (the service runs ``SURVEY_THREADS`` of them at once; one thread
here keeps CPU time and the profile exact). Per survey: wall seconds, this process's CPU
seconds, members/s, the decision groups, the likelihood states stored; ``--profile MECH`` prints
cProfile's top functions (cumulative) for the surveys of that mechanism.

The survey service bench is ``bench/large_domain.py --survey N`` (through ``gatekeeper serve``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# ``--tree DIR``: run another checkout's code (a baseline) with this script, side by side
_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else None
sys.path.insert(0, _TREE or str(Path(__file__).resolve().parents[1]))

ADMIN = os.environ.get("GATEKEEPER_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _population(n: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(int.from_bytes(secrets.token_bytes(8), "big"))
    weights = 1.0 / np.arange(1, k + 1) ** 1.1
    return rng.choice(k, size=n, p=weights / weights.sum())


def _import(url: str, n: int, k: int, budget: float = 4.0) -> None:
    from app.db.session import make_engine
    from app.engine.limits import DEFAULT_LIMITS
    from app.services.imports import import_objects, parse_items

    engine = make_engine(url)
    values = _population(n, k)
    domain = {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": k - 1}]}
    started = time.perf_counter()
    for first in range(0, n, 10_000):
        items = [
            {"id": f"o{i:07d}", "domain": domain, "value": {"v": int(values[i])},
             "budget": {"epsilon": budget}, "labels": {"study": "oracles"}}
            for i in range(first, min(n, first + 10_000))
        ]  # fmt: skip
        import_objects(
            engine=engine,
            registrations=parse_items(items, DEFAULT_LIMITS),
            fingerprint=secrets.token_hex(8),
            idempotency_key=None,
            actor_key_id=None,
        )
    engine.dispose()
    print(f"imported {n:,} objects over k = {k:,} in {time.perf_counter() - started:.1f} s")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    import psycopg

    from app import crypto
    from app.db.migrate import upgrade
    from app.db.session import make_engine
    from app.engine.limits import DEFAULT_LIMITS
    from app.services import survey_runs
    from app.services.surveys import SurveyRequest, create_survey
    from app.settings import Settings
    from app.worker.pool import BoundWorker, WorkerSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--mechanisms", default="grr,olh")
    parser.add_argument("--chunk", type=int, default=5000)
    parser.add_argument(
        "--budget", type=float, default=4.0, help="every object's budget (ε = 1 per survey)"
    )
    parser.add_argument("--database", default="olh_bench")
    parser.add_argument("--profile", default="", help="a mechanism whose surveys to profile")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--tree", default="", help="the checkout whose code runs (a baseline)")
    parser.add_argument(
        "--template",
        default="",
        help="a database kept with the imported population (made if missing), copied per run",
    )
    args = parser.parse_args()

    admin = ADMIN.replace("postgresql+psycopg://", "postgresql://")
    url = admin.rsplit("/", 1)[0] + "/" + args.database
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
        have = (
            bool(args.template)
            and conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (args.template,)
            ).fetchone()
            is not None
        )
        if have:
            conn.execute(f'CREATE DATABASE "{args.database}" TEMPLATE "{args.template}"')
        else:
            conn.execute(f'CREATE DATABASE "{args.database}"')
    crypto.configure(Settings(database_url=url).value_cipher())
    import app

    print(f"load average {_load()}; code {Path(app.__file__).parents[1]}; template: {have}")
    if not have:
        upgrade(url)
        _import(url, args.n, args.k, args.budget)
        if args.template:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{args.template}" TEMPLATE "{args.database}"')
    engine = make_engine(url)
    worker = BoundWorker(WorkerSettings(processes=0, time_limit=60))
    print("| survey | wall s | CPU s | members/s | groups | likelihood states | load |")
    print("|---|---:|---:|---:|---:|---:|---|")
    try:
        for mechanism in args.mechanisms.split(","):
            query: dict[str, Any] = {"mechanism": mechanism, "attribute": "v", "epsilon": 1.0}
            request = SurveyRequest(mechanism, query, {"study": "oracles"}, None)
            view, _ = create_survey(
                engine=engine,
                request=request,
                fingerprint=secrets.token_hex(8),
                idempotency_key=None,
                analyst_key_id=None,
                max_members=10**8,
                limits=DEFAULT_LIMITS,
                chunk_size=args.chunk,
            )
            total = view.progress.total
            profile = cProfile.Profile() if mechanism == args.profile else None
            wall, cpu = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            cache = survey_runs.new_run_cache(query, DEFAULT_LIMITS)
            groups = 0
            for chunk in survey_runs.pending_chunks(engine=engine, survey_id=view.id):
                outcome = survey_runs.run_chunk(
                    engine=engine,
                    worker=worker,
                    survey_id=view.id,
                    chunk=chunk,
                    limits=DEFAULT_LIMITS,
                    cache=cache,
                )
                groups += outcome.groups
            status = survey_runs._finish(engine, view.id, time.monotonic())
            if profile is not None:
                profile.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            with psycopg.connect(url) as conn:
                found = conn.execute("SELECT count(*) FROM likelihood_states").fetchone()
            states = found[0] if found else "?"
            print(f"| {mechanism} ({status}) | {wall:.1f} | {cpu:.1f} | {total / wall:,.0f} | "
                  f"{groups:,} | {states} | {_load()} |", flush=True)  # fmt: skip
            if profile is not None:
                stats = pstats.Stats(profile, stream=sys.stdout)
                stats.sort_stats("cumulative").print_stats(args.top)
                stats.sort_stats("tottime").print_stats(args.top)
    finally:
        engine.dispose()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.database}"')


if __name__ == "__main__":
    main()

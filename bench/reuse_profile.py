"""Profile a reusing survey's chunks in process (cProfile), on a kept PostgreSQL database.

``setup``: (re)creates the database ``--database`` (default ``reuse``), imports ``--objects``
objects of ``bench.survey_load``'s population and runs the first ``grr`` survey (ε = 1 on
``region``). ``run``: creates the identical survey with ``"reuse": true``, decides its chunks
one by one in this thread — under cProfile with ``--profile`` — prints wall and CPU seconds and
the load, then deletes that survey again (so every run finds the same earlier surveys).
``drop``: drops the database. The code profiled is the tree on ``PYTHONPATH``::

    PYTHONPATH=. .venv/bin/python bench/reuse_profile.py setup --objects 200000
    PYTHONPATH=. .venv/bin/python bench/reuse_profile.py run --profile
    PYTHONPATH=/work/main .venv/bin/python bench/reuse_profile.py run   # another tree, same data
    PYTHONPATH=. .venv/bin/python bench/reuse_profile.py drop
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

from bench.survey_load import KEY_FILE, SURVEYS, cli, write_population

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def _url(name: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + name


def setup(name: str, n: int, seed: int) -> None:
    import psycopg
    from cryptography.fernet import Fernet

    from app.db.migrate import upgrade

    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _url(name)
    upgrade(url)
    key = Path(tempfile.gettempdir()) / f"{name}.fernet"
    key.write_text(Fernet.generate_key().decode())
    KEY_FILE.write_text(key.read_text())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            population = Path(tmp) / "population.ndjson"
            write_population(population, n, seed)
            done = cli(url, "import", str(population), "--quiet")
            if done.returncode != 0:
                raise SystemExit(done.stderr)
    finally:
        KEY_FILE.unlink(missing_ok=True)
    seconds, cpu, survey_id = _survey(name, reuse=False, profile=False)
    print(f"first survey {survey_id}: {seconds:.1f} s wall, {cpu:.1f} s CPU", flush=True)


def _survey(name: str, *, reuse: bool, profile: bool) -> tuple[float, float, int]:
    from app import crypto
    from app.db.session import make_engine
    from app.engine.limits import DEFAULT_LIMITS
    from app.services import survey_runs
    from app.services.surveys import SurveyRequest, create_survey
    from app.settings import Settings
    from app.worker.pool import BoundWorker, WorkerSettings

    key = Path(tempfile.gettempdir()) / f"{name}.fernet"
    os.environ["GATEKEEPER_ENCRYPTION_KEY_FILE"] = str(key)
    crypto.configure(Settings(database_url=_url(name)).value_cipher())
    engine = make_engine(_url(name))
    worker = BoundWorker(WorkerSettings(processes=0), None)
    request = SurveyRequest("profile", SURVEYS[0], {"study": "bench"}, None, reuse)
    view, _ = create_survey(
        engine=engine,
        request=request,
        fingerprint=os.urandom(8).hex(),
        idempotency_key=None,
        analyst_key_id=None,
        max_members=10_000_000,
        limits=DEFAULT_LIMITS,
        chunk_size=5000,
    )
    survey_id = view.id
    if not survey_runs.claim(engine=engine, survey_id=survey_id, owner="p", lease_seconds=600):
        raise SystemExit(f"survey {survey_id} could not be claimed")
    chunks = survey_runs.pending_chunks(engine=engine, survey_id=survey_id)
    cache = survey_runs.new_run_cache(SURVEYS[0], DEFAULT_LIMITS)
    profiler = cProfile.Profile() if profile else None
    start, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    reused = 0
    for chunk in chunks:
        survey_runs.run_chunk(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            chunk=chunk,
            limits=DEFAULT_LIMITS,
            cache=cache,
        )
    if profiler is not None:
        profiler.disable()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    with engine.begin() as conn:
        from sqlalchemy import text

        reused = conn.execute(
            text("SELECT reused FROM surveys WHERE id = :id"), {"id": survey_id}
        ).scalar_one()
        if reuse:
            conn.execute(text("DELETE FROM survey_chunks WHERE survey_id = :id"), {"id": survey_id})
            conn.execute(text("DELETE FROM surveys WHERE id = :id"), {"id": survey_id})
    print(f"survey {survey_id}: {len(chunks)} chunks, reused {reused}", flush=True)
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
    engine.dispose()
    return seconds, cpu, survey_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["setup", "run", "drop"])
    parser.add_argument("--database", default="reuse")
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.action == "setup":
        setup(args.database, args.objects, args.seed)
    elif args.action == "run":
        load = os.getloadavg()
        seconds, cpu, _ = _survey(args.database, reuse=True, profile=args.profile)
        load_after = os.getloadavg()
        print(f"reuse survey: {seconds:.2f} s wall, {cpu:.2f} s CPU; load {load} -> {load_after}")
    else:
        import psycopg

        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A diverged survey's chunks in process: where their CPU goes, and two trees side by side.

Issue 27 item 3 (h/vec). ``bench/survey_load.py --surveys 7`` times the seventh survey through a
server; here the same population and sequence (its ``write_population`` and ``series_query``)
are prepared once, the first ``--before`` surveys run in process, and the database is kept as a
template. Then the next survey runs in process (its chunks one after the other on this thread,
then the run's end), on a fresh copy of that template per run:

    # where a chunk's CPU goes (cProfile: calls and seconds per function, per member/group/state)
    bench/chunk_arrays.py --objects 40000 --profile

    # two trees side by side, alternated (each run its own copy of the same database)
    bench/chunk_arrays.py --objects 40000 --trees /work/wt/vec,/work/wt/base --rounds 3

Each run prints the survey's members, groups, new states, client CPU (this process, the
chunks and the collection), PostgreSQL CPU (the database's backends) and wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import pstats
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# appended, not first: a run of another tree (PYTHONPATH) imports that tree's ``app``
sys.path.append(str(ROOT))

from bench.service_load import POSTGRES_URL, BackendSampler, fresh_database  # noqa: E402
from bench.survey_load import series_query, write_population  # noqa: E402

KEY_FILE = Path(tempfile.gettempdir()) / "gk-chunk-arrays.key"
ADMIN = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")


def _url(name: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + name


def _admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(statement)


def _states(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM likelihood_states").fetchone()
    return int(row[0]) if row else 0


class _Collections:
    """The cyclic collector's passes during a run: CPU seconds and counts per generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()  # the collecting thread's CPU
        else:
            self.seconds[info["generation"]] += time.thread_time() - self._start
            self.counts[info["generation"]] += 1


def run_survey(
    url: str,
    index: int,
    profile: Path | None = None,
    *,
    freeze: bool = False,
    server_collector: bool = True,
) -> dict[str, Any]:
    """Survey ``index`` of the series on ``url``, its chunks in order on this thread."""
    from app import crypto
    from app.db.session import make_engine
    from app.engine.limits import DEFAULT_LIMITS
    from app.services import survey_runs, surveys
    from app.worker.pool import BoundWorker, WorkerSettings

    crypto.configure(crypto.cipher_from_settings(None, str(KEY_FILE), production=False))
    if server_collector:  # as ``gatekeeper serve`` sets it: what the process holds frozen,
        from app.bootstrap import tune_collector  # a youngest pass every 50,000 allocations

        tune_collector()
    engine = make_engine(url)
    worker = BoundWorker(WorkerSettings(processes=0))
    query = series_query(index)
    try:
        request = surveys.parse_request(
            {"name": f"s{index}", "query": query, "cohort": {"labels": {"study": "bench"}}},
            max_members=10**7,
        )
        view, _ = surveys.create_survey(
            engine=engine,
            request=request,
            fingerprint=secrets.token_hex(8),
            idempotency_key=None,
            analyst_key_id=None,
            max_members=10**7,
            limits=DEFAULT_LIMITS,
            chunk_size=5000,
        )
        states = _states(url)
        chunks = survey_runs.pending_chunks(engine=engine, survey_id=view.id)
        cache = survey_runs.new_run_cache(query, DEFAULT_LIMITS)
        name = url.rsplit("/", 1)[1]
        backends = BackendSampler(name)
        profiler = cProfile.Profile() if profile else None
        collector = _Collections()
        gc.callbacks.append(collector)
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler:  # the chunks one after the other on this thread (cProfile sees one thread)
            profiler.enable()
            for chunk in chunks:
                survey_runs.run_chunk(
                    engine=engine,
                    worker=worker,
                    survey_id=view.id,
                    chunk=chunk,
                    limits=DEFAULT_LIMITS,
                    cache=cache,
                )
                if freeze:  # as run_survey does since h/vec
                    gc.freeze()
            status = survey_runs._finish(engine, view.id, time.monotonic())
            profiler.disable()
            gc.unfreeze()
        else:  # as a server runs it (one survey thread)
            status = survey_runs.run_survey(
                engine=engine,
                worker=worker,
                survey_id=view.id,
                owner="bench",
                limits=DEFAULT_LIMITS,
                lease_seconds=600,
                threads=1,
            )
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        gc.callbacks.remove(collector)
        pg = backends.stop()
        if profiler and profile:
            profiler.dump_stats(profile)
        with engine.connect() as conn:
            from sqlalchemy import text

            members, groups = conn.execute(
                text("SELECT decided, groups FROM surveys WHERE id = :id"), {"id": view.id}
            ).one()
        import app

        return {
            "app": str(Path(app.__file__).parents[1]),
            "survey": index + 1,
            "attribute": query["attribute"],
            "status": status,
            "members": members,
            "groups": groups,
            "new_states": _states(url) - states,
            "states_after": _states(url),
            "client_cpu": cpu,
            "pg_cpu": pg,
            "wall": wall,
            "gc_seconds": collector.seconds,
            "gc_counts": collector.counts,
        }
    finally:
        worker.close()
        engine.dispose()


def prepare(args: argparse.Namespace) -> str:
    """A kept database with the population and the first ``--before`` surveys decided."""
    with tempfile.TemporaryDirectory() as tmp:
        population = Path(tmp) / "population.ndjson"
        write_population(population, args.objects, args.seed)
        with fresh_database(keep=True, prefix=args.db_prefix) as (url, name):
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "BOUND_PROCESSES": "0",
                "GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE),
            }
            if not KEY_FILE.exists():
                from app import crypto

                KEY_FILE.write_text(crypto.new_key() + "\n")
            done = subprocess.run(  # noqa: S603 - our own CLI
                [sys.executable, "-m", "app.cli", "import", str(population), "--quiet"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(done.stderr)
            for index in range(args.before):
                print(json.dumps(run_survey(url, index)), flush=True)
    return name


def one_run(
    tree: Path,
    template: str,
    index: int,
    profile: Path | None,
    *,
    freeze: bool = False,
    default_collector: bool = False,
) -> dict[str, Any]:
    """Survey ``index`` from ``tree``'s code on a fresh copy of ``template`` (a subprocess)."""
    copy = f"{template}_c{secrets.token_hex(3)}"
    _admin(f'CREATE DATABASE "{copy}" TEMPLATE "{template}"')
    try:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--one",
            copy,
            "--index",
            str(index),
        ]
        if profile:
            command += ["--profile-file", str(profile)]
        if freeze:
            command.append("--freeze")
        if default_collector:
            command.append("--default-collector")
        env = {
            **os.environ,
            "PYTHONPATH": f"{tree}:{tree}/clients/python/src",
            "OPENBLAS_NUM_THREADS": "1",
        }
        done = subprocess.run(  # noqa: S603 - this script
            command, cwd=tree, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return found
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


def print_profile(path: Path, result: dict[str, Any], top: int) -> None:
    stats = pstats.Stats(str(path))
    members, groups, new = result["members"], result["groups"], result["new_states"]
    total = result["client_cpu"]
    print(
        f"members {members:,}, groups {groups:,}, new states {new:,}; client CPU {total:.2f} s "
        f"({total / members * 1e6:.1f} µs per member); PG CPU {result['pg_cpu']:.2f} s; "
        f"collector {sum(result['gc_seconds']):.2f} s in {result['gc_counts']} passes "
        f"(generations 0, 1, 2)"
    )
    print("| function | calls | calls per member | own s | incl. s | incl. µs per member |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][3])  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, incl, _) in rows[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(
            f"| `{name}` ({where}) | {calls:,} | {calls / members:.2f} | {own:.2f} | {incl:.2f} "
            f"| {incl / members * 1e6:.1f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=40_000)
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--before", type=int, default=6, help="surveys decided beforehand (6)")
    parser.add_argument("--db-prefix", default="vc_")
    parser.add_argument("--template", help="a database kept by an earlier run (no preparing)")
    parser.add_argument("--keep", action="store_true", help="keep the prepared database")
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated trees (alternated)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="cProfile the first tree's run")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=6, help=argparse.SUPPRESS)
    parser.add_argument("--profile-file", help=argparse.SUPPRESS)
    parser.add_argument(
        "--freeze", action="store_true", help="with --profile: gc.freeze() after each chunk"
    )
    parser.add_argument(
        "--default-collector",
        action="store_true",
        help="Python's collector thresholds, not the server's (app.bootstrap.tune_collector)",
    )
    args = parser.parse_args(argv)
    if args.one:
        profile = Path(args.profile_file) if args.profile_file else None
        found = run_survey(
            _url(args.one),
            args.index,
            profile,
            freeze=args.freeze,
            server_collector=not args.default_collector,
        )
        print(json.dumps(found), flush=True)
        return 0
    template = args.template or prepare(args)
    print(f"template database {template}", flush=True)
    trees = [Path(t) for t in args.trees.split(",")]
    try:
        if args.profile:
            path = Path(tempfile.gettempdir()) / f"chunk_arrays_{os.getpid()}.prof"
            result = one_run(
                trees[0],
                template,
                args.before,
                path,
                freeze=args.freeze,
                default_collector=args.default_collector,
            )
            print_profile(path, result, args.top)
            return 0
        print(
            "| round | tree | members | groups | new states | client CPU s | PG CPU s | wall s "
            "| collector s | load |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for round_ in range(args.rounds):
            order = trees if round_ % 2 == 0 else trees[::-1]
            for tree in order:
                r = one_run(
                    tree, template, args.before, None, default_collector=args.default_collector
                )
                if Path(r["app"]).resolve() != tree.resolve():
                    raise SystemExit(f"{tree}'s run imported the app of {r['app']}")
                print(
                    f"| {round_ + 1} | {tree} | {r['members']:,} | {r['groups']:,} | "
                    f"{r['new_states']:,} | {r['client_cpu']:.2f} | {r['pg_cpu']:.2f} | "
                    f"{r['wall']:.2f} | {sum(r['gc_seconds']):.2f} | {os.getloadavg()[0]:.2f} |",
                    flush=True,
                )
    finally:
        if not (args.keep or args.template):
            with contextlib.suppress(Exception):
                _admin(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

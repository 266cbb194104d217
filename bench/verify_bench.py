"""``gatekeeper verify`` on a seeded PostgreSQL population: seconds and objects/s per source tree.

How to run (from the project root, PostgreSQL reachable)::

    .venv/bin/python bench/verify_bench.py --objects 100000 --tree /tmp/gk-main
    .venv/bin/python bench/verify_bench.py --objects 1000000 --keep-database
    .venv/bin/python bench/verify_bench.py --database gk_bench_xxxx --key-file K  # reuse one

What it does
------------
1. Seeds a fresh PostgreSQL database the way ``bench/survey_load.py`` does: ``gatekeeper
   import`` of ``--objects`` registrations (300-point domain, budget 4), then the surveys of
   ``--surveys`` (default ``3``: ``grr`` ε = 1 on region, age, region; ``7``: issue 27 item 3's
   diverging sequence, ``grr`` ε = 0.5 on region, age, sex, ... seven times, after which nearly
   every member has its own ordered history) through ``gatekeeper serve``,
   then ``--singles`` objects with 3 single submits each (``grr`` on sex, age, region) — so
   histories mix survey answers (in their chunks) and rows of ``queries``, and likelihood
   states are shared by many objects. ``--database NAME`` skips the seeding and reuses a kept
   database (``--key-file``: the encryption key it was seeded with).
2. Runs ``gatekeeper verify --quiet`` from this tree (once per ``--jobs N``) and from each
   ``--tree`` (an older commit's source: ``git archive COMMIT | tar -x -C DIR``), back to back
   on the same database, and prints a table: tree, processes, objects, wall seconds, objects/s,
   CPU seconds of the command and its processes (the machine is shared: wall time follows its
   load, CPU time much less), exit code, verdict.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import survey_load as load  # noqa: E402
from bench.service_load import ADMIN_KEY, POSTGRES_URL, Server, fresh_database  # noqa: E402

SURVEY_SETS = {
    "3": load.SURVEYS,
    "1": load.SURVEYS[:1],
    "0": [],
    # issue 27 item 3's diverging sequence: nearly every member ends with its own ordered history
    "7": [load.series_query(i) for i in range(7)],
}
SINGLE_QUERIES = [
    {"mechanism": "grr", "attribute": "sex", "epsilon": 0.5},
    {"mechanism": "grr", "attribute": "age", "epsilon": 0.5},
    {"mechanism": "grr", "attribute": "region", "epsilon": 0.5},
]


def seed(url: str, args: argparse.Namespace, tmp: Path) -> None:
    """Import, surveys and single submits (module docstring); prints what each took."""
    population = tmp / "population.ndjson"
    load.write_population(population, args.objects, args.seed)
    start = time.perf_counter()
    done = load.cli(url, "import", str(population), "--quiet")
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    print(f"import: {args.objects} objects in {time.perf_counter() - start:.1f} s", flush=True)
    env = {"GATEKEEPER_ENCRYPTION_KEY_FILE": str(load.KEY_FILE), "BOUND_PROCESSES": "1"}
    server = Server(url, 1, 1, tmp / "server.log", env)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            for query in SURVEY_SETS[args.surveys]:
                view, seconds = load.run_survey(http, admin, query, "bench")
                print(
                    f"survey {query['attribute']}: {view['status']}, "
                    f"{view['progress']['decided']} members in {seconds:.1f} s, "
                    f"groups {view['groups']}",
                    flush=True,
                )
            r = http.post("/v1/keys", json={"role": "analyst", "label": "bench"}, headers=admin)
            r.raise_for_status()
            analyst = {"Authorization": f"Bearer {r.json()['key']}"}
            start = time.perf_counter()
            step = max(1, args.objects // max(1, args.singles))
            for i in range(0, min(args.objects, args.singles * step), step):
                for query in SINGLE_QUERIES:
                    r = http.post(
                        f"/v1/objects/p{i:07d}/queries",
                        json={"query": query},
                        headers={**analyst, "Idempotency-Key": uuid.uuid4().hex},
                    )
                    if r.status_code not in (201, 409):
                        raise SystemExit(f"submit: {r.status_code} {r.text[:300]}")
            print(
                f"single submits: {args.singles} objects x {len(SINGLE_QUERIES)} in "
                f"{time.perf_counter() - start:.1f} s",
                flush=True,
            )
    finally:
        server.stop()


def time_verify(url: str, tree: Path, jobs: int) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (the command and its worker processes, user + system), exit
    code and last line of ``gatekeeper verify --quiet`` from ``tree`` (``--jobs`` when > 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    extra = ["--jobs", str(jobs)] if jobs else []
    done = load.cli(url, "verify", "--quiet", *extra, tree=tree)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    lines = (done.stdout.strip() or done.stderr.strip() or "(no output)").splitlines()
    return seconds, cpu, done.returncode, lines[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--surveys", choices=sorted(SURVEY_SETS), default="3")
    parser.add_argument("--singles", type=int, default=1000, help="objects given 3 submits")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--database", help="reuse this kept database (no seeding)")
    parser.add_argument("--db-prefix", default="gk_bench_", help="a seeded database's name prefix")
    parser.add_argument("--key-file", type=Path, help="its encryption key (with --database)")
    parser.add_argument(
        "--jobs",
        type=int,
        action="append",
        default=[],
        help="time this tree's verify with --jobs N (repeatable; default: without the option)",
    )
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        default=[],
        help="also time verify from the source in this directory (repeatable)",
    )
    args = parser.parse_args(argv)
    print(f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()}")
    runs = [(load.ROOT, jobs) for jobs in args.jobs or [0]] + [(tree, 0) for tree in args.tree]
    results: list[tuple[Path, int, int, float, float, int, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.database:
            if args.key_file is None:
                parser.error("--database needs --key-file")
            load.KEY_FILE = args.key_file
            admin = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
            url = admin.rsplit("/", 1)[0] + "/" + args.database
            for tree, jobs in runs:
                results.append((tree, jobs, *_timed(url, tree, jobs)))
        else:
            from cryptography.fernet import Fernet

            if args.keep_database:  # the key outlives this run, next to nothing else
                load.KEY_FILE = Path(tempfile.gettempdir()) / f"gk-verify-bench-{os.getpid()}.key"
                print(f"encryption key: {load.KEY_FILE}")
            load.KEY_FILE.write_text(Fernet.generate_key().decode())
            with fresh_database(keep=args.keep_database, prefix=args.db_prefix) as (url, name):
                if args.keep_database:
                    print(f"database: {name} (reuse: --database {name} --key-file {load.KEY_FILE})")
                seed(url, args, Path(tmp))
                for tree, jobs in runs:
                    results.append((tree, jobs, *_timed(url, tree, jobs)))
            if not args.keep_database:
                load.KEY_FILE.unlink(missing_ok=True)
    print(f"load after: {os.getloadavg()}")
    print()
    print(
        "| tree | jobs | objects | seconds | objects/s | CPU s | CPU µs/object | exit | verdict |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for tree, jobs, objects, seconds, cpu, code, verdict in results:
        name = "this tree" if tree == load.ROOT else str(tree)
        print(
            f"| {name} | {jobs or 1} | {objects:,} | {seconds:.1f} | {objects / seconds:,.0f} | "
            f"{cpu:.1f} | {1e6 * cpu / max(objects, 1):,.0f} | {code} | {verdict} |"
        )
    return 0 if all(code == 0 for *_, code, _ in results) else 1


def _timed(url: str, tree: Path, jobs: int) -> tuple[int, float, float, int, str]:
    objects = int(load.sql(url, "SELECT count(*) FROM objects"))
    seconds, cpu, code, verdict = time_verify(url, tree, jobs)
    print(
        f"{tree} (jobs {jobs or 1}): {seconds:.1f} s, CPU {cpu:.1f} s, exit {code}: {verdict}; "
        f"load {os.getloadavg()}",
        flush=True,
    )
    return objects, seconds, cpu, code, verdict


if __name__ == "__main__":
    raise SystemExit(main())

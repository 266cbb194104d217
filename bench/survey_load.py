"""Population-survey benchmark: bulk import, surveys over the population, side by side with the
single-submit path and pgbench on the same PostgreSQL.

How to run (from the project root, PostgreSQL reachable)::

    .venv/bin/python bench/survey_load.py                      # 10^6 objects (several minutes)
    .venv/bin/python bench/survey_load.py --objects 100000     # a quicker look
    .venv/bin/python bench/survey_load.py --objects 2000 --continuous 200 --no-single --no-pgbench
    .venv/bin/python bench/survey_load.py --import-only                 # the import alone
    .venv/bin/python bench/survey_load.py --import-only --tree /work/old  # an older tree's import

What it does
------------
1. A fresh PostgreSQL database (``bench.service_load.fresh_database``: migrated, dropped at the
   end).
2. **Import**: writes ``--objects`` registrations (3 attributes: ``age`` integer 0..9, ``sex``
   0..1, ``region`` categorical with 15 values — 300 points; random values; budget 4; label
   ``study: bench``) to an NDJSON file and times ``gatekeeper import FILE`` (the command users
   run: validation, encryption of each value, batches of 5,000 in one transaction each).
3. **Surveys**: starts ``gatekeeper serve`` (one web worker; surveys run in process) and times
   three surveys from ``POST /v1/surveys`` to ``status: done`` — ``grr`` ε = 1 on ``region``,
   then on ``age``, then on ``region`` again — each decided, sampled, recorded and estimated.
   After each: members/s, decision groups, likelihood states stored, database size.
4. **Side by side, same PostgreSQL**: ``pgbench`` running one submit-shaped transaction (lock a
   row, insert a history row, bump the version) with 8 clients for 10 s, and the single-submit
   path (``bench/service_load.py --duration 10 --filters bayesian``).
5. **Continuous cohort**: ``--continuous`` objects on [0,1]^2 and a ``linear`` survey over them.

The last line is ``gatekeeper verify``'s verdict unless ``--no-verify`` (it replays every
object: minutes at 10^6).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import (  # noqa: E402
    ADMIN_KEY,
    BackendSampler,
    Server,
    descendants,
    fresh_database,
)

REGIONS = [f"r{i:02d}" for i in range(15)]
DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 9},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "region", "type": "categorical", "values": REGIONS},
    ]
}
CONTINUOUS = {
    "attributes": [
        {"name": "x", "type": "real", "low": 0, "high": 1},
        {"name": "y", "type": "real", "low": 0, "high": 1},
    ]
}
SURVEYS = [
    {"mechanism": "grr", "attribute": "region", "epsilon": 1.0},
    {"mechanism": "grr", "attribute": "age", "epsilon": 1.0},
    {"mechanism": "grr", "attribute": "region", "epsilon": 1.0},
]
#: Issue 27 item 3: ``--surveys N`` runs the first N of grr ε = 0.5 on region, age, sex, region,
#: age, sex, region, ... — histories diverge with every answer (the order of the outputs differs
#: between members), while their contents (the multiset of outputs) diverge much more slowly.
SERIES = ["region", "age", "sex"]


def series_query(i: int) -> dict[str, Any]:
    """The ``i``-th survey (from 0) of the ``--surveys`` sequence."""
    return {"mechanism": "grr", "attribute": SERIES[i % len(SERIES)], "epsilon": 0.5}


LINEAR = {
    "mechanism": "linear",
    "weights": {"x": 0.5, "y": 0.5},
    "intercept": 0.0,
    "range": [0, 1],
    "truncate": False,
    "epsilon": 1.0,
}


def write_population(path: Path, n: int, seed: int, *, continuous: bool = False) -> None:
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(n):
            if continuous:
                value: dict[str, Any] = {"x": rng.random(), "y": rng.random()}
                body = {
                    "id": f"c{i:07d}",
                    "domain": CONTINUOUS,
                    "value": value,
                    "budget": {"epsilon": 4.0},
                    "labels": {"study": "continuous"},
                }
            else:
                value = {
                    "age": rng.randrange(10),
                    "sex": rng.randrange(2),
                    "region": REGIONS[min(int(rng.expovariate(0.3)), 14)],
                }
                body = {
                    "id": f"p{i:07d}",
                    "domain": DOMAIN,
                    "value": value,
                    "budget": {"epsilon": 4.0},
                    "labels": {"study": "bench"},
                }
            out.write(json.dumps(body) + "\n")


def cli(database_url: str, *args: str, tree: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``gatekeeper ARGS`` on the database, from the source in ``tree`` (default: this one)."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "BOUND_PROCESSES": "0",
        "GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE),
    }
    return subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "app.cli", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def sql(database_url: str, statement: str) -> str:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return str(conn.execute(statement).fetchone()[0])  # type: ignore[index]


def db_size(database_url: str) -> int:
    """The database's size in bytes."""
    return int(sql(database_url, "SELECT pg_database_size(current_database())"))


def table_sizes(database_url: str) -> str:
    """The largest tables with their indexes, in MiB."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r' "
            "AND relnamespace = 'public'::regnamespace ORDER BY 2 DESC LIMIT 5"
        ).fetchall()
    return ", ".join(f"{name} {size / 2**20:,.0f}" for name, size in rows)


def run_survey(
    http: httpx.Client, headers: dict[str, str], query: dict[str, Any], study: str
) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    r = http.post(
        "/v1/surveys",
        headers=headers,
        json={
            "name": f"bench {query['mechanism']}",
            "query": query,
            "cohort": {"labels": {"study": study}},
        },
    )
    r.raise_for_status()
    survey_id = r.json()["id"]
    while True:
        view = http.get(f"/v1/surveys/{survey_id}", headers=headers).json()
        if view["status"] not in ("queued", "running"):
            return view, time.perf_counter() - start
        time.sleep(0.2)


PGBENCH_SCRIPT = """\\set id random(1, {rows})
BEGIN;
SELECT version FROM pgb_objects WHERE id = :id FOR UPDATE;
INSERT INTO pgb_history (object_id, seq, output) VALUES (:id, 1, '"r01"');
UPDATE pgb_objects SET version = version + 1 WHERE id = :id;
COMMIT;
"""


def pgbench(database_url: str, rows: int = 100_000, seconds: int = 10) -> float:
    """Transactions per second of :data:`PGBENCH_SCRIPT` (tables created first)."""
    pgbench_tables(database_url, rows)
    return pgbench_run(database_url, rows, seconds)[0]


def pgbench_tables(database_url: str, rows: int = 100_000) -> None:
    """The tables :data:`PGBENCH_SCRIPT` works on, ``rows`` objects."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE pgb_objects (id int PRIMARY KEY, version int NOT NULL)")
        conn.execute(
            "CREATE TABLE pgb_history (id bigserial PRIMARY KEY, object_id int, "
            "seq int, output text)"
        )
        conn.execute(
            "INSERT INTO pgb_objects SELECT g, 0 FROM generate_series(1, %s) g", (int(rows),)
        )


def pgbench_run(database_url: str, rows: int = 100_000, seconds: int = 10) -> tuple[float, int]:
    """``pgbench`` with 8 clients for ``seconds``: transactions per second and their count."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(PGBENCH_SCRIPT.format(rows=rows))
    done = subprocess.run(  # noqa: S603 - pgbench from PATH, as the docs say
        [  # noqa: S607
            "pgbench",
            "-n",
            "-c",
            "8",
            "-j",
            "2",
            "-T",
            str(seconds),
            "-f",
            script.name,
            database_url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    os.unlink(script.name)
    tps, count = None, None
    for line in done.stdout.splitlines():
        if line.startswith("tps ="):
            tps = float(line.split()[2])
        if line.startswith("number of transactions actually processed:"):
            count = int(line.split(":")[1].split()[0])
    if tps is None or count is None:
        raise RuntimeError(done.stdout)
    return tps, count


def single_submits() -> float | None:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    done = subprocess.run(  # noqa: S603
        [
            sys.executable,
            "bench/service_load.py",
            "--duration",
            "10",
            "--filters",
            "bayesian",
            "--no-verify",
            "--json",
            path,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        runs = json.loads(Path(path).read_text())["runs"]
    except (OSError, ValueError, KeyError):
        print(done.stdout[-2000:], done.stderr[-2000:])
        return None
    finally:
        os.unlink(path)
    grr = [r for r in runs if r["scenario"] == "grr"]
    return float(grr[0]["submits_per_second"]) if grr else None


KEY_FILE = Path(tempfile.gettempdir()) / f"gk-bench-{os.getpid()}.key"


def states_size(database_url: str) -> tuple[int, float]:
    """Stored likelihood states: how many, and their table's size with indexes and TOAST (MiB)."""
    count = int(sql(database_url, "SELECT count(*) FROM likelihood_states"))
    size = int(sql(database_url, "SELECT pg_total_relation_size('likelihood_states')"))
    return count, size / 2**20


def states_dead(database_url: str) -> int:
    """``likelihood_states``' dead row versions now, counted by ``pgstattuple`` (a scan)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        row = conn.execute(
            "SELECT dead_tuple_count FROM pgstattuple('likelihood_states')"
        ).fetchone()
    assert row is not None  # noqa: S101 - one row
    return int(row[0])


def states_stats(database_url: str) -> str:
    """``likelihood_states``' ``pg_stat_user_tables`` counts: dead versions, rows written.

    An idle backend reports its counts up to 10 s late (PostgreSQL 15), hence the wait; the
    write counts are cumulative, ``n_dead_tup`` what autovacuum has not removed yet.
    """
    import psycopg

    time.sleep(11)
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, "
            "autovacuum_count FROM pg_stat_user_tables WHERE relname = 'likelihood_states'"
        ).fetchone()
    assert row is not None  # noqa: S101 - the table exists in a migrated database
    names = ("live", "dead", "inserted", "updated", "HOT updated", "deleted", "autovacuums")
    return ", ".join(f"{name} {value:,}" for name, value in zip(names, row, strict=True))


class RssSampler:
    """The server's memory during a survey: the peak of its processes' summed resident sets.

    Every ``interval`` seconds the resident set (``VmRSS``) of the server and every process
    below it (uvicorn's worker, the bound worker's process, the survey child processes) is
    summed; :meth:`stop` gives the largest sum seen, and how many processes made it.
    """

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval = pid, interval
        self.peak, self.processes = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            total, count = 0, 0
            for pid in descendants(self.pid):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    status = Path(f"/proc/{pid}/status").read_text()
                    total += int(status.split("VmRSS:", 1)[1].split()[0])  # kB
                    count += 1
            if total > self.peak:
                self.peak, self.processes = total, count
            if self._stop.wait(self.interval):
                return

    def stop(self) -> str:
        """``peak MiB (processes)``."""
        self._stop.set()
        self._thread.join()
        return f"{self.peak / 1024:,.0f} ({self.processes})"


class Profiler:
    """``--profile DIR``: py-spy over this tree's server (and its worker process) from a survey on.

    Two samplers at once on the same process tree, ``--nonblocking`` (the server is not paused
    to be read): ``all.raw`` (every thread not idle in py-spy's sense: a thread waiting on
    PostgreSQL counts) and ``gil.raw`` (``--gil``: only the thread holding the GIL, i.e. the
    Python code's CPU). Stopped by SIGINT (py-spy then writes its file); summarized with
    :func:`bench.profile_submit.by_function`.
    """

    def __init__(self, folder: Path, pid: int, rate: int) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        folder.mkdir(parents=True, exist_ok=True)
        self.raws = {"all": folder / "all.raw", "gil": folder / "gil.raw"}
        self.processes = [
            subprocess.Popen(  # noqa: S603 - our own arguments
                [
                    *(spy, "record", "-p", str(pid), "--subprocesses", "--nonblocking"),
                    *("-r", str(rate), "-f", "raw", "-o", str(raw)),
                    *(["--gil"] if name == "gil" else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name, raw in self.raws.items()
        ]

    def stop(self, top: int) -> None:
        from bench.profile_submit import by_function

        for process in self.processes:
            process.send_signal(signal.SIGINT)
        for process in self.processes:
            process.wait(timeout=120)
        for name, raw in self.raws.items():
            print(f"py-spy record --subprocesses --nonblocking{' --gil' if name == 'gil' else ''}")
            print(by_function(raw, top) if raw.exists() else f"{raw}: not written", flush=True)


def survey_series(args: argparse.Namespace) -> int:
    """``--surveys N``: the issue's diverging sequence, per tree, interleaved survey by survey.

    One database and one server per tree (this one, then each ``--baseline``), the same
    population imported into each; survey ``i`` runs on every tree before survey ``i + 1``
    (alternating which goes first), so the trees share the machine's load. Per survey and tree:
    wall time, members/s, decision groups, likelihood states stored and their MiB, the states
    table's dead row versions (:func:`states_dead`), the server's CPU seconds and its PostgreSQL
    backends' CPU seconds, and the load average; at the end the table's statistics
    (:func:`states_stats`).
    """
    # this tree once, or once per --processes value (SURVEY_PROCESSES of its server), then each
    # baseline tree with its own defaults
    mine = [(ROOT, {}, "branch")]
    if args.processes:
        mine = [
            (ROOT, {"SURVEY_PROCESSES": str(p)}, f"branch p={p}")
            for p in (int(v) for v in args.processes.split(","))
        ]
    variants = [*mine, *((tree, {}, f"base {tree}") for tree in args.baseline)]
    trees = [tree for tree, _, _ in variants]
    names = [name for _, _, name in variants]
    ok = True
    rows: list[tuple[int, str, str]] = []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        population = Path(tmp) / "population.ndjson"
        write_population(population, args.objects, args.seed)
        urls, servers, dbnames = [], [], []
        for n, tree in enumerate(trees):
            # a baseline's database is migrated by its own tree (its head may be older)
            url, dbname = stack.enter_context(
                fresh_database(keep=args.keep_database, prefix=args.db_prefix, migrate=tree == ROOT)
            )
            if tree != ROOT:
                done = cli(url, "migrate", tree=tree)
                if done.returncode != 0:
                    print(done.stderr)
                    return 1
            start = time.perf_counter()
            done = cli(url, "import", str(population), "--quiet", tree=tree)
            if done.returncode != 0:
                print(done.stderr)
                return 1
            print(
                f"{names[n]}: imported {args.objects} in {time.perf_counter() - start:.1f} s",
                flush=True,
            )
            env = {
                "GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE),
                "BOUND_PROCESSES": "1",
                **variants[n][1],
            }
            server = Server(url, 1, 1, Path(tmp) / f"server{n}.log", env, tree=tree)
            stack.callback(server.stop)
            urls.append(url)
            servers.append(server)
            dbnames.append(dbname)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        print(
            "| survey | tree | wall s | members/s | groups | states | states MiB | "
            "states dead | server CPU s | PG CPU s | server RSS MiB | load |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        profiler: Profiler | None = None
        for i in range(args.surveys):
            query = series_query(i)
            order = list(range(len(trees)))
            if i % 2:
                order.reverse()
            for n in order:
                if args.profile and n == 0 and profiler is None and i + 1 >= args.profile_from:
                    profiler = Profiler(args.profile, servers[0].process.pid, args.profile_rate)
                    time.sleep(1.0)  # py-spy attached before the survey starts
                with httpx.Client(base_url=servers[n].url, timeout=60) as http:
                    cpu = servers[n].cpu()
                    backends = BackendSampler(dbnames[n])
                    memory = RssSampler(servers[n].process.pid)
                    view, seconds = run_survey(http, headers, query, "bench")
                    pg_cpu = backends.stop()
                    rss = memory.stop()
                    cpu = servers[n].cpu() - cpu
                states, mib = states_size(urls[n])
                dead = states_dead(urls[n])
                members = view["progress"]["decided"]
                line = (
                    f"| {i + 1} ({query['attribute']}) | {names[n]} | {seconds:.1f} | "
                    f"{members / seconds:,.0f} | {view['groups']} | {states} | {mib:,.1f} | "
                    f"{dead:,} | {cpu:.1f} | {pg_cpu:.1f} | {rss} | {os.getloadavg()[0]:.2f} |"
                )
                ok &= view["status"] == "done" and members == args.objects
                rows.append((i, names[n], line))
                print(line, flush=True)
        if profiler is not None:
            profiler.stop(args.profile_top)
        for n, url in enumerate(urls):
            print(f"{names[n]}: largest tables (MiB) {table_sizes(url)}", flush=True)
            print(f"{names[n]}: likelihood_states statistics: {states_stats(url)}", flush=True)
            if not args.no_verify:
                done = cli(url, "verify", tree=trees[n])
                said = [line for line in done.stdout.splitlines() if line.startswith("verified")]
                print(f"{names[n]}: verify: {said[-1] if said else done.stdout}", flush=True)
                ok &= done.returncode == 0
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--continuous", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--no-single", action="store_true", help="skip service_load.py")
    parser.add_argument("--no-pgbench", action="store_true")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument(
        "--keep-database", action="store_true", help="do not drop the database (to inspect it)"
    )
    parser.add_argument(
        "--import-only", action="store_true", help="time the import alone (no server, surveys)"
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="run `gatekeeper import` from the source in this directory (an older commit's "
        "worktree, to compare it with this one on the same machine)",
    )
    parser.add_argument(
        "--surveys",
        type=int,
        default=0,
        help="run the first N surveys of issue 27's diverging sequence (grr ε = 0.5 on region, "
        "age, sex, region, ...) instead of the default three, printing groups, states, their "
        "MiB and time per survey",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        action="append",
        default=[],
        help="with --surveys: also serve a database from this tree (a worktree of an older "
        "commit), surveys interleaved with this tree's",
    )
    parser.add_argument(
        "--processes",
        help="with --surveys: serve this tree once per value of this comma-separated list, "
        "each server with that SURVEY_PROCESSES (e.g. 0,2: chunks in threads beside chunks in "
        "two child processes), each on its own database, surveys interleaved",
    )
    parser.add_argument("--db-prefix", default="gk_bench_", help="the databases' name prefix")
    parser.add_argument(
        "--profile",
        type=Path,
        help="with --surveys: py-spy over this tree's server from survey --profile-from to the "
        "last (all.raw and gil.raw written in this folder, the top functions printed)",
    )
    parser.add_argument("--profile-from", type=int, default=6, help="first profiled survey (6)")
    parser.add_argument("--profile-rate", type=int, default=100, help="samples per second (100)")
    parser.add_argument("--profile-top", type=int, default=30, help="functions printed (30)")
    args = parser.parse_args(argv)
    if args.baseline and not args.surveys:
        parser.error("--baseline needs --surveys")
    if args.processes and not args.surveys:
        parser.error("--processes needs --surveys")
    if args.tree != ROOT and not args.import_only:
        parser.error("--tree times an older tree's import: use it with --import-only")
    from cryptography.fernet import Fernet

    KEY_FILE.write_text(Fernet.generate_key().decode())
    print(f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()}")
    if args.surveys:
        try:
            return survey_series(args)
        finally:
            KEY_FILE.unlink(missing_ok=True)
    rows: list[tuple[str, str]] = []
    ok = True
    with (
        fresh_database(
            keep=args.keep_database, prefix=args.db_prefix, migrate=args.tree == ROOT
        ) as (url, _name),
        tempfile.TemporaryDirectory() as tmp,
    ):
        population = Path(tmp) / "population.ndjson"
        write_population(population, args.objects, args.seed)
        start = time.perf_counter()
        done = cli(url, "import", str(population), "--quiet", tree=args.tree)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(done.stderr)
            return 1
        rows.append(
            (
                "import" if args.tree == ROOT else f"import ({args.tree})",
                f"{args.objects} objects in {seconds:.1f} s = "
                f"{args.objects / seconds:,.0f} objects/s  {done.stdout.strip()}",
            )
        )
        print(rows[-1][1], flush=True)
        if args.import_only:
            rows.append(("database after import", f"{db_size(url) / 2**20:,.0f} MiB"))
            args.no_pgbench = args.no_verify = args.no_single = True
        else:
            env = {
                "GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE),
                "BOUND_PROCESSES": "1",
            }
            server = Server(url, 1, 1, Path(tmp) / "server.log", env)
            try:
                with httpx.Client(base_url=server.url, timeout=60) as http:
                    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
                    for i, query in enumerate(SURVEYS, start=1):
                        view, seconds = run_survey(http, headers, query, "bench")
                        states = sql(url, "SELECT count(*) FROM likelihood_states")
                        size = db_size(url)
                        members = view["progress"]["decided"]
                        rows.append(
                            (
                                f"survey {i} ({query['attribute']})",
                                f"{view['status']}: {members} members in {seconds:.1f} s = "
                                f"{members / seconds:,.0f} members/s; accepted "
                                f"{view['progress']['accepted']}, refused "
                                f"{view['progress']['refused']}, groups {view['groups']}, "
                                f"states stored {states}, database {size / 2**20:,.0f} MiB",
                            )
                        )
                        print(rows[-1][1], flush=True)
                        ok &= view["status"] == "done"
                    if args.continuous:
                        cont = Path(tmp) / "continuous.ndjson"
                        write_population(cont, args.continuous, args.seed, continuous=True)
                        done = cli(url, "import", str(cont), "--quiet")
                        view, seconds = run_survey(http, headers, LINEAR, "continuous")
                        members = view["progress"]["decided"]
                        rows.append(
                            (
                                "continuous (linear, 2-D)",
                                f"{view['status']}: {members} members in {seconds:.1f} s = "
                                f"{members / seconds:,.0f} members/s; groups {view['groups']}; "
                                f"estimate {view['estimate']}",
                            )
                        )
                        print(rows[-1][1], flush=True)
            finally:
                server.stop()
        rows.append(("largest tables (MiB, with indexes)", table_sizes(url)))
        print(rows[-1][1], flush=True)
        if not args.no_pgbench:
            tps = pgbench(url)
            rows.append(("pgbench (submit-shaped tx, 8 clients)", f"{tps:,.0f} tx/s"))
            print(rows[-1][1], flush=True)
        if not args.no_verify:
            done = cli(url, "verify")
            rows.append(("verify", done.stdout.strip().splitlines()[-1]))
            ok &= done.returncode == 0
    if not args.no_single:
        rate = single_submits()
        rows.append(
            (
                "single submits (service_load.py, grr)",
                f"{rate:,.1f} submits/s" if rate else "failed",
            )
        )
    KEY_FILE.unlink(missing_ok=True)
    print()
    print("| measurement | result |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

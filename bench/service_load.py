"""Load benchmark of the HTTP service: submits per second and latency, Bayesian next to basic.

How to run (from the project root, PostgreSQL and Redis reachable)::

    .venv/bin/python bench/service_load.py                        # 50 clients, 15 s per run
    .venv/bin/python bench/service_load.py --clients 50 --duration 20 --workers 4 --json out.json
    .venv/bin/python bench/service_load.py --requests 3000        # a fixed number per run
    .venv/bin/python bench/service_load.py --rate 300             # open loop at 300 submits/s
    .venv/bin/python bench/service_load.py --scenarios linear --budget 2   # near the budget
    .venv/bin/python bench/service_load.py --scenarios grr --trees BEFORE,AFTER   # one run

What it does
------------
1. Creates a fresh PostgreSQL database (``gk_bench_<random>``, from the admin URL
   ``GATEKEEPER_BENCH_POSTGRES_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``),
   migrates it with Alembic, stores the bootstrap admin key, and drops the database at the end
   (also after an error or Ctrl-C).
2. Starts ``python -m app.cli serve --host 127.0.0.1 --workers W`` (loopback only) on that
   database with ``REDIS_URL`` (``GATEKEEPER_BENCH_REDIS_URL``, default
   ``redis://127.0.0.1:6379/14``), ``BOUND_PROCESSES`` (``--bound-processes``, default 1 per web
   worker) and the default log level (INFO: one JSON access line per request, as in production).
   The server log goes to a temporary file whose path is printed.
3. For each scenario and filter, registers fresh objects (by default **one object per client**,
   so no single hot row: each client submits to its own object; ``--objects K`` with K < clients
   makes clients share objects round-robin) with budget ε_g = 10000 (the maximum), far above what
   a run can spend, so every submit is accepted (non-201 answers are counted as errors).
   ``--budget B`` registers them with ε_g = B instead: objects reach their budget during the
   run, and the filter's rejections (409) count as answers, not errors — the near-budget regime,
   where every decision of a continuous object runs its searches.
4. Load: ``--clients`` closed-loop clients, each on its own keep-alive HTTP/1.1 connection,
   send ``POST /v1/objects/{id}/queries`` with a fresh ``Idempotency-Key`` one after the other,
   after ``--warmup`` untimed submits each; the timed phase ends after ``--duration`` seconds or
   ``--requests`` submits (always also after ``--time-limit`` seconds). With ``--rate R`` the load
   is open-loop instead: submits are scheduled every 1/R s over ``--clients`` connections, and the
   latency is measured from the scheduled time (no coordinated omission).

Scenarios: ``grr`` — a 1,000-point finite domain (``a`` integer 0..9 x ``b`` integer 0..9 x ``c``
categorical with 10 values), ``grr`` with ε = 0.5 on ``a``, ``b``, ``c`` in turn; ``binary_rr`` —
the same domain, ``binary_rr`` with ε = 0.5 on ``a < 5``, ``b >= 3``, ``c in {v1, v2, v3}`` in turn;
``grr1m`` — a 10^6-point finite domain (six integers 0..9: an 8 MB likelihood array per object),
``grr`` as above; ``linear`` — a
9-dimensional box of reals (``x1..x9`` in [0, 1]), ``linear`` queries with ε = 0.5, weights drawn
uniformly in [-1, 1] (a pool of 64 seeded queries), ``range`` the exact min/max over the box
rounded outwards, no truncation. Each scenario runs with the ``bayesian`` filter and then the
``basic`` filter on the same server (the order alternates with ``--rounds``).

The client is a minimal asyncio HTTP/1.1 client (uvloop when available), to leave the CPU to
the server: the machine runs client, server, PostgreSQL and Redis together. The table reports,
over the timed phase and per timed submit, the CPU time used by the server's process tree, by
the PostgreSQL backends of the benchmark database (sampled every 0.25 s) and by this client,
and the machine's busy share (all processes, including anything else running). At the end
``gatekeeper verify`` replays every object's history against its stored state (``--no-verify``
skips it); the exit status is 1 if any submit failed or verify did not pass. Then, on the same
PostgreSQL (``--pgbench SECONDS``, 10 by default, 0 to skip), ``pgbench`` runs the submit-shaped
transaction of ``bench/survey_load.py`` (lock an object's row, insert a history row, bump its
version) with 8 clients, and its transactions per second and the CPU per transaction of
``pgbench`` and of the PostgreSQL backends are printed beside the service's CPU per submit: the
database's own ceiling for this shape of work, measured in the same run; each run's answers per
second are then printed as a multiple of pgbench's transactions per second, beside its server and
database CPU per submit. ``--trees DIR,DIR`` starts a server from each source tree in turn (its
code first on ``PYTHONPATH``; the order alternates by round) on the same database, so code before
and after a change is measured in one run (a tree is e.g. ``git archive COMMIT | tar -x -C DIR``).

Targets: >= 300 finite-domain (``grr``) submits/s with p99 < 100 ms, and the Bayesian filter
within 1.5x of basic (throughput and latency). Note that in a closed loop the mean latency is
clients / throughput (Little's law): with 50 clients, p99 < 100 ms needs well over 500
submits/s. ``--rate`` measures the latency at a given offered load instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "bench-admin-" + secrets.token_hex(24)
POSTGRES_URL = os.environ.get(
    "GATEKEEPER_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("GATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
BUDGET = 10_000.0
EPSILON = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")

GRR_DOMAIN = {
    "attributes": [
        {"name": "a", "type": "integer", "low": 0, "high": 9},
        {"name": "b", "type": "integer", "low": 0, "high": 9},
        {"name": "c", "type": "categorical", "values": [f"v{i}" for i in range(10)]},
    ]
}
#: 10^6 points: six integer attributes 0..9 (the likelihood array is 8 MB).
MILLION_DOMAIN = {
    "attributes": [{"name": n, "type": "integer", "low": 0, "high": 9} for n in "abcdef"]
}
LINEAR_DOMAIN = {
    "attributes": [{"name": f"x{i}", "type": "real", "low": 0, "high": 1} for i in range(1, 10)]
}


# --------------------------------------------------------------------------- workloads


def grr_value(rng: random.Random) -> dict[str, Any]:
    return {"a": rng.randint(0, 9), "b": rng.randint(0, 9), "c": f"v{rng.randint(0, 9)}"}


def grr_queries(_: random.Random) -> list[dict[str, Any]]:
    return [{"mechanism": "grr", "attribute": a, "epsilon": EPSILON} for a in ("a", "b", "c")]


def binary_rr_queries(_: random.Random) -> list[dict[str, Any]]:
    predicates = [
        {"attribute": "a", "op": "<", "value": 5},
        {"attribute": "b", "op": ">=", "value": 3},
        {"attribute": "c", "op": "in", "value": ["v1", "v2", "v3"]},
    ]
    return [{"mechanism": "binary_rr", "predicate": p, "epsilon": EPSILON} for p in predicates]


def million_value(rng: random.Random) -> dict[str, Any]:
    return {n: rng.randint(0, 9) for n in "abcdef"}


def linear_value(rng: random.Random) -> dict[str, Any]:
    return {f"x{i}": round(rng.random(), 4) for i in range(1, 10)}


def linear_queries(rng: random.Random) -> list[dict[str, Any]]:
    queries = []
    for _ in range(64):
        weights = {f"x{i}": round(rng.uniform(-1, 1), 3) for i in range(1, 10)}
        low = sum(min(0.0, w) for w in weights.values())
        high = sum(max(0.0, w) for w in weights.values())
        queries.append(
            {
                "mechanism": "linear",
                "weights": weights,
                "intercept": 0.0,
                "range": [round(low - 0.01, 3), round(high + 0.01, 3)],
                "truncate": False,
                "epsilon": EPSILON,
            }
        )
    return queries


SCENARIOS = {
    "grr": ("grr, 1,000-point finite domain", GRR_DOMAIN, grr_value, grr_queries),
    "binary_rr": ("binary_rr, 1,000-point finite domain", GRR_DOMAIN, grr_value, binary_rr_queries),
    "grr1m": ("grr, 10^6-point finite domain", MILLION_DOMAIN, million_value, grr_queries),
    "linear": ("linear, 9-dim box of reals", LINEAR_DOMAIN, linear_value, linear_queries),
}


# --------------------------------------------------------------------------- HTTP client


class Connection:
    """One keep-alive HTTP/1.1 connection (just enough HTTP for this service)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.writer is None:
            await self._open()
        if self.reader is None or self.writer is None:
            raise ConnectionError("no connection")
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers.items()),
            "",
            "",
        ]
        self.writer.write("\r\n".join(head).encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            await self.close()
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if chunked:
            payload = b""
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                payload += await self.reader.readexactly(size)
                await self.reader.readline()
        else:
            payload = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, payload


# --------------------------------------------------------------------------- processes, CPU


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def procs_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (gone ones count 0)."""
    return sum(proc_cpu(pid) for pid in pids)


def add_scratch_args(
    parser: argparse.ArgumentParser, *, db_prefix: str, redis: bool = True
) -> None:
    """The options of a bench that makes its own scratch database: ``--db-prefix``,
    ``--admin-url`` (``GATEKEEPER_BENCH_POSTGRES_URL``) and, with ``redis``, ``--redis``
    (``GATEKEEPER_BENCH_REDIS_URL``)."""
    parser.add_argument("--db-prefix", default=db_prefix, help="the database's name prefix")
    parser.add_argument("--admin-url", default=POSTGRES_URL, help="PostgreSQL to create it in")
    if redis:
        parser.add_argument("--redis", default=REDIS_URL, help="the service's Redis")


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return total - idle, total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def fresh_database(
    *,
    keep: bool = False,
    migrate: bool = True,
    name: str | None = None,
    prefix: str = "gk_bench_",
) -> Iterator[tuple[str, str]]:
    """A new migrated database with the bootstrap admin key; dropped afterwards unless ``keep``.

    ``migrate=False``: an empty database (an older tree's command migrates it to its own head).
    ``name``: the database's name (default: ``prefix`` and a random suffix); one of that
    name left by an interrupted run is dropped first.
    """
    import psycopg

    from app.db.migrate import upgrade
    from app.db.session import make_engine
    from app.services.auth import ensure_bootstrap_admin

    admin = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    if name is None:
        name = prefix + secrets.token_hex(6)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = admin.rsplit("/", 1)[0] + "/" + name
        if not migrate:
            yield url, name
            return
        upgrade(url)
        # stored before the workers start: several workers creating it at once can collide
        engine = make_engine(url)
        ensure_bootstrap_admin(engine=engine, secret=ADMIN_KEY)
        engine.dispose()
        yield url, name
    finally:
        if keep:
            print(f"kept database {name}", flush=True)
        else:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class BackendSampler:
    """CPU of the PostgreSQL backends serving one database, sampled in a background thread.

    Pooled connections come and go (SQLAlchemy closes overflow connections), so the backends
    are listed every ``interval`` seconds and the last CPU time seen of each is kept; a backend
    that lives less than ``interval`` is missed. Client backends only: an autovacuum worker of
    the database, which runs when the table's dead rows call for it (often during the next
    run of a tree that finished sooner), is not the measured statements' cost.
    """

    def __init__(self, name: str, interval: float = 0.25) -> None:
        import psycopg

        self.name, self.interval = name, interval
        admin = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
        self.conn = psycopg.connect(admin, autocommit=True)
        self.baseline = self._sample()
        self.latest = dict(self.baseline)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[int, float]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'",
            (self.name,),
        ).fetchall()
        return {int(r[0]): proc_cpu(int(r[0])) for r in rows}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            for pid, cpu in self._sample().items():
                self.latest[pid] = max(cpu, self.latest.get(pid, 0.0))

    def stop(self) -> float:
        """Stop sampling; CPU seconds used by the backends since the start."""
        self._stop.set()
        self._thread.join()
        for pid, cpu in self._sample().items():
            self.latest[pid] = max(cpu, self.latest.get(pid, 0.0))
        self.conn.close()
        return sum(cpu - self.baseline.get(pid, 0.0) for pid, cpu in self.latest.items())


class Server:
    """``python -m app.cli serve`` on loopback, in its own process group."""

    def __init__(
        self,
        database_url: str,
        workers: int,
        bound: int,
        log_path: Path,
        extra_env: dict[str, str] | None = None,
        tree: Path = ROOT,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": REDIS_URL,
            "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "BOUND_PROCESSES": str(bound),
            # one key for every tree's server and for verify (else each tree's folder gets its
            # own ./data/encryption.key and verify, run from this one, finds none)
            "GATEKEEPER_ENCRYPTION_KEY_FILE": str(log_path.parent / "encryption.key"),
            # the server runs the code of ``tree`` (``--trees``: several in one run)
            "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'clients' / 'python' / 'src'}",
            **(extra_env or {}),
        }
        self.process = subprocess.Popen(  # noqa: S603 - our own CLI
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            cwd=tree,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"server not ready: {log_path.read_text()[-2000:]}")
        # every worker must have started (a worker that fails makes uvicorn stop the server)
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            if "Application startup failed" in text:
                self.stop()
                raise RuntimeError(f"a worker failed to start: {text[-2000:]}")
            if text.count("Application startup complete") >= workers:
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("not every worker started")

    def cpu(self) -> float:
        return sum(proc_cpu(p) for p in descendants(self.process.pid))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


# --------------------------------------------------------------------------- one run


@dataclass
class Run:
    scenario: str
    filter: str
    objects: int
    clients: int
    mode: str
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    server_cpu: float = 0.0
    postgres_cpu: float = 0.0
    client_cpu: float = 0.0
    machine_busy: float = 0.0
    histories: list[int] = field(default_factory=list)
    warmup_errors: int = 0
    #: Statuses that answer a submit (``--budget``: the filter's 409 too).
    answers: tuple[int, ...] = (201,)
    #: Which source tree the server ran (``--trees``; empty: this one).
    code: str = ""

    @property
    def ok(self) -> int:
        """Submits answered (accepted, and with ``--budget`` rejected by the filter)."""
        return sum(self.statuses.get(status, 0) for status in self.answers)

    @property
    def throughput(self) -> float:
        return self.ok / self.wall if self.wall else 0.0

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000 if self.latencies else float("nan")

    def summary(self) -> dict[str, Any]:
        n = max(1, len(self.latencies))
        return {
            "scenario": self.scenario,
            "filter": self.filter,
            "mode": self.mode,
            "objects": self.objects,
            "clients": self.clients,
            "requests": len(self.latencies),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "wall_seconds": self.wall,
            "submits_per_second": self.throughput,
            "latency_ms": {
                "p50": self.pct(50),
                "p90": self.pct(90),
                "p99": self.pct(99),
                "max": self.pct(100),
                "mean": float(np.mean(self.latencies)) * 1000 if self.latencies else None,
            },
            "cpu_ms_per_request": {
                "server": 1000 * self.server_cpu / n,
                "postgres": 1000 * self.postgres_cpu / n,
                "client": 1000 * self.client_cpu / n,
            },
            "machine_busy_share": self.machine_busy,
            "accepted_per_object": self.histories,
            "warmup_errors": self.warmup_errors,
            "errors": self.errors[:5],
        }


class Meter:
    """CPU of the server tree, the database backends and this client over the timed phase."""

    def __init__(self, server: Server, db_name: str, run: Run) -> None:
        self.server, self.db_name, self.run = server, db_name, run

    def start(self) -> None:
        self.backends = BackendSampler(self.db_name)
        self.server0 = self.server.cpu()
        self.client0 = time.process_time()
        self.busy0, self.total0 = machine_busy()

    def stop(self) -> None:
        busy1, total1 = machine_busy()
        self.run.client_cpu = time.process_time() - self.client0
        self.run.server_cpu = self.server.cpu() - self.server0
        self.run.postgres_cpu = self.backends.stop()
        self.run.machine_busy = (busy1 - self.busy0) / max(1, total1 - self.total0)


def pgbench_side(url: str, name: str, seconds: int) -> tuple[float, float, float]:
    """``pgbench``'s submit-shaped transaction on the benchmark database (``bench/survey_load.py``).

    Returns transactions per second and the CPU milliseconds per transaction of ``pgbench``
    itself (this process's children) and of the database's backends, measured like a run's.
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.survey_load import pgbench_run, pgbench_tables

    pgbench_tables(url)  # before the meters: filling the table is not a transaction
    backends = BackendSampler(name)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tps, count = pgbench_run(url, seconds=seconds)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    postgres = backends.stop()
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    n = max(1, count)
    return tps, 1000 * client / n, 1000 * postgres / n


def register_objects(
    server: Server,
    scenario: str,
    filter_: str,
    count: int,
    rng: random.Random,
    budget: float = BUDGET,
) -> tuple[list[str], str]:
    _, domain, make_value, _ = SCENARIOS[scenario]
    ids = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        for _ in range(count):
            oid = f"bench-{scenario}-{filter_}-{secrets.token_hex(5)}"
            body = {
                "id": oid,
                "domain": domain,
                "value": make_value(rng),
                "budget": {"epsilon": budget},
                "filter": filter_,
            }
            r = client.post("/v1/objects", json=body, headers=headers)
            r.raise_for_status()
            ids.append(oid)
        r = client.post("/v1/keys", json={"role": "analyst", "label": "bench"}, headers=headers)
        r.raise_for_status()
        return ids, str(r.json()["key"])


async def drive(
    server: Server,
    run: Run,
    object_ids: list[str],
    analyst: str,
    queries: list[dict[str, Any]],
    args: argparse.Namespace,
    meter: Meter,
) -> None:
    host, port = "127.0.0.1", server.port
    auth = {"Authorization": f"Bearer {analyst}"}
    bodies = [json.dumps({"query": q}).encode() for q in queries]
    conns = [Connection(host, port) for _ in range(args.clients)]
    counter = 0

    async def submit(conn: Connection, index: int) -> tuple[int, bytes]:
        oid = object_ids[index % len(object_ids)]
        body = bodies[(index // len(object_ids)) % len(bodies)]
        headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
        return await asyncio.wait_for(
            conn.post(f"/v1/objects/{oid}/queries", body, headers), timeout=args.request_timeout
        )

    def record(status: int, payload: bytes, latency: float) -> None:
        run.statuses[status] = run.statuses.get(status, 0) + 1
        run.latencies.append(latency)
        if status not in run.answers and len(run.errors) < 20:
            run.errors.append(f"{status} {payload[:300]!r}")

    # warm-up: every connection opened, every object touched, untimed
    async def warm(i: int) -> None:
        for k in range(args.warmup):
            try:
                status, payload = await submit(conns[i], i + k * args.clients)
            except Exception as e:  # counted below, like a failed timed request
                await conns[i].close()
                status, payload = 0, repr(e).encode()
            if status not in run.answers:
                run.warmup_errors += 1
                if len(run.errors) < 20:
                    run.errors.append(f"warm-up {status} {payload[:300]!r}")

    await asyncio.gather(*(warm(i) for i in range(args.clients)))
    counter = args.warmup * args.clients

    limit = args.requests if args.requests else None
    hard_stop = time.perf_counter() + args.time_limit
    duration_stop = time.perf_counter() + (args.duration if not args.requests else 1e9)
    stop = min(hard_stop, duration_stop)
    issued = 0

    meter.start()  # CPU is counted over the timed phase only (after the warm-up)
    start = time.perf_counter()
    if args.rate is None:

        async def loop(i: int) -> None:
            nonlocal issued
            index = counter + i
            while time.perf_counter() < stop and (limit is None or issued < limit):
                issued += 1
                t0 = time.perf_counter()
                try:
                    status, payload = await submit(conns[i], index)
                except Exception as e:  # recorded as a failed request (status 0)
                    await conns[i].close()
                    status, payload = 0, repr(e).encode()
                record(status, payload, time.perf_counter() - t0)
                index += args.clients

        await asyncio.gather(*(loop(i) for i in range(args.clients)))
    else:
        pool: asyncio.Queue[Connection] = asyncio.Queue()
        for c in conns:
            pool.put_nowait(c)
        interval = 1.0 / args.rate

        async def one(k: int, due: float) -> None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            conn = await pool.get()
            try:
                status, payload = await submit(conn, counter + k)
            except Exception as e:  # recorded as a failed request (status 0)
                await conn.close()
                status, payload = 0, repr(e).encode()
            finally:
                pool.put_nowait(conn)
            record(status, payload, time.perf_counter() - due)

        tasks = []
        k = 0
        while True:
            due = start + k * interval
            if due >= stop or (limit is not None and k >= limit):
                break
            tasks.append(asyncio.ensure_future(one(k, due)))
            k += 1
            if len(tasks) % 200 == 0:
                await asyncio.sleep(max(0.0, due - time.perf_counter() - 0.5))
        await asyncio.gather(*tasks)
    run.wall = time.perf_counter() - start
    meter.stop()
    for c in conns:
        await c.close()


def run_one(
    server: Server,
    db_name: str,
    scenario: str,
    filter_: str,
    args: argparse.Namespace,
    rng: random.Random,
) -> Run:
    objects = args.objects or args.clients
    run = Run(scenario, filter_, objects, args.clients, "open" if args.rate else "closed")
    ids, analyst = register_objects(server, scenario, filter_, objects, rng, args.budget)
    if args.budget != BUDGET:
        run.answers = (201, 409)
    queries = SCENARIOS[scenario][3](rng)
    meter = Meter(server, db_name, run)
    asyncio.run(drive(server, run, ids, analyst, queries, args, meter))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        run.histories = sorted(
            client.get(f"/v1/objects/{oid}/odometer", headers=headers).json()["accepted"]
            for oid in ids
        )
    return run


# --------------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg": os.getloadavg(),
    }


def table(runs: list[Run]) -> str:
    width = max((len(r.code) for r in runs), default=0)
    code = f"{'code':<{width}} " if width else ""
    head = (
        f"{code}{'scenario':<9} {'filter':<9} {'mode':<6} {'obj':>4} {'cli':>4} {'requests':>8} "
        f"{'201':>6} {'409':>5} {'other':>5} {'answer/s':>9} {'p50 ms':>7} {'p90 ms':>7} "
        f"{'p99 ms':>7} {'max ms':>7}  {'cpu ms/submit srv pg cli':>24} {'busy':>5} {'per obj':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        n = max(1, len(r.latencies))
        cpu = (
            f"{1000 * r.server_cpu / n:7.2f} {1000 * r.postgres_cpu / n:6.2f} "
            f"{1000 * r.client_cpu / n:5.2f}"
        )
        hist = f"{r.histories[0]}-{r.histories[-1]}" if r.histories else "-"
        lines.append(
            (f"{r.code:<{width}} " if width else "")
            + f"{r.scenario:<9} {r.filter:<9} {r.mode:<6} {r.objects:>4} {r.clients:>4} "
            f"{len(r.latencies):>8} {r.statuses.get(201, 0):>6} {r.statuses.get(409, 0):>5} "
            f"{len(r.latencies) - r.ok:>5} "
            f"{r.throughput:>9.1f} {r.pct(50):>7.1f} {r.pct(90):>7.1f} {r.pct(99):>7.1f} "
            f"{r.pct(100):>7.1f}  {cpu:>24} {100 * r.machine_busy:>4.0f}% {hist:>8}"
        )
    return "\n".join(lines)


def verdicts(runs: list[Run], rate: float | None = None) -> list[str]:
    out = []
    for r in runs:
        if r.scenario == "grr" and r.filter == "bayesian":
            tp, p99 = r.throughput, r.pct(99)
            if rate is not None and rate < 300:
                load = f"open loop, {rate:g}/s offered: the >= 300/s target is not tested"
                tp_verdict = "n/a"
            elif rate is not None:
                # an open loop can at most serve what it offers: it "keeps up" when it served
                # the offered rate (1 % slack for the submits still in flight at the end)
                load = f"open loop, {rate:g}/s offered"
                tp_verdict = "met, kept up" if tp >= 0.99 * rate else "MISSED, fell behind"
            else:
                load = r.mode + " loop"
                tp_verdict = "met" if tp >= 300 else "MISSED"
            out.append(
                f"target grr bayesian ({load}): {tp:.1f} submits/s ({tp_verdict}: >= 300), "
                f"p99 {p99:.1f} ms ({'met' if p99 < 100 else 'MISSED'}: < 100)"
            )
    cores = os.cpu_count() or 1
    for r in runs:
        measured = r.server_cpu + r.postgres_cpu + r.client_cpu
        if r.ok:
            out.append(
                f"{r.scenario}/{r.filter}: measured CPU {1000 * measured / r.ok:.2f} ms/submit "
                f"(this client {100 * r.client_cpu / max(1e-9, measured):.1f} %); "
                f"{cores} cores / that = {cores * r.ok / max(1e-9, measured):.0f} submits/s "
                f"if nothing else ran (an estimate, not a measurement)"
            )
    for scenario in SCENARIOS:
        bay = [r for r in runs if r.scenario == scenario and r.filter == "bayesian"]
        bas = [r for r in runs if r.scenario == scenario and r.filter == "basic"]
        if not bay or not bas:
            continue
        tp_ratio = np.mean([r.throughput for r in bas]) / max(
            1e-9, np.mean([r.throughput for r in bay])
        )
        p50_ratio = np.mean([r.pct(50) for r in bay]) / np.mean([r.pct(50) for r in bas])
        p99_ratio = np.mean([r.pct(99) for r in bay]) / np.mean([r.pct(99) for r in bas])
        ok = max(tp_ratio, p50_ratio, p99_ratio) <= 1.5
        out.append(
            f"target {scenario}: bayesian within 1.5x of basic: {'met' if ok else 'MISSED'} "
            f"(basic/bayesian throughput {tp_ratio:.2f}, bayesian/basic p50 {p50_ratio:.2f}, "
            f"p99 {p99_ratio:.2f})"
        )
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent connections (50)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--duration", type=float, default=15.0, help="seconds per run (15)")
    group.add_argument("--requests", type=int, default=None, help="timed submits per run")
    parser.add_argument("--workers", type=int, default=4, help="uvicorn workers (4)")
    parser.add_argument(
        "--bound-processes", type=int, default=1, help="BOUND_PROCESSES per web worker (1)"
    )
    parser.add_argument("--objects", type=int, default=None, help="objects per run (= clients)")
    parser.add_argument(
        "--scenarios",
        default="grr,linear",
        help=f"comma-separated: {', '.join(SCENARIOS)} (grr,linear)",
    )
    parser.add_argument("--filters", default="bayesian,basic", help="comma-separated filters")
    parser.add_argument("--rounds", type=int, default=1, help="repeat; filter order alternates")
    parser.add_argument("--rate", type=float, default=None, help="open loop: submits per second")
    parser.add_argument("--warmup", type=int, default=2, help="untimed submits per client (2)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="hard cap per run (s)")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="per submit (s)")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the server, e.g. REDIS_LOCKS=false (repeatable)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=BUDGET,
        help=f"objects' ε_g ({BUDGET:g}); below it, 409 rejections count as answers",
    )
    parser.add_argument(
        "--pgbench", type=int, default=10, metavar="SECONDS", help="pgbench run (10; 0: skip)"
    )
    parser.add_argument(
        "--trees",
        default="",
        metavar="DIR,DIR",
        help="source trees whose servers run the same scenarios in turn, in one run "
        "(their code under PYTHONPATH; default: this one)",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip `gatekeeper verify`")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--db-prefix", default="gk_bench_", help="the database's name prefix")
    parser.add_argument("--json", metavar="PATH", help="write summaries and latencies as JSON")
    args = parser.parse_args(argv)
    if args.requests:
        args.duration = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    rng = random.Random(args.seed)
    scenarios = [s for s in args.scenarios.split(",") if s]
    filters = [f for f in args.filters.split(",") if f]
    info = machine_info()
    log_dir = Path(tempfile.mkdtemp(prefix="gk_bench_"))
    length = f"{args.requests} submits" if args.requests else f"{args.duration:g} s"
    load = f"open loop {args.rate:g}/s" if args.rate else "closed loop"
    print(
        f"service load: {args.clients} clients ({load}), {length} per run, "
        f"{args.workers} uvicorn workers, BOUND_PROCESSES={args.bound_processes}, "
        f"objects per run {args.objects or args.clients}, budget {args.budget:g}, warm-up "
        f"{args.warmup} per client"
    )
    print(
        f"machine: {info['cpus']} CPU(s), {info['cpu_model']}, Python {info['python']}, "
        f"kernel {info['kernel']}, loadavg {' '.join(f'{x:.2f}' for x in info['loadavg'])}"
    )
    if args.server_env:
        print(f"server environment: {' '.join(args.server_env)}")
    print(f"server logs: {log_dir}", flush=True)
    runs: list[Run] = []
    verify_rc = None
    pgbench: tuple[float, float, float] | None = None
    trees = [Path(t).resolve() for t in args.trees.split(",") if t] or [ROOT]
    for tree in trees:
        print(f"code {tree.name}: {tree}")
    with fresh_database(prefix=args.db_prefix) as (url, name):
        extra = dict(item.split("=", 1) for item in args.server_env)
        for round_ in range(args.rounds):
            # the trees take turns (the order alternates by round, like the filters)
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                log = log_dir / f"server-{tree.name}-{round_}.log"
                server = Server(url, args.workers, args.bound_processes, log, extra, tree)
                try:
                    for scenario in scenarios:
                        order = filters if round_ % 2 == 0 else filters[::-1]
                        for filter_ in order:
                            run = run_one(server, name, scenario, filter_, args, rng)
                            run.code = tree.name if len(trees) > 1 else ""
                            runs.append(run)
                            print(
                                f"  {run.code} {scenario}/{filter_}: {run.ok} answered "
                                f"({run.statuses.get(201, 0)} accepted) in {run.wall:.1f} s, "
                                f"{run.throughput:.1f}/s, p99 {run.pct(99):.1f} ms",
                                flush=True,
                            )
                finally:
                    server.stop()
        if not args.no_verify:
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "REDIS_URL": "",
                "GATEKEEPER_ENCRYPTION_KEY_FILE": str(log_dir / "encryption.key"),
            }
            done = subprocess.run(
                [sys.executable, "-m", "app.cli", "verify"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            verify_rc = done.returncode
            tail = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or ["(no output)"]
            print(f"gatekeeper verify: exit {verify_rc}, {tail[0]}")
        if args.pgbench:
            pgbench = pgbench_side(url, name, args.pgbench)
    print()
    print(table(runs))
    print()
    print(
        "cpu ms/submit: CPU time per timed submit of the server process tree (uvicorn workers "
        "and bound processes), of the PostgreSQL backends of the benchmark database, and of "
        "this client; busy = machine-wide CPU busy share during the run (all processes); "
        "per obj = fewest-most accepted queries of an object at the end (warm-up included)"
    )
    for line in verdicts(runs, args.rate):
        print(line)
    if pgbench is not None:
        tps, client_ms, postgres_ms = pgbench
        print(
            f"pgbench, same PostgreSQL, submit-shaped transaction (8 clients, {args.pgbench} s): "
            f"{tps:,.0f} tx/s, cpu ms/tx pgbench {client_ms:.3f} pg {postgres_ms:.3f} — beside "
            "the service's cpu ms/submit (srv pg cli) above"
        )
        for r in runs:
            n = max(1, len(r.latencies))
            print(
                f"  {r.code} {r.scenario}/{r.filter}: {r.throughput / max(1e-9, tps):.3f}x "
                f"pgbench's tx/s; server cpu {1000 * r.server_cpu / n:.2f} ms/submit, "
                f"database {1000 * r.postgres_cpu / n:.2f} ms/submit "
                f"({1000 * r.postgres_cpu / n / max(1e-9, postgres_ms):.1f}x pgbench's)"
            )
    info["loadavg_end"] = os.getloadavg()
    print(f"loadavg at the end: {' '.join(f'{x:.2f}' for x in info['loadavg_end'])}")
    if args.json:
        dump = {
            "machine": info,
            "args": dict(vars(args)),
            "runs": [
                {**r.summary(), "latencies_ms": [round(1000 * x, 3) for x in r.latencies]}
                for r in runs
            ],
            "verdicts": verdicts(runs, args.rate),
            "verify_exit": verify_rc,
            "pgbench": None
            if pgbench is None
            else dict(zip(("tps", "cpu_ms_pgbench", "cpu_ms_postgres"), pgbench, strict=True)),
        }
        Path(args.json).write_text(json.dumps(dump, indent=1))
    for r in runs:
        if r.errors:
            bad = len(r.latencies) - r.ok + r.warmup_errors
            print(
                f"{r.scenario}/{r.filter}: {bad} failed submit(s) ({r.warmup_errors} in the "
                "warm-up); first answers:"
            )
            for line in r.errors[:5]:
                print(f"  {line}")
    errors = sum(len(r.latencies) - r.ok + r.warmup_errors for r in runs)
    return 1 if errors or (verify_rc not in (None, 0)) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What each layer of the single submit's server road costs, and which server road could reach
0.25x pgbench: a ladder of servers under one client load, side by side in one run.

How to run (from the project root, PostgreSQL and Redis reachable; ``wrk`` on PATH; granian is
not a project dependency — a folder of its own for the measurement)::

    pip install --target /tmp/road_deps granian            # measurement only
    GATEKEEPER_BENCH_REDIS_URL=redis://127.0.0.1:6379/14 OPENBLAS_NUM_THREADS=1 \\
      .venv/bin/python bench/server_road.py --extra-path /tmp/road_deps --blocks 8 --seconds 4 \\
      --db-prefix road_

The rungs (every server: 2 workers, ``--workers``; uvicorn with httptools and uvloop as
``gatekeeper serve`` gets them, granian with uvloop and HTTP/1; the service's JSON log
configuration and multiprocess metrics directory; the collector tuned as
:func:`app.bootstrap.app_factory` tunes it), each cumulative on the one before:

1. ``bare``: a bare ASGI callable that reads the body and answers a fixed JSON of a real answer's
   fields and size (366 bytes, 201).
2. ``bare_granian``: (1) under granian.
3. ``context``: (1) behind the real :class:`app.api.middleware.RequestContext` (request id, the
   JSON access line, the latency histogram).
4. ``fastapi``: a FastAPI application built as :func:`app.api.main.create_app` builds it (the
   problem handlers, :class:`~app.api.lean.LeanSubmit`, ``RequestContext``, FastAPI's telemetry
   off) with one route of the submit's signature on :class:`~app.api.direct.DirectRoute`: the
   runtime, the real bearer authentication (:class:`~app.services.auth.KeyCache`; a miss reads
   the database), the path parameter, ``Response``, the real body model
   (:data:`app.api.routes.objects.QueryBody`: strict JSON, ``QueryRequest``) and the
   ``Idempotency-Key`` header; it answers the real response model
   (:class:`~app.services.schemas.SubmitResult` with its ``Odometer``), built per request as the
   service builds it, from a fixed row. No thread, no Redis, no SQL.
5. ``fastapi_granian``: (4) under granian.
6. ``handoff``: (4) with the answer built in a request thread (:func:`app.api.deps.in_thread`, a
   ``ThreadPoolExecutor`` of 5 per worker).
7. ``lock``: (6) with the real :class:`~app.services.locks.ObjectLocks` held around it (redis-py:
   ``SET … NX PX`` and ``EVALSHA``, the submit's two Redis round trips).
7b. ``read`` (``--arms``, not in the default ladder): (7) with the submit's first SQL round trip
   alone in the lock (the real ``load_for_submit`` in a ``submitting()`` block, the answer from
   the row read): splits (8)'s two statements.
7c. ``unnamed`` (``--arms``, not in the default ladder): (7b) and the accepted write without a
   new likelihood array (``record_accepted`` with no ``new_state``, the object naming the array
   it named): what the 8 KB array's part of the write costs. Not a correct submit.
8. ``sql``: (7) with the submit's two SQL round trips in the lock: ``bench/async_probe.py``'s
   ``SyncRoad`` (the real ``load_for_submit`` and ``record_accepted`` in a real ``submitting()``
   block, the accepted write's parameters of the real shapes and sizes); its round trips are
   checked against a real submit's before any load (the run refuses to measure otherwise).
   Left out against (9): the engine's decision, state and sampling, the value's decryption, the
   audit event's and fingerprint's own work, the service's submit glue.
9. ``real``: ``gatekeeper serve`` itself (``BOUND_PROCESSES=1`` per worker, Redis locks on).
10. ``real_granian``: the same application (``app.bootstrap:app_factory``, the same settings and
    environment, the metrics directory exported) under granian.

And ``pgbench``'s submit-shaped transaction (``bench/survey_load.py``: lock the object row,
insert a history row, bump its version; 8 clients) as one more arm of the same rotation.

Load: ``wrk`` (``--connections`` keep-alive connections, ``--threads`` threads), every arm the
same requests: ``POST /v1/objects/{id}/queries`` with the analyst key, a fresh
``Idempotency-Key`` and the ``grr`` body of ``bench/service_load.py``, over ``--objects`` objects
of the arm's own (registered through the real service). After ``--warmup`` seconds per arm,
``--blocks`` blocks of ``--seconds`` seconds per arm, the arms' order rotating block by block.
Per block and arm: requests per second, the server process tree's CPU per request (``/proc``:
user + system, every process and thread), its PostgreSQL backends' CPU (by
``application_name``), the client's (``wrk``'s, or ``pgbench``'s) and the Redis server's
(a process shared with other users of the machine: shown, not added). Each rung is printed as a
multiple of pgbench's transactions per second twice: **measured** (the rung's requests per
second over pgbench's transactions per second in the same block) and **by CPU** (pgbench's CPU
per transaction, client + backends, over the rung's per request, server + backends + client:
the ratio of what each could do on the same cores if CPU were all that bounded them; load
drifts over both alike).

PostgreSQL's ``max_connections`` is shared with whatever else runs on the machine: the rungs
without SQL keep one connection per worker (the key cache's misses), and a block whose
connection PostgreSQL refused (pgbench's, the backend sampler's) is tried again, 5 s apart, up
to 10 times. A failed request in a warm-up refuses the run; failed requests in a block are
counted and printed beside the arm (the exit status is then 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import service_load as sl  # noqa: E402

#: The environment a probe server's workers read.
ENV_STEP, ENV_URL, ENV_REDIS, ENV_EXTRA = (
    "ROAD_STEP",
    "ROAD_DATABASE_URL",
    "ROAD_REDIS_URL",
    "ROAD_EXTRA_PATH",
)
#: The probe steps, in the ladder's order (``real`` is the application itself).
STEPS = ("bare", "context", "fastapi", "handoff", "lock", "read", "unnamed", "sql", "real")
#: The arms: name -> (step, server). ``real`` under uvicorn is ``gatekeeper serve`` itself.
ARMS: dict[str, tuple[str, str]] = {
    "bare": ("bare", "uvicorn"),
    "bare_granian": ("bare", "granian"),
    "context": ("context", "uvicorn"),
    "fastapi": ("fastapi", "uvicorn"),
    "fastapi_granian": ("fastapi", "granian"),
    "handoff": ("handoff", "uvicorn"),
    "lock": ("lock", "uvicorn"),
    "read": ("read", "uvicorn"),
    "unnamed": ("unnamed", "uvicorn"),
    "sql": ("sql", "uvicorn"),
    "real": ("real", "serve"),
    "real_granian": ("real", "granian"),
}
#: Consecutive rungs whose difference is one layer: (from, to, what the layer is).
LAYERS = (
    ("bare", "context", "request context: request id, JSON access line, latency histogram"),
    ("context", "fastapi", "FastAPI route: auth, body and response models, DirectRoute"),
    ("fastapi", "handoff", "hand-off to a request thread (in_thread)"),
    ("handoff", "lock", "the Redis lock's two round trips (ObjectLocks)"),
    ("lock", "sql", "the two SQL round trips (load_for_submit, record_accepted)"),
    ("lock", "read", "the first SQL round trip (load_for_submit, prepared)"),
    ("read", "sql", "the second SQL round trip (record_accepted: the accepted write)"),
    ("read", "unnamed", "the accepted write without its likelihood array (not the service's)"),
    ("unnamed", "sql", "the 8 KB likelihood array named and inserted by the accepted write"),
    ("sql", "real", "the service's own work: engine, state, sampling, decryption, audit, glue"),
    ("bare", "bare_granian", "granian instead of uvicorn (bare)"),
    ("fastapi", "fastapi_granian", "granian instead of uvicorn (FastAPI route)"),
    ("real", "real_granian", "granian instead of uvicorn (the real service)"),
)
POOL = 5
#: The budget: a submit at this multiple of pgbench's rate (issue 27 item 1).
GOAL = 0.25


# --------------------------------------------------------------------------- the probe apps


def fixed_body() -> bytes:
    """The bare rung's answer: a submit's answer of fixed values (366 bytes)."""
    import async_probe as ap

    row = fixed_row("bench-grr-bayesian-0000000000")
    now = datetime(2026, 11, 27, tzinfo=UTC)
    return json.dumps(ap.answer_body(row, 42, 4242, now)).encode()


def fixed_row(object_id: str) -> Any:
    """What ``async_probe.answer_body`` reads of an object's row, fixed."""
    return SimpleNamespace(id=object_id, data_version=1, budget=10_000.0, rejected=0)


def bare_app() -> Any:
    """Rung 1: read the body, answer :func:`fixed_body` (201)."""
    body = fixed_body()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    start = {"type": "http.response.start", "status": 201, "headers": headers}
    answer = {"type": "http.response.body", "body": body}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send(start)
        await send(answer)

    return app


def submit_result(answer: dict[str, Any]) -> Any:
    """The response model from ``async_probe.answer_body``'s dict, as the service builds it
    (:func:`app.services.objects.odometer_with`, then ``SubmitResult``)."""
    from app.services import schemas

    odo = answer["odometer"]
    odometer = schemas.Odometer(
        budget=odo["budget"],
        realized_loss=schemas.LossBounds(**odo["realized_loss"]),
        remaining=odo["remaining"],
        basic_composition=odo["basic_composition"],
        accepted=odo["accepted"],
        rejected=odo["rejected"],
        updated_at=odo["updated_at"],
        version=odo["version"],
    )
    return schemas.SubmitResult(**{**answer, "odometer": odometer, "reused": False})


def fastapi_app(step: str, url: str, redis_url: str) -> Any:
    """Rungs 4, 6, 7, 8: the submit's route shape in a FastAPI app built as the service's."""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import asynccontextmanager
    from typing import Annotated

    import async_probe as ap
    import redis
    from fastapi import APIRouter, FastAPI, Header, Response

    from app.api import problems
    from app.api.deps import AnalystDep, RuntimeDep, in_thread
    from app.api.direct import DirectRoute
    from app.api.lean import LeanSubmit
    from app.api.main import TELEMETRY_OFF
    from app.api.middleware import RequestContext
    from app.api.routes.objects import ObjectId, QueryBody
    from app.db.session import make_engine
    from app.services import schemas
    from app.services.auth import KeyCache
    from app.services.locks import ObjectLocks
    from app.settings import Settings

    settings = Settings(database_url=url, redis_url=redis_url)

    def answered(object_id: str) -> Any:
        """The answer of a fixed row (no database): a fresh query id and time per request."""
        now = datetime.now(UTC)
        return submit_result(ap.answer_body(fixed_row(object_id), 42, 4242, now))

    def locked(object_id: str) -> Any:
        with runtime.locks.hold(object_id):
            return answered(object_id)

    def recorded(object_id: str, key: str) -> Any:
        return submit_result(runtime.road.submit(object_id, key))

    def read(object_id: str, key: str) -> Any:
        """The submit's read alone (as SyncRoad.submit reads), the answer from the row read."""
        from app.store import objects as object_store
        from app.store.base import submitting

        with runtime.locks.hold(object_id), submitting(runtime.engine) as conn:
            found = object_store.load_for_submit(conn, object_id=object_id, key=key)
        if found is None:
            raise LookupError("no such object")
        row = found[0]
        return submit_result(ap.answer_body(row, row.accepted + 1, 4242, datetime.now(UTC)))

    def unnamed(object_id: str, key: str) -> Any:
        """SyncRoad.submit with no new likelihood array: the object keeps naming the one it
        names (the accepted write's other variant, ``names_state`` false) — what the array's
        part of the write costs, not a correct submit."""
        from app.store import objects as object_store
        from app.store import submits as submit_store
        from app.store.base import submitting

        road = runtime.road
        with runtime.locks.hold(object_id):
            for _ in range(ap.ATTEMPTS):
                with submitting(road.engine) as conn:
                    found = object_store.load_for_submit(conn, object_id=object_id, key=key)
                    if found is None:
                        raise LookupError("no such object")
                    row = found[0]
                    inputs = ap.accept_inputs(row, key, road.key_id, row.state or b"")
                    inputs["new_state"] = None
                    inputs["columns"]["state_hash"] = row.state_hash
                    query_id = submit_store.record_accepted(conn, commit=True, **inputs)
                if query_id is not None:
                    now = inputs["query"].created_at
                    return submit_result(ap.answer_body(row, row.accepted + 1, query_id, now))
        raise RuntimeError("lost races")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        road = None
        if step in ("read", "unnamed", "sql"):
            key_id = int(os.environ.get("ROAD_KEY_ID", "0"))
            road = ap.SyncRoad.make(url, redis_url, key_id)  # engine, ObjectLocks, 5 threads
            engine, threads, locks = road.engine, road.threads, road.locks
        else:
            # one connection per worker, for the key cache's misses (every AUTH_CACHE_SECONDS):
            # the machine's PostgreSQL is shared, its max_connections a limit of the run
            engine = make_engine(url, pool_size=1, max_overflow=0)
            threads = ThreadPoolExecutor(POOL, thread_name_prefix="request")
            locks = None
            if step == "lock":  # as SyncRoad.make makes it
                locks = ObjectLocks(
                    redis.Redis.from_url(redis_url), timeout=ap.LOCK_TIMEOUT_MS / 1000
                )
        runtime.__dict__.update(
            settings=settings,
            engine=engine,
            threads=threads,
            locks=locks,
            road=road,
            keys=KeyCache(settings.auth_cache_seconds),
        )
        app.state.runtime = runtime
        yield
        threads.shutdown()
        engine.dispose()

    runtime = SimpleNamespace()
    app = FastAPI(title="road", lifespan=lifespan, telemetry=TELEMETRY_OFF)
    problems.install(app)
    app.add_middleware(LeanSubmit)
    app.add_middleware(
        RequestContext,
        max_bytes=settings.max_body_bytes,
        per_second=settings.rate_limit_per_second,
        burst=settings.rate_limit_burst,
    )
    router = APIRouter(prefix="/v1/objects", route_class=DirectRoute)

    async def submit(
        runtime: Any,
        caller: Any,
        object_id: Any,
        response: Any,
        body: Any,
        idempotency_key: Any = None,
    ) -> Any:
        """The submit route's signature; what it does depends on the rung."""
        if idempotency_key is not None and not idempotency_key.strip(" \t"):
            raise ValueError("blank Idempotency-Key")
        body.written("query")
        key = idempotency_key or uuid.uuid4().hex
        if step == "fastapi":
            return answered(object_id)
        if step == "handoff":
            return await in_thread(runtime, answered, object_id)
        if step == "lock":
            return await in_thread(runtime, locked, object_id)
        if step == "read":
            return await in_thread(runtime, read, object_id, key)
        if step == "unnamed":
            return await in_thread(runtime, unnamed, object_id, key)
        return await in_thread(runtime, recorded, object_id, key)

    # the route's own annotations as objects (this module's are strings, and the names are
    # local): what FastAPI reads, as the service's route declares them
    submit.__annotations__ = {
        "runtime": RuntimeDep,
        "caller": AnalystDep,
        "object_id": ObjectId,
        "response": Response,
        "body": QueryBody,
        "idempotency_key": Annotated[str | None, Header(max_length=255)],
        "return": schemas.SubmitResult,
    }
    router.post("/{object_id}/queries", status_code=201)(submit)

    @router.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    app.include_router(router)
    return app


def make_app() -> Any:
    """The ASGI app of the step in ``ROAD_STEP`` (the servers' factory)."""
    from app.bootstrap import collector_paused, tune_collector
    from app.logs import configure

    extra = os.environ.get(ENV_EXTRA)
    if extra and extra not in sys.path:
        sys.path.append(extra)
    step = os.environ[ENV_STEP]
    if step == "real":  # granian: the service's factory, logging as `gatekeeper serve` sets it
        from app.bootstrap import app_factory
        from app.settings import get_settings

        configure(get_settings().log_level)
        return app_factory()
    configure("INFO")  # granian's workers configure their own logging first; ours replaces it
    with collector_paused():
        if step == "bare":
            app = bare_app()
        elif step == "context":
            from app.api.middleware import RequestContext

            app = RequestContext(bare_app(), max_bytes=16 * 1024 * 1024)
        else:
            app = fastapi_app(step, os.environ[ENV_URL], os.environ[ENV_REDIS])
    tune_collector()
    return app


def serve_uvicorn(port: int, workers: int) -> int:
    """Run ``make_app`` under uvicorn as ``gatekeeper serve`` runs the service."""
    import uvicorn

    from app.logs import configure, uvicorn_log_config
    from app.multiproc import metrics_directory

    configure("INFO")
    with metrics_directory(workers):
        uvicorn.run(
            "server_road:make_app",
            factory=True,
            app_dir=str(BENCH),
            host="127.0.0.1",
            port=port,
            workers=workers,
            log_level="info",
            log_config=uvicorn_log_config("INFO"),
            timeout_worker_healthcheck=30,
        )
    return 0


# --------------------------------------------------------------------------- the servers


class RoadServer(sl.Server):
    """One arm's server on loopback, in its own process group (``sl.Server``'s ``stop``)."""

    def __init__(
        self,
        arm: str,
        url: str,
        workers: int,
        log_path: Path,
        extra_path: str | None,
        env: dict[str, str],
    ) -> None:
        step, kind = ARMS[arm]
        self.port = sl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        paths = [str(sl.ROOT), str(sl.ROOT / "clients" / "python" / "src"), str(BENCH)]
        if kind == "granian" and extra_path:
            paths.append(extra_path)
        full = {
            **os.environ,
            **env,
            ENV_STEP: step,
            ENV_URL: f"{url}?application_name=road_{arm}",
            ENV_REDIS: sl.REDIS_URL,
            ENV_EXTRA: extra_path or "",
            "PYTHONPATH": os.pathsep.join(paths),
        }
        if step == "real":
            full["DATABASE_URL"] = f"{url}?application_name=road_{arm}"
        if kind == "granian":
            self.metrics_dir = tempfile.mkdtemp(prefix="road_metrics_")
            full["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
            command = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory"]
            command += ["--workers", str(workers), "--loop", "uvloop", "--http", "1", "--no-ws"]
            command += ["--host", "127.0.0.1", "--port", str(self.port)]
            command += ["--log-level", "warning", "server_road:make_app"]
        else:
            command = [sys.executable, str(Path(__file__).resolve()), "--serve"]
            command += ["--port", str(self.port), "--workers", str(workers)]
        self.process = subprocess.Popen(  # noqa: S603 - this script, or granian on it
            command,
            cwd=sl.ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait(workers, kind)

    def _wait(self, workers: int, kind: str) -> None:
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            text = self.log_path.read_text(errors="replace")
            if "startup failed" in text:
                self.stop()
                raise RuntimeError(f"a worker failed to start: {text[-2000:]}")
            started = kind == "granian" or text.count("Application startup complete") >= workers
            if started:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.url + "/v1/objects/readyz", timeout=1.0).status_code < 500:
                        return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"not ready: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        super().stop()
        if getattr(self, "metrics_dir", None):
            shutil.rmtree(self.metrics_dir, ignore_errors=True)


# --------------------------------------------------------------------------- the load


#: wrk's script: every request a POST of the submit's shape with a fresh Idempotency-Key;
#: ``done`` prints one JSON line.
WRK_SCRIPT = """
local ids = {%(ids)s}
local auth = "Bearer %(key)s"
local body = '%(body)s'
local salt = "x"
local counter = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  salt = args[1] or "x"
end
function request()
  counter = counter + 1
  local key = string.format("%%s-%%d-%%d", salt, tid, counter)
  local path = "/v1/objects/" .. ids[(counter %% #ids) + 1] .. "/queries"
  return wrk.format("POST", path, {["Authorization"] = auth, ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json"}, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('ROAD {"requests": %%d, "us": %%d, "bad_status": %%d, ' ..
    '"connect": %%d, "read": %%d, "write": %%d, "timeout": %%d, "p50_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_script(ids: list[str], key: str, body: bytes) -> str:
    """The Lua script of an arm's load (its objects, the analyst key, the body)."""
    text = body.decode()
    if "'" in text or "\\" in text:
        raise ValueError("the body must not need Lua escapes")
    quoted = ", ".join(f'"{i}"' for i in ids)
    return WRK_SCRIPT % {"ids": quoted, "key": key, "body": text}


def parse_wrk(stdout: str) -> dict[str, float]:
    """The ``ROAD {...}`` line of wrk's output (its ``done``), as numbers."""
    for line in stdout.splitlines():
        if line.startswith("ROAD "):
            return {k: float(v) for k, v in json.loads(line[5:]).items()}
    raise RuntimeError(f"wrk printed no summary: {stdout[-2000:]}")


def run_wrk(
    port: int, script: Path, seconds: float, connections: int, threads: int
) -> dict[str, float]:
    """``wrk`` against ``port`` for ``seconds``: its summary."""
    done = subprocess.run(  # noqa: S603 - wrk from PATH
        [  # noqa: S607
            "wrk",
            "-t",
            str(threads),
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "--timeout",
            "30s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}",
            "--",
            secrets.token_hex(6),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return parse_wrk(done.stdout)


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def redis_pid() -> int | None:
    """The Redis server's process (shared with every other user of this Redis), if visible."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "redis-server":
                    return int(entry.name)
    return None


@dataclass
class Arm:
    """One arm: its server (None for pgbench), objects, key, script and per-block rows."""

    name: str
    server: sl.Server | None = None
    script: Path | None = None
    rows: list[dict[str, float]] = field(default_factory=list)
    bad: int = 0


def measure(
    arm: Arm, admin: Any, db_name: str, url: str, args: argparse.Namespace, rpid: int | None
) -> dict[str, float]:
    """One block of ``arm``: rate and CPU per request (ms) of server, backends, client, Redis."""
    import async_probe as ap

    redis0 = sl.proc_cpu(rpid) if rpid else 0.0
    client0 = children_cpu()
    if arm.server is None:  # pgbench: short-lived backends, sampled often
        from survey_load import pgbench_run

        sampler = sl.BackendSampler(db_name, interval=0.05)
        tps, count = pgbench_run(url, seconds=args.seconds)
        pg = sampler.stop()
        client = children_cpu() - client0
        tx = max(1, count)
        return {"rate": tps, "server": 0.0, "pg": 1000 * pg / tx, "client": 1000 * client / tx}
    assert arm.script is not None  # noqa: S101 - for mypy: a server arm has its script
    pids = sl.descendants(arm.server.process.pid)
    cpu0 = sl.procs_cpu(pids)
    pg0 = ap.backends(admin, db_name)
    out = run_wrk(arm.server.port, arm.script, args.seconds, args.connections, args.threads)
    cpu1 = sl.procs_cpu(sl.descendants(arm.server.process.pid))
    pg1 = ap.backends(admin, db_name)
    client = children_cpu() - client0
    redis = (sl.proc_cpu(rpid) - redis0) if rpid else 0.0
    name = f"road_{arm.name}"
    pg = sum(used - pg0.get(pid, ("", 0.0))[1] for pid, (app, used) in pg1.items() if app == name)
    n = max(1.0, out["requests"])
    arm.bad += int(out["bad_status"] + out["connect"] + out["read"] + out["write"] + out["timeout"])
    return {
        "rate": out["requests"] / (out["us"] / 1e6),
        "server": 1000 * (cpu1 - cpu0) / n,
        "pg": 1000 * pg / n,
        "client": 1000 * client / n,
        "redis": 1000 * redis / n,
        "p50": out["p50_us"] / 1000,
        "p99": out["p99_us"] / 1000,
    }


def retried(measure: Any, arm: Arm, *args: Any) -> dict[str, float]:
    """``measure(arm, ...)``, tried again (10 times, 5 s apart) when PostgreSQL refused a
    connection (the machine's PostgreSQL is shared: its ``max_connections`` can be full)."""
    import psycopg

    for attempt in range(11):
        try:
            row: dict[str, float] = measure(arm, *args)
        except (psycopg.OperationalError, subprocess.CalledProcessError) as exc:
            if attempt == 10:
                raise
            print(f"{arm.name}: {exc!r:.200}; tried again in 5 s", flush=True)
            time.sleep(5)
        else:
            return row
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- the report


def total(row: dict[str, float]) -> float:
    """CPU ms per request that counts against the cores: server + backends + client."""
    return row["server"] + row["pg"] + row["client"]


def ladder(arms: list[Arm], pgbench: Arm) -> list[str]:
    """The table: per arm the medians over its blocks and its multiples of pgbench's."""
    lines = [
        f"{'arm':<16} {'req/s':>8} {'srv ms':>7} {'(IQR)':>13} {'pg ms':>6} {'cli ms':>6} "
        f"{'redis':>6} {'p99 ms':>7} {'x pgb meas':>10} {'x pgb cpu':>9}  over budget"
    ]
    pgb = statistics.median(total(r) for r in pgbench.rows)
    lines.append(
        f"{'pgbench':<16} {statistics.median(r['rate'] for r in pgbench.rows):>8.0f} "
        f"{'':>7} {'':>13} {statistics.median(r['pg'] for r in pgbench.rows):>6.3f} "
        f"{statistics.median(r['client'] for r in pgbench.rows):>6.3f} {'':>6} {'':>7} "
        f"{1:>10.3f} {1:>9.3f}"
    )
    for arm in arms:

        def med(key: str, arm: Arm = arm) -> float:
            return statistics.median(r.get(key, 0.0) for r in arm.rows)

        q = statistics.quantiles([r["server"] for r in arm.rows], n=4)
        measured = statistics.median(
            a["rate"] / p["rate"] for a, p in zip(arm.rows, pgbench.rows, strict=True)
        )
        by_cpu = pgb / statistics.median(total(r) for r in arm.rows)
        lines.append(
            f"{arm.name:<16} {med('rate'):>8.0f} {med('server'):>7.3f} "
            f"{q[0]:>6.3f}-{q[2]:.3f} {med('pg'):>6.3f} {med('client'):>6.3f} "
            f"{med('redis'):>6.3f} {med('p99'):>7.1f} {measured:>10.3f} {by_cpu:>9.3f}  "
            + ("yes" if by_cpu < GOAL else "no")
            + (f"  ({arm.bad} failed)" if arm.bad else "")
        )
    room = pgb / GOAL
    lines.append(
        f"pgbench: {pgb:.3f} ms of CPU per transaction (client + backends); at {GOAL}x its rate a "
        f"request may cost {room:.3f} ms of CPU in all (server + backends + client)"
    )
    return lines


def layer_costs(named: dict[str, Arm]) -> list[str]:
    """Each layer's server CPU per request: the per-block difference of two rungs (median)."""
    lines = []
    for low, high, what in LAYERS:
        if low not in named or high not in named:
            continue
        diffs = [
            b["server"] - a["server"]
            for a, b in zip(named[low].rows, named[high].rows, strict=True)
        ]
        totals = [
            total(b) - total(a) for a, b in zip(named[low].rows, named[high].rows, strict=True)
        ]
        lines.append(
            f"{low + ' -> ' + high:<30} server {statistics.median(diffs):+7.3f} ms "
            f"(blocks {min(diffs):+.3f}..{max(diffs):+.3f}), all CPU "
            f"{statistics.median(totals):+7.3f} ms  {what}"
        )
    return lines


# --------------------------------------------------------------------------- the run


def check_sql_rung(url: str) -> str:
    """The sql rung's round trips against a real submit's (``async_probe``): the real ones, or
    an error when they differ."""
    import async_probe as ap

    captured = ap.capture(url, sl.REDIS_URL)
    road = ap.SyncRoad.make(url, sl.REDIS_URL, captured.key_id)
    try:
        road.submit(captured.object_id, uuid.uuid4().hex)  # warm
        with ap.recorded() as seen:
            road.submit(captured.object_id, uuid.uuid4().hex)
    finally:
        road.threads.shutdown()
        road.engine.dispose()
    problems = ap.check_trips(captured.trips, {"sql": seen})
    if problems:
        raise RuntimeError("the sql rung's round trips differ: " + "; ".join(problems))
    return ap.describe(ap.per_submit(captured.trips[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--blocks", type=int, default=8, help="blocks per arm (8)")
    parser.add_argument("--seconds", type=int, default=4, help="seconds per block (4)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed seconds per arm (3)")
    parser.add_argument("--connections", type=int, default=32, help="wrk's connections (32)")
    parser.add_argument("--threads", type=int, default=2, help="wrk's threads (2)")
    parser.add_argument("--workers", type=int, default=2, help="server workers (2)")
    parser.add_argument("--objects", type=int, default=20, help="objects per arm (20)")
    parser.add_argument(
        "--arms",
        default=",".join(a for a in ARMS if a not in ("read", "unnamed")),
        help=f"comma-separated, of: {', '.join(ARMS)} (all but read and unnamed)",
    )
    parser.add_argument("--extra-path", help="the folder granian is installed in")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    sl.add_scratch_args(parser, db_prefix="gk_road_", redis=False)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_uvicorn(args.port, args.workers)
    if args.blocks < 2:
        parser.error("--blocks: at least 2 (the table gives quartiles)")
    names = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in names if a not in ARMS]:
        parser.error(f"--arms: unknown {unknown}")
    if shutil.which("wrk") is None:
        parser.error("wrk is not on PATH")
    if any(ARMS[a][1] == "granian" for a in names):
        found = args.extra_path and (Path(args.extra_path) / "granian").is_dir()
        if not found:
            parser.error("--extra-path: a folder with granian (pip install --target DIR granian)")
    sl.POSTGRES_URL = args.admin_url
    import psycopg

    from app.db.session import make_engine
    from app.services.auth import authenticate

    rng = random.Random(args.seed)
    body = json.dumps({"query": sl.grr_queries(rng)[0]}).encode()
    logs = Path(tempfile.mkdtemp(prefix="gk_road_"))
    key_file = logs / "encryption.key"
    os.environ["GATEKEEPER_ENCRYPTION_KEY_FILE"] = str(key_file)
    load0 = os.getloadavg()
    started = datetime.now(UTC)
    with sl.fresh_database(prefix=args.db_prefix) as (url, db_name):
        trips = check_sql_rung(url) if "sql" in names else ""
        from survey_load import pgbench_tables

        pgbench_tables(url)
        servers: list[sl.Server] = []
        arms: list[Arm] = []
        try:
            # the service first: it registers every arm's objects (and makes the key file)
            real = sl.Server(
                f"{url}?application_name=road_real", args.workers, 1, logs / "real.log"
            )
            servers.append(real)
            _, analyst = sl.register_objects(real, "grr", "bayesian", 1, rng)
            engine = make_engine(url)
            found = authenticate(engine=engine, secret=analyst)
            engine.dispose()
            if found is None:
                raise RuntimeError("the analyst key was not stored")
            env = {
                "ROAD_KEY_ID": str(found[0].id),
                "REDIS_URL": sl.REDIS_URL,
                "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": sl.ADMIN_KEY,
                "BOUND_PROCESSES": "1",
            }
            for name in names:
                server = real
                if name != "real":
                    server = RoadServer(
                        name, url, args.workers, logs / f"{name}.log", args.extra_path, env
                    )
                    servers.append(server)
                ids = sl.register_objects(real, "grr", "bayesian", args.objects, rng)[0]
                script = logs / f"{name}.lua"
                script.write_text(wrk_script(ids, analyst, body))
                arms.append(Arm(name, server, script))
            pgbench = Arm("pgbench")
            rpid = redis_pid()
            for arm in arms:  # warm: connections made, statements prepared, caches filled
                port, script = arm.server.port if arm.server else 0, arm.script or Path()
                warm = run_wrk(port, script, args.warmup, args.connections, args.threads)
                failed = sum(warm[k] for k in ("bad_status", "connect", "read", "write", "timeout"))
                if failed:  # a rung that fails measures its error path: refused
                    raise RuntimeError(f"{arm.name}: {failed:.0f} failed requests in the warm-up")
            everyone = [*arms, pgbench]
            with psycopg.connect(url, autocommit=True) as admin:
                try:
                    for b in range(args.blocks):
                        shift = b % len(everyone)
                        for arm in everyone[shift:] + everyone[:shift]:
                            arm.rows.append(retried(measure, arm, admin, db_name, url, args, rpid))
                        print(f"block {b + 1} of {args.blocks}, load {os.getloadavg()[0]:.2f}")
                except Exception as exc:  # the blocks done so far are still a side-by-side run
                    done = min(len(arm.rows) for arm in everyone)
                    print(f"stopped after {done} whole blocks: {exc!r:.300}", flush=True)
                    if done < 2:
                        raise
                    for arm in everyone:
                        del arm.rows[done:]
        finally:
            for running in servers:
                running.stop()
    load1 = os.getloadavg()
    print(
        f"server_road: {args.blocks} blocks of {args.seconds} s per arm, arms rotated; wrk "
        f"{args.threads} threads, {args.connections} connections; {args.workers} workers per "
        f"server; {started:%H:%M}-{datetime.now(UTC):%H:%M} UTC; load {load0[0]:.2f} -> "
        f"{load1[0]:.2f} (5-min {load0[1]:.2f} -> {load1[1]:.2f})"
    )
    if trips:
        print(f"round trips per warm submit (real = sql rung): {trips}")
    for line in ladder(arms, pgbench):
        print(line)
    print("layers (per-block differences of the server's CPU per request, median):")
    for line in layer_costs({arm.name: arm for arm in arms}):
        print("  " + line)
    print(
        "(srv: the server's process tree, pg: the arm's backends, cli: wrk's or pgbench's CPU, "
        "redis: the Redis server's, a process shared with others, not in the totals — all CPU "
        "ms per request, medians over the blocks; x pgb meas: req/s over pgbench's tx/s in the "
        "same block; x pgb cpu: pgbench's CPU per tx over the arm's srv + pg + cli; over "
        f"budget: x pgb cpu < {GOAL}; logs in {logs})"
    )
    return 1 if any(arm.bad for arm in arms) else 0


if __name__ == "__main__":
    raise SystemExit(main())

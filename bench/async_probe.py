"""How much of a single submit's server CPU would an async store road remove? Two probes, one run.

How to run (from the project root, PostgreSQL and Redis reachable)::

    GATEKEEPER_BENCH_REDIS_URL=redis://127.0.0.1:6379/4 OPENBLAS_NUM_THREADS=1 \\
      .venv/bin/python bench/async_probe.py --blocks 16 --block 600 --real --db-prefix gk_async_
    # psycopg_pool is not a dependency: a folder of its own for the second async road
    .venv/bin/python -m pip install --target /tmp/probe_deps psycopg-pool
    .venv/bin/python bench/async_probe.py --pools queue,psycopg_pool --extra-path /tmp/probe_deps \\
      --real --perf --profile 15

Today a submit's request runs its synchronous part in a request thread (the runtime's
``ThreadPoolExecutor`` of ``DB_POOL_SIZE`` threads, :func:`app.api.deps.in_thread`) on psycopg's
blocking connection (the thread's kept one, :func:`app.store.submitting`) and redis-py's blocking
client (:class:`app.services.locks.ObjectLocks`). ``bench/server_threads.py`` put ≈ 1.2 ms of the
server's CPU per submit in those threads and 13 ``futex`` calls and 12 context switches per
submit on the six threads passing one GIL. This script measures what the other road — an async
route awaiting psycopg's ``AsyncConnection`` and ``redis.asyncio`` on the event loop, no thread
hop — would cost for **the same statements**, before anyone restructures the store.

First it records the real submit's round trips: an accepted ``grr`` submit through the whole
application in process (:func:`app.bootstrap.create_app`, Redis locks on), with psycopg's and
redis-py's ``execute``/``send_command`` watched (:func:`capture`). A finite submit on the hot
path is four round trips: Redis ``SET … NX PX``, the object's ``SELECT`` with the answer stored
under the key (prepared), the accepted write as one statement (autocommit, no ``BEGIN``) and
Redis ``EVALSHA`` (the lock's release). Each probe then makes exactly these round trips per
submit, the same SQL text (the store's compiled statements) and parameters of the same shapes
and sizes — the object's real version and count, a fresh idempotency key and state hash, the
loaded likelihood array (8 KB) named again under a new hash, the real audit event — and the
script checks (before any load) that each probe's sequence equals the real one. What the probes
leave out is the same for both: FastAPI and pydantic (the probes are Starlette routes behind the
real :class:`app.api.middleware.RequestContext`: request id, JSON access line, metrics), the
engine's decision and sampling, the value's decryption.

- ``sync`` (A, today's shape): an ``async`` Starlette route hands the submit to a
  ``ThreadPoolExecutor`` of 5 threads through the real :func:`app.api.deps.in_thread`; the thread
  holds the real :class:`~app.services.locks.ObjectLocks` and runs the real store functions
  (:func:`app.store.objects.load_for_submit`, :func:`app.store.submits.record_accepted`) in a real
  :func:`app.store.submitting` block on an engine of :func:`app.db.session.make_engine` (pool 5 +
  5, kept connections).
- ``async`` (B): the route awaits the same round trips on the event loop: an ``asyncio.Lock`` per
  object, the Redis commands sent by hand on a connection of ``redis.asyncio``'s pool (as the real
  lock sends them on its thread's own), the two statements on an ``AsyncConnection`` (autocommit)
  of a pool of 5 per worker (``--pools queue``: an ``asyncio.Queue`` of connections; ``--pools
  psycopg_pool``: ``psycopg_pool.AsyncConnectionPool``, if it is importable — it is not a
  dependency of the project; add its folder with ``--extra-path``; ``--pools queue,psycopg_pool``
  runs both; ``--pools lean``: the ``asyncio.Queue`` of PostgreSQL connections and the Redis
  connections in one too, never checked out of ``redis.asyncio``'s pool per submit — the least
  an async road can do, :class:`RedisQueue`), the row typed by the same result processors and
  :class:`~app.store.objects.ObjectState` as the store's.

Both roads try a submit whose compare-and-set missed again, as the service does (a warning in
the probe's log, counted at the end; none expected under the object locks).
- ``real`` (C, ``--real``): the service itself (``gatekeeper serve``), as ``bench/http_ab.py``
  runs it, on its own objects of the same database: how close A is to reality.

Each probe is a ``uvicorn`` server of 2 workers (``--workers``; uvloop and httptools as
``gatekeeper serve`` gets them, the same JSON log configuration, metrics summed over the workers'
directory) on one fresh database (dropped at the end), ``--objects`` objects of its own
(``service_load``'s ``grr`` scenario, registered through the real service). Load: ``http_ab``'s
client (``--clients`` keep-alive connections, a fresh ``Idempotency-Key`` per submit), blocks of
``--block`` submits per road, the roads' order rotating from block to block. Per block and road:
the server's process tree's CPU (``/proc``, clock ticks: user + system), split into the workers'
event loop threads (the main thread of each worker) and every other thread, the voluntary and
involuntary context switches of all its threads, and the CPU of the PostgreSQL backends of that
road (``application_name``). With ``--perf``, ``perf stat`` counts the workers' ``futex`` and
other system calls during each block. The table gives per road the medians over the blocks, and
the per-block ratios of the roads to ``sync`` (median, ratio of the totals, in how many blocks
lower). With ``--profile S``, then ``py-spy record --gil`` over each probe's workers for S
seconds under the same load: the share of the samples (the thread holding the GIL) by the file
of the innermost Python frame (:data:`PARTS`) — wall time of the Python code, not CPU, on a
loaded machine (time in C without a Python frame of its own, uvloop's, counts for the frame that
called it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import service_load as sl  # noqa: E402

#: The environment a probe server's workers read (set by :class:`ProbeServer`).
ENV_URL, ENV_REDIS, ENV_ROAD = "GK_PROBE_DATABASE_URL", "GK_PROBE_REDIS_URL", "GK_PROBE_ROAD"
ENV_KEY, ENV_KEY_ID, ENV_POOL = "GK_PROBE_KEY_HASH", "GK_PROBE_KEY_ID", "GK_PROBE_POOL"
ENV_EXTRA = "GK_PROBE_EXTRA_PATH"
#: Threads of the sync road and connections of the async one, per worker (``DB_POOL_SIZE``).
POOL = 5
LOCK_TIMEOUT_MS = 30_000
#: Tries of a submit whose compare-and-set missed (the service's ``SUBMIT_ATTEMPTS``).
ATTEMPTS = 50
#: The warning a probe logs when it tries a submit again (counted in its log at the end).
LOST = "probe: lost race, submit tried again"
log = logging.getLogger("async_probe")
PATH_PREFIX, PATH_SUFFIX = "/v1/objects/", "/queries"
SYSCALLS = ("futex", "poll", "sendto", "recvfrom", "write", "read", "epoll_pwait", "epoll_ctl")


# --------------------------------------------------------------------------- the submit's inputs


def accept_inputs(row: Any, key: str, key_id: int, state: bytes) -> dict[str, Any]:
    """``record_accepted``'s arguments for one accepted submit on ``row`` (shaped as the real).

    Values as :func:`app.services.queries._record_acceptance` makes them, without the engine:
    the seq and version after the row's, a fresh state and history hash (a new array is named,
    as a grr query's output changes it), ``state`` (the loaded array, 8 KB for 1,000 points)
    named under it, the real audit event and a stored answer of the real body's size.
    """
    from app.services import audit
    from app.store import submits as submit_store

    now = datetime.now(UTC)
    seq = row.accepted + 1
    loss = 0.5 * seq
    query_text = '{"attribute": "a", "epsilon": 0.5, "mechanism": "grr"}'
    body = answer_body(row, seq, 0, now)
    body.pop("query_id")
    event = audit.query_event(
        kind=audit.AuditKind.DECISION_ACCEPTED,
        actor_key_id=key_id,
        object_id=row.id,
        seq=seq,
        detail={
            "seq": seq,
            "mechanism": "grr",
            "epsilon": 0.5,
            "filter": row.filter,
            "version": row.data_version,
            "realized_loss": {"lower": 0.5, "upper": 0.5, "exact": True},
        },
    )
    columns = {
        "state_hash": secrets.token_hex(16),
        "state_pending": 0,
        "history_hash": secrets.token_hex(16),
        "loss_lower": 0.5,
        "loss_upper": 0.5,
        "basic_total": str(loss),
        "f0_account": "0",
        "accepted": seq,
        "updated_at": now,
    }
    query = submit_store.AcceptedQuery(
        object_id=row.id,
        seq=seq,
        query=query_text,
        output="2",
        epsilon=0.5,
        epsilon_exact="1/2",
        loss_lower=0.5,
        loss_upper=0.5,
        basic_after=loss,
        analyst_key_id=key_id,
        idempotency_key=key,
        fingerprint=hashlib.sha256(query_text.encode()).hexdigest(),
        response=json.dumps(body),
        created_at=now,
    )
    new_state = submit_store.NewState(columns["state_hash"], state, 5.3e-15)
    return {
        "query": query,
        "version": row.version,
        "columns": columns,
        "new_state": new_state,
        "event": event,
    }


def answer_body(row: Any, seq: int, query_id: int, now: datetime) -> dict[str, Any]:
    """The submit's answer (the real one's fields and size, ≈ 320 bytes)."""
    return {
        "query_id": query_id,
        "object_id": row.id,
        "seq": seq,
        "version": row.data_version,
        "output": 2,
        "epsilon": 0.5,
        "odometer": {
            "budget": row.budget,
            "realized_loss": {"lower": 0.5, "upper": 0.5, "exact": True},
            "remaining": row.budget - 0.5,
            "basic_composition": 0.5 * seq,
            "accepted": seq,
            "rejected": row.rejected,
            "updated_at": now.isoformat(),
            "version": row.data_version,
        },
        "reused": False,
    }


#: A likelihood array's size for the first submit of an object (none stored yet).
_FIRST_STATE = os.urandom(8055)


# --------------------------------------------------------------------------- road A: today's


@dataclass
class SyncRoad:
    """Today's road: the request thread runs the real lock and store functions."""

    engine: Any
    locks: Any
    key_id: int
    threads: ThreadPoolExecutor

    @classmethod
    def make(cls, url: str, redis_url: str, key_id: int) -> SyncRoad:
        """The engine (the app's pool bounds), the lock on a redis-py client, 5 threads."""
        import redis

        from app.db.session import make_engine
        from app.services.locks import ObjectLocks

        engine = make_engine(url, pool_size=POOL, max_overflow=POOL)
        locks = ObjectLocks(redis.Redis.from_url(redis_url), timeout=LOCK_TIMEOUT_MS / 1000)
        return cls(engine, locks, key_id, ThreadPoolExecutor(POOL, thread_name_prefix="request"))

    def submit(self, object_id: str, key: str) -> dict[str, Any]:
        """One accepted submit's round trips, in the calling thread."""
        from app.store import objects as object_store
        from app.store import submits as submit_store
        from app.store.base import submitting

        with self.locks.hold(object_id):
            for _ in range(ATTEMPTS):  # as the service's submit: a lost race is tried again
                with submitting(self.engine) as conn:
                    found = object_store.load_for_submit(conn, object_id=object_id, key=key)
                    if found is None:
                        raise LookupError("no such object")
                    row = found[0]
                    inputs = accept_inputs(row, key, self.key_id, row.state or _FIRST_STATE)
                    query_id = submit_store.record_accepted(conn, commit=True, **inputs)
                if query_id is not None:
                    return answer_body(row, row.accepted + 1, query_id, inputs["query"].created_at)
                log.warning(LOST)
        raise RuntimeError("lost races")

    async def serve(self, object_id: str, key: str) -> dict[str, Any]:
        """The route's side: the hand-off to a request thread (:func:`app.api.deps.in_thread`)."""
        from app.api.deps import in_thread

        runtime: Any = self  # in_thread reads the runtime's ``threads`` alone
        return await in_thread(runtime, self.submit, object_id, key)

    async def close(self) -> None:
        """Stop the threads, close the connections."""
        self.threads.shutdown()
        self.engine.dispose()


# --------------------------------------------------------------------------- road B: async


class QueuePool:
    """The least an async pool can be: ``size`` open connections in an ``asyncio.Queue``."""

    def __init__(self, url: str, size: int, name: str) -> None:
        self.url, self.size, self.name = url, size, name
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.all: list[Any] = []

    async def open(self) -> None:
        """Connect ``size`` connections (autocommit)."""
        import psycopg

        for _ in range(self.size):
            conn = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, application_name=self.name
            )
            self.all.append(conn)
            self.queue.put_nowait(conn)

    async def get(self) -> Any:
        """A connection (waits for one)."""
        return await self.queue.get()

    async def put(self, conn: Any) -> None:
        """Give ``conn`` back (a broken one is replaced)."""
        if conn.broken or conn.closed:
            import psycopg

            self.all.remove(conn)
            conn = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, application_name=self.name
            )
            self.all.append(conn)
        self.queue.put_nowait(conn)

    async def close(self) -> None:
        """Close every connection."""
        for conn in self.all:
            await conn.close()


class PsycopgPool:
    """``psycopg_pool.AsyncConnectionPool`` of ``size`` connections (autocommit)."""

    def __init__(self, url: str, size: int, name: str) -> None:
        from psycopg_pool import (  # type: ignore[import-not-found,unused-ignore]
            AsyncConnectionPool,
        )

        self.pool = AsyncConnectionPool(
            url,
            min_size=size,
            max_size=size,
            kwargs={"autocommit": True, "application_name": name},
            open=False,
        )

    async def open(self) -> None:
        """Open the pool and wait for its connections."""
        await self.pool.open(wait=True)

    async def get(self) -> Any:
        """A connection (waits for one)."""
        return await self.pool.getconn()

    async def put(self, conn: Any) -> None:
        """Give ``conn`` back (the pool checks it)."""
        await self.pool.putconn(conn)

    async def close(self) -> None:
        """Close the pool."""
        await self.pool.close()


class RedisQueue:
    """``size`` connections of a ``redis.asyncio`` pool in an ``asyncio.Queue`` (``--pools lean``).

    What the real lock does with its thread's own connection, for a loop: no check-out and
    check-in through the pool (its ``asyncio.Lock``, observability hooks and the connection's
    readability check on every check-out); a connection whose command failed was disconnected
    (:func:`_command`) and connects again on its next command.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.all: list[Any] = []

    async def open(self, size: int) -> None:
        """Make and connect ``size`` connections."""
        for _ in range(size):
            conn = self.pool.make_connection()
            await conn.connect()
            self.all.append(conn)
            self.queue.put_nowait(conn)

    async def get_connection(self) -> Any:
        """A connection (waits for one)."""
        return await self.queue.get()

    async def release(self, conn: Any) -> None:
        """Give ``conn`` back."""
        self.queue.put_nowait(conn)

    async def disconnect(self) -> None:
        """Close every connection."""
        for conn in self.all:
            await conn.disconnect()


@dataclass
class AsyncRoad:
    """The async road: the same round trips awaited on the event loop."""

    url: str
    redis_url: str
    key_id: int
    pool_kind: str
    pg: Any = None
    redis: Any = None
    release_sha: str = ""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def open(self, name: str) -> None:
        """The PostgreSQL pool, the Redis pool and the release script's digest."""
        from redis.asyncio import ConnectionPool

        from app.services.locks import _RELEASE

        self.pg = (PsycopgPool if self.pool_kind == "psycopg_pool" else QueuePool)(
            self.url, POOL, name
        )
        await self.pg.open()
        self.redis = ConnectionPool.from_url(self.redis_url)
        if self.pool_kind == "lean":  # the pool's connections, never checked out or in again
            self.redis = RedisQueue(self.redis)
            await self.redis.open(POOL)
        self.release_sha = hashlib.sha1(_RELEASE.encode()).hexdigest()  # noqa: S324 - Redis's
        conn = await self.redis.get_connection()
        try:
            await conn.send_command("SCRIPT", "LOAD", _RELEASE)
            await conn.read_response()
        finally:
            await self.redis.release(conn)

    async def serve(self, object_id: str, key: str) -> dict[str, Any]:
        """One accepted submit's round trips, awaited: lock, load, write, release."""
        from app import metrics

        start = time.perf_counter()
        lock = self.locks.get(object_id)
        if lock is None:
            lock = self.locks[object_id] = asyncio.Lock()
        async with lock:
            name = f"gatekeeper:lock:{object_id}"
            token = os.urandom(16).hex()
            conn = await self.redis.get_connection()
            try:
                delay = 0.002
                while not await _command(
                    conn, "SET", name, token, "NX", "PX", LOCK_TIMEOUT_MS
                ):  # held by the other worker: the real lock's backoff
                    await asyncio.sleep(delay)
                    delay = min(0.05, 2 * delay)
                metrics.LOCK_WAIT.labels("acquired").observe(time.perf_counter() - start)
                try:
                    for _ in range(ATTEMPTS):  # as the service's submit
                        answer = await self._store(object_id, key)
                        if answer is not None:
                            return answer
                        log.warning(LOST)
                    raise RuntimeError("lost races")
                finally:
                    await _command(conn, "EVALSHA", self.release_sha, 1, name, token)
            finally:
                await self.redis.release(conn)

    async def _store(self, object_id: str, key: str) -> dict[str, Any] | None:
        """The load and the accepted write on a pooled ``AsyncConnection`` (None: lost race)."""
        import psycopg

        from app.store import audit as audit_store
        from app.store import compiled
        from app.store import objects as object_store
        from app.store import submits as submit_store

        load = object_store._LOAD_FOR_SUBMIT_PG
        conn = await self.pg.get()
        try:
            async with conn.cursor() as cursor:
                await cursor.execute(
                    load.text, load.params({"object_id": object_id, "key": key}), prepare=True
                )
                found = await cursor.fetchone()
                if found is None:
                    raise LookupError("no such object")
                processors = load.processors(cursor)
            *columns, _query_id, _owner, _print, _response = compiled._typed(found, processors)
            row = object_store._state(columns)
            inputs = accept_inputs(row, key, self.key_id, row.state or _FIRST_STATE)
            # record_accepted's parameters, as it builds them
            query, event, new_state = inputs["query"], inputs["event"], inputs["new_state"]
            version, columns_set = inputs["version"], inputs["columns"]
            accept = submit_store._accept_sql(
                frozenset(columns_set) | {"version"}, new_state is not None
            )
            params = {
                submit_store._QUERY_PARAM + n: getattr(query, n)
                for n in submit_store._QUERY_COLUMNS
            }
            params.update(audit_store.query_event_params(event))
            params.update({"where_id": object_id, "where_version": version, "version": version + 1})
            params.update(columns_set)
            params[submit_store._STATE_PARAM + "hash"] = new_state.key
            params[submit_store._STATE_PARAM + "state"] = new_state.state
            params[submit_store._STATE_PARAM + "err"] = new_state.err
            try:
                async with conn.cursor() as cursor:
                    await cursor.execute(accept.text, accept.params(params))
                    written = await cursor.fetchone()
            except psycopg.errors.InvalidTextRepresentation as exc:
                if submit_store.LOST_RACE in (exc.diag.message_primary or ""):
                    return None
                raise
        finally:
            await self.pg.put(conn)
        if written is None:
            return None
        return answer_body(row, row.accepted + 1, int(written[0]), query.created_at)

    async def close(self) -> None:
        """Close both pools."""
        await self.pg.close()
        await self.redis.disconnect()


async def _command(conn: Any, *args: Any) -> Any:
    """One command on ``conn`` (as :meth:`app.services.locks.ObjectLocks._command`)."""
    try:
        await conn.send_command(*args)
        return await conn.read_response()
    except BaseException:
        await conn.disconnect()
        raise


# --------------------------------------------------------------------------- the probe apps


def make_app() -> Any:
    """The probe's ASGI app (road from the environment), behind the real ``RequestContext``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from app.api.middleware import RequestContext

    extra = os.environ.get(ENV_EXTRA)
    if extra:
        sys.path.append(extra)
    road_name = os.environ[ENV_ROAD]
    url, redis_url = os.environ[ENV_URL], os.environ[ENV_REDIS]
    key_hash, key_id = os.environ[ENV_KEY], int(os.environ[ENV_KEY_ID])
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        road: SyncRoad | AsyncRoad
        if road_name == "sync":
            road = SyncRoad.make(f"{url}?application_name=probe_sync", redis_url, key_id)
        else:
            pool = os.environ.get(ENV_POOL, "queue")
            road = AsyncRoad(url, redis_url, key_id, pool)
            await road.open(f"probe_async_{pool}")
        state["road"] = road
        yield
        await road.close()

    async def submit(request: Request) -> Response:
        secret = (request.headers.get("authorization") or "").removeprefix("Bearer ")
        if hashlib.sha256(secret.encode()).hexdigest() != key_hash:  # the keys' cache: a hit
            return JSONResponse({"detail": "the API key is not valid"}, status_code=401)
        key = request.headers.get("idempotency-key") or uuid.uuid4().hex
        body = json.loads(await request.body())
        if not isinstance(body, dict) or "query" not in body:
            return JSONResponse({"detail": "query: required"}, status_code=422)
        answer = await state["road"].serve(request.path_params["object_id"], key)
        return Response(json.dumps(answer).encode(), 201, media_type="application/json")

    async def ready(_request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    app = Starlette(
        routes=[
            Route(PATH_PREFIX + "{object_id}" + PATH_SUFFIX, submit, methods=["POST"]),
            Route("/readyz", ready),
        ],
        lifespan=lifespan,
    )
    return RequestContext(app, max_bytes=1 << 20)


def serve(road: str, port: int, workers: int) -> int:
    """Run the probe ``road`` under uvicorn, as ``gatekeeper serve`` runs the app."""
    import uvicorn

    from app.logs import configure, uvicorn_log_config
    from app.multiproc import metrics_directory

    configure("INFO")
    os.environ[ENV_ROAD] = road
    with metrics_directory(workers):
        uvicorn.run(
            "async_probe:make_app",
            factory=True,
            app_dir=str(BENCH),
            host="127.0.0.1",
            port=port,
            workers=workers,
            log_level="info",
            log_config=uvicorn_log_config("INFO"),
            timeout_worker_healthcheck=30,  # the service's WORKER_HEALTHCHECK_SECONDS
        )
    return 0


class ProbeServer(sl.Server):
    """A probe server (``--serve ROAD``) on loopback, its own process group; ``sl.Server``'s
    readiness wait and stop."""

    def __init__(
        self,
        road: str,
        url: str,
        workers: int,
        log_path: Path,
        key: str,
        key_id: int,
        pool: str,
        extra_path: str | None,
    ) -> None:
        self.port = sl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        env = {
            **os.environ,
            ENV_URL: url,
            ENV_REDIS: sl.REDIS_URL,
            ENV_KEY: hashlib.sha256(key.encode()).hexdigest(),
            ENV_KEY_ID: str(key_id),
            ENV_POOL: pool,
            ENV_EXTRA: extra_path or "",
            "PYTHONPATH": f"{sl.ROOT}{os.pathsep}{sl.ROOT / 'clients' / 'python' / 'src'}",
        }
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", road]
        command += ["--port", str(self.port), "--workers", str(workers)]
        self.process = subprocess.Popen(  # noqa: S603 - this script
            command,
            cwd=sl.ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait(workers)

    def _wait(self, workers: int) -> None:
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"probe exited: {self.log_path.read_text()[-2000:]}")
            text = self.log_path.read_text(errors="replace")
            if "Application startup failed" in text:
                self.stop()
                raise RuntimeError(f"a probe worker failed to start: {text[-2000:]}")
            if text.count("Application startup complete") >= workers:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                        return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("probe not ready")


# --------------------------------------------------------------------------- round trips


@contextlib.contextmanager
def recorded() -> Iterator[list[tuple[str, str]]]:
    """Every PostgreSQL statement and Redis command sent meanwhile, as (kind, text or name).

    Watches psycopg's ``Cursor.execute`` and ``AsyncCursor.execute`` (with ``prepare`` noted:
    ``pg`` or ``pg prepared``) and redis-py's ``send_command``, blocking and asyncio.
    """
    import psycopg
    import redis.asyncio.connection as async_connection
    import redis.connection as sync_connection

    seen: list[tuple[str, str]] = []

    def pg(query: Any, kwargs: dict[str, Any]) -> None:
        text = query.decode() if isinstance(query, bytes) else str(query)
        seen.append(("pg prepared" if kwargs.get("prepare") else "pg", text))

    originals: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        originals.append((owner, name, original))
        setattr(owner, name, make(original))

    def sync_execute(original: Any) -> Any:
        def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            pg(query, kwargs)
            return original(self, query, params, **kwargs)

        return execute

    def async_execute(original: Any) -> Any:
        async def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            pg(query, kwargs)
            return await original(self, query, params, **kwargs)

        return execute

    def sync_send(original: Any) -> Any:
        def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(("redis", str(args[0])))
            return original(self, *args, **kwargs)

        return send

    def async_send(original: Any) -> Any:
        async def send(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(("redis", str(args[0])))
            return await original(self, *args, **kwargs)

        return send

    patch(psycopg.Cursor, "execute", sync_execute)
    patch(psycopg.AsyncCursor, "execute", async_execute)
    patch(sync_connection.AbstractConnection, "send_command", sync_send)
    patch(async_connection.AbstractConnection, "send_command", async_send)
    try:
        yield seen
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)


#: A connection's set-up commands (redis-py's handshake) and the script's load: not per submit.
_SETUP = {"HELLO", "CLIENT", "SELECT", "SCRIPT LOAD", "SCRIPT"}


def per_submit(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``seen`` without connection set-up (what a warm connection sends per submit)."""
    return [(kind, text) for kind, text in seen if not (kind == "redis" and text in _SETUP)]


@dataclass
class Captured:
    """The real submits' round trips (one list per submit), on which object, by which key."""

    trips: list[list[tuple[str, str]]]
    object_id: str
    key_id: int


def capture(url: str, redis_url: str, submits: int = 6) -> Captured:
    """The round trips of ``submits`` accepted ``grr`` submits of the real application.

    Through the whole app in process (``create_app``, Redis locks on), one new object and
    analyst key: the first submit includes the key's lookup and the connections' set-up.
    """
    import httpx

    from app.bootstrap import create_app
    from app.settings import Settings

    settings = Settings(
        database_url=url,
        redis_url=redis_url,
        gatekeeper_bootstrap_admin_key=sl.ADMIN_KEY,
        bound_processes=0,
    )
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {sl.ADMIN_KEY}"}
    trips: list[list[tuple[str, str]]] = []
    made: dict[str, Any] = {}

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://probe") as client,
        ):
            key = await client.post("/v1/keys", json={"role": "analyst"}, headers=admin)
            key.raise_for_status()
            auth = {"Authorization": f"Bearer {key.json()['key']}"}
            oid = made["object_id"] = "probe-capture-" + secrets.token_hex(4)
            made["key_id"] = key.json()["id"]
            value = sl.grr_value(random.Random(1))
            answer = await client.post(
                "/v1/objects",
                json={
                    "id": oid,
                    "domain": sl.GRR_DOMAIN,
                    "value": value,
                    "budget": {"epsilon": sl.BUDGET},
                    "filter": "bayesian",
                },
                headers=admin,
            )
            answer.raise_for_status()
            body = {"query": sl.grr_queries(random.Random(1))[0]}
            for _ in range(submits):
                headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
                with recorded() as seen:
                    answer = await client.post(
                        f"/v1/objects/{oid}/queries", json=body, headers=headers
                    )
                if answer.status_code != 201:
                    raise RuntimeError(f"the real submit failed: {answer.status_code}")
                trips.append(seen)

    asyncio.run(run())
    return Captured(trips, made["object_id"], made["key_id"])


def probe_trips(url: str, redis_url: str, object_id: str, key_id: int, pool: str) -> dict[str, Any]:
    """The round trips of one warm submit of each probe road, in process (no HTTP)."""
    found: dict[str, Any] = {}
    sync_road = SyncRoad.make(url, redis_url, key_id)
    try:
        sync_road.submit(object_id, uuid.uuid4().hex)  # warm: connections made
        with recorded() as seen:
            sync_road.submit(object_id, uuid.uuid4().hex)
        found["sync"] = seen
    finally:
        sync_road.threads.shutdown()
        sync_road.engine.dispose()

    async def run() -> None:
        road = AsyncRoad(url, redis_url, key_id, pool)
        await road.open("probe_check")
        try:
            await road.serve(object_id, uuid.uuid4().hex)
            with recorded() as seen:
                await road.serve(object_id, uuid.uuid4().hex)
            found["async"] = seen
        finally:
            await road.close()

    asyncio.run(run())
    return found


def describe(trips: list[tuple[str, str]]) -> str:
    """``trips`` in one line: the kind and the statement's first words."""
    return ", ".join(f"{kind} {' '.join(text.split()[:3])}" for kind, text in trips)


# --------------------------------------------------------------------------- measuring


def tasks(pids: list[int]) -> dict[tuple[int, int], tuple[float, float, int]]:
    """Per (process, thread): user + system CPU seconds, whether it is the main thread (1/0)
    and its context switches (voluntary + involuntary)."""
    out: dict[tuple[int, int], tuple[float, float, int]] = {}
    for pid in pids:
        try:
            entries = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in entries:
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = (task / "status").read_text()
            except OSError:
                continue
            switches = sum(
                int(line.split(":")[1])
                for line in status.splitlines()
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
            )
            cpu = (int(fields[11]) + int(fields[12])) / sl.CLK_TCK
            tid = int(task.name)
            out[(pid, tid)] = (cpu, 1.0 if tid == pid else 0.0, switches)
    return out


def backends(admin: Any, name: str) -> dict[int, tuple[str, float]]:
    """The database's client backends: pid -> (application name, CPU seconds)."""
    rows = admin.execute(
        "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
        (name,),
    ).fetchall()
    return {int(pid): (str(app or ""), sl.proc_cpu(int(pid))) for pid, app in rows}


def perf_start(pids: list[int]) -> subprocess.Popen[str] | None:
    """``perf stat`` of the system calls of ``pids`` until :func:`perf_stop`."""
    events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
    command = ["perf", "stat", "-x", ",", "-e", events, "-p", ",".join(map(str, pids))]
    return subprocess.Popen(  # noqa: S603 - a fixed command
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )


def perf_stop(process: subprocess.Popen[str] | None) -> dict[str, int]:
    """Stop ``perf stat``: its counts by system call."""
    if process is None:
        return {}
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    counts: dict[str, int] = {}
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("syscalls:sys_enter_") and parts[0].isdigit():
            counts[parts[2].removeprefix("syscalls:sys_enter_")] = int(parts[0])
    return counts


@dataclass
class Arm:
    """One road's server, its objects and key, the database backends it is known by, and its
    per-block measurements."""

    name: str
    server: sl.Server
    ids: list[str]
    analyst: str
    #: Its backends' ``application_name``; "" for the real service (none set).
    app_name: str
    rows: list[dict[str, float]] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


async def block(
    arm: Arm, count: int, clients: int, body: bytes, stop: threading.Event | None = None
) -> tuple[dict[int, int], float]:
    """``count`` submits over ``clients`` connections (``http_ab``'s client): statuses, wall.

    ``stop``: end early when it is set (each connection after its submit in flight).
    """
    conns = [sl.Connection("127.0.0.1", arm.server.port) for _ in range(clients)]
    statuses: dict[int, int] = {}
    left = list(range(count))

    async def client(conn: sl.Connection) -> None:
        while left and not (stop is not None and stop.is_set()):
            n = left.pop()
            headers = {
                "Authorization": f"Bearer {arm.analyst}",
                "Idempotency-Key": uuid.uuid4().hex,
            }
            path = f"{PATH_PREFIX}{arm.ids[n % len(arm.ids)]}{PATH_SUFFIX}"
            status, _ = await conn.post(path, body, headers)
            statuses[status] = statuses.get(status, 0) + 1

    for conn in conns:
        await conn._open()
    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    wall = time.perf_counter() - t0
    for conn in conns:
        await conn.close()
    return statuses, wall


def measured(
    arm: Arm, admin: Any, db_name: str, count: int, clients: int, body: bytes, perf: bool
) -> dict[str, float]:
    """One timed block of ``arm``: per submit CPU (ms), loop and threads (µs), PG (ms), ..."""
    pids = sl.descendants(arm.server.process.pid)
    before, pg_before = tasks(pids), backends(admin, db_name)
    counter = perf_start(pids[1:] or pids) if perf else None
    statuses, wall = asyncio.run(block(arm, count, clients, body))
    counts = perf_stop(counter)
    after, pg_after = tasks(sl.descendants(arm.server.process.pid)), backends(admin, db_name)
    for status, n in statuses.items():
        arm.statuses[status] = arm.statuses.get(status, 0) + n
    cpu = {"loop": 0.0, "threads": 0.0}
    switches = 0
    for task, (used, main, switched) in after.items():
        used0, _, switched0 = before.get(task, (0.0, main, 0))
        cpu["loop" if main else "threads"] += used - used0
        switches += switched - switched0
    pg = sum(
        used - pg_before.get(pid, ("", 0.0))[1]
        for pid, (app, used) in pg_after.items()
        if app == arm.app_name
    )
    row = {
        "cpu": 1000 * (cpu["loop"] + cpu["threads"]) / count,
        "loop": 1e6 * cpu["loop"] / count,
        "threads": 1e6 * cpu["threads"] / count,
        "pg": 1000 * pg / count,
        "switches": switches / count,
        "rate": count / wall,
    }
    for name, n in counts.items():
        row["sc_" + name] = n / count
    return row


# --------------------------------------------------------------------------- where the CPU goes

#: (part, path fragments): a sample counts for the part of its innermost frame's file (the
#: first part whose fragment the file's path holds); "other" when none does.
PARTS = (
    ("psycopg (execute, waits, adaptation)", ("psycopg/", "psycopg_pool/")),
    ("redis-py (commands, replies, connections)", ("redis/",)),
    ("SQLAlchemy (the sync road's Connection, pool)", ("sqlalchemy/",)),
    ("asyncio, futures, threads, queues", ("asyncio/", "concurrent/", "threading.py", "queue.py")),
    ("uvicorn, Starlette", ("uvicorn/", "starlette/", "httptools/", "h11/")),
    (
        "access line, metrics (logging, prometheus)",
        ("logging/", "app/logs.py", "prometheus_client/"),
    ),
    ("json", ("json/",)),
    ("the app's store, audit, deps (app/)", ("app/",)),
    ("the probe's own (inputs, answer, route)", ("async_probe.py",)),
)


def parts(raw: str) -> dict[str, float]:
    """Shares of py-spy's collapsed stacks (``-f raw``) by the part of each innermost frame."""
    counts: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if not number.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        part = next((name for name, marks in PARTS if any(m in leaf for m in marks)), "other")
        counts[part] = counts.get(part, 0) + int(number)
        total += int(number)
    return {name: n / total for name, n in counts.items()} if total else {}


def profile(arm: Arm, seconds: float, clients: int, body: bytes, rate: int) -> dict[str, float]:
    """py-spy over ``arm``'s workers for ``seconds`` under load (on-CPU samples, every thread)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = Path(tempfile.mkdtemp(prefix="gk_async_spy_")) / f"{arm.name}.raw"
    stop = threading.Event()
    load = threading.Thread(
        target=lambda: asyncio.run(block(arm, 10**7, clients, body, stop)), daemon=True
    )
    load.start()
    time.sleep(1.0)
    spied = subprocess.run(  # noqa: S603 - py-spy on our own server
        [
            *(spy, "record", "--subprocesses", "--nonblocking", "--gil", "-r", str(rate)),
            *(
                "-d",
                str(max(1, round(seconds))),
                "-f",
                "raw",
                "-o",
                str(out),
                "-p",
                str(arm.server.process.pid),
            ),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    stop.set()
    load.join(60)
    if spied.returncode != 0:
        raise RuntimeError(f"py-spy failed: {spied.stderr[-1000:]}")
    return parts(out.read_text())


# --------------------------------------------------------------------------- the run


def check_probes(url: str, redis_url: str, real: Captured, pools: list[str]) -> list[str]:
    """Where the probes' round trips differ from the real submit's (empty: nowhere).

    Each probe road (``sync``, and ``async`` with each of ``pools``) submits twice to the
    captured object in process; its second submit's round trips are compared with the real
    warm ones.
    """
    problems: list[str] = []
    for pool in pools:
        trips = probe_trips(url, redis_url, real.object_id, real.key_id, pool)
        named = {"sync": trips["sync"], f"async_{pool}": trips["async"]}
        problems += [p for p in check_trips(real.trips, named) if p not in problems]
    return problems


def check_trips(real: list[list[tuple[str, str]]], probes: dict[str, Any]) -> list[str]:
    """The probes' differences from the real submit's warm round trips (empty: the same)."""
    warm = [per_submit(t) for t in real[2:]]
    problems = []
    if any(w != warm[0] for w in warm[1:]):
        problems.append("the real submit's round trips differ from one submit to the next")
    for name, seen in probes.items():
        if per_submit(seen) != warm[0]:
            problems.append(f"{name}: {describe(per_submit(seen))}")
    return problems


def table(arms: list[Arm], perf: bool) -> list[str]:
    """The per-road medians and the ratios to the first road (``sync``)."""
    lines = [
        f"{'road':<14} {'submits/s':>9}  {'server ms/submit':>16} {'(IQR)':>13}"
        f"  {'loop µs':>8} {'threads µs':>10}  {'PG ms':>6}  {'switches':>8}  statuses"
    ]
    for arm in arms:

        def med(key: str, arm: Arm = arm) -> float:
            return statistics.median(r.get(key, 0.0) for r in arm.rows)

        q = statistics.quantiles([r["cpu"] for r in arm.rows], n=4)
        lines.append(
            f"{arm.name:<14} {med('rate'):>9.1f}  {med('cpu'):>16.3f} {q[0]:>6.3f}-{q[2]:.3f}"
            f"  {med('loop'):>8.1f} {med('threads'):>10.1f}  {med('pg'):>6.3f}"
            f"  {med('switches'):>8.2f}  {dict(sorted(arm.statuses.items()))}"
        )
        if perf:
            lines.append(
                "    system calls per submit: "
                + ", ".join(f"{s} {med('sc_' + s):.2f}" for s in SYSCALLS)
            )
    base = arms[0]
    for arm in arms[1:]:
        for key in ("cpu", "pg"):
            pairs = [b[key] / a[key] for a, b in zip(base.rows, arm.rows, strict=True) if a[key]]
            if not pairs:
                continue
            totals = sum(b[key] for b in arm.rows) / sum(a[key] for a in base.rows)
            lower = sum(p < 1 for p in pairs)
            what = "server CPU" if key == "cpu" else "PG CPU"
            lines.append(
                f"{arm.name} / {base.name} {what}: median per-block ratio "
                f"{statistics.median(pairs):.3f}, totals {totals:.3f}, "
                f"lower in {lower} of {len(pairs)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--blocks", type=int, default=16, help="blocks per road (16)")
    parser.add_argument("--block", type=int, default=600, help="submits per block (600)")
    parser.add_argument("--clients", type=int, default=32, help="connections per block (32)")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers per server (2)")
    parser.add_argument("--objects", type=int, default=20, help="objects per road (20)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed submits first (300)")
    parser.add_argument(
        "--pools",
        default="queue",
        help="async roads by their pools, comma-separated: queue, psycopg_pool, lean (queue)",
    )
    parser.add_argument("--real", action="store_true", help="also the real service (C)")
    parser.add_argument("--perf", action="store_true", help="system calls by kind (perf stat)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        help="then py-spy over each probe for this many seconds (0: none)",
    )
    parser.add_argument("--extra-path", help="a folder with psycopg_pool (not a dependency)")
    parser.add_argument("--db-prefix", default="gk_async_", help="the database's name prefix")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve", choices=["sync", "async"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.port, args.workers)
    if args.perf and shutil.which("perf") is None:
        parser.error("--perf: perf is not installed")
    pools = [p for p in args.pools.split(",") if p]
    if any(p not in ("queue", "psycopg_pool", "lean") for p in pools):
        parser.error("--pools: queue, psycopg_pool or lean")
    if args.extra_path:
        sys.path.append(args.extra_path)
    import psycopg

    from app.services.auth import authenticate

    rng = random.Random(args.seed)
    body = json.dumps({"query": sl.grr_queries(rng)[0]}).encode()
    load0 = os.getloadavg()[0]
    logs = Path(tempfile.mkdtemp(prefix="gk_async_probe_"))
    os.environ.setdefault("GATEKEEPER_ENCRYPTION_KEY_FILE", str(logs / "encryption.key"))
    with sl.fresh_database(prefix=args.db_prefix) as (url, db_name):
        captured = capture(url, sl.REDIS_URL)
        # the probes send the real submit's round trips: checked before any load
        problems = check_probes(url, sl.REDIS_URL, captured, pools)
        if problems:
            print("real: " + describe(per_submit(captured.trips[-1])), file=sys.stderr)
            raise RuntimeError("the probes' round trips differ: " + "; ".join(problems))
        print(
            "round trips per warm submit (real, sync, async): "
            + describe(per_submit(captured.trips[-1]))
        )
        arms: list[Arm] = []
        servers: list[sl.Server] = []
        try:
            real = sl.Server(f"{url}?application_name=gk_real", args.workers, 1, logs / "real.log")
            servers.append(real)
            ids, analyst = sl.register_objects(real, "grr", "bayesian", args.objects, rng)
            from app.db.session import make_engine

            engine = make_engine(url)
            found = authenticate(engine=engine, secret=analyst)
            engine.dispose()
            if found is None:
                raise RuntimeError("the analyst key was not stored")
            key_id = found[0].id
            probe_ids = {}
            for name in ["sync", *(f"async_{p}" for p in pools)]:
                probe_ids[name] = sl.register_objects(real, "grr", "bayesian", args.objects, rng)[0]
            for name in probe_ids:
                road, pool = ("sync", "queue") if name == "sync" else ("async", name[6:])
                server = ProbeServer(
                    road,
                    url,
                    args.workers,
                    logs / f"{name}.log",
                    analyst,
                    key_id,
                    pool,
                    args.extra_path,
                )
                servers.append(server)
                arms.append(Arm(name, server, probe_ids[name], analyst, f"probe_{name}"))
            if args.real:
                arms.append(Arm("real", real, ids, analyst, "gk_real"))
            for arm in arms:  # warm: every connection made, statements prepared
                asyncio.run(block(arm, args.warmup, args.clients, body))
            with psycopg.connect(
                sl.POSTGRES_URL.rsplit("/", 1)[0] + "/" + db_name, autocommit=True
            ) as admin:
                for b in range(args.blocks):
                    shift = b % len(arms)
                    for arm in arms[shift:] + arms[:shift]:
                        arm.rows.append(
                            measured(arm, admin, db_name, args.block, args.clients, body, args.perf)
                        )
            profiles = {
                arm.name: profile(arm, args.profile, args.clients, body, 200)
                for arm in arms
                if args.profile > 0 and arm.name != "real"
            }
        finally:
            for running in servers:
                running.stop()
    load1 = os.getloadavg()[0]
    print(
        f"async_probe: {args.blocks} blocks of {args.block} grr submits per road "
        f"({args.clients} connections, {args.workers} workers each), roads rotated; "
        f"load {load0:.2f} -> {load1:.2f}"
    )
    for line in table(arms, args.perf):
        print(line)
    retried = {
        arm.name: arm.server.log_path.read_text(errors="replace").count(LOST) for arm in arms
    }
    print(
        "submits tried again after a lost race (the probes' logs): "
        + ", ".join(f"{name} {n}" for name, n in retried.items() if name != "real")
    )
    if profiles:
        print(f"py-spy --gil, {args.profile} s per probe, 200 Hz: the thread holding the GIL, ")
        print("by the file of its innermost Python frame (shares of each probe's samples):")
        print(f"{'part':<48}" + "".join(f"{name:>20}" for name in profiles))
        for name, _ in (*PARTS, ("other", ())):
            print(f"{name:<48}" + "".join(f"{p.get(name, 0.0):>20.1%}" for p in profiles.values()))
    print(
        "(server: the uvicorn process tree's CPU per submit; loop: the workers' main threads; "
        "threads: every other thread; PG: the road's backends; switches: voluntary + "
        "involuntary, every thread; medians over the blocks)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

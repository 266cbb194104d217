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
8b. ``batched`` (``--arms``, not in the default ladder): (8) with group commit — what option
   (c) of issue 27 item 1 would buy at most. A request thread takes the lock and reads as (8)
   does and builds the accepted write (the same statement and parameters ``record_accepted``
   sends); the route then awaits it on the event loop (no thread waits) while the worker's one
   committer thread (:class:`Committer`, a connection of its own) sends every write handed to
   it while its previous batch was committing as one transaction in one pipeline (``BEGIN``,
   the writes, ``COMMIT``: one round trip, one commit flush; a batch of one is the statement
   alone in autocommit, as (8) sends it), releases the batch's locks after the commit and
   answers each request. A batch never holds two writes of one object (the lock keeps them
   apart; the committer defers a second one to the next batch all the same); when a batch
   fails (a lost race's guarded cast aborts the transaction, or a conflict) each of its writes
   runs again alone, so a lost race loses that write only. The batch sizes go to
   ``ROAD_STATS_DIR`` (one file per worker), read around each block. Not the service: each
   submit still its own statement (no multi-row statement).
8c. ``batched_thread`` (``--arms``): (8b) with the request thread waiting for its batch (the
   lock held and released in it, as (8)): a worker's batch is then at most its 5 threads.
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
ENV_STEP, ENV_URL, ENV_REDIS, ENV_EXTRA, ENV_STATS = (
    "ROAD_STEP",
    "ROAD_DATABASE_URL",
    "ROAD_REDIS_URL",
    "ROAD_EXTRA_PATH",
    "ROAD_STATS_DIR",
)
#: The probe steps, in the ladder's order (``real`` is the application itself).
STEPS = (
    "bare",
    "context",
    "fastapi",
    "handoff",
    "lock",
    "read",
    "unnamed",
    "sql",
    "batched",
    "batched_thread",
    "real",
)
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
    "batched": ("batched", "uvicorn"),
    "batched_thread": ("batched_thread", "uvicorn"),
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
    ("sql", "batched", "group commit: the accepted writes of concurrent submits, one transaction"),
    ("sql", "batched_thread", "group commit, each request thread waiting for its batch"),
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


# --------------------------------------------------------------------------- group commit


def accept_statement(inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The accepted write's text and parameters for ``record_accepted``'s arguments
    (``async_probe.accept_inputs``): what :func:`app.store.submits.record_accepted` sends on
    PostgreSQL, built as it builds them (the same compiled statement, the same names)."""
    from app.store import audit as audit_store
    from app.store import submits as submit_store

    query, version, columns = inputs["query"], inputs["version"], inputs["columns"]
    new_state = inputs["new_state"]
    cas = {"where_id": query.object_id, "where_version": version, "version": version + 1}
    cas.update(columns)
    accept = submit_store._accept_sql(frozenset(columns) | {"version"}, new_state is not None)
    params = {submit_store._QUERY_PARAM + n: getattr(query, n) for n in submit_store._QUERY_COLUMNS}
    params.update(audit_store.query_event_params(inputs["event"]))
    params.update(cas)
    if new_state is not None:
        params[submit_store._STATE_PARAM + "hash"] = new_state.key
        params[submit_store._STATE_PARAM + "state"] = new_state.state
        params[submit_store._STATE_PARAM + "err"] = new_state.err
    return accept.text, accept.params(params)


class _Write:
    """One accepted write waiting for its batch: its object, statement, what to release after
    the commit (the object's lock, for a caller that does not wait in a thread) and the answer's
    slot: a lock the waiting request thread blocks on until the committer releases it, or an
    asyncio future of ``loop`` the committer settles."""

    __slots__ = (
        "done",
        "error",
        "future",
        "loop",
        "object_id",
        "params",
        "query_id",
        "release",
        "text",
    )

    def __init__(
        self,
        object_id: str,
        text: str,
        params: dict[str, Any],
        release: Any = None,
        loop: Any = None,
    ) -> None:
        import threading

        self.object_id, self.text, self.params = object_id, text, params
        self.release, self.loop = release, loop
        self.future = None if loop is None else loop.create_future()
        self.done = None
        if loop is None:
            self.done = threading.Lock()
            self.done.acquire()
        self.query_id: int | None = None
        self.error: BaseException | None = None

    def answer(self, query_id: int | None = None, error: BaseException | None = None) -> None:
        """The write's outcome, after its batch: what it holds released, then its caller woken."""
        if self.release is not None:
            try:
                self.release()
            except Exception as exc:  # the caller's error; the committer goes on
                error = error or exc
        self.query_id, self.error = query_id, error
        if self.loop is None:
            self.done.release()
        else:
            self.loop.call_soon_threadsafe(_settle, self.future, query_id, error)


def _settle(future: Any, query_id: int | None, error: BaseException | None) -> None:
    if future.done():  # the request was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(query_id)


class Committer:
    """One worker's group commit: a thread on a connection of its own that sends every write
    handed to it while its previous batch was committing as one transaction in one pipeline.

    ``connect`` makes the connection (a pool's, given back at :meth:`close`, or psycopg's own),
    used in autocommit. ``write`` blocks the calling (request) thread until its batch committed
    and returns the new query's id, or None when the write's compare-and-set missed (a lost
    race: the caller reads again, as ``record_accepted``'s caller does). A batch never holds two
    writes of one object: a second one waits for the next batch. A batch of one is the statement
    alone in autocommit (as ``record_accepted`` sends it). When a batch fails, nothing of it was
    committed, and each of its writes runs again alone in its own transaction: its own outcome
    (id, None, or the error) is what its caller gets. ``sizes`` counts the batches by size,
    ``alone`` the writes run again alone after a failed batch; with ``stats`` both go to that
    file (JSON), at most every ``every`` seconds while busy and whenever the queue goes idle.
    """

    def __init__(self, connect: Any, stats: Path | None = None, every: float = 0.25) -> None:
        import queue
        import threading
        from collections import Counter

        self._connect = connect
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self.sizes: Counter[int] = Counter()
        self.alone = 0
        self._stats, self._every, self._saved = stats, every, 0.0
        self._dirty = False
        self._thread = threading.Thread(target=self._run, name="committer", daemon=True)
        self._thread.start()

    def write(self, object_id: str, inputs: dict[str, Any]) -> int | None:
        """Hand the accepted write of ``inputs`` to the next batch; its id after the commit (the
        calling thread waits)."""
        text, params = accept_statement(inputs)
        item = _Write(object_id, text, params)
        self._queue.put(item)
        item.done.acquire()
        if item.error is not None:
            raise item.error
        return item.query_id

    async def write_async(
        self, object_id: str, statement: tuple[str, dict[str, Any]], release: Any
    ) -> int | None:
        """Hand an accepted write (:func:`accept_statement`'s) to the next batch from the event
        loop; the committer calls ``release`` after the batch's commit, then the awaiting
        coroutine has its id (no thread waits)."""
        import asyncio

        item = _Write(object_id, *statement, release=release, loop=asyncio.get_running_loop())
        self._queue.put(item)
        result: int | None = await item.future
        return result

    def close(self) -> None:
        """Stop the thread after the batches handed to it (its connection closed)."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        import queue

        own = self._connect()  # a pool's connection (SQLAlchemy's proxy) or psycopg's own
        conn = getattr(own, "driver_connection", own)
        conn.autocommit = True
        waiting: list[_Write] = []  # deferred: a second write of an object already batched
        stopping = False
        try:
            while not (stopping and not waiting):
                if not waiting:
                    try:
                        first = self._queue.get(timeout=self._every)
                    except queue.Empty:
                        self._save(idle=True)
                        continue
                    if first is None:
                        break
                    waiting.append(first)
                while True:  # everything handed over so far
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stopping = True
                        break
                    waiting.append(more)
                batch, seen, later = [], set(), []
                for item in waiting:
                    if item.object_id in seen:
                        later.append(item)
                    else:
                        seen.add(item.object_id)
                        batch.append(item)
                waiting = later
                self._commit(conn, batch)
                self.sizes[len(batch)] += 1
                self._dirty = True
                self._save(idle=False)
        finally:
            self._save(idle=True)
            own.close()

    def _commit(self, conn: Any, batch: list[_Write]) -> None:
        import psycopg

        if len(batch) == 1:
            self._alone(conn, batch[0])
            return
        try:
            cursors = [conn.cursor() for _ in batch]
            with conn.pipeline():
                conn.execute(b"BEGIN", prepare=False)
                for cursor, item in zip(cursors, batch, strict=True):
                    cursor.execute(item.text, item.params)
                conn.execute(b"COMMIT", prepare=False)
            ids = [cursor.fetchone() for cursor in cursors]
        except psycopg.Error:
            from psycopg.pq import TransactionStatus

            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute(b"ROLLBACK", prepare=False)
            for item in batch:  # nothing of the batch stayed: each alone, its own outcome
                self.alone += 1
                self._alone(conn, item)
            return
        for item, row in zip(batch, ids, strict=True):
            item.answer(None if row is None else int(row[0]))

    @staticmethod
    def _alone(conn: Any, item: _Write) -> None:
        """One write as ``record_accepted`` sends it with ``commit``: a transaction of its own."""
        import psycopg

        from app.store import submits as submit_store

        try:
            row = conn.cursor().execute(item.text, item.params).fetchone()
        except psycopg.errors.InvalidTextRepresentation as exc:
            item.answer(error=None if submit_store._lost_race(exc) else exc)
        except psycopg.Error as exc:
            item.answer(error=exc)
        except BaseException as exc:  # the request thread must not wait for ever
            item.answer(error=exc)
            raise
        else:
            item.answer(None if row is None else int(row[0]))

    def _save(self, *, idle: bool) -> None:
        if self._stats is None or not self._dirty:
            return
        now = time.monotonic()
        if not idle and now - self._saved < self._every:
            return
        self._saved, self._dirty = now, False
        data = {"sizes": {str(k): v for k, v in self.sizes.items()}, "alone": self.alone}
        temporary = self._stats.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        temporary.replace(self._stats)


def batch_stats(folder: Path) -> dict[str, Any]:
    """The batch sizes of every worker's committer in ``folder`` (summed): ``sizes`` (size ->
    batches) and ``alone``."""
    from collections import Counter

    sizes: Counter[int] = Counter()
    alone = 0
    for path in folder.glob("*.json"):
        data = json.loads(path.read_text())
        sizes.update({int(k): v for k, v in data["sizes"].items()})
        alone += data["alone"]
    return {"sizes": sizes, "alone": alone}


def size_summary(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What a block's batches were (``after`` minus ``before``): batches, writes, writes per
    batch (mean), the median write's batch size, the largest batch, writes run alone again."""
    sizes = after["sizes"] - before["sizes"]
    batches = sum(sizes.values())
    writes = sum(k * v for k, v in sizes.items())
    # the batch size the median write was committed in
    median = 0
    seen = 0
    for size in sorted(sizes):
        seen += size * sizes[size]
        if 2 * seen >= writes:
            median = size
            break
    return {
        "batches": float(batches),
        "writes": float(writes),
        "mean": writes / batches if batches else 0.0,
        "median_write": float(median),
        "max": float(max(sizes, default=0)),
        "alone": float(after["alone"] - before["alone"]),
    }


def fastapi_app(step: str, url: str, redis_url: str) -> Any:
    """Rungs 4, 6, 7, 8 (and 7b, 7c, 8b): the submit's route shape in a FastAPI app built as
    the service's."""
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

    def load_row(object_id: str, key: str) -> Any:
        """The submit's read in a transaction of its own (as SyncRoad.submit reads): the
        object's row (``LookupError`` if there is none)."""
        from app.store import objects as object_store
        from app.store.base import submitting

        with submitting(runtime.engine) as conn:
            found = object_store.load_for_submit(conn, object_id=object_id, key=key)
        if found is None:
            raise LookupError("no such object")
        return found[0]

    def read(object_id: str, key: str) -> Any:
        """The submit's read alone (as SyncRoad.submit reads), the answer from the row read."""
        with runtime.locks.hold(object_id):
            row = load_row(object_id, key)
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

    def locked_read(object_id: str, key: str) -> tuple[Any, Any, dict[str, Any], Any]:
        """The batched rung's request thread: the object's lock taken (held past the return: the
        committer releases it after the batch's commit), the row read as the sql rung reads it,
        the accepted write's statement built."""
        from contextlib import ExitStack

        road = runtime.road
        held = ExitStack()
        held.enter_context(road.locks.hold(object_id))
        try:
            row = load_row(object_id, key)
            inputs = ap.accept_inputs(row, key, road.key_id, row.state or ap._FIRST_STATE)
            return held, row, inputs, accept_statement(inputs)
        except BaseException:
            held.close()
            raise

    async def batched(object_id: str, key: str) -> Any:
        """The sql rung's submit with group commit: the lock and the read in a request thread,
        then the accepted write awaited on the loop (no thread waits) while the worker's
        :class:`Committer` commits it with the others handed to it; the lock released after the
        batch's commit, the answer after that."""
        for _ in range(ap.ATTEMPTS):
            held, row, inputs, statement = await in_thread(runtime, locked_read, object_id, key)
            query_id = await runtime.committer.write_async(object_id, statement, held.close)
            if query_id is not None:
                now = inputs["query"].created_at
                return submit_result(ap.answer_body(row, row.accepted + 1, query_id, now))
        raise RuntimeError("lost races")

    def batched_thread(object_id: str, key: str) -> Any:
        """SyncRoad.submit with the accepted write handed to the worker's :class:`Committer`:
        the lock held and the row read as the sql rung's, the request thread waiting for the
        batch's commit (so a worker's batch is at most its request threads)."""
        road = runtime.road
        with road.locks.hold(object_id):
            for _ in range(ap.ATTEMPTS):
                row = load_row(object_id, key)
                state = row.state or ap._FIRST_STATE
                inputs = ap.accept_inputs(row, key, road.key_id, state)
                query_id = runtime.committer.write(object_id, inputs)
                if query_id is not None:
                    now = inputs["query"].created_at
                    return submit_result(ap.answer_body(row, row.accepted + 1, query_id, now))
        raise RuntimeError("lost races")

    def committer_connection() -> Any:
        """The committer's connection: the app's engine's kind, a pool of its own (one)."""
        return runtime.committer_engine.raw_connection()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        road = None
        committer = committer_engine = None
        if step in ("batched", "batched_thread"):
            committer_engine = make_engine(url, pool_size=1, max_overflow=0)
            runtime.committer_engine = committer_engine
            stats = os.environ.get(ENV_STATS)
            where = Path(stats) / f"{os.getpid()}.json" if stats else None
            committer = Committer(committer_connection, where)
        if step in ("read", "unnamed", "sql", "batched", "batched_thread"):
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
            committer=committer,
            keys=KeyCache(settings.auth_cache_seconds),
        )
        app.state.runtime = runtime
        yield
        threads.shutdown()
        if committer is not None:
            committer.close()
        if committer_engine is not None:
            committer_engine.dispose()
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
        if step == "batched":
            return await batched(object_id, key)
        if step == "batched_thread":
            return await in_thread(runtime, batched_thread, object_id, key)
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
        self.stats_dir: Path | None = None
        if step.startswith("batched"):  # the committers' batch sizes, one file per worker
            self.stats_dir = Path(tempfile.mkdtemp(prefix="road_batches_"))
            full[ENV_STATS] = str(self.stats_dir)
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
        if self.stats_dir is not None:
            shutil.rmtree(self.stats_dir, ignore_errors=True)


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
    stats = getattr(arm.server, "stats_dir", None)
    batches0 = batch_stats(stats) if stats else None
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
    batches: dict[str, float] = {}
    if stats and batches0 is not None:  # the committers save when idle (after the CPU read)
        time.sleep(0.6)
        summary = size_summary(batches0, batch_stats(stats))
        batches = {"batch_" + key: value for key, value in summary.items()}
    return {
        **batches,
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


def batch_lines(arms: list[Arm]) -> list[str]:
    """Per arm with a committer (``batched``): its batches per block, medians over the blocks
    (writes per batch, the batch size the median write was committed in), the largest batch of
    any block and the writes run again alone after a failed batch (all blocks)."""
    lines = []
    for arm in arms:
        rows = [r for r in arm.rows if "batch_writes" in r]
        if not rows:
            continue
        means = sorted(r["batch_mean"] for r in rows)
        lines.append(
            f"{arm.name}: writes per batch median {statistics.median(means):.2f} "
            f"(blocks {means[0]:.2f}..{means[-1]:.2f}), the median write's batch "
            f"{statistics.median(r['batch_median_write'] for r in rows):.0f}, largest "
            f"{max(r['batch_max'] for r in rows):.0f}, batches per block median "
            f"{statistics.median(r['batch_batches'] for r in rows):.0f} for "
            f"{statistics.median(r['batch_writes'] for r in rows):.0f} writes; run alone again "
            f"after a failed batch: {sum(r['batch_alone'] for r in rows):.0f}"
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
        default=",".join(a for a in ARMS if a not in ("read", "unnamed") and "batched" not in a),
        help=f"comma-separated, of: {', '.join(ARMS)} (all but read, unnamed, batched*)",
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
    names = [a for a in args.arms.split(",") if a and a != "pgbench"]  # pgbench: always an arm
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
        trips = check_sql_rung(url) if {"sql", "batched", "batched_thread"} & set(names) else ""
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
            if "real" not in names:  # its connections back to the shared PostgreSQL
                real.stop()
                servers.remove(real)
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
    for line in batch_lines(arms):
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

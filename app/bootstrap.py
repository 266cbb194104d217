"""The one composition root: ``gatekeeper serve``, ``gatekeeper worker`` and the CLI build here.

Everything below this module receives what it uses: the API gets a :class:`~app.api.deps.Runtime`
(engine, bound worker, locks, survey jobs), the Celery app gets the survey handlers it
runs (:class:`~app.worker.celery_app.SurveyHandlers`), and no layer imports a layer above it
(import-linter's layers contract in ``pyproject.toml``: cli → node → bootstrap → api →
services → worker → engine → db, settings and the other bottom modules).
"""

from __future__ import annotations

import gc
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from app import crypto
from app.db.session import make_engine, wait_for_database
from app.engine.limits import DEFAULT_LIMITS
from app.settings import Settings, get_settings

# The web stack, the services and the workers are imported where they are built, not here:
# importing them loads app.metrics, whose multiprocess files must not be created by the
# `gatekeeper serve` parent before it has set up PROMETHEUS_MULTIPROC_DIR (it migrates first).
if TYPE_CHECKING:
    from celery import Celery
    from fastapi import FastAPI

    from app.api.deps import Runtime
    from app.services.survey_runs import Children, ChildRuns, ChunkOutcome
    from app.worker.cache import RedisCache
    from app.worker.celery_app import CelerySettings, CountedBefore, SurveyHandlers
    from app.worker.jobs import SurveyJobs
    from app.worker.pool import BoundWorker, WorkerSettings


def prepare_database(settings: Settings | None = None) -> tuple[Settings, Engine]:
    """Wait for the database and migrate it (the prestart steps); returns (settings, engine).

    A database already at the newest migration is left as it is without starting Alembic:
    Alembic's upgrade to where the database already is (importing Alembic, Mako and Pygments,
    then every migration script) was a quarter of a ``gatekeeper migrate``'s instructions and
    7 % of a one-worker ``serve`` process's up to its app, at every start (docs/benchmarks.md,
    "Eighteenth session, h/start"). Any other
    answer of :func:`~app.db.migrate.migration_problem` — never migrated, behind, or at a
    revision this version does not know — goes to Alembic as before, which migrates or refuses.
    """
    # Alembic (with Mako and Pygments) is imported by upgrade, not with this module: every
    # uvicorn worker imports this module for app_factory and never migrates
    from app.db.migrate import migration_problem, upgrade

    settings = settings or get_settings()
    crypto.configure(settings.value_cipher())
    engine = make_engine(settings.database_url)
    wait_for_database(engine, settings.database_wait_seconds)
    if migration_problem(engine) is not None:
        upgrade(settings.database_url)
    return settings, engine


def create_app(settings: Settings | None = None) -> FastAPI:
    """The web application of ``settings``, each process building its runtime here."""
    from app.api import main as api_main

    return api_main.create_app(settings or get_settings(), build_runtime)


def app_factory() -> FastAPI:
    """Factory for ``uvicorn --factory app.bootstrap:app_factory`` (``gatekeeper serve``)."""
    with collector_paused():
        app = create_app()
    tune_collector()
    return app


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: for a new serving process's imports and app.

    Importing the web stack and the app (FastAPI, pydantic's schemas, SQLAlchemy's mappers, the
    routes) allocates about 10^6 objects that live as long as the process; the collector's
    passes over them, the full ones over an ever larger heap, found nearly nothing to free.
    :func:`tune_collector` right after freezes what is there, with no pass. Every uvicorn
    worker pays this start, and a worker killed is replaced by a new one (docs/benchmarks.md,
    "h/ci7"). A collector already off stays off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


#: Container allocations (net of frees) between two youngest-generation collections; Python's
#: default is 700. Above what a diverged survey's chunks hold at once: their members are each
#: a group of their own, with about ten tuples, lists and dicts each alive until the chunk
#: ends, so at 50,000 the seventh diverging survey at 2·10^5 ran 36 passes in its 40 chunks,
#: each traversing them — 1.3 s of its 11.5 s of server CPU (a gen-1 pass 0.1-0.15 s,
#: docs/benchmarks.md "h/member3"); at 250,000, 4 passes, 0.36 s.
COLLECT_EVERY = 250_000


def tune_collector() -> None:
    """Set a serving process's cyclic garbage collector for surveys: fewer, smaller passes.

    A survey chunk allocates tens of thousands of tuples, dicts and lists for its 5,000
    members, nearly all freed by reference counting when the chunk ends. With Python's default
    threshold (700) the collector ran a youngest-generation pass every 700 of them and, every
    hundred passes, a full pass over the whole heap (the modules, SQLAlchemy, FastAPI: ~10^5
    objects) — 45% of a chunk thread's CPU in a profile of the first survey (docs/benchmarks.md,
    "h/member"). Here the objects alive once the process is built are moved out of the
    collector's generations (``gc.freeze``: they live as long as the process; reference
    counting still frees them) and a youngest pass waits for :data:`COLLECT_EVERY`
    allocations, so a chunk's objects are mostly freed before any pass sees them. Reference
    cycles made from then on are still collected, after at most that many allocations.

    No full pass runs before the freeze: it cost every worker start 3.5-7% of its CPU (a pass
    over ~2·10^5 objects; docs/benchmarks.md, "h/start" and "h/ci") to free what the imports
    left in reference cycles, about 900 objects and 0.2 MB — classes, functions and
    descriptors that modules built and dropped (``datetime``, ``ssl``'s and ``socket``'s
    enums, SQLAlchemy's and pydantic's helpers), none of them holding a file, a socket or a
    finalizer. They are frozen with the rest and kept for the process's life, a fixed cost
    paid once.
    """
    gc.freeze()
    gc.set_threshold(COLLECT_EVERY, *gc.get_threshold()[1:])


def celery_settings(settings: Settings) -> CelerySettings:
    """The Celery configuration of ``settings`` (``BROKER_URL`` must be set)."""
    from app.worker.celery_app import CelerySettings

    if settings.broker_url is None or settings.result_url is None:
        raise ValueError("BROKER_URL is not set")
    return CelerySettings(
        broker_url=settings.broker_url,
        result_url=settings.result_url,
        namespace=settings.broker_namespace,
        time_limit=settings.bound_time_limit,
        result_ttl=settings.broker_result_ttl,
    )


def build_runtime(settings: Settings) -> Runtime:
    """Engine, bound worker, locks, Redis client and survey jobs for one web process."""
    from app.services import survey_runs
    from app.worker.cache import RedisCache
    from app.worker.jobs import InProcessJobs
    from app.worker.pool import BoundWorker, WorkerSettings

    crypto.configure(settings.value_cipher())
    engine = make_engine(settings.database_url, settings.db_pool_size, settings.db_max_overflow)
    redis_client = None
    if settings.redis_url:
        import redis

        redis_client = redis.Redis.from_url(
            # a hung Redis costs a request at most this long before it decides on the database
            # alone (locks) or skips the cache: requests answer within ~2 s, never hang
            settings.redis_url,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
        )
    cache_ = RedisCache(redis_client) if redis_client is not None else None
    bound_settings = WorkerSettings(
        processes=settings.bound_processes, time_limit=settings.bound_time_limit
    )
    lock_client = redis_client if settings.redis_locks else None
    if settings.broker_url is not None:  # the distributed worker module (gatekeeper worker)
        return _with_celery(settings, engine, redis_client, cache_, bound_settings, lock_client)
    worker = BoundWorker(bound_settings, cache_)
    owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    children = survey_children(settings)
    jobs = InProcessJobs(
        run=lambda survey_id: survey_runs.run_survey(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            owner=owner,
            limits=DEFAULT_LIMITS,
            lease_seconds=settings.survey_lease_seconds,
            threads=settings.survey_threads,
            children=children,
        ),
        orphans=lambda: survey_runs.resumable_surveys(engine=engine),
        children=children,
    )
    return _runtime(settings, engine, redis_client, lock_client, worker=worker, surveys=jobs)


def _runtime(
    settings: Settings,
    engine: Engine,
    redis_client: Any,
    lock_client: Any,
    *,
    worker: BoundWorker,
    surveys: SurveyJobs,
    celery: tuple[Any, Any] | None = None,
) -> Runtime:
    """The runtime around a bound worker and a survey job runner (in process or Celery)."""
    from concurrent.futures import ThreadPoolExecutor

    from app.api.deps import Runtime
    from app.services.auth import KeyCache, RevocationListener
    from app.services.locks import ObjectLocks
    from app.services.snapshots import collect_states_periodically
    from app.worker.periodic import Periodic

    seconds = settings.states_collect_seconds
    housekeeping = (
        Periodic(
            name="states-collection",
            task=lambda: collect_states_periodically(engine, redis=redis_client, seconds=seconds),
            seconds=seconds,
        )
        if seconds > 0
        else None
    )
    keys = KeyCache(settings.auth_cache_seconds)
    # keys revoked by other processes leave this one's key cache when they are announced
    revocations = (
        RevocationListener(redis_client, keys).start()
        if redis_client is not None and keys.ttl > 0
        else None
    )
    return Runtime(
        settings=settings,
        engine=engine,
        worker=worker,
        locks=ObjectLocks(lock_client, settings.lock_timeout, settings.lock_wait),
        limits=DEFAULT_LIMITS,
        redis=redis_client,
        keys=keys,
        threads=ThreadPoolExecutor(settings.db_pool_size, thread_name_prefix="request"),
        surveys=surveys,
        celery=celery,
        housekeeping=housekeeping,
        revocations=revocations,
    )


def _with_celery(
    settings: Settings,
    engine: Engine,
    redis_client: Any,
    cache_: RedisCache | None,
    bound_settings: WorkerSettings,
    lock_client: Any,
) -> Runtime:
    """The runtime of a web process whose heavy work runs on ``gatekeeper worker`` nodes."""
    from app.services import survey_runs
    from app.worker.celery_app import make_celery
    from app.worker.celery_jobs import CeleryJobs
    from app.worker.remote import CeleryBoundWorker

    cfg = celery_settings(settings)
    celery = make_celery(cfg)
    worker = CeleryBoundWorker(bound_settings, cache_, celery=celery, cfg=cfg)
    jobs = CeleryJobs(
        celery=celery, cfg=cfg, orphans=lambda: survey_runs.resumable_surveys(engine=engine)
    )
    return _runtime(
        settings,
        engine,
        redis_client,
        lock_client,
        worker=worker,
        surveys=jobs,
        celery=(celery, cfg),
    )


def survey_children(settings: Settings) -> Children | None:
    """The child processes deciding this web process's survey chunks (``SURVEY_PROCESSES``).

    None with ``SURVEY_PROCESSES=0``: the chunks are decided by ``SURVEY_THREADS`` threads of
    this process. The children start with the first survey; each builds what it needs from
    plain data (:func:`_start_survey_child`).
    """
    from app.worker.children import ChildPool

    if settings.survey_processes < 1:
        return None
    given = {
        name: getattr(settings, name)
        for name in (
            "gatekeeper_env",
            "database_url",
            "gatekeeper_encryption_keys",
            "gatekeeper_encryption_key_file",
            "bound_time_limit",
            "log_level",
        )
    }
    return ChildPool(
        processes=settings.survey_processes,
        target=_survey_child_decide,
        initializer=_start_survey_child,
        initargs=({k: v.value if k == "gatekeeper_env" else v for k, v in given.items()},),
        preload=SURVEY_CHILD_MODULES,
    )


#: What a survey child imports: this module (its target and initializer) and what
#: :func:`_start_survey_child` imports; the children's forkserver imports them once
#: (:class:`~app.worker.children.ChildPool`). None opens a connection or starts a thread when
#: imported (tests/worker/test_children_forkserver.py checks both, and that this list is whole).
SURVEY_CHILD_MODULES = (
    __name__,
    "app.logs",
    "app.services.survey_runs",
    "app.worker.pool",
)


#: A survey child process's side (set by :func:`_start_survey_child`, in the child only).
_SURVEY_CHILD: ChildRuns | None = None


def _start_survey_child(given: dict[str, Any]) -> None:
    """A survey child's start: its settings, logs, cipher, engine, bound worker, collector.

    Its own database engine (one connection: it decides one chunk at a time) and a bound worker
    computing in this process (``processes=0``); the collector tuned as a serving process's.
    """
    global _SURVEY_CHILD  # one per child process, set once at its start
    from app import logs
    from app.services.survey_runs import ChildRuns
    from app.worker.pool import BoundWorker, WorkerSettings

    settings = Settings(**given)
    logs.configure(settings.log_level)
    crypto.configure(settings.value_cipher())
    engine = make_engine(settings.database_url, pool_size=1, max_overflow=1)
    worker = BoundWorker(WorkerSettings(processes=0, time_limit=settings.bound_time_limit))
    _SURVEY_CHILD = ChildRuns(engine=engine, worker=worker, limits=DEFAULT_LIMITS)
    tune_collector()


def _survey_child_decide(
    survey_id: int, run: str, chunk: int, attempts: int
) -> tuple[str, ChunkOutcome | None]:
    """A survey child's call (:meth:`~app.services.survey_runs.ChildRuns.decide`)."""
    if _SURVEY_CHILD is None:
        raise RuntimeError("not a survey child process")
    return _SURVEY_CHILD.decide(survey_id, run, chunk, attempts)


def survey_handlers(settings: Settings) -> SurveyHandlers:
    """What a worker's survey tasks run: plan and decide chunks on this process's engine.

    Every worker process opens its own database connections (never shared across ``fork``).
    """
    from app.services import survey_runs
    from app.worker.celery_app import SurveyHandlers
    from app.worker.pool import BoundWorker, WorkerSettings

    bound = BoundWorker(WorkerSettings(processes=0, time_limit=settings.bound_time_limit))

    @cache
    def engine(pid: int) -> Engine:  # one engine per process: connections never cross a fork
        return make_engine(settings.database_url, pool_size=1, max_overflow=1)

    def plan(survey_id: int) -> tuple[str, list[int]] | None:
        owner = f"celery:{secrets.token_hex(8)}"
        chunks = survey_runs.plan_survey(
            engine=engine(os.getpid()),
            survey_id=survey_id,
            owner=owner,
            lease_seconds=settings.survey_lease_seconds,
        )
        return None if not chunks else (owner, chunks)

    def run_range(survey_id: int, owner: str, chunk: int, counted: CountedBefore | None) -> str:
        return survey_runs.run_survey_range(
            engine=engine(os.getpid()),
            worker=bound,
            survey_id=survey_id,
            owner=owner,
            chunk=chunk,
            limits=DEFAULT_LIMITS,
            lease_seconds=settings.survey_lease_seconds,
            counted_before=counted,
        )

    return SurveyHandlers(plan=plan, run_range=run_range)


def sending_celery(settings: Settings) -> Celery:
    """A Celery app that only sends and reads (no survey handlers): checks and tools."""
    from app.worker.celery_app import make_celery

    return make_celery(celery_settings(settings))


def worker_celery(settings: Settings) -> tuple[Celery, CelerySettings]:
    """The Celery app of a ``gatekeeper worker`` node, its survey tasks given their handlers."""
    from app.worker.celery_app import make_celery

    cfg = celery_settings(settings)
    return make_celery(cfg, survey_handlers(settings)), cfg


def prepare_worker(settings: Settings) -> None:
    """A worker's start-up before its nodes fork: the values' cipher and a reachable database.

    The collector is set for survey chunks (:func:`tune_collector`), the nodes inheriting it.
    """
    crypto.configure(settings.value_cipher())
    probe = make_engine(settings.database_url, pool_size=1, max_overflow=0)
    wait_for_database(probe, settings.database_wait_seconds)
    probe.dispose()
    tune_collector()

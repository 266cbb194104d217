"""The FastAPI application: ``create_app(settings)`` and the module-level ``app`` for uvicorn."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from anyio import CapacityLimiter
from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from app import crypto, metrics, multiproc
from app.api import openapi, problems
from app.api.deps import Runtime
from app.api.middleware import BodyLimit, RequestContext
from app.api.ratelimit import RateLimitMiddleware
from app.api.routes import (
    audit,
    calculator,
    dashboard,
    health,
    imports,
    keys,
    objects,
    odometers,
    surveys,
)
from app.db.session import make_engine, make_session_factory
from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.services.auth import KeyCache, ensure_bootstrap_admin
from app.services.locks import ObjectLocks
from app.settings import Settings, get_settings
from app.worker.cache import RedisCache
from app.worker.jobs import InProcessJobs, SurveyJobs
from app.worker.pool import BoundWorker, WorkerSettings
from app.worker.threads import single_threaded_blas

log = logging.getLogger("gatekeeper")


def build_runtime(settings: Settings) -> Runtime:
    """Engine, sessions, worker pool, locks and Redis client for one process."""
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
    cache = RedisCache(redis_client) if redis_client is not None else None
    bound_settings = WorkerSettings(
        processes=settings.bound_processes, time_limit=settings.bound_time_limit
    )
    lock_client = redis_client if settings.redis_locks else None
    if settings.broker_url is not None:  # the distributed worker module (app.node)
        return _with_celery(settings, engine, redis_client, cache, bound_settings, lock_client)
    worker = BoundWorker(bound_settings, cache)
    owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    jobs = InProcessJobs(
        run=lambda survey_id: survey_runs.run_survey(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            owner=owner,
            limits=DEFAULT_LIMITS,
            lease_seconds=settings.survey_lease_seconds,
            threads=settings.survey_threads,
        ),
        orphans=lambda: survey_runs.resumable_surveys(engine=engine),
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
    return Runtime(
        settings=settings,
        engine=engine,
        sessions=make_session_factory(engine),
        worker=worker,
        locks=ObjectLocks(lock_client, settings.lock_timeout, settings.lock_wait),
        limits=DEFAULT_LIMITS,
        redis=redis_client,
        keys=KeyCache(settings.auth_cache_seconds),
        threads=CapacityLimiter(settings.db_pool_size),
        surveys=surveys,
        celery=celery,
    )


def _with_celery(
    settings: Settings,
    engine: Engine,
    redis_client: Any,
    cache: RedisCache | None,
    bound_settings: WorkerSettings,
    lock_client: Any,
) -> Runtime:
    """The runtime of a web process whose heavy work runs on ``gatekeeper worker`` nodes."""
    from app.node import celery_settings
    from app.worker.celery_app import make_celery
    from app.worker.celery_jobs import CeleryJobs
    from app.worker.remote import CeleryBoundWorker

    cfg = celery_settings(settings)
    celery = make_celery(cfg)
    worker = CeleryBoundWorker(bound_settings, cache, celery=celery, cfg=cfg)
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


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application (migrations are run beforehand by ``gatekeeper serve``)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        single_threaded_blas()  # the worker processes are the parallelism (app.worker.threads)
        runtime = build_runtime(settings)
        app.state.runtime = runtime
        metrics.WEB_WORKERS.set(1)
        if settings.gatekeeper_bootstrap_admin_key:
            try:
                with runtime.sessions() as session, session.begin():
                    if ensure_bootstrap_admin(
                        session=session, secret=settings.gatekeeper_bootstrap_admin_key
                    ):
                        log.info("bootstrap admin key registered")
            except IntegrityError:  # another uvicorn worker registered it at the same moment
                log.info("bootstrap admin key registered by another worker")
        yield
        runtime.surveys.close()
        runtime.worker.close()
        runtime.engine.dispose()
        multiproc.mark_this_process_dead()

    app = FastAPI(
        title="ldp-gatekeeper",
        version="0.1.0",
        description="Per-object privacy-budget gatekeeper for Local Differential Privacy: the "
        "Bayesian Privacy Filter and Odometer. Errors are application/problem+json.",
        lifespan=lifespan,
        # operation ids are the route functions' names (register, submit, odometer...): a
        # generated client's methods get those names, not "submit_v1_objects_object_id_..."
        generate_unique_id_function=lambda route: route.name,
    )
    problems.install(app)
    openapi.install(app)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # inside the request context (request id, access log): throttled requests never reach
    # the routes or the database
    app.add_middleware(
        RateLimitMiddleware,
        per_second=settings.rate_limit_per_second,
        burst=settings.rate_limit_burst,
    )
    # added last, so outermost: every response (413s too) gets a request id and a log line
    app.add_middleware(RequestContext)

    app.include_router(objects.router)
    for module in (odometers, imports, surveys, audit, calculator, keys, health):
        app.include_router(module.router)
    app.include_router(dashboard.router)
    return app


def app_factory() -> FastAPI:
    """Factory for ``uvicorn --factory app.api.main:app_factory``."""
    return create_app()

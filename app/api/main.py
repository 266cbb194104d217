"""The FastAPI application: ``create_app(settings)`` and the module-level ``app`` for uvicorn."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from sqlalchemy.exc import IntegrityError

from app import logs, metrics
from app.api import problems
from app.api.deps import Runtime
from app.api.routes import misc, objects
from app.db.session import make_engine, make_session_factory
from app.engine.limits import DEFAULT_LIMITS
from app.services.auth import ensure_bootstrap_admin
from app.services.locks import ObjectLocks
from app.settings import Settings, get_settings
from app.worker.cache import RedisCache
from app.worker.pool import BoundWorker, WorkerSettings

log = logging.getLogger("gatekeeper")
access = logging.getLogger("gatekeeper.access")


def build_runtime(settings: Settings) -> Runtime:
    """Engine, sessions, worker pool, locks and Redis client for one process."""
    engine = make_engine(settings.database_url, settings.db_pool_size, settings.db_max_overflow)
    redis_client = None
    if settings.redis_url:
        import redis

        redis_client = redis.Redis.from_url(
            settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0
        )
    cache = RedisCache(redis_client) if redis_client is not None else None
    worker = BoundWorker(
        WorkerSettings(processes=settings.bound_processes, time_limit=settings.bound_time_limit),
        cache,
    )
    lock_client = redis_client if settings.redis_locks else None
    return Runtime(
        settings=settings,
        engine=engine,
        sessions=make_session_factory(engine),
        worker=worker,
        locks=ObjectLocks(lock_client, settings.lock_timeout, settings.lock_wait),
        limits=DEFAULT_LIMITS,
        redis=redis_client,
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application (migrations are run beforehand by ``gatekeeper serve``)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = build_runtime(settings)
        app.state.runtime = runtime
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
        runtime.worker.close()
        runtime.engine.dispose()

    app = FastAPI(
        title="ldp-gatekeeper",
        version="0.1.0",
        description="Per-object privacy-budget gatekeeper for Local Differential Privacy: the "
        "Bayesian Privacy Filter and Odometer. Errors are application/problem+json.",
        lifespan=lifespan,
    )
    problems.install(app)

    @app.middleware("http")
    async def limit_body(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and not length.isdigit():
            return problems.problem(
                400, "bad-request", "Bad request", "the Content-Length header is not a number"
            )
        if length is not None and int(length) > settings.max_body_bytes:
            return problems.problem(
                413,
                "payload-too-large",
                "Payload too large",
                f"request bodies are limited to {settings.max_body_bytes} bytes",
            )
        return await call_next(request)

    # added last, so outermost: every response (413s too) gets a request id and a log line
    @app.middleware("http")
    async def request_context(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        incoming = request.headers.get("x-request-id", "")
        rid = incoming if 0 < len(incoming) <= 64 and incoming.isprintable() else uuid.uuid4().hex
        token = logs.request_id.set(rid)
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            response.headers["X-Request-ID"] = rid
            return response
        finally:
            route = request.scope.get("route")
            path = getattr(route, "path", "unmatched")
            access.info(
                "request",
                extra={
                    "method": request.method,
                    "path": getattr(route, "path", "unmatched"),
                    "status": status,
                    "duration_ms": round(1000 * (time.perf_counter() - start), 2),
                },
            )
            metrics.REQUESTS.labels(request.method, path, str(status)).observe(
                time.perf_counter() - start
            )
            logs.request_id.reset(token)

    app.include_router(objects.router)
    app.include_router(misc.router)
    return app


def app_factory() -> FastAPI:
    """Factory for ``uvicorn --factory app.api.main:app_factory``."""
    return create_app()

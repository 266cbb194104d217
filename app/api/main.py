"""The FastAPI application around a runtime built by the composition root (:mod:`app.bootstrap`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from app import metrics, multiproc
from app.api import openapi, problems
from app.api.deps import Runtime
from app.api.lean import LeanSubmit
from app.api.middleware import RequestContext
from app.api.routes import (
    audit,
    calculator,
    dashboard,
    health,
    imports,
    keys,
    objects,
    odometers,
    projects,
    surveys,
)
from app.services.auth import ensure_bootstrap_admin
from app.settings import Settings
from app.store import Conflict
from app.worker.threads import single_threaded_blas

log = logging.getLogger("gatekeeper")

#: FastAPI's native OpenTelemetry configuration: nothing traced, measured or logged by it.
TELEMETRY_OFF: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
    "auto_configure": False,
}


def create_app(settings: Settings, build_runtime: Callable[[Settings], Runtime]) -> FastAPI:
    """Build the application (migrations are run beforehand by ``gatekeeper serve``).

    ``build_runtime`` makes each process's :class:`Runtime` at start-up; the composition root
    (:func:`app.bootstrap.create_app`) gives it.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        single_threaded_blas()  # the worker processes are the parallelism (app.worker.threads)
        runtime = build_runtime(settings)
        app.state.runtime = runtime
        metrics.WEB_WORKERS.set(1)
        if settings.gatekeeper_bootstrap_admin_key:
            try:
                if ensure_bootstrap_admin(
                    engine=runtime.engine, secret=settings.gatekeeper_bootstrap_admin_key
                ):
                    log.info("bootstrap admin key registered")
            except Conflict:  # another uvicorn worker registered it at the same moment
                log.info("bootstrap admin key registered by another worker")
        yield
        if runtime.revocations is not None:
            runtime.revocations.stop()
        runtime.threads.shutdown(wait=True)  # the requests' threads have nothing left to run
        runtime.surveys.close()
        if runtime.housekeeping is not None:
            runtime.housekeeping.close()
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
        # FastAPI's own OpenTelemetry off: the service's logs and metrics are its own
        # (app.logs scrubs what it writes; an exporter would send exceptions' messages as they
        # are), and the check whether a provider is configured cost ≈ 4 µs on every request
        telemetry=TELEMETRY_OFF,
    )
    problems.install(app)
    openapi.install(app)

    # the submit's short road, inside the one middleware (app.api.lean): added first, so the
    # middleware added next wraps it
    app.add_middleware(LeanSubmit)
    # the one middleware: every response (429s and 413s too) gets a request id and a log
    # line; throttled and oversized requests never reach the routes or the database
    app.add_middleware(
        RequestContext,
        max_bytes=settings.max_body_bytes,
        per_second=settings.rate_limit_per_second,
        burst=settings.rate_limit_burst,
    )

    app.include_router(objects.router)
    for module in (odometers, imports, surveys, audit, calculator, keys, projects, health):
        app.include_router(module.router)
    app.include_router(dashboard.router)
    return app

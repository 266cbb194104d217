"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from app.api import scrape
from app.api.deps import RuntimeDep, in_thread
from app.api.openapi import answers, problems
from app.api.problems import problem
from app.services import schemas
from app.store import reading
from app.store.health import ping
from app.worker.fleet import fleet_status

router = APIRouter()


@router.get("/healthz", tags=["health"], **answers(schemas.Health))
async def healthz() -> schemas.Health:
    """The process is up."""
    return schemas.Health(status="ok")


@router.get(
    "/readyz",
    tags=["health"],
    **answers(schemas.Ready),
    responses=problems(503, s503="not-ready: the database or Redis is unavailable (checks)"),
)
async def readyz(runtime: RuntimeDep) -> Response:
    """The database (and Redis, and the broker, when configured) answer.

    With ``BROKER_URL`` the answer also counts the live worker nodes; none alive does not make
    the service unready: bound computations then fall back to basic composition (sound) and
    surveys wait in the queue.
    """
    extra: dict[str, Any] = {}  # the worker count, beside the checks

    def check() -> dict[str, str]:
        checks = {}
        try:
            with reading(runtime.engine) as conn:
                ping(conn)
            checks["database"] = "ok"
        except Exception:
            checks["database"] = "unavailable"
        if runtime.redis is not None:
            try:
                runtime.redis.ping()
                checks["redis"] = "ok"
            except Exception:
                checks["redis"] = "unavailable"
        if runtime.celery is not None:
            fleet = fleet_status(*runtime.celery)
            checks["broker"] = "ok" if None not in fleet.queues.values() else "unavailable"
            extra["workers"] = fleet.nodes
        return checks

    checks = await in_thread(runtime, check)
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ok", **checks, **extra})
    return problem(
        503,
        "not-ready",
        "Not ready",
        "a dependency is unavailable",
        headers={"Retry-After": "2"},
        checks=checks,
    )


@router.get(
    "/metrics",
    tags=["health"],
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Prometheus text exposition format",
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
        },
        **problems(503),
    },
)
async def metrics(runtime: RuntimeDep) -> Response:
    """Prometheus metrics, summed over the web workers, and object counts (docs/dashboard.md)."""
    body = await in_thread(runtime, scrape.render, runtime.engine, runtime.celery)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

"""Odometer summary, the loss calculator, keys, who am I, health and metrics."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response, status
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from app.api import examples, schemas, scrape
from app.api.deps import AdminDep, AnalystDep, JsonBody, RuntimeDep, ViewerDep, in_thread
from app.api.openapi import (
    AUTHENTICATED,
    WITH_BODY,
    body_doc,
    problems,
)
from app.api.problems import problem
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_object, as_string, check_keys
from app.services import audit
from app.services import objects as object_service
from app.services.audit import MAX_PAGE, AuditKind
from app.services.auth import Role, create_key, list_keys, revoke_key
from app.services.errors import NotFound

router = APIRouter()


@router.get("/v1/odometers", tags=["odometers"], responses=problems(*AUTHENTICATED))
async def odometers(
    runtime: RuntimeDep,
    _: ViewerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2_147_483_647)] = 0,
    remaining_lt: Annotated[float | None, Query(description="Only remaining < this")] = None,
    remaining_gt: Annotated[float | None, Query(description="Only remaining > this")] = None,
    include_retired: bool = False,
) -> dict[str, Any]:
    """A page of odometers across objects, filtered by remaining budget."""
    for name, bound in (("remaining_lt", remaining_lt), ("remaining_gt", remaining_gt)):
        if bound is not None and not math.isfinite(bound):
            raise InvalidInput(name, "must be a finite number")
    return await in_thread(
        runtime,
        object_service.list_odometers,
        session_factory=runtime.sessions,
        limit=limit,
        offset=offset,
        remaining_lt=remaining_lt,
        remaining_gt=remaining_gt,
        include_retired=include_retired,
    )


@router.get("/v1/audit", tags=["audit"], responses=problems(*AUTHENTICATED))
async def audit_log(
    runtime: RuntimeDep,
    _: AdminDep,
    # the pattern of registered ids: anything else (a NUL byte, which PostgreSQL refuses in
    # text, was a 500) is a 422 naming the parameter
    object_id: Annotated[str | None, Query(pattern=schemas.OBJECT_ID_PATTERN)] = None,
    kind: AuditKind | None = None,
    # ids are 32-bit integers: a larger ``after`` reached PostgreSQL and was a 500
    after: Annotated[int, Query(ge=0, le=2_147_483_647, description="Events with a larger id")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> dict[str, Any]:
    """The audit log (admin): registrations, retirements, keys, every submit decision.

    Oldest first; pass ``next_after`` back as ``after`` for the next page.
    """
    return await in_thread(
        runtime,
        audit.list_events,
        session_factory=runtime.sessions,
        object_id=object_id,
        kind=kind,
        after=after,
        limit=limit,
    )


@router.post(
    "/v1/loss",
    tags=["calculator"],
    responses=problems(*WITH_BODY),
    openapi_extra=body_doc(schemas.LossRequest, examples.LOSS),
)
async def loss(runtime: RuntimeDep, _: AnalystDep, body: JsonBody) -> dict[str, Any]:
    """The stateless loss calculator (DESIGN.md): realized loss of a history and a candidate."""
    as_object(body, "")
    return await runtime.worker.compute_async(body)


@router.post(
    "/v1/keys",
    tags=["keys"],
    status_code=status.HTTP_201_CREATED,
    responses=problems(*WITH_BODY),
    openapi_extra=body_doc(schemas.KeyRequest, examples.KEY),
)
async def new_key(
    runtime: RuntimeDep,
    caller: AdminDep,
    body: JsonBody,
) -> dict[str, Any]:
    """Create an API key (admin); the secret is shown once."""
    obj = as_object(body, "")
    check_keys(obj, "", required=("role",), optional=("label",))
    if not isinstance(obj["role"], str) or obj["role"] not in {r.value for r in Role}:
        raise InvalidInput("role", "must be one of admin, analyst, viewer")
    label = as_string(obj["label"], "label", max_len=200) if "label" in obj else None

    def create() -> dict[str, Any]:
        with runtime.sessions() as session, session.begin():
            row, secret = create_key(
                session=session, role=Role(obj["role"]), label=label, actor_key_id=caller.key_id
            )
            return {"id": row.id, "role": row.role, "label": row.label, "key": secret}

    return await in_thread(runtime, create)


@router.get("/v1/keys", tags=["keys"], responses=problems(*AUTHENTICATED))
async def list_api_keys(
    runtime: RuntimeDep,
    _: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        int, Query(ge=0, le=2_147_483_647, description="Return keys with id > after")
    ] = 0,
) -> dict[str, Any]:
    """API keys (admin): id, role, label, created and revoked times — never a secret."""

    def read() -> dict[str, Any]:
        with runtime.sessions() as session:
            return list_keys(session=session, limit=limit, after=after)

    return await in_thread(runtime, read)


@router.delete(
    "/v1/keys/{key_id}",
    tags=["keys"],
    responses=problems(
        *AUTHENTICATED, 404, 409, s404="No such key", s409="The last active admin key"
    ),
)
async def drop_key(
    runtime: RuntimeDep, caller: AdminDep, key_id: Annotated[int, Path(ge=1, le=2_147_483_647)]
) -> dict[str, Any]:
    """Revoke an API key (admin)."""

    def revoke() -> bool:
        with runtime.sessions() as session, session.begin():
            return revoke_key(session=session, key_id=key_id, actor_key_id=caller.key_id)

    if not await in_thread(runtime, revoke):
        raise NotFound("no key with that id")
    runtime.keys.forget(key_id)  # other processes: within AUTH_CACHE_SECONDS (KeyCache)
    return {"id": key_id, "revoked": True}


@router.get("/v1/whoami", tags=["keys"], responses=problems(*AUTHENTICATED))
async def whoami(caller: ViewerDep) -> dict[str, Any]:
    """The calling key's id and role (never its secret); 401 for a missing or bad key."""
    return {"key_id": caller.key_id, "role": caller.role.value}


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["health"],
    responses={
        200: {
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["status", "database"],
                        "properties": {
                            "status": {"const": "ok"},
                            "database": {"const": "ok"},
                            "redis": {"const": "ok"},
                        },
                    }
                }
            }
        },
        **problems(503, s503="not-ready: the database or Redis is unavailable (checks)"),
    },
)
async def readyz(runtime: RuntimeDep) -> Response:
    """The database (and Redis, when configured) answer."""

    def check() -> dict[str, str]:
        checks = {}
        try:
            with runtime.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception:
            checks["database"] = "unavailable"
        if runtime.redis is not None:
            try:
                runtime.redis.ping()
                checks["redis"] = "ok"
            except Exception:
                checks["redis"] = "unavailable"
        return checks

    checks = await in_thread(runtime, check)
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ok", **checks})
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
    body = await in_thread(runtime, scrape.render, runtime.sessions)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

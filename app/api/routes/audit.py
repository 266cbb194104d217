"""The audit log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.api.deps import AdminDep, RuntimeDep, in_thread
from app.api.openapi import (
    AUTHENTICATED,
    answers,
    problems,
)
from app.services import audit, schemas
from app.services.audit import MAX_PAGE, AuditKind

router = APIRouter()


@router.get(
    "/v1/audit",
    tags=["audit"],
    **answers(schemas.AuditPage),
    responses=problems(*AUTHENTICATED),
)
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
        engine=runtime.engine,
        object_id=object_id,
        kind=kind,
        after=after,
        limit=limit,
    )

"""The audit log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.deps import AdminDep, RuntimeDep, in_thread
from app.api.openapi import (
    AUTHENTICATED,
    answers,
    problems,
)
from app.services import audit, schemas
from app.services.audit import MAX_PAGE, AuditKind

router = APIRouter()

NDJSON = "application/x-ndjson"


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
) -> schemas.AuditPage:
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


@router.get(
    "/v1/audit/export",
    tags=["audit"],
    response_class=StreamingResponse,
    responses={
        # the media type is said in words: openapi-python-client refuses a response whose only
        # content type is application/x-ndjson (the generated client test wants no warning)
        200: {
            "description": "`application/x-ndjson`: the audit log from the start given to its "
            "end, one `AuditEvent` (as in `GET /v1/audit`) a line, oldest first",
        },
        **problems(*AUTHENTICATED),
    },
)
async def audit_export(
    runtime: RuntimeDep,
    _: AdminDep,
    after: Annotated[
        int | None,
        Query(ge=0, le=2_147_483_647, description="Start after this event id (a resumption)"),
    ] = None,
    since: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Start at this RFC 3339 time (with an offset); not with after",
        ),
    ] = None,
) -> StreamingResponse:
    """The audit log as NDJSON (admin), for outside ledgers.

    Oldest first, from ``after`` (an event id) or ``since`` (a time), to the end; streamed in
    keyset pages. Each line is an event as in ``GET /v1/audit``: pass the last line's ``id`` as
    ``after`` to resume an interrupted export.
    """
    start, at = audit.export_start(after=after, since=since)
    # a sync iterator: Starlette reads it in its thread pool, one page per statement
    lines = audit.export_lines(engine=runtime.engine, after=start, since=at)
    return StreamingResponse(lines, media_type=NDJSON)

"""Objects, dry-runs, submits, history and odometers of one object."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status

from app.api import examples
from app.api.deps import AdminDep, AnalystDep, JsonBody, RuntimeDep, ViewerDep, body_doc, in_thread
from app.engine.jsonfields import as_object, check_keys
from app.services import objects as object_service
from app.services import queries as query_service
from app.services.auth import Role

router = APIRouter(prefix="/v1/objects", tags=["objects"])

PROBLEMS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid API key (problem+json)"},
    403: {"description": "The key's role may not do this (problem+json)"},
    404: {"description": "No such object (problem+json)"},
    422: {"description": "Invalid input, naming the field (problem+json)"},
}


def _query_of(body: Any) -> Any:
    obj = as_object(body, "")
    check_keys(obj, "", required=("query",))
    return obj["query"]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    openapi_extra=body_doc(examples.REGISTER),
    responses={**PROBLEMS, 409: {"description": "An object with this id exists"}},
)
async def register(
    runtime: RuntimeDep,
    caller: AdminDep,
    body: JsonBody,
) -> dict[str, Any]:
    """Register a protected object (admin). The value is stored and never returned."""
    return await in_thread(
        runtime,
        object_service.register_object,
        session_factory=runtime.sessions,
        body=body,
        limits=runtime.limits,
        actor_key_id=caller.key_id,
    )


@router.get("/{object_id}", responses=PROBLEMS)
async def get_object(runtime: RuntimeDep, caller: AnalystDep, object_id: str) -> dict[str, Any]:
    """Metadata of an object: domain, budget, filter, odometer — never the value."""
    return await in_thread(
        runtime, object_service.get_object, session_factory=runtime.sessions, object_id=object_id
    )


@router.delete("/{object_id}", responses=PROBLEMS)
async def retire(runtime: RuntimeDep, caller: AdminDep, object_id: str) -> dict[str, Any]:
    """Retire an object (admin): it answers no more queries; its history is kept."""
    return await in_thread(
        runtime,
        object_service.retire_object,
        session_factory=runtime.sessions,
        object_id=object_id,
        actor_key_id=caller.key_id,
    )


@router.post("/{object_id}/dry-run", responses=PROBLEMS, openapi_extra=body_doc(examples.QUERY))
async def dry_run(
    runtime: RuntimeDep,
    _: AnalystDep,
    object_id: str,
    body: JsonBody,
) -> dict[str, Any]:
    """Would the filter accept this query now? Nothing changes; a rejection is a normal 200."""
    query = _query_of(body)
    return await in_thread(
        runtime,
        query_service.dry_run,
        engine=runtime.engine,
        worker=runtime.worker,
        object_id=object_id,
        query=query,
        limits=runtime.limits,
    )


@router.post(
    "/{object_id}/queries",
    status_code=status.HTTP_201_CREATED,
    openapi_extra=body_doc(examples.QUERY),
    responses={
        **PROBLEMS,
        409: {
            "description": "budget-exhausted: the filter rejected the query (with the loss "
            "now and the worst case after), or the object is retired"
        },
        503: {"description": "busy: too much contention on the object; retry (Retry-After)"},
    },
)
async def submit(
    runtime: RuntimeDep,
    caller: AnalystDep,
    object_id: str,
    response: Response,
    body: JsonBody,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Makes the submit safe to retry: a retry with the same key and body "
            "returns the stored output (header Idempotent-Replayed: true), never a new sample. "
            "Without it a retry may spend budget twice.",
        ),
    ] = None,
) -> dict[str, Any]:
    """Run an accepted query: sample its output from the true value, record it, return it."""
    query = _query_of(body)
    outcome = await in_thread(
        runtime,
        query_service.submit,
        engine=runtime.engine,
        worker=runtime.worker,
        locks=runtime.locks,
        object_id=object_id,
        query=query,
        idempotency_key=idempotency_key,
        analyst_key_id=caller.key_id,
        limits=runtime.limits,
        attempts=runtime.settings.submit_attempts,
    )
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return outcome.body


@router.get("/{object_id}/queries", responses=PROBLEMS)
async def history(
    runtime: RuntimeDep,
    caller: AnalystDep,
    object_id: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        int, Query(ge=0, le=2_147_483_647, description="Return queries with seq > after")
    ] = 0,
) -> dict[str, Any]:
    """Accepted queries with their outputs; an analyst sees only its own."""
    own = caller.key_id if caller.role is Role.ANALYST else None
    return await in_thread(
        runtime,
        query_service.list_queries,
        session_factory=runtime.sessions,
        object_id=object_id,
        analyst_key_id=own,
        limit=limit,
        after=after,
    )


@router.get("/{object_id}/odometer", responses=PROBLEMS)
async def odometer(runtime: RuntimeDep, _: ViewerDep, object_id: str) -> dict[str, Any]:
    """Realized loss (certified bounds), remaining budget, basic composition, counts."""
    return await in_thread(
        runtime, object_service.get_odometer, session_factory=runtime.sessions, object_id=object_id
    )


@router.get("/{object_id}/odometer/history", responses=PROBLEMS)
async def odometer_history(
    runtime: RuntimeDep,
    _: ViewerDep,
    object_id: str,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    after: Annotated[int, Query(ge=0, le=2_147_483_647)] = 0,
) -> dict[str, Any]:
    """The loss after each accepted query, for charts."""
    return await in_thread(
        runtime,
        object_service.odometer_history,
        session_factory=runtime.sessions,
        object_id=object_id,
        limit=limit,
        after=after,
    )

"""Objects, dry-runs, submits, history and odometers of one object."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response, status

from app.api import examples
from app.api.deps import (
    AdminDep,
    AnalystDep,
    Caller,
    JsonBody,
    RuntimeDep,
    ViewerDep,
    in_thread,
    typed_body,
)
from app.api.direct import DirectRoute
from app.api.openapi import (
    AUTHENTICATED,
    WITH_BODY,
    answers,
    body_doc,
    problems,
)
from app.services import objects as object_service
from app.services import queries as query_service
from app.services import schemas
from app.services import versions as version_service
from app.services.errors import BadHeader
from app.services.reuse import reuse_owner
from app.services.schemas import Role

#: The submit's hot path: its dependencies solved by a plan made once (app.api.direct).
router = APIRouter(prefix="/v1/objects", tags=["objects"], route_class=DirectRoute)

#: The errors of every operation on one object.
PROBLEMS = problems(*AUTHENTICATED, 404, s404="No such object")
#: Any id: one that cannot have been registered (ID_PATTERN) is simply not found (404).
ObjectId = Annotated[str, Path(description="The object's id")]
#: The body of a dry-run and a submit.
QueryBody = Annotated[schemas.QueryRequest, typed_body(schemas.QueryRequest)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    **answers(schemas.ObjectView),
    openapi_extra=body_doc(schemas.RegisterRequest, examples.REGISTER),
    responses=problems(*WITH_BODY, 409, s409="already-exists: an object with this id exists"),
)
async def register(
    runtime: RuntimeDep,
    caller: AdminDep,
    body: JsonBody,
) -> schemas.ObjectView:
    """Register a protected object (admin). The value is stored and never returned."""
    # the use case validates the body (schemas.RegisterRequest, as imports do per item)
    return await in_thread(
        runtime,
        object_service.register_object,
        engine=runtime.engine,
        body=body,
        limits=runtime.limits,
        actor_key_id=caller.key_id,
    )


@router.get("/{object_id}", **answers(schemas.ObjectView), responses=PROBLEMS)
async def get_object(
    runtime: RuntimeDep, caller: AnalystDep, object_id: ObjectId
) -> schemas.ObjectView:
    """Metadata of an object: domain, budget, filter, odometer — never the value."""
    return await in_thread(
        runtime,
        object_service.get_object,
        engine=runtime.engine,
        object_id=object_id,
        scope=caller.scope,
    )


@router.delete("/{object_id}", **answers(schemas.ObjectView), responses=PROBLEMS)
async def retire(runtime: RuntimeDep, caller: AdminDep, object_id: ObjectId) -> schemas.ObjectView:
    """Retire an object (admin): it answers no more queries; its history is kept."""
    return await in_thread(
        runtime,
        object_service.retire_object,
        engine=runtime.engine,
        object_id=object_id,
        actor_key_id=caller.key_id,
    )


@router.post(
    "/{object_id}/versions",
    status_code=status.HTTP_201_CREATED,
    **answers(schemas.VersionCreated),
    openapi_extra=body_doc(schemas.VersionRequest, examples.VERSION),
    responses=problems(
        *WITH_BODY,
        404,
        409,
        s404="No such object",
        s409="object-retired: a retired object takes no new version",
    ),
)
async def new_version(
    runtime: RuntimeDep,
    caller: AdminDep,
    object_id: ObjectId,
    body: Annotated[schemas.VersionRequest, typed_body(schemas.VersionRequest)],
) -> schemas.VersionCreated:
    """Give the object a new value (admin); its current version is closed, history kept.

    Queries from now on read the new value under a fresh per-version filter, within the
    object's lifetime budget. The value is checked against the domain and never returned.
    """
    item = version_service.parse_single(object_id, body)
    return await in_thread(
        runtime,
        version_service.create_versions,
        engine=runtime.engine,
        locks=runtime.locks,
        items=[item],
        actor_key_id=caller.key_id,
        bulk=False,
    )


@router.post(
    "/{object_id}/dry-run",
    **answers(schemas.Decision),
    responses=problems(*WITH_BODY, 404, 409, s404="No such object", s409="object-retired"),
    openapi_extra=body_doc(schemas.QueryRequest, examples.QUERY),
)
async def dry_run(
    runtime: RuntimeDep,
    caller: AnalystDep,
    object_id: ObjectId,
    body: QueryBody,
) -> schemas.Decision:
    """Would the filter accept this query now? Nothing changes; a rejection is a normal 200."""
    return await in_thread(
        runtime,
        query_service.dry_run,
        engine=runtime.engine,
        worker=runtime.worker,
        object_id=object_id,
        query=body.written("query"),
        limits=runtime.limits,
        scope=caller.scope,
        reuse=body.reuse,
        reuse_owner=_reuse_owner(caller),
    )


def _reuse_owner(caller: Caller) -> int | None:
    """Whose stored answers the caller may reuse (its own; an unscoped admin's: anyone's)."""
    return reuse_owner(
        caller.key_id, admin=caller.role is Role.ADMIN, scoped=caller.scope is not None
    )


@router.post(
    "/{object_id}/queries",
    status_code=status.HTTP_201_CREATED,
    **answers(schemas.SubmitResult),
    openapi_extra=body_doc(schemas.QueryRequest, examples.QUERY),
    responses={
        200: {
            "model": schemas.SubmitResult,
            "description": 'With `"reuse": true`: a stored identical answer of the current data '
            'version (`"reused": true`), nothing charged or recorded',
        },
        **problems(
            *WITH_BODY,
            404,
            409,
            s404="No such object",
            s409="budget-exhausted: the object's filter rejected the query (with the loss now and "
            "the worst case after); quota-exhausted: a project key's quota rejected it on the "
            "project's own sub-history; or object-retired",
            s503="busy: too much contention on the object, or the database is unavailable; retry "
            "after Retry-After",
        ),
    },
)
async def submit(
    runtime: RuntimeDep,
    caller: AnalystDep,
    object_id: ObjectId,
    response: Response,
    body: QueryBody,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Makes the submit safe to retry: a retry with the same key and body "
            "returns the stored answer (header Idempotent-Replayed: true) — the output, never a "
            "new sample, or the stored 409 of a rejection. Without it a retry may spend budget "
            "twice. An empty or blank key is a 400.",
            # documented, checked by the route (a 400 naming the header, not FastAPI's 422)
            # blank = only spaces and tabs, HTTP's optional whitespace (the same rule as below)
            json_schema_extra={"minLength": 1, "pattern": "[^ \t]"},
        ),
    ] = None,
) -> schemas.SubmitResult:
    """Run an accepted query: sample its output from the true value, record it, return it.

    With ``"reuse": true``, a stored answer of the identical query from the object's current
    data version is returned instead (status 200, ``"reused": true``), charging nothing.
    """
    if idempotency_key is not None and not idempotency_key.strip(" \t"):
        # an empty key used to be taken as no key: a retry could then spend budget twice
        raise BadHeader("Idempotency-Key", "must not be empty")
    outcome = await in_thread(
        runtime,
        query_service.submit,
        engine=runtime.engine,
        worker=runtime.worker,
        locks=runtime.locks,
        object_id=object_id,
        query=body.written("query"),
        idempotency_key=idempotency_key,
        analyst_key_id=caller.key_id,
        limits=runtime.limits,
        attempts=runtime.settings.submit_attempts,
        scope=caller.scope,
        reuse=body.reuse,
        reuse_owner=_reuse_owner(caller),
    )
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    if outcome.reused:
        response.status_code = status.HTTP_200_OK
        return outcome.body
    if "reused" in outcome.body.model_fields_set:  # an accepted submit's own body: set
        return outcome.body
    return outcome.body.model_copy(update={"reused": False})


@router.get("/{object_id}/queries", **answers(schemas.HistoryPage), responses=PROBLEMS)
async def history(
    runtime: RuntimeDep,
    caller: AnalystDep,
    object_id: ObjectId,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        int, Query(ge=0, le=2_147_483_647, description="Return queries with seq > after")
    ] = 0,
    version: Annotated[
        int | None,
        Query(ge=1, le=2_147_483_647, description="The data version (default: the current one)"),
    ] = None,
) -> schemas.HistoryPage:
    """Accepted queries of one data version with their outputs; an analyst sees only its own."""
    own = caller.key_id if caller.role is Role.ANALYST else None
    return await in_thread(
        runtime,
        query_service.list_queries,
        engine=runtime.engine,
        object_id=object_id,
        analyst_key_id=own,
        limit=limit,
        after=after,
        version=version,
        scope=caller.scope,
    )


@router.get("/{object_id}/odometer", **answers(schemas.Odometer), responses=PROBLEMS)
async def odometer(runtime: RuntimeDep, caller: ViewerDep, object_id: ObjectId) -> schemas.Odometer:
    """Realized loss (certified bounds), remaining budget, basic composition, counts."""
    return await in_thread(
        runtime,
        object_service.get_odometer,
        engine=runtime.engine,
        object_id=object_id,
        scope=caller.scope,
        projects=caller.role is Role.ADMIN,
    )


@router.get("/{object_id}/odometer/history", **answers(schemas.OdometerHistory), responses=PROBLEMS)
async def odometer_history(
    runtime: RuntimeDep,
    caller: ViewerDep,
    object_id: ObjectId,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    after: Annotated[int, Query(ge=0, le=2_147_483_647)] = 0,
    version: Annotated[
        int | None,
        Query(ge=1, le=2_147_483_647, description="The data version (default: the current one)"),
    ] = None,
) -> schemas.OdometerHistory:
    """The loss after each accepted query of one data version, for charts."""
    return await in_thread(
        runtime,
        object_service.odometer_history,
        engine=runtime.engine,
        object_id=object_id,
        limit=limit,
        after=after,
        version=version,
        scope=caller.scope,
    )

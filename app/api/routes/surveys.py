"""Population surveys: create, dry-run, follow, list, page the responses, cancel."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response, status

from app.api import examples
from app.api.deps import AnalystDep, Runtime, RuntimeDep, ViewerDep, in_thread, typed_body
from app.api.openapi import AUTHENTICATED, WITH_BODY, answers, body_doc, problems
from app.services import schemas
from app.services import surveys as survey_service
from app.services.errors import BadHeader
from app.services.reuse import reuse_owner
from app.services.schemas import Role

#: The body of a survey and of its dry-run.
SurveyBody = Annotated[schemas.SurveyRequest, typed_body(schemas.SurveyRequest)]

router = APIRouter(prefix="/v1/surveys", tags=["surveys"])

SurveyId = Annotated[int, Path(ge=1, le=2_147_483_647, description="The survey's id")]
_COHORT_422 = (
    "Invalid input naming the field, or invalid-cohort: it matches no object, names unknown "
    "ids (listed in unknown_ids), or exceeds SURVEY_MAX_MEMBERS"
)


async def _with_workers(
    runtime: Runtime, views: list[schemas.SurveyView]
) -> list[schemas.SurveyView]:
    """The views with ``waiting_for_workers`` (the job runner is asked only when one waits)."""
    no_workers = False
    if any(survey_service.waits_on_workers(v) for v in views):
        no_workers = await in_thread(runtime, runtime.surveys.waiting_for_workers)
    return [survey_service.with_workers(v, no_workers=no_workers) for v in views]


def _fingerprint(body: Any) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    **answers(schemas.SurveyView),
    openapi_extra=body_doc(schemas.SurveyRequest, examples.SURVEY),
    responses=problems(*WITH_BODY, s422=_COHORT_422),
)
async def create_survey(
    runtime: RuntimeDep,
    caller: AnalystDep,
    response: Response,
    body: SurveyBody,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="A retry with the same key and body returns the survey created first "
            "(header Idempotent-Replayed: true), never a second survey",
            json_schema_extra={"minLength": 1, "pattern": "[^ \t]"},
        ),
    ] = None,
) -> schemas.SurveyView:
    """Ask one query of every member of a cohort (analyst); it runs in the background."""
    if idempotency_key is not None and not idempotency_key.strip(" \t"):
        raise BadHeader("Idempotency-Key", "must not be empty")
    max_members = runtime.settings.survey_max_members
    request = survey_service.survey_request(body, max_members=max_members)
    view, replayed = await in_thread(
        runtime,
        survey_service.create_survey,
        engine=runtime.engine,
        request=request,
        fingerprint=_fingerprint(body.written()),
        idempotency_key=idempotency_key,
        analyst_key_id=caller.key_id,
        max_members=max_members,
        limits=runtime.limits,
        chunk_size=runtime.settings.survey_chunk_size,
        scope=caller.scope,
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/surveys/{view.id}"
    runtime.surveys.start(view.id)
    return (await _with_workers(runtime, [view]))[0]


@router.post(
    "/dry-run",
    **answers(schemas.SurveyDryRun),
    openapi_extra=body_doc(schemas.SurveyRequest, examples.SURVEY),
    responses=problems(*WITH_BODY, s422=_COHORT_422),
)
async def survey_dry_run(
    runtime: RuntimeDep, caller: AnalystDep, body: SurveyBody
) -> schemas.SurveyDryRun:
    """How a survey would go now: members, would accept, refusals by reason, groups."""
    max_members = runtime.settings.survey_max_members
    request = survey_service.survey_request(body, max_members=max_members)
    return await in_thread(
        runtime,
        survey_service.dry_run_survey,
        engine=runtime.engine,
        worker=runtime.worker,
        request=request,
        limits=runtime.limits,
        max_members=max_members,
        scope=caller.scope,
        reuse_owner=reuse_owner(
            caller.key_id, admin=caller.role is Role.ADMIN, scoped=caller.scope is not None
        ),
    )


@router.get("", **answers(schemas.SurveyPage), responses=problems(*AUTHENTICATED))
async def list_surveys(
    runtime: RuntimeDep,
    caller: ViewerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=2_147_483_647, description="Surveys with id < before")
    ] = None,
) -> schemas.SurveyPage:
    """Surveys, newest first."""
    page = await in_thread(
        runtime,
        survey_service.list_surveys,
        engine=runtime.engine,
        limit=limit,
        before=before,
        caller_key_id=caller.key_id,
        is_admin=caller.role is Role.ADMIN,
        scope=caller.scope,
    )
    return page.model_copy(update={"items": await _with_workers(runtime, page.items)})


_NOT_FOUND = problems(*AUTHENTICATED, 404, s404="No such survey")


@router.get("/{survey_id:int}", **answers(schemas.SurveyView), responses=_NOT_FOUND)
async def get_survey(
    runtime: RuntimeDep, caller: ViewerDep, survey_id: SurveyId
) -> schemas.SurveyView:
    """Status, progress, refusals by reason and the estimate with its error.

    ``waiting_for_workers``: true while members are left to decide and, with ``BROKER_URL``
    set, no ``gatekeeper worker`` runs surveys (no live heartbeat of a surveys node).
    """
    view = await in_thread(
        runtime,
        survey_service.get_survey,
        engine=runtime.engine,
        survey_id=survey_id,
        caller_key_id=caller.key_id,
        is_admin=caller.role is Role.ADMIN,
        scope=caller.scope,
    )
    return (await _with_workers(runtime, [view]))[0]


@router.get(
    "/{survey_id:int}/responses", **answers(schemas.SurveyResponsePage), responses=_NOT_FOUND
)
async def survey_responses(
    runtime: RuntimeDep,
    caller: ViewerDep,
    survey_id: SurveyId,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None,
        Query(
            max_length=128,
            pattern=schemas.OBJECT_ID_PATTERN,
            description="The previous page's next_after (an object id)",
        ),
    ] = None,
) -> schemas.SurveyResponsePage:
    """Each member's decision; outputs only for the survey's analyst and admins."""
    return await in_thread(
        runtime,
        survey_service.list_responses,
        engine=runtime.engine,
        survey_id=survey_id,
        limit=limit,
        after=after,
        caller_key_id=caller.key_id,
        is_admin=caller.role is Role.ADMIN,
        scope=caller.scope,
    )


@router.delete(
    "/{survey_id:int}",
    **answers(schemas.SurveyView),
    responses=problems(*AUTHENTICATED, 404, s404="No such survey"),
)
async def cancel_survey(
    runtime: RuntimeDep, caller: AnalystDep, survey_id: SurveyId
) -> schemas.SurveyView:
    """Cancel: members not yet decided are not queried; accepted answers stay."""
    view = await in_thread(
        runtime,
        survey_service.cancel_survey,
        engine=runtime.engine,
        survey_id=survey_id,
        caller_key_id=caller.key_id,
        is_admin=caller.role is Role.ADMIN,
        scope=caller.scope,
    )
    if view.status == "cancelled":
        await in_thread(runtime, runtime.surveys.cancelled, survey_id)
    return (await _with_workers(runtime, [view]))[0]

"""The odometer summary of every object (dashboards)."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import RuntimeDep, ViewerDep, in_thread
from app.api.openapi import (
    AUTHENTICATED,
    answers,
    problems,
)
from app.engine.errors import InvalidInput
from app.services import objects as object_service
from app.services import schemas

router = APIRouter()

#: ``name:value`` of a label filter (the server's rule: app.services.objects.parse_label_filters).
LABEL_FILTER = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}:[^\x00-\x1f\x7f]{1,256}$"
#: The start of an object id: the characters an id may hold (app.services.objects.ID_PATTERN).
ID_PREFIX = r"^[A-Za-z0-9._:@-]{1,128}$"


class OdometerStatus(StrEnum):
    """The statuses a list may ask for (one definition each, shared with the metrics)."""

    ACTIVE = "active"
    EXHAUSTED = "exhausted"
    NEAR_EXHAUSTION = "near_exhaustion"
    RETIRED = "retired"


LabelsQuery = Annotated[
    list[str],
    Query(
        max_length=20,
        description="Only objects with this label, as name:value (repeat: all must match)",
        json_schema_extra={"items": {"type": "string", "pattern": LABEL_FILTER}},
    ),
]
PrefixQuery = Annotated[
    str | None,
    Query(pattern=ID_PREFIX, description="Only objects whose id starts with this (exact case)"),
]


@router.get(
    "/v1/odometers",
    tags=["odometers"],
    **answers(schemas.OdometerPage),
    responses=problems(*AUTHENTICATED),
)
async def odometers(
    runtime: RuntimeDep,
    caller: ViewerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2_147_483_647)] = 0,
    remaining_lt: Annotated[float | None, Query(description="Only remaining < this")] = None,
    remaining_gt: Annotated[float | None, Query(description="Only remaining > this")] = None,
    include_retired: bool = False,
    label: LabelsQuery = [],  # noqa: B006 - FastAPI copies the default
    id_prefix: PrefixQuery = None,
    status: Annotated[
        OdometerStatus | None,
        Query(
            description="Only objects with this status: active, exhausted (active, remaining "
            "below the smallest query epsilon), near_exhaustion (active, remaining below 0.1 of "
            "the budget, the exhausted included; the gatekeeper_objects_near_exhaustion gauge) "
            "or retired. Without it: active ones (and retired ones with include_retired)"
        ),
    ] = None,
    after: Annotated[
        str | None,
        Query(
            pattern=schemas.OBJECT_ID_PATTERN,
            description="Start after this id (keyset paging: pass the last item's id)",
        ),
    ] = None,
) -> schemas.OdometerPage:
    """A page of odometers across objects in id order, filtered.

    By id prefix, status, remaining budget and labels; ``after`` (the last id seen) pages
    through any number of objects.
    """
    for name, bound in (("remaining_lt", remaining_lt), ("remaining_gt", remaining_gt)):
        if bound is not None and not math.isfinite(bound):
            raise InvalidInput(name, "must be a finite number")
    return await in_thread(
        runtime,
        object_service.list_odometers,
        engine=runtime.engine,
        limit=limit,
        offset=offset,
        remaining_lt=remaining_lt,
        remaining_gt=remaining_gt,
        include_retired=include_retired,
        labels=object_service.parse_label_filters(label),
        id_prefix=id_prefix,
        status=None if status is None else status.value,
        after=after,
        scope=caller.scope,
    )


@router.get(
    "/v1/odometers/totals",
    tags=["odometers"],
    **answers(schemas.OdometerTotals),
    responses=problems(*AUTHENTICATED),
)
async def odometer_totals(
    runtime: RuntimeDep,
    caller: ViewerDep,
    label: LabelsQuery = [],  # noqa: B006 - FastAPI copies the default
    id_prefix: PrefixQuery = None,
    include_retired: Annotated[
        bool, Query(description="objects and rejected cover retired objects too")
    ] = False,
) -> schemas.OdometerTotals:
    """How many objects carry the labels (and id prefix), by status; rejected submits summed.

    ``objects`` is the ``total`` of ``GET /v1/odometers`` with the same parameters; the counts
    by status are every matching object's, and unfiltered they are the Prometheus gauges' (one
    definition of each status).
    """
    return await in_thread(
        runtime,
        object_service.odometer_totals,
        engine=runtime.engine,
        labels=object_service.parse_label_filters(label),
        id_prefix=id_prefix,
        include_retired=include_retired,
        scope=caller.scope,
    )

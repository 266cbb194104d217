"""The odometer summary of every object (dashboards)."""

from __future__ import annotations

import math
from typing import Annotated, Any

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
    label: Annotated[
        list[str],
        Query(
            max_length=20,
            description="Only objects with this label, as name:value (repeat: all must match)",
            json_schema_extra={"items": {"type": "string", "pattern": LABEL_FILTER}},
        ),
    ] = [],  # noqa: B006 - FastAPI copies the default
) -> dict[str, Any]:
    """A page of odometers across objects, filtered by remaining budget and labels."""
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
        scope=caller.scope,
    )

"""The loss calculator (``POST /v1/loss``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from app.api import examples
from app.api.deps import AnalystDep, RuntimeDep, typed_body
from app.api.openapi import (
    WITH_BODY,
    answers,
    body_doc,
    problems,
)
from app.services import calculator, schemas

router = APIRouter()


@router.post(
    "/v1/loss",
    tags=["calculator"],
    **answers(schemas.LossResult),
    responses=problems(*WITH_BODY),
    openapi_extra=body_doc(schemas.LossRequest, examples.LOSS),
)
async def loss(
    runtime: RuntimeDep,
    _: AnalystDep,
    body: Annotated[schemas.LossRequest, typed_body(schemas.LossRequest)],
) -> schemas.LossResult:
    """The stateless loss calculator (contract.md): realized loss of a history and a candidate."""
    # the engine computes from the request as written (decimals as written, against its domain)
    return await calculator.compute_loss(worker=runtime.worker, request=body.written())

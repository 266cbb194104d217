"""The stateless loss calculator as a use case: ``POST /v1/loss`` (and ``gatekeeper loss``).

The request is answered by :func:`app.engine.calculator.compute_loss` — the same pipeline as
every decision (:mod:`app.engine.pipeline`) — in the bound worker, with its cache, time limit
and basic-composition fallback (:class:`app.worker.pool.BoundWorker`).
"""

from __future__ import annotations

from typing import Any

from app.services.schemas import LossResult
from app.worker.pool import BoundWorker


async def compute_loss(*, worker: BoundWorker, request: Any) -> LossResult:
    """The calculator's answer to ``request`` as written (``InvalidInput`` names a bad field).

    The route validated its structure (:class:`app.services.schemas.LossRequest`); the engine
    parses it against its domain and answers JSON (it crosses the worker's process boundary),
    read here into its model.
    """
    return LossResult.model_validate(await worker.compute_async(request))

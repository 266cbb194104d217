"""Odometers and survey responses as pandas DataFrames (the ``pandas`` extra).

``pip install 'ldp-gatekeeper-client[pandas]'``; without pandas these functions raise
:class:`ImportError` saying so, and nothing else of the client needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ldp_gatekeeper_client.models import OdometerSummary, SurveyResponse

ODOMETER_COLUMNS = [
    "id",
    "filter",
    "status",
    "budget",
    "realized_loss_lower",
    "realized_loss_upper",
    "remaining",
    "basic_composition",
    "accepted",
    "rejected",
    "updated_at",
    "labels",
]
RESPONSE_COLUMNS = ["object_id", "decision", "reason", "output"]


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "DataFrames need pandas: pip install 'ldp-gatekeeper-client[pandas]'"
        ) from exc
    return pandas


def odometers_frame(items: Iterable[OdometerSummary]) -> Any:
    """One row per object, the loss bounds in two columns, indexed by nothing (``id`` column)."""
    pandas = _pandas()
    rows = [
        {
            "id": item.id,
            "filter": item.filter,
            "status": item.status,
            "budget": item.budget,
            "realized_loss_lower": item.realized_loss.lower,
            "realized_loss_upper": item.realized_loss.upper,
            "remaining": item.remaining,
            "basic_composition": item.basic_composition,
            "accepted": item.accepted,
            "rejected": item.rejected,
            "updated_at": item.updated_at,
            "labels": dict(item.labels),
        }
        for item in items
    ]
    return pandas.DataFrame(rows, columns=ODOMETER_COLUMNS)


def responses_frame(items: Iterable[SurveyResponse]) -> Any:
    """One row per survey member: ``object_id``, ``decision``, ``reason``, ``output``."""
    pandas = _pandas()
    rows = [
        {
            "object_id": item.object_id,
            "decision": item.decision,
            "reason": item.reason,
            "output": item.output,
        }
        for item in items
    ]
    return pandas.DataFrame(rows, columns=RESPONSE_COLUMNS)

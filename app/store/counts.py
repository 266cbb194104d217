"""The aggregates ``GET /metrics`` reads at each scrape: objects, stored states, surveys."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table, func, select

from app.db.models import Survey
from app.store.base import Tx
from app.store.objects import ObjectTotals, totals

_SURVEYS = cast(Table, Survey.__table__)
_BY_STATUS = select(_SURVEYS.c.status, func.count()).group_by(_SURVEYS.c.status)


def count_objects(conn: Tx) -> ObjectTotals:
    """Every object's counts by status, as ``object_counts`` keeps them (no scan of objects).

    The statuses are :mod:`app.store.objects`' conditions, the ones the odometers list and its
    totals (the dashboard) use: near exhaustion is active with ``budget - loss_upper`` (as in
    the odometer) below ``NEAR_EXHAUSTION_FRACTION`` of the budget. The triggers of migration
    0014 keep the counts in every writer's statement.
    """
    return totals(conn)


def surveys_by_status(conn: Tx) -> dict[str, int]:
    """How many surveys are in each status that has any."""
    return {str(status): int(count) for status, count in conn.execute(_BY_STATUS)}

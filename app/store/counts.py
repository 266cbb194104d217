"""The aggregates ``GET /metrics`` reads at each scrape: objects, stored states, surveys."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import cast

from sqlalchemy import Numeric, Table, case, func, literal, select
from sqlalchemy import cast as sql_cast

from app.db.models import Survey
from app.store.base import Tx
from app.store.objects import OBJECTS

_SURVEYS = cast(Table, Survey.__table__)
_BY_STATUS = select(_SURVEYS.c.status, func.count()).group_by(_SURVEYS.c.status)


@dataclass(frozen=True)
class ObjectCounts:
    """Objects in all, active ones, and active ones near exhaustion."""

    total: int
    active: int
    near_exhaustion: int


def count_objects(conn: Tx, *, near_fraction: float) -> ObjectCounts:
    """One aggregate query (a scan of the objects table).

    Near exhaustion: active, remaining (``budget - loss_upper``, as in the odometer) below
    ``near_fraction`` of the budget.
    """
    active = OBJECTS.c.retired_at.is_(None)
    # In NUMERIC, not double precision: PostgreSQL raises "value out of range: underflow" when a
    # float product rounds to zero (0.1 * a budget of 5e-324, stored before budgets had a
    # floor), and one such row made every scrape a 500. NUMERIC arithmetic is exact here.
    budget = sql_cast(OBJECTS.c.budget, Numeric)
    remaining = budget - sql_cast(OBJECTS.c.loss_upper, Numeric)
    near = active & (remaining < literal(Decimal(repr(near_fraction)), Numeric) * budget)
    statement = select(
        func.count(),
        func.coalesce(func.sum(case((active, 1), else_=0)), 0),
        func.coalesce(func.sum(case((near, 1), else_=0)), 0),
    ).select_from(OBJECTS)
    total, active_count, near_count = conn.execute(statement).one()
    return ObjectCounts(int(total), int(active_count), int(near_count))


def surveys_by_status(conn: Tx) -> dict[str, int]:
    """How many surveys are in each status that has any."""
    return {str(status): int(count) for status, count in conn.execute(_BY_STATUS)}

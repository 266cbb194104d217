"""An object's stored history: its single submits (table ``queries``) and rejected submits.

Survey answers live in their chunks (:mod:`app.store.chunks`);
:func:`app.services.history.object_history` merges both kinds, and its consistency argument
(entries numbered ``<= accepted``) is why the readers here take an ``upto``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, bindparam, func, select

from app.db.models import ApiKey, AuditEvent, QueryRecord, Survey
from app.store.base import Tx

_QUERIES = cast(Table, QueryRecord.__table__)
_SURVEYS = cast(Table, Survey.__table__)
_EVENTS = cast(Table, AuditEvent.__table__)
_KEYS = cast(Table, ApiKey.__table__)


def _project_keys(project_id: int) -> Any:
    """The ids of the keys of project ``project_id`` (a subquery)."""
    return select(_KEYS.c.id).where(_KEYS.c.project_id == project_id).scalar_subquery()


@dataclass(frozen=True)
class HistoryItem:
    """One accepted query of an object's history (stored JSON texts for query and output)."""

    seq: int
    query: str
    output: str
    epsilon: float
    epsilon_exact: str
    loss_lower: float
    loss_upper: float
    basic_after: float
    created_at: datetime | None
    #: The ``queries`` row of a single submit (None: a survey answer).
    query_id: int | None
    #: The survey that asked it (None: a single submit).
    survey_id: int | None


_COUNT_SUBMITS = (
    select(func.count())
    .select_from(_QUERIES)
    .where(_QUERIES.c.object_id == bindparam("object_id"), _QUERIES.c.seq <= bindparam("upto"))
)


def count_submits(conn: Tx, *, object_id: str, upto: int) -> int:
    """How many single submits of the object are numbered ``<= upto``."""
    return int(conn.execute(_COUNT_SUBMITS, {"object_id": object_id, "upto": upto}).scalar_one())


def submits(
    conn: Tx,
    *,
    object_id: str,
    upto: int | None = None,
    after: int = 0,
    analyst_key_id: int | None = None,
    limit: int | None = None,
    project_id: int | None = None,
) -> list[HistoryItem]:
    """The object's single submits numbered in ``(after, upto]``, by number, at most ``limit``.

    ``analyst_key_id``: only that analyst's; ``project_id``: only those of that project's keys.
    ``upto`` None: every stored one.
    """
    statement = (
        select(_QUERIES)
        .where(_QUERIES.c.object_id == object_id, _QUERIES.c.seq > after)
        .order_by(_QUERIES.c.seq)
    )
    if upto is not None:
        statement = statement.where(_QUERIES.c.seq <= upto)
    if analyst_key_id is not None:
        statement = statement.where(_QUERIES.c.analyst_key_id == analyst_key_id)
    if project_id is not None:
        statement = statement.where(_QUERIES.c.analyst_key_id.in_(_project_keys(project_id)))
    if limit is not None:
        statement = statement.limit(limit)
    return [submitted(r) for r in conn.execute(statement)]


#: Objects whose submits one statement of :func:`submits_of` reads.
_MANY = 5000


def submits_of(conn: Tx, object_ids: Sequence[str]) -> dict[str, list[HistoryItem]]:
    """Every stored single submit of each object, by number: one statement per 5,000 objects.

    :func:`submits` of many objects at once (a survey chunk's members); objects without a
    submit are absent.
    """
    found: dict[str, list[HistoryItem]] = {}
    ids = sorted(set(object_ids))
    for start in range(0, len(ids), _MANY):
        statement = (
            select(_QUERIES)
            .where(_QUERIES.c.object_id.in_(ids[start : start + _MANY]))
            .order_by(_QUERIES.c.object_id, _QUERIES.c.seq)
        )
        for r in conn.execute(statement):
            found.setdefault(r.object_id, []).append(submitted(r))
    return found


def submitted(r: Row[Any]) -> HistoryItem:
    """A ``queries`` row as a history item."""
    return HistoryItem(
        seq=r.seq,
        query=r.query,
        output=r.output,
        epsilon=r.epsilon,
        epsilon_exact=r.epsilon_exact,
        loss_lower=r.loss_lower,
        loss_upper=r.loss_upper,
        basic_after=r.basic_after,
        created_at=r.created_at,
        query_id=r.id,
        survey_id=r.survey_id,
    )


def surveys_of(
    conn: Tx,
    *,
    analyst_key_id: int | None = None,
    among: set[int | None],
    project_id: int | None = None,
) -> set[int]:
    """Which of the surveys ``among`` the analyst created (or a key of ``project_id``)."""
    by = (
        _SURVEYS.c.analyst_key_id.in_(_project_keys(project_id))
        if project_id is not None
        else _SURVEYS.c.analyst_key_id == analyst_key_id
    )
    statement = select(_SURVEYS.c.id).where(
        by, _SURVEYS.c.id.in_(sorted(i for i in among if i is not None))
    )
    return set(conn.execute(statement).scalars())


@dataclass(frozen=True)
class Rejection:
    """A rejected submit, from its audit event."""

    at: datetime
    #: How many queries had been accepted when it was rejected (None: an event written before
    #: the count was recorded, issue #11).
    accepted: int | None
    #: The data version it was asked of (1 for events written before versions existed).
    version: int = 1


_REJECTIONS = (
    select(_EVENTS.c.at, _EVENTS.c.detail)
    .where(_EVENTS.c.object_id == bindparam("object_id"), _EVENTS.c.kind == "decision.rejected")
    .order_by(_EVENTS.c.id)
)


def rejections(conn: Tx, *, object_id: str) -> Iterator[Rejection]:
    """The object's rejected submits in order, read as the caller iterates (it may stop)."""
    for at, detail in conn.execute(_REJECTIONS, {"object_id": object_id}):
        fields = json.loads(detail)
        accepted, version = fields.get("accepted"), fields.get("version", 1)
        yield Rejection(
            at,
            accepted if isinstance(accepted, int) else None,
            version if isinstance(version, int) else 1,
        )

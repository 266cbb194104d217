"""An object's accepted history: its single-submit rows and its survey answers, in order.

Single submits are rows of ``queries``; survey answers are packed in their survey's chunk
(:mod:`app.services.survey_chunks`), which ``objects.answered`` names. Every reader of a history
— continuous snapshots, ``gatekeeper verify``, ``GET /v1/objects/{id}/queries`` and the odometer
history — goes through :func:`object_history`, so both kinds are always seen together, ordered
by their sequence numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Table, select

from app.db.models import ProtectedObject, QueryRecord, Survey
from app.services.survey_chunks import ChunkCache, parse_answered

_QUERIES = cast(Table, QueryRecord.__table__)
_OBJECTS = cast(Table, ProtectedObject.__table__)
_SURVEYS = cast(Table, Survey.__table__)


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
    analyst_key_id: int | None


def answered_of(conn: Connection, object_id: str) -> str | None:
    """``objects.answered`` of one object (None when it has no survey answer or no row)."""
    return cast(
        "str | None",
        conn.execute(select(_OBJECTS.c.answered).where(_OBJECTS.c.id == object_id)).scalar(),
    )


def object_history(
    conn: Connection,
    object_id: str,
    answered: str | None,
    *,
    after: int = 0,
    limit: int | None = None,
    analyst_key_id: int | None = None,
    chunks: ChunkCache | None = None,
) -> list[HistoryItem]:
    """The object's accepted queries with ``seq > after``, in order, at most ``limit``.

    ``answered`` is the object's ``objects.answered`` (read with the row the caller holds).
    ``analyst_key_id``: only the queries that analyst asked (its submits and its surveys').
    """
    statement = (
        select(_QUERIES).where(_QUERIES.c.object_id == object_id, _QUERIES.c.seq > after)
    ).order_by(_QUERIES.c.seq)
    if analyst_key_id is not None:
        statement = statement.where(_QUERIES.c.analyst_key_id == analyst_key_id)
    if limit is not None:
        statement = statement.limit(limit)
    items = [
        HistoryItem(
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
            analyst_key_id=r.analyst_key_id,
        )
        for r in conn.execute(statement)
    ]
    pairs = parse_answered(answered)
    if pairs:
        items.extend(_survey_answers(conn, object_id, pairs, after, analyst_key_id, chunks))
        items.sort(key=lambda item: item.seq)
    return items if limit is None else items[:limit]


def _survey_answers(
    conn: Connection,
    object_id: str,
    pairs: list[tuple[int, int]],
    after: int,
    analyst_key_id: int | None,
    chunks: ChunkCache | None,
) -> list[HistoryItem]:
    analysts = dict(
        conn.execute(
            select(_SURVEYS.c.id, _SURVEYS.c.analyst_key_id).where(
                _SURVEYS.c.id.in_(sorted({s for s, _ in pairs}))
            )
        ).all()
    )
    found = []
    for chunk in (chunks or ChunkCache(len(pairs))).get_many(conn, pairs):
        decision = chunk.answer(object_id)
        if decision is None or decision.variant is None:
            raise LookupError(
                f"{object_id}: objects.answered names survey {chunk.survey_id} chunk "
                f"{chunk.chunk}, which holds no answer of it"
            )
        analyst = analysts.get(chunk.survey_id)
        if decision.seq <= after or (analyst_key_id is not None and analyst != analyst_key_id):
            continue
        v = decision.variant
        found.append(
            HistoryItem(
                seq=decision.seq,
                query=v.query,
                output=v.output,
                epsilon=v.epsilon,
                epsilon_exact=v.epsilon_exact,
                loss_lower=v.loss_lower,
                loss_upper=v.loss_upper,
                basic_after=v.basic_after,
                created_at=chunk.decided_at,
                query_id=None,
                survey_id=chunk.survey_id,
                analyst_key_id=analyst,
            )
        )
    return found

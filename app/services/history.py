"""An object's accepted history: its single-submit rows and its survey answers, in order.

Single submits are rows of ``queries``; survey answers are packed in their survey's chunks
(:mod:`app.store.chunks`), found through the decided chunks whose id range covers the
object. Every reader of a history — continuous snapshots, ``gatekeeper verify``,
``GET /v1/objects/{id}/queries`` and the odometer history — goes through :func:`object_history`,
so both kinds are always seen together, ordered by their sequence numbers.

Consistency without a lock: the object's ``accepted`` count ``n`` is read first. Every entry of
its history has a sequence number, given as ``accepted + 1`` in the transaction that commits
it, so entries ``1..n`` had all committed when ``n`` was read, and anything committed later has
a larger number. The history is the entries numbered ``<= n`` — read in any order afterwards
— and there must be exactly ``n`` of them (:class:`HistoryMismatch` otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, func, select

from app.db.models import ProtectedObject, QueryRecord, Survey
from app.store.chunks import ChunkCache, chunks_covering, shared_cache

_QUERIES = cast(Table, QueryRecord.__table__)
_OBJECTS = cast(Table, ProtectedObject.__table__)
_SURVEYS = cast(Table, Survey.__table__)


class HistoryMismatch(LookupError):
    """The stored entries of an object's history are not exactly ``1..accepted``."""


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


def object_history(
    conn: Connection,
    object_id: str,
    *,
    after: int = 0,
    limit: int | None = None,
    analyst_key_id: int | None = None,
    chunks: ChunkCache | None = None,
) -> list[HistoryItem]:
    """The object's accepted queries with ``seq > after``, in order, at most ``limit``.

    ``analyst_key_id``: only the queries that analyst asked (its submits and its surveys').
    Raises :class:`HistoryMismatch` when the stored entries are not ``1..accepted``.
    """
    accepted = conn.execute(select(_OBJECTS.c.accepted).where(_OBJECTS.c.id == object_id)).scalar()
    if not accepted:
        return []
    mine = (_QUERIES.c.object_id == object_id, _QUERIES.c.seq <= accepted)
    singles = conn.execute(select(func.count()).select_from(_QUERIES).where(*mine)).scalar_one()
    statement = select(_QUERIES).where(*mine, _QUERIES.c.seq > after).order_by(_QUERIES.c.seq)
    if analyst_key_id is not None:
        statement = statement.where(_QUERIES.c.analyst_key_id == analyst_key_id)
    if limit is not None:
        statement = statement.limit(limit)
    items = [_submitted(r) for r in conn.execute(statement)]
    if singles < accepted:
        answers = _survey_answers(conn, object_id, accepted, chunks)
        if len(answers) + singles != accepted or len({r.seq for r in answers}) != len(answers):
            raise HistoryMismatch(
                f"{object_id}: accepted={accepted}, but {singles} submits and "
                f"{len(answers)} survey answers are stored"
            )
        if analyst_key_id is not None:
            own = _surveys_of(conn, analyst_key_id, {r.survey_id for r in answers})
            answers = [r for r in answers if r.survey_id in own]
        items.extend(r for r in answers if r.seq > after)
        items.sort(key=lambda item: item.seq)
    elif singles > accepted:  # pragma: no cover - seq <= accepted and unique (object, seq)
        raise HistoryMismatch(f"{object_id}: more submits stored than accepted")
    return items if limit is None else items[:limit]


def stored_entries(
    conn: Connection, object_id: str, *, chunks: ChunkCache | None = None
) -> list[HistoryItem]:
    """Every stored entry of the object's history, whatever ``accepted`` says, by ``seq``.

    For ``gatekeeper verify``, which compares them with the object's row; a decision reads
    :func:`object_history`.
    """
    rows = conn.execute(
        select(_QUERIES).where(_QUERIES.c.object_id == object_id).order_by(_QUERIES.c.seq)
    )
    items = [_submitted(r) for r in rows]
    items.extend(_survey_answers(conn, object_id, None, chunks))
    items.sort(key=lambda item: item.seq)
    return items


def _submitted(r: Any) -> HistoryItem:
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


def _survey_answers(
    conn: Connection, object_id: str, upto: int | None, chunks: ChunkCache | None
) -> list[HistoryItem]:
    """The object's survey answers (numbered ``<= upto``), from the chunks covering it."""
    pairs = chunks_covering(conn, object_id)
    found = []
    for chunk in (chunks or shared_cache(conn)).get_many(conn, pairs):
        decision = chunk.answer(object_id)
        if decision is None or decision.variant is None:
            continue  # not a member (the range only covers it), or refused
        if upto is not None and decision.seq > upto:
            continue  # committed after the count was read
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
            )
        )
    return found


def _surveys_of(conn: Connection, analyst_key_id: int, among: set[int | None]) -> set[int]:
    """Which of the surveys ``among`` the analyst created."""
    statement = select(_SURVEYS.c.id).where(
        _SURVEYS.c.analyst_key_id == analyst_key_id,
        _SURVEYS.c.id.in_(sorted(i for i in among if i is not None)),
    )
    return set(conn.execute(statement).scalars())

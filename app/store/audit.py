"""The ``audit_events`` table: one event added in the caller's transaction, a filtered page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias, cast

from sqlalchemy import (
    ColumnElement,
    FromClause,
    Insert,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    insert,
    select,
)
from sqlalchemy import cast as sql_cast

from app.db.models import AuditEvent
from app.db.types import UTCDateTime
from app.store.base import Tx
from app.store.queries import QUERIES

_EVENTS = cast(Table, AuditEvent.__table__)

#: What an event is written with: the caller's connection (the event joins its transaction).
Target: TypeAlias = Tx


@dataclass(frozen=True)
class Event:
    """An event as stored; ``detail`` is its JSON text."""

    id: int
    at: datetime
    kind: str
    actor_key_id: int | None
    object_id: str | None
    detail: str


#: Every submit decision writes one event: built once.
_INSERT = insert(_EVENTS)
_COLUMNS = (
    _EVENTS.c.id,
    _EVENTS.c.at,
    _EVENTS.c.kind,
    _EVENTS.c.actor_key_id,
    _EVENTS.c.object_id,
    _EVENTS.c.detail,
)


def add(
    target: Target,
    *,
    at: datetime,
    kind: str,
    actor_key_id: int | None,
    object_id: str | None,
    detail: str,
) -> None:
    """Add an event in ``target``'s transaction."""
    target.execute(
        _INSERT,
        {
            "at": at,
            "kind": kind,
            "actor_key_id": actor_key_id,
            "object_id": object_id,
            "detail": detail,
        },
    )


@dataclass(frozen=True)
class QueryEvent:
    """An event about a query row this transaction inserts, whose id the INSERT makes.

    Its detail is ``head + str(id) + tail``, the id being the ``queries`` row ``(object_id,
    seq)``'s: written by the same statement, so the event can go out before the id is known
    (:mod:`app.store.submits` sends it in the accepted submit's one round trip).
    """

    at: datetime
    kind: str
    actor_key_id: int | None
    object_id: str
    seq: int
    head: str
    tail: str


@dataclass(frozen=True)
class NewEvent:
    """An event to add (:func:`add`'s arguments; ``detail`` its JSON text)."""

    at: datetime
    kind: str
    actor_key_id: int | None
    object_id: str | None
    detail: str


def add_for(object_ids: ColumnElement[str], source: FromClause) -> Insert:
    """:func:`add` once per row of ``source``, for its object id ``object_ids``.

    The event's other columns are bound parameters named as :class:`NewEvent`'s fields (its
    ``object_id`` is not used): :mod:`app.store.submits` writes a rejection's event only if
    the rejection's count was written.
    """
    return insert(_EVENTS).from_select(
        ["at", "kind", "actor_key_id", "object_id", "detail"],
        select(
            bindparam("at", type_=UTCDateTime()),
            bindparam("kind", type_=String()),
            bindparam("actor_key_id", type_=Integer()),
            object_ids,
            bindparam("detail", type_=Text()),
        ).select_from(source),
    )


def for_query_rows(rows: FromClause, *where: ColumnElement[bool]) -> Insert:
    """The statement adding a :class:`QueryEvent` for the query rows of ``rows`` (and ``where``).

    ``rows`` has the ``queries`` columns ``id`` and ``object_id`` (the table itself, or the
    rows a data-modifying CTE inserted: :mod:`app.store.submits`); the detail is made around
    the row's id.
    """
    return insert(_EVENTS).from_select(
        ["at", "kind", "actor_key_id", "object_id", "detail"],
        select(
            bindparam("at", type_=UTCDateTime()),
            bindparam("kind", type_=String()),
            bindparam("actor_key_id", type_=Integer()),
            rows.c.object_id,
            (
                bindparam("head", type_=Text())
                + sql_cast(rows.c.id, Text())
                + bindparam("tail", type_=Text())
            ).label("detail"),
        )
        .select_from(rows)
        .where(*where),
    )


#: :class:`QueryEvent`'s statement: the detail made around the query row's id.
ADD_FOR_QUERY = for_query_rows(
    QUERIES, QUERIES.c.object_id == bindparam("object_id"), QUERIES.c.seq == bindparam("seq")
)


def query_event_params(event: QueryEvent) -> dict[str, object]:
    """The parameters of :data:`ADD_FOR_QUERY` for ``event``."""
    return {
        "at": event.at,
        "kind": event.kind,
        "actor_key_id": event.actor_key_id,
        "object_id": event.object_id,
        "seq": event.seq,
        "head": event.head,
        "tail": event.tail,
    }


def add_for_query(target: Target, event: QueryEvent) -> None:
    """Add ``event`` in ``target``'s transaction (after its query row was inserted)."""
    target.execute(ADD_FOR_QUERY, query_event_params(event))


def page(
    conn: Tx,
    *,
    after: int,
    object_id: str | None,
    kind: str | None,
    limit: int,
    since: datetime | None = None,
) -> list[Event]:
    """At most ``limit`` events with ``id > after`` in id order, of ``object_id`` and ``kind``.

    With ``since``, only events written at or after it. A keyset page: the primary key's index
    finds the first row, so each page costs its own rows whatever the log's length.
    """
    query = select(*_COLUMNS).where(_EVENTS.c.id > after)
    if object_id is not None:
        query = query.where(_EVENTS.c.object_id == object_id)
    if kind is not None:
        query = query.where(_EVENTS.c.kind == kind)
    if since is not None:
        query = query.where(_EVENTS.c.at >= since)
    query = query.order_by(_EVENTS.c.id).limit(limit)
    return [Event(*row) for row in conn.execute(query)]

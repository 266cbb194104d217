"""The ``audit_events`` table: one event added in the caller's transaction, a filtered page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias, cast

from sqlalchemy import Table, insert, select

from app.db.models import AuditEvent
from app.store.base import Tx

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

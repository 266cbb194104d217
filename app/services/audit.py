"""The audit log, queryable by admins (``GET /v1/audit``).

It records who registered or retired which object, created or revoked which key, and every
submit decision (accepted or rejected). Each event is written in the same transaction as the
change it describes, so the log and the data never disagree (a rolled-back submit leaves no
event; an accepted one always has one).
Events name objects and keys by id and carry public facts only (query kind, ε, filter, loss
bounds, reason): never a private value, a key secret or an output. There is no endpoint that
changes a budget, so there are no budget-change events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from app.engine.errors import InvalidInput
from app.services.schemas import AuditEvent, AuditPage
from app.store import Database, reading
from app.store import audit as store
from app.store.audit import Event, QueryEvent, Target

#: Most events one page answers.
MAX_PAGE = 1000
#: Events an export reads per statement: its memory is one page, whatever the log's length.
EXPORT_PAGE = 1000
#: An RFC 3339 date-time (section 5.6): a full date, a full time, an offset ("Z" or ±hh:mm).
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


class AuditKind(StrEnum):
    """What an event records."""

    OBJECT_REGISTERED = "object.registered"
    OBJECT_RETIRED = "object.retired"
    KEY_CREATED = "key.created"
    KEY_REVOKED = "key.revoked"
    DECISION_ACCEPTED = "decision.accepted"
    DECISION_REJECTED = "decision.rejected"
    OBJECTS_IMPORTED = "objects.imported"
    VERSION_CREATED = "object.version_created"
    VERSIONS_IMPORTED = "objects.versions_imported"
    SURVEY_CREATED = "survey.created"
    SURVEY_FINISHED = "survey.finished"
    SURVEY_CANCELLED = "survey.cancelled"
    PROJECT_CREATED = "project.created"
    PROJECT_QUOTA_CHANGED = "project.quota_changed"
    PROJECT_DELETED = "project.deleted"


def record(
    target: Target,
    *,
    kind: AuditKind,
    actor_key_id: int | None,
    object_id: str | None,
    detail: dict[str, Any],
) -> None:
    """Add an event in ``target``'s transaction."""
    made = new_event(kind=kind, actor_key_id=actor_key_id, object_id=object_id, detail=detail)
    store.add(
        target,
        at=made.at,
        kind=made.kind,
        actor_key_id=made.actor_key_id,
        object_id=made.object_id,
        detail=made.detail,
    )


def new_event(
    *, kind: AuditKind, actor_key_id: int | None, object_id: str | None, detail: dict[str, Any]
) -> store.NewEvent:
    """The event :func:`record` adds, for a store function that writes it with other rows."""
    return store.NewEvent(
        at=datetime.now(UTC),
        kind=kind.value,
        actor_key_id=actor_key_id,
        object_id=object_id,
        detail=json.dumps(detail, sort_keys=True),
    )


#: Stands in a detail for the query id the store writes in (a number no detail carries).
_HOLE = 7_240_817_053_337_019_301


def query_event(
    *, kind: AuditKind, actor_key_id: int | None, object_id: str, seq: int, detail: dict[str, Any]
) -> QueryEvent:
    """An event like :func:`record`'s whose ``detail["query_id"]`` is the query row's id.

    The row ``(object_id, seq)`` is inserted in the same transaction; its id is written into
    the detail by the store, so the text is exactly what :func:`record` would have written.
    """
    text = json.dumps({**detail, "query_id": _HOLE}, sort_keys=True)
    marker = f'"query_id": {_HOLE}'
    if text.count(marker) != 1:  # pragma: no cover - the hole is a number no detail holds
        raise ValueError("an audit detail already holds the query id's placeholder")
    head, tail = text.split(marker)
    return QueryEvent(
        at=datetime.now(UTC),
        kind=kind.value,
        actor_key_id=actor_key_id,
        object_id=object_id,
        seq=seq,
        head=head + '"query_id": ',
        tail=tail,
    )


def _view(event: Event) -> AuditEvent:
    return AuditEvent(
        id=event.id,
        at=event.at.isoformat(),
        kind=event.kind,
        actor_key_id=event.actor_key_id,
        object_id=event.object_id,
        detail=json.loads(event.detail),
    )


def list_events(
    *,
    engine: Database,
    object_id: str | None = None,
    kind: AuditKind | None = None,
    after: int = 0,
    limit: int = 100,
) -> AuditPage:
    """Events with ``id > after`` in order, filtered; ``next_after`` pages on (None at the end)."""
    with reading(engine) as conn:
        rows = store.page(
            conn,
            after=after,
            object_id=object_id,
            kind=None if kind is None else kind.value,
            limit=limit + 1,
        )
    more = len(rows) > limit
    events = [_view(e) for e in rows[:limit]]
    return AuditPage(items=events, next_after=events[-1].id if more else None)


def parse_since(text: str, field: str = "since") -> datetime:
    """An RFC 3339 date-time with its offset (``2026-11-25T21:30:00Z``), as an aware datetime.

    A time without an offset is refused: it names no instant.
    """
    found = _RFC3339.fullmatch(text)
    if found is None:
        raise InvalidInput(
            field, "must be an RFC 3339 date-time with an offset, e.g. 2026-11-25T21:30:00Z"
        )
    # fromisoformat reads at most 6 fraction digits; stored times are whole microseconds, so a
    # finer time starts at the next microsecond (at >= since, exactly)
    fraction = found.group(1) or ""
    finer = fraction[7:].strip("0") != ""
    if fraction:
        text = text[: found.start(1)] + fraction[:7].ljust(7, "0") + text[found.end(1) :]
    try:
        at = datetime.fromisoformat(text.replace("z", "Z").replace("t", "T")).astimezone(UTC)
        return at + timedelta(microseconds=1) if finer else at
    except ValueError:
        raise InvalidInput(field, "is not a valid date and time") from None


def export_start(*, after: int | None, since: str | None) -> tuple[int, datetime | None]:
    """Where an export starts: after an event id, or at a time (not both); the log's start."""
    if after is not None and since is not None:
        raise InvalidInput("since", "give either after (an event id) or since (a time), not both")
    return (after or 0), (None if since is None else parse_since(since))


def export_lines(
    *, engine: Database, after: int = 0, since: datetime | None = None, page: int = EXPORT_PAGE
) -> Iterator[bytes]:
    """The audit log from ``after`` (or ``since``) to its end as NDJSON lines, oldest first.

    Keyset pages of ``page`` events, each read in its own short transaction: memory and
    locks stay bounded by one page however long the log is; events written during the export
    are included up to the last page read. A line is one event as ``GET /v1/audit`` shows it,
    so the last line's ``id`` passed as ``after`` resumes an interrupted export.
    """
    while True:
        with reading(engine) as conn:
            rows = store.page(conn, after=after, object_id=None, kind=None, limit=page, since=since)
        for event in rows:
            line = json.dumps(_view(event).model_dump(mode="json"), sort_keys=True)
            yield (line + "\n").encode()
        if len(rows) < page:
            return
        after = rows[-1].id

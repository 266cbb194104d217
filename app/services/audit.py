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
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from app.store import Database, reading
from app.store import audit as store
from app.store.audit import Event, Target

#: Most events one page answers.
MAX_PAGE = 1000


class AuditKind(StrEnum):
    """What an event records."""

    OBJECT_REGISTERED = "object.registered"
    OBJECT_RETIRED = "object.retired"
    KEY_CREATED = "key.created"
    KEY_REVOKED = "key.revoked"
    DECISION_ACCEPTED = "decision.accepted"
    DECISION_REJECTED = "decision.rejected"
    OBJECTS_IMPORTED = "objects.imported"
    SURVEY_CREATED = "survey.created"
    SURVEY_FINISHED = "survey.finished"
    SURVEY_CANCELLED = "survey.cancelled"
    PROJECT_CREATED = "project.created"
    PROJECT_QUOTA_CHANGED = "project.quota_changed"


def record(
    target: Target,
    *,
    kind: AuditKind,
    actor_key_id: int | None,
    object_id: str | None,
    detail: dict[str, Any],
) -> None:
    """Add an event in ``target``'s transaction."""
    store.add(
        target,
        at=datetime.now(UTC),
        kind=kind.value,
        actor_key_id=actor_key_id,
        object_id=object_id,
        detail=json.dumps(detail, sort_keys=True),
    )


def _view(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "at": event.at.isoformat(),
        "kind": event.kind,
        "actor_key_id": event.actor_key_id,
        "object_id": event.object_id,
        "detail": json.loads(event.detail),
    }


def list_events(
    *,
    engine: Database,
    object_id: str | None = None,
    kind: AuditKind | None = None,
    after: int = 0,
    limit: int = 100,
) -> dict[str, Any]:
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
    return {"events": events, "next_after": events[-1]["id"] if more else None}

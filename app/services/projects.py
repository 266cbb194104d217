"""Projects (issue 25): tenants sharing one population, each with a label scope and a quota.

A key created in a project inherits both. **Scope**: the key sees and queries only the objects
whose labels include every label of the scope; any other object is answered exactly as a
missing one (404 ``not-found``, same detail) on every endpoint. **Quota**: an ε bound on the
realized loss of the project's own sub-history of each object. Admin keys and keys outside
projects are unscoped.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_object, as_positive_number, check_keys
from app.engine.limits import MAX_BUDGET
from app.services import audit
from app.services.errors import AlreadyExists, NotFound
from app.services.objects import parse_labels
from app.services.scope import Scope
from app.store import Conflict, Database, Tx, reading, transaction
from app.store import projects as store
from app.store.projects import ProjectRow

#: A project's name: 1-64 letters, digits and ``._-``, starting with a letter or digit.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "must be 1-64 letters, digits and ._- starting with a letter or digit"


def scope_of(row: ProjectRow) -> Scope:
    """The scope of a project's keys."""
    return Scope(row.id, row.name, tuple(sorted(row.labels.items())))


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:  # SQLite returns naive datetimes
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


def project_view(row: ProjectRow) -> dict[str, Any]:
    """A project resource."""
    return {
        "name": row.name,
        "scope": {"labels": dict(row.labels)},
        "quota": {"epsilon": row.quota},
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
    }


def parse_name(raw: Any, field: str) -> str:
    """A project's name (422 naming ``field`` otherwise)."""
    if not isinstance(raw, str) or not NAME_PATTERN.fullmatch(raw):
        raise InvalidInput(field, NAME_RULE)
    return raw


def parse_quota(raw: Any, field: str) -> float:
    """``{"epsilon": q}``: ``0 < q <= MAX_BUDGET`` (a quota above every budget is bad input)."""
    quota = as_object(raw, field)
    check_keys(quota, field, required=("epsilon",))
    return as_positive_number(quota["epsilon"], f"{field}.epsilon", maximum=MAX_BUDGET)


def parse_project(body: Any) -> tuple[str, dict[str, str], float]:
    """``{"name", "scope": {"labels": {...}}, "quota": {"epsilon"}}`` → name, labels, quota."""
    obj = as_object(body, "")
    check_keys(obj, "", required=("name", "scope", "quota"))
    name = parse_name(obj["name"], "name")
    scope = as_object(obj["scope"], "scope")
    check_keys(scope, "scope", required=("labels",))
    labels = parse_labels(scope["labels"], "scope.labels")
    if not labels:
        raise InvalidInput("scope.labels", "must name at least one label")
    return name, labels, parse_quota(obj["quota"], "quota")


def create_project(*, engine: Database, body: Any, actor_key_id: int | None) -> dict[str, Any]:
    """Validate and store a project (409 ``already-exists`` for a taken name)."""
    name, labels, quota = parse_project(body)
    try:
        with transaction(engine) as conn:
            row = store.insert_project(
                conn, name=name, labels=labels, quota=quota, at=datetime.now(UTC)
            )
            audit.record(
                conn,
                kind=audit.AuditKind.PROJECT_CREATED,
                actor_key_id=actor_key_id,
                object_id=None,
                detail={"project": name, "labels": sorted(labels), "quota": quota},
            )
    except Conflict:
        raise AlreadyExists(f"a project named {name!r} already exists") from None
    return project_view(row)


def load_project(conn: Tx, name: str) -> ProjectRow:
    """The project named ``name`` or :class:`NotFound`."""
    row = store.by_name(conn, name=name) if NAME_PATTERN.fullmatch(name) else None
    if row is None:
        raise NotFound("no project with that name")
    return row


def get_project(*, engine: Database, name: str) -> dict[str, Any]:
    """A project's view."""
    with reading(engine) as conn:
        return project_view(load_project(conn, name))


def list_projects(*, engine: Database, limit: int, after: int) -> dict[str, Any]:
    """Projects in creation order (``next_after``: the cursor of the next page)."""
    with reading(engine) as conn:
        rows = store.page(conn, after=after, limit=limit)
    return {
        "items": [project_view(r) for r in rows],
        "next_after": rows[-1].id if len(rows) == limit else None,
    }


def change_quota(
    *, engine: Database, name: str, body: Any, actor_key_id: int | None
) -> dict[str, Any]:
    """``PATCH {"quota": {"epsilon"}}``: a new quota (the scope is fixed)."""
    obj = as_object(body, "")
    check_keys(obj, "", required=("quota",))
    quota = parse_quota(obj["quota"], "quota")
    with transaction(engine) as conn:
        before = load_project(conn, name)
        store.set_quota(conn, name=name, quota=quota, at=datetime.now(UTC))
        audit.record(
            conn,
            kind=audit.AuditKind.PROJECT_QUOTA_CHANGED,
            actor_key_id=actor_key_id,
            object_id=None,
            detail={"project": name, "before": before.quota, "quota": quota},
        )
        return project_view(load_project(conn, name))


def project_for_key(conn: Tx, name: Any, field: str) -> ProjectRow:
    """The project a new key names (422 naming ``field``: unknown project, never a 404)."""
    parsed = parse_name(name, field)
    row = store.by_name(conn, name=parsed)
    if row is None:
        raise InvalidInput(field, "names no project")
    return row


def scope_by_id(conn: Tx, project_id: int) -> Scope | None:
    """The scope of project ``project_id`` (None if it is gone)."""
    row = store.by_id(conn, project_id=project_id)
    return None if row is None else scope_of(row)

"""Projects (issue 25): tenants sharing one population, each with a label scope and a quota.

A key created in a project inherits both. **Scope**: the key sees and queries only the objects
whose labels include every label of the scope; any other object is answered exactly as a
missing one (404 ``not-found``, same detail) on every endpoint. **Quota**: an ε bound on the
realized loss of the project's own sub-history of each object. Admin keys and keys outside
projects are unscoped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.engine.errors import InvalidInput
from app.services import audit
from app.services.errors import AlreadyExists, NotFound
from app.services.schemas import (
    PROJECT_NAME,
    PROJECT_NAME_RULE,
    ProjectPage,
    ProjectPatch,
    ProjectRequest,
    ProjectView,
    QuotaView,
    ScopeView,
)
from app.services.scope import Scope
from app.store import Conflict, Database, Tx, reading, transaction
from app.store import keys as key_store
from app.store import projects as store
from app.store.projects import ProjectRow

#: A project's name (one definition, the contract's).
NAME_PATTERN = PROJECT_NAME
NAME_RULE = PROJECT_NAME_RULE


def scope_of(row: ProjectRow) -> Scope:
    """The scope of a project's keys."""
    return Scope(row.id, row.name, tuple(sorted(row.labels.items())))


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:  # SQLite returns naive datetimes
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


def project_view(row: ProjectRow) -> ProjectView:
    """A project resource."""
    return ProjectView(
        name=row.name,
        scope=ScopeView(labels=dict(row.labels)),
        quota=QuotaView(epsilon=row.quota),
        created_at=_iso(row.created_at),
        updated_at=_iso(row.updated_at),
    )


def parse_name(raw: Any, field: str) -> str:
    """A project's name (422 naming ``field`` otherwise)."""
    if not isinstance(raw, str) or not NAME_PATTERN.fullmatch(raw):
        raise InvalidInput(field, NAME_RULE)
    return raw


def create_project(
    *, engine: Database, request: ProjectRequest, actor_key_id: int | None
) -> ProjectView:
    """Store a project (409 ``already-exists`` for a taken name)."""
    name, labels, quota = request.name, dict(request.scope.labels), request.quota.epsilon
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
    """The live project named ``name`` or :class:`NotFound` (also for a deleted one)."""
    row = store.by_name(conn, name=name) if NAME_PATTERN.fullmatch(name) else None
    if row is None or row.deleted_at is not None:
        raise NotFound("no project with that name")
    return row


def get_project(*, engine: Database, name: str) -> ProjectView:
    """A project's view."""
    with reading(engine) as conn:
        return project_view(load_project(conn, name))


def list_projects(*, engine: Database, limit: int, after: int) -> ProjectPage:
    """Projects in creation order (``next_after``: the cursor of the next page)."""
    with reading(engine) as conn:
        rows = store.page(conn, after=after, limit=limit)
    return ProjectPage(
        items=[project_view(r) for r in rows],
        next_after=rows[-1].id if len(rows) == limit else None,
    )


def change_quota(
    *, engine: Database, name: str, request: ProjectPatch, actor_key_id: int | None
) -> ProjectView:
    """A new quota (the scope is fixed)."""
    quota = request.quota.epsilon
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


def delete_project(*, engine: Database, name: str, actor_key_id: int | None) -> list[int]:
    """Delete a project: its keys are revoked; its row, name and sub-histories are kept.

    The project's keys then answer 401 like any revoked key; its name stays taken (admins'
    odometers and the audit log keep naming it); its surveys already running finish under its
    quota, as a revoked key's surveys do. The ids of the keys revoked (the caller forgets them
    from its key cache). :class:`NotFound` for an unknown or already deleted project.
    """
    with transaction(engine) as conn:
        row = load_project(conn, name)
        at = datetime.now(UTC)
        if not store.mark_deleted(conn, project_id=row.id, at=at):
            raise NotFound("no project with that name")  # deleted concurrently
        revoked = key_store.revoke_project(conn, project_id=row.id, at=at)
        audit.record(
            conn,
            kind=audit.AuditKind.PROJECT_DELETED,
            actor_key_id=actor_key_id,
            object_id=None,
            detail={"project": name, "revoked_keys": revoked},
        )
    return revoked


def project_for_key(conn: Tx, name: Any, field: str) -> ProjectRow:
    """The project a new key names (422 naming ``field``: unknown or deleted, never a 404)."""
    parsed = parse_name(name, field)
    row = store.by_name(conn, name=parsed)
    if row is None:
        raise InvalidInput(field, "names no project")
    if row.deleted_at is not None:
        raise InvalidInput(field, "names a deleted project (its keys are revoked)")
    return row


def scope_by_id(conn: Tx, project_id: int) -> Scope | None:
    """The scope of project ``project_id`` (None if it is gone)."""
    row = store.by_id(conn, project_id=project_id)
    return None if row is None else scope_of(row)

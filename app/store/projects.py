"""Projects (table ``projects``, issue 25): tenants with a label scope and an ε quota.

A project's scope is a condition on ``objects`` (:func:`app.store.objects.scope_conditions`):
the small, composable filter every listing and cohort statement adds for a project key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, delete, insert, select, update

from app.db.models import Project, ProjectState
from app.store.base import Tx
from app.store.rows import Rows

PROJECTS = cast(Table, Project.__table__)
_STATES = cast(Table, ProjectState.__table__)


@dataclass(frozen=True)
class ProjectRow:
    """A project as stored."""

    id: int
    name: str
    labels: dict[str, str]
    quota: float
    created_at: datetime
    updated_at: datetime
    #: When it was deleted (None: a live project).
    deleted_at: datetime | None = None


_COLUMNS = (
    PROJECTS.c.id,
    PROJECTS.c.name,
    PROJECTS.c.labels,
    PROJECTS.c.quota,
    PROJECTS.c.created_at,
    PROJECTS.c.updated_at,
    PROJECTS.c.deleted_at,
)
#: Pages list live projects; a lookup finds a deleted one too (its sub-histories are kept).
_ROWS = Rows(ProjectRow, _COLUMNS, id_=PROJECTS.c.id, listed=PROJECTS.c.deleted_at.is_(None))
_BY_NAME = _ROWS.by(PROJECTS.c.name)
_BY_ID = _ROWS.by(PROJECTS.c.id)
_SET_QUOTA = (
    update(PROJECTS)
    .where(PROJECTS.c.name == bindparam("where_name"))
    .values(quota=bindparam("quota"), updated_at=bindparam("at"))
)
_DELETE = (
    update(PROJECTS)
    .where(PROJECTS.c.id == bindparam("where_id"), PROJECTS.c.deleted_at.is_(None))
    .values(deleted_at=bindparam("at"), updated_at=bindparam("at"))
)


def insert_project(
    conn: Tx, *, name: str, labels: Mapping[str, str], quota: float, at: datetime
) -> ProjectRow:
    """Store a new project; :class:`~app.store.Conflict` if the name is taken."""
    result = conn.execute(
        insert(PROJECTS),
        {"name": name, "labels": dict(labels), "quota": quota, "created_at": at, "updated_at": at},
    )
    project_id = int(result.inserted_primary_key[0])  # type: ignore[index]
    return ProjectRow(project_id, name, dict(labels), quota, at, at)


def by_name(conn: Tx, *, name: str) -> ProjectRow | None:
    """The project named ``name``, or None."""
    return _BY_NAME(conn, name)


def by_id(conn: Tx, *, project_id: int) -> ProjectRow | None:
    """The project with id ``project_id``, or None."""
    return _BY_ID(conn, project_id)


def page(conn: Tx, *, after: int, limit: int) -> list[ProjectRow]:
    """At most ``limit`` live projects with ``id > after``, in id order."""
    return _ROWS.page(conn, after=after, limit=limit)


def set_quota(conn: Tx, *, name: str, quota: float, at: datetime) -> bool:
    """Change a project's quota; False if there is no such project."""
    return bool(
        conn.execute(_SET_QUOTA, {"where_name": name, "quota": quota, "at": at}).rowcount == 1
    )


def mark_deleted(conn: Tx, *, project_id: int, at: datetime) -> bool:
    """Mark a live project deleted at ``at`` (its row kept); False if it was deleted already."""
    return bool(conn.execute(_DELETE, {"where_id": project_id, "at": at}).rowcount == 1)


@dataclass(frozen=True)
class SubHistory:
    """A project's sub-history of one object, as stored (``project_states``)."""

    object_id: str
    project_id: int
    accepted: int
    history_hash: str
    loss_lower: float
    loss_upper: float
    basic_total: str


_SUB = select(*_STATES.c)


def sub_history(conn: Tx, *, object_id: str, project_id: int) -> SubHistory | None:
    """The project's stored sub-history of the object (None: it has seen no output)."""
    row = conn.execute(
        _SUB.where(_STATES.c.object_id == object_id, _STATES.c.project_id == project_id)
    ).one_or_none()
    return None if row is None else SubHistory(*row)


def sub_histories(conn: Tx, *, object_id: str) -> list[tuple[SubHistory, ProjectRow]]:
    """Every project's sub-history of the object, with its project, by project id."""
    statement = (
        select(*_STATES.c, *_COLUMNS)
        .join(PROJECTS, PROJECTS.c.id == _STATES.c.project_id)
        .where(_STATES.c.object_id == object_id)
        .order_by(_STATES.c.project_id)
    )
    width = len(_STATES.c)
    return [(SubHistory(*row[:width]), ProjectRow(*row[width:])) for row in conn.execute(statement)]


def drop_sub_histories(conn: Tx, *, object_ids: Sequence[str]) -> None:
    """Forget the objects' sub-histories: a new data version starts every project afresh."""
    for start in range(0, len(object_ids), 1000):
        part = list(object_ids[start : start + 1000])
        conn.execute(delete(_STATES).where(_STATES.c.object_id.in_(part)))


def all_sub_histories(conn: Tx) -> list[SubHistory]:
    """Every stored sub-history (``gatekeeper verify``)."""
    return [SubHistory(*row) for row in conn.execute(_SUB.order_by(*_STATES.primary_key))]


_SUB_VALUES = ("accepted", "history_hash", "loss_lower", "loss_upper", "basic_total")
_INSERT_SUB = insert(_STATES)
_UPDATE_SUB = (
    update(_STATES)
    .where(
        _STATES.c.object_id == bindparam("where_object"),
        _STATES.c.project_id == bindparam("where_project"),
    )
    .values({name: bindparam(name) for name in _SUB_VALUES})
)


def put_sub_histories(conn: Tx, states: Sequence[SubHistory], *, new: bool) -> None:
    """Store sub-histories after one more entry each (``new``: their first; one statement)."""
    if not states:
        return
    if new:
        conn.execute(_INSERT_SUB, [asdict(state) for state in states])
        return
    conn.execute(
        _UPDATE_SUB,
        [
            {
                "where_object": state.object_id,
                "where_project": state.project_id,
                **{name: getattr(state, name) for name in _SUB_VALUES},
            }
            for state in states
        ],
    )


def sub_hashes(conn: Tx, *, project_id: int, object_ids: Sequence[str]) -> dict[str, str]:
    """The stored sub-history hash chain of each object of ``object_ids`` the project has one of."""
    found: dict[str, str] = {}
    for start in range(0, len(object_ids), 1000):
        part = list(object_ids[start : start + 1000])
        statement = select(_STATES.c.object_id, _STATES.c.history_hash).where(
            _STATES.c.project_id == project_id, _STATES.c.object_id.in_(part)
        )
        found.update({str(o): str(h) for o, h in conn.execute(statement)})
    return found

"""Data versions (table ``object_versions``): closing an object's version and opening the next.

Closing copies the version's value as stored (its ciphertext, never decrypted) and its final
accounting into ``object_versions``; opening writes the new value and resets the object's
accounting columns with the same compare-and-set on ``objects.version`` that a submit uses. Both
are one statement for a whole batch on PostgreSQL (:mod:`app.store.bulk`'s JSON recordsets),
an ``executemany`` on SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, literal, select, text

from app.db.models import ObjectVersion
from app.store import bulk
from app.store.base import Tx, is_postgres
from app.store.domains import DOMAIN_TEXT
from app.store.objects import OBJECTS, ObjectState

VERSIONS = cast(Table, ObjectVersion.__table__)

#: Columns of a closed version's row other than its value (copied from the object's row).
_CLOSED_TYPES = {
    "object_id": "text",
    "data_version": "int",
    "seq_start": "int",
    "seq_end": "int",
    "loss_lower": "float8",
    "loss_upper": "float8",
    "loss_exact": "text",
    "basic_total": "text",
    "rejected": "int",
    "closed_at": "timestamptz",
}
_CLOSE_PG = text(
    "INSERT INTO object_versions (value, "  # noqa: S608 - names from the models
    + ", ".join(_CLOSED_TYPES)
    + ") SELECT o.value, "
    + ", ".join(f"v.{c}" for c in _CLOSED_TYPES)
    + " FROM json_to_recordset(CAST(:rows AS json)) AS v("
    + ", ".join(f"{c} {t}" for c, t in _CLOSED_TYPES.items())
    + ") JOIN objects AS o ON o.id = v.object_id"
)
_CLOSE_SQLITE = text(
    "INSERT INTO object_versions (value, "  # noqa: S608 - names from the models
    + ", ".join(_CLOSED_TYPES)
    + ") SELECT o.value, "
    + ", ".join(f":{c}" for c in _CLOSED_TYPES)
    + " FROM objects AS o WHERE o.id = :object_id"
).bindparams(bindparam("closed_at", type_=VERSIONS.c.closed_at.type))

#: The columns a new version sets on the object (``where_id``/``where_version`` select it).
_OPEN_TYPES = {
    "where_id": "text",
    "where_version": "int",
    "value": "text",
    "version": "int",
    "data_version": "int",
    "version_start": "int",
    "state_hash": "text",
    "state_pending": "int",
    "history_hash": "text",
    "loss_lower": "float8",
    "loss_upper": "float8",
    "basic_total": "text",
    "f0_account": "text",
    "rejected": "int",
    "lifetime_exact": "text",
    "lifetime_lower": "float8",
    "lifetime_upper": "float8",
    "updated_at": "timestamptz",
}

#: An object's row as a new version reads it (no likelihood array: loaded once per state).
_ROW_FIELDS = [f.name for f in fields(ObjectState) if f.name not in {"state", "state_err"}]
#: The value is not read (a closing version's ciphertext is copied in SQL; nothing decrypted).
_ROWS = select(
    *(
        DOMAIN_TEXT
        if n == "domain"
        else literal("").label("value")
        if n == "value"
        else OBJECTS.c[n]
        for n in _ROW_FIELDS
    )
)
_ROWS_IN = _ROWS.where(OBJECTS.c.id.in_(bindparam("ids", expanding=True)))
_ROWS_ANY = _ROWS.where(OBJECTS.c.id == func.any(bindparam("ids")))
_RANGE = select(VERSIONS.c.seq_start, VERSIONS.c.seq_end).where(
    VERSIONS.c.object_id == bindparam("object_id"),
    VERSIONS.c.data_version == bindparam("data_version"),
)
_CLOSED_AT = select(VERSIONS.c.closed_at).where(
    VERSIONS.c.object_id == bindparam("object_id"),
    VERSIONS.c.data_version == bindparam("data_version"),
)
_LOOKUP_CHUNK = 1000


@dataclass(frozen=True)
class ClosedVersion:
    """A closed version's final accounting (its value stays in the table, encrypted)."""

    object_id: str
    data_version: int
    seq_start: int
    seq_end: int
    loss_lower: float
    loss_upper: float
    loss_exact: str | None
    basic_total: str
    rejected: int
    closed_at: datetime


_CURRENT = select(OBJECTS.c.id, OBJECTS.c.data_version, OBJECTS.c.version_start)
_SPANS = select(
    VERSIONS.c.object_id, VERSIONS.c.data_version, VERSIONS.c.seq_start, VERSIONS.c.seq_end
)


def versions_answered(conn: Tx, answers: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The data version each ``(object id, seq)`` answer was given from.

    Ids without an object row are left out.
    """
    if not answers:
        return {}
    ids = sorted({object_id for object_id, _ in answers})
    current: dict[str, tuple[int, int]] = {}
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for start in range(0, len(ids), _LOOKUP_CHUNK):
        part = ids[start : start + _LOOKUP_CHUNK]
        for oid, number, version_start in conn.execute(_CURRENT.where(OBJECTS.c.id.in_(part))):
            current[str(oid)] = (int(number), int(version_start))
        for oid, number, first, last in conn.execute(_SPANS.where(VERSIONS.c.object_id.in_(part))):
            spans.setdefault(str(oid), []).append((int(number), int(first), int(last)))
    found: dict[str, int] = {}
    for object_id, seq in answers:
        if object_id not in current:
            continue
        number, version_start = current[object_id]
        if seq > version_start:
            found[object_id] = number
            continue
        for closed, first, last in spans.get(object_id, []):
            if first < seq <= last:
                found[object_id] = closed
    return found


_CLOSED = select(*(VERSIONS.c[f.name] for f in fields(ClosedVersion))).where(
    VERSIONS.c.object_id == bindparam("object_id")
)


def object_rows(conn: Tx, ids: Sequence[str]) -> list[ObjectState]:
    """The objects among ``ids`` as a decision reads them, without values or likelihood arrays.

    ``value`` is empty (never decrypted) and ``state`` None: :func:`app.store.states.load_states`
    loads each distinct array once.
    """
    postgres = is_postgres(conn)
    statement = _ROWS_ANY if postgres else _ROWS_IN
    chunk = max(len(ids), 1) if postgres else _LOOKUP_CHUNK
    found = []
    for start in range(0, len(ids), chunk):
        for row in conn.execute(statement, {"ids": list(ids[start : start + chunk])}):
            found.append(ObjectState(**row._mapping, state=None, state_err=0.0))
    return found


def close_versions(conn: Tx, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert the closed versions (keys of ``_CLOSED_TYPES``), each copying its object's value."""
    if not rows:
        return
    if is_postgres(conn):
        conn.execute(_CLOSE_PG, {"rows": bulk.rows_json(rows, list(_CLOSED_TYPES))})
    else:
        conn.execute(_CLOSE_SQLITE, [dict(row) for row in rows])


def open_versions(conn: Tx, rows: Sequence[Mapping[str, Any]]) -> int:
    """Write each object's new version if it is still at ``where_version``; rows updated.

    ``value`` is the new value in plaintext (encrypted here or by the column type).
    """
    where = {"where_id": "id", "where_version": "version"}
    values = dict(_OPEN_TYPES)
    return bulk.update_rows(conn, OBJECTS, rows, where=where, values=values, encrypted=("value",))


def version_range(conn: Tx, *, object_id: str, data_version: int) -> tuple[int, int] | None:
    """The ``seq`` range ``(start, end]`` of a closed version, or None if it is not closed."""
    found = conn.execute(_RANGE, {"object_id": object_id, "data_version": data_version}).first()
    return None if found is None else (int(found[0]), int(found[1]))


def closed_at(conn: Tx, *, object_id: str, data_version: int) -> datetime | None:
    """When a version was closed (its successor opened), or None if it is not closed."""
    found = conn.execute(
        _CLOSED_AT, {"object_id": object_id, "data_version": data_version}
    ).scalar_one_or_none()
    return cast(datetime | None, found)


def closed_versions(conn: Tx, *, object_id: str) -> list[ClosedVersion]:
    """The object's closed versions, oldest first."""
    rows = conn.execute(_CLOSED.order_by(VERSIONS.c.data_version), {"object_id": object_id})
    return [ClosedVersion(**r._mapping) for r in rows]

"""Data versions (table ``object_versions``): closing an object's version and opening the next.

Closing copies the version's value as stored (its ciphertext, never decrypted) and its final
accounting into ``object_versions``; opening writes the new value and resets the object's
accounting columns with the same compare-and-set on ``objects.version`` that a submit uses, and
drops the projects' sub-histories of the object. On PostgreSQL the three writes of a whole batch
are one statement, its rows one JSON text (:func:`replace_versions`; measured in
docs/benchmarks.md, "Bulk versions"); on SQLite an ``executemany`` each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import NamedTuple, cast

import orjson
from sqlalchemy import Table, bindparam, insert, select, text, update

from app.crypto import active
from app.db.models import ObjectVersion
from app.store import ids as ids_
from app.store.base import Tx, is_postgres
from app.store.objects import OBJECTS
from app.store.projects import drop_sub_histories

VERSIONS = cast(Table, ObjectVersion.__table__)


class ClosingRow(NamedTuple):
    """What closing an object's version reads of its row (by position: no value, no labels).

    The closed version's other columns (its seq range, Σε, rejections) and the next version's
    counters are copied from the row in SQL, under the compare-and-set on ``version``.
    """

    id: str
    version: int
    data_version: int
    domain_hash: str
    retired_at: datetime | None
    accepted: int
    version_start: int
    state_hash: str | None
    state_pending: int
    loss_lower: float
    loss_upper: float
    lifetime_exact: str | None
    lifetime_lower: float
    lifetime_upper: float


class NewVersion(NamedTuple):
    """One object's new version: the closing loss and the lifetime sums after it, its value.

    ``value`` is the new value's JSON in plaintext, or its ciphertext when ``sealed`` is
    passed to :func:`replace_versions`.
    """

    object_id: str
    where_version: int
    value: str
    loss_lower: float
    loss_upper: float
    loss_exact: str | None
    lifetime_exact: str | None
    lifetime_lower: float
    lifetime_upper: float


_CLOSING = select(*(OBJECTS.c[name] for name in ClosingRow._fields))
_CLOSING_AMONG = ids_.where_among(_CLOSING, OBJECTS.c.id)

#: PostgreSQL: every write of a batch of new versions in one statement, its rows one JSON text.
#: The sub-statements of a ``WITH`` share one snapshot, so the ``INSERT`` copies each row's
#: value and accounting as they were before the ``UPDATE`` replaces them; both select the row
#: only at the version read (the compare-and-set), and the ``UPDATE``'s count says whether every
#: row was still there (a concurrent writer makes it short: the caller rolls back and retries).
_REPLACE_PG = text(
    "WITH v AS MATERIALIZED (SELECT * FROM json_to_recordset(CAST(:rows AS json)) AS v("
    "object_id text, where_version int, value text, loss_lower float8, loss_upper float8, "
    "loss_exact text, lifetime_exact text, lifetime_lower float8, lifetime_upper float8)), "
    "closed AS (INSERT INTO object_versions (object_id, data_version, value, seq_start, "
    "seq_end, loss_lower, loss_upper, loss_exact, basic_total, rejected, closed_at) "
    "SELECT o.id, o.data_version, o.value, o.version_start, o.accepted, v.loss_lower, "
    "v.loss_upper, v.loss_exact, o.basic_total, o.rejected, :now "
    "FROM v JOIN objects AS o ON o.id = v.object_id AND o.version = v.where_version), "
    "dropped AS (DELETE FROM project_states AS p USING v WHERE p.object_id = v.object_id), "
    "opened AS (UPDATE objects AS o SET value = v.value, version = o.version + 1, "
    "data_version = o.data_version + 1, version_start = o.accepted, state_hash = NULL, "
    "state_pending = 0, history_hash = NULL, loss_lower = 0, loss_upper = 0, "
    "basic_total = '0', f0_account = '0', rejected = 0, lifetime_exact = v.lifetime_exact, "
    "lifetime_lower = v.lifetime_lower, lifetime_upper = v.lifetime_upper, updated_at = :now "
    "FROM v WHERE o.id = v.object_id AND o.version = v.where_version RETURNING 1) "
    "SELECT count(*) FROM opened"
).bindparams(bindparam("now", type_=VERSIONS.c.closed_at.type))

#: SQLite: the same writes, an ``executemany`` each (the value encrypted by its column type).
_CLOSE_SQLITE = insert(VERSIONS).from_select(
    [
        "object_id",
        "data_version",
        "value",
        "seq_start",
        "seq_end",
        "loss_lower",
        "loss_upper",
        "loss_exact",
        "basic_total",
        "rejected",
        "closed_at",
    ],
    select(
        OBJECTS.c.id,
        OBJECTS.c.data_version,
        OBJECTS.c.value,
        OBJECTS.c.version_start,
        OBJECTS.c.accepted,
        bindparam("closed_lower", type_=VERSIONS.c.loss_lower.type),
        bindparam("closed_upper", type_=VERSIONS.c.loss_upper.type),
        bindparam("closed_exact", type_=VERSIONS.c.loss_exact.type),
        OBJECTS.c.basic_total,
        OBJECTS.c.rejected,
        bindparam("now", type_=VERSIONS.c.closed_at.type),
    ).where(
        OBJECTS.c.id == bindparam("object_id"),
        OBJECTS.c.version == bindparam("where_version"),
    ),
)
_OPEN_SQLITE = (
    update(OBJECTS)
    .where(
        OBJECTS.c.id == bindparam("object_id"),
        OBJECTS.c.version == bindparam("where_version"),
    )
    .values(
        value=bindparam("value", type_=OBJECTS.c.value.type),
        version=OBJECTS.c.version + 1,
        data_version=OBJECTS.c.data_version + 1,
        version_start=OBJECTS.c.accepted,
        state_hash=None,
        state_pending=0,
        history_hash=None,
        loss_lower=0.0,
        loss_upper=0.0,
        basic_total="0",
        f0_account="0",
        rejected=0,
        lifetime_exact=bindparam("lifetime_exact", type_=OBJECTS.c.lifetime_exact.type),
        lifetime_lower=bindparam("lifetime_lower", type_=OBJECTS.c.lifetime_lower.type),
        lifetime_upper=bindparam("lifetime_upper", type_=OBJECTS.c.lifetime_upper.type),
        updated_at=bindparam("now", type_=OBJECTS.c.updated_at.type),
    )
)
_RANGE = select(VERSIONS.c.seq_start, VERSIONS.c.seq_end).where(
    VERSIONS.c.object_id == bindparam("object_id"),
    VERSIONS.c.data_version == bindparam("data_version"),
)
_CLOSED_AT = select(VERSIONS.c.closed_at).where(
    VERSIONS.c.object_id == bindparam("object_id"),
    VERSIONS.c.data_version == bindparam("data_version"),
)


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
_CURRENT_AMONG = ids_.where_among(_CURRENT, OBJECTS.c.id)
_SPANS_AMONG = ids_.where_among(_SPANS, VERSIONS.c.object_id)


def versions_answered(conn: Tx, answers: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The data version each ``(object id, seq)`` answer was given from.

    Ids without an object row are left out.
    """
    if not answers:
        return {}
    ids = sorted({object_id for object_id, _ in answers})
    current: dict[str, tuple[int, int]] = {}
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for oid, number, version_start in ids_.rows_among(conn, _CURRENT_AMONG, ids):
        current[str(oid)] = (int(number), int(version_start))
    for oid, number, first, last in ids_.rows_among(conn, _SPANS_AMONG, ids):
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


def closing_rows(conn: Tx, ids: Sequence[str]) -> list[ClosingRow]:
    """The objects among ``ids`` as closing a version reads them (one statement on PostgreSQL)."""
    return [ClosingRow._make(row) for row in ids_.rows_among(conn, _CLOSING_AMONG, ids)]


def seals_values(conn: Tx) -> bool:
    """Whether :func:`replace_versions` takes values encrypted ahead.

    PostgreSQL's statement bypasses the column type; SQLite's goes through it, which encrypts
    the plaintext.
    """
    return is_postgres(conn)


def replace_versions(
    conn: Tx, rows: Sequence[NewVersion], *, now: datetime, sealed: bool = False
) -> int:
    """Close each row's object's version and open the next with its value; rows updated.

    Each object is written only if it is still at ``where_version`` (the compare-and-set): the
    closed version copies its value (the ciphertext, never decrypted) and accounting into
    ``object_versions``, the object gets the new value, its counters start afresh at its
    accepted count and every project's sub-history of it is dropped. Fewer rows than given
    means a concurrent writer came first: the caller must roll back. ``sealed``: the values are
    already encrypted with the process's cipher (else they are encrypted here).
    """
    if not rows:
        return 0
    if is_postgres(conn):
        if not sealed:
            cipher = active()
            rows = [row._replace(value=cipher.encrypt(row.value)) for row in rows]
        # orjson: the C encoder (docs/benchmarks.md, "Import: before and after")
        payload = orjson.dumps([row._asdict() for row in rows]).decode()
        return int(conn.execute(_REPLACE_PG, {"rows": payload, "now": now}).scalar_one())
    if sealed:
        raise ValueError("SQLite encrypts values by the column type: pass them in plaintext")
    # the closing loss under names that are no column of ``objects`` (an executemany's keys
    # named like a column would be added to the UPDATE's SET clause)
    params = [
        {
            "object_id": row.object_id,
            "where_version": row.where_version,
            "value": row.value,
            "closed_lower": row.loss_lower,
            "closed_upper": row.loss_upper,
            "closed_exact": row.loss_exact,
            "lifetime_exact": row.lifetime_exact,
            "lifetime_lower": row.lifetime_lower,
            "lifetime_upper": row.lifetime_upper,
            "now": now,
        }
        for row in rows
    ]
    conn.execute(_CLOSE_SQLITE, params)
    updated = int(conn.execute(_OPEN_SQLITE, params).rowcount)
    drop_sub_histories(conn, object_ids=[row.object_id for row in rows])
    return updated


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

"""The ``api_keys`` table: a key's row by hash or id, a page of keys, creation and revocation."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, func, insert, select, update

from app.db.models import ApiKey
from app.store.base import Tx, is_postgres
from app.store.rows import Rows

_KEYS = cast(Table, ApiKey.__table__)


@dataclass(frozen=True)
class KeyRow:
    """An API key as stored, without its hash (nothing outside this module needs it)."""

    id: int
    role: str
    label: str | None
    created_at: datetime
    revoked_at: datetime | None
    #: The key's project (None: an unscoped key).
    project_id: int | None = None


#: The columns of :class:`KeyRow`, in its order.
_COLUMNS = (
    _KEYS.c.id,
    _KEYS.c.role,
    _KEYS.c.label,
    _KEYS.c.created_at,
    _KEYS.c.revoked_at,
    _KEYS.c.project_id,
)
_ROWS = Rows(KeyRow, _COLUMNS, id_=_KEYS.c.id)
#: Every authenticated request that misses the key cache runs this one (built once).
_BY_HASH = _ROWS.by(_KEYS.c.key_hash)
_BY_ID = _ROWS.by(_KEYS.c.id)
_INSERT = insert(_KEYS)
_ACTIVE_ADMINS = (_KEYS.c.role == "admin") & _KEYS.c.revoked_at.is_(None)
_LOCK_ADMINS = select(_KEYS.c.id).where(_ACTIVE_ADMINS).with_for_update()
_OTHER_ADMINS = (
    select(func.count())
    .select_from(_KEYS)
    .where(_ACTIVE_ADMINS, _KEYS.c.id != bindparam("key_id"))
    .scalar_subquery()
)
#: Revokes an active key unless it is the last active admin key (one conditional statement).
_REVOKE = (
    update(_KEYS)
    .where(
        _KEYS.c.id == bindparam("key_id"),
        _KEYS.c.revoked_at.is_(None),
        (_KEYS.c.role != "admin") | (_OTHER_ADMINS > 0),
    )
    .values(revoked_at=bindparam("at"))
)


def by_hash(conn: Tx, *, key_hash: str) -> KeyRow | None:
    """The key whose secret hashes to ``key_hash`` (revoked or not), or None."""
    return _BY_HASH(conn, key_hash)


def by_id(conn: Tx, *, key_id: int) -> KeyRow | None:
    """The key with id ``key_id``, or None."""
    return _BY_ID(conn, key_id)


def page(conn: Tx, *, after: int, limit: int) -> list[KeyRow]:
    """At most ``limit`` keys with ``id > after``, in id order."""
    return _ROWS.page(conn, after=after, limit=limit)


def insert_key(
    conn: Tx,
    *,
    key_hash: str,
    prefix: str,
    role: str,
    label: str | None,
    project_id: int | None = None,
) -> int:
    """Store a new key (in project ``project_id``, if given); its id."""
    result = conn.execute(
        _INSERT,
        {
            "key_hash": key_hash,
            "prefix": prefix,
            "role": role,
            "label": label,
            "project_id": project_id,
        },
    )
    return int(result.inserted_primary_key[0])  # type: ignore[index]


def revoke(conn: Tx, *, key_id: int, at: datetime) -> bool:
    """Revoke an active key at ``at``, unless it is the last active admin key; True if revoked.

    Race-free: one conditional ``UPDATE`` (SQLite runs it under its write lock), and on
    PostgreSQL the active admin rows are locked first, so two revocations of the last two admin
    keys cannot both see "another admin remains".
    """
    if is_postgres(conn):
        conn.execute(_LOCK_ADMINS)
    return conn.execute(_REVOKE, {"key_id": key_id, "at": at}).rowcount == 1


def revoke_project(conn: Tx, *, project_id: int, at: datetime) -> list[int]:
    """Revoke every active key of project ``project_id`` at ``at``; their ids, in order.

    Project keys are never admin keys, so this can never revoke the last admin key.
    """
    active = (_KEYS.c.project_id == project_id) & _KEYS.c.revoked_at.is_(None)
    ids = [int(i) for i in conn.scalars(select(_KEYS.c.id).where(active).order_by(_KEYS.c.id))]
    if ids:
        conn.execute(update(_KEYS).where(_KEYS.c.id.in_(ids)).values(revoked_at=at))
    return ids

"""Stored likelihood arrays (table ``likelihood_states``), shared, kept while an object names them.

A finite object's ``state_hash`` names one row here (by content for an exact history, else by
history: :func:`app.services.snapshots.content_key`). No count of users is kept: a writer that
makes objects name states only makes sure each is stored (:func:`name_states`,
:data:`NAME_STATE`), and :func:`collect_unnamed` deletes the rows no object names — at the end of
a survey run, at ``gatekeeper serve``'s start and by ``gatekeeper states collect``
(:func:`app.services.snapshots.collect_states`). Until then an unnamed row is garbage, harmless
(nothing reads a state by key but an object naming it, or a run that :func:`name_states` it).

Why no count: an object moves to a new state with every accepted query, so a count was written
twice per accepted query (one up, one down, plus a delete at zero): three statements of every
single submit, and a new version of each touched row per survey chunk — the array is stored
inline, so each of those ``UPDATE`` s copied the whole row (docs/benchmarks.md, "h/refs").

**No live object loses its array.** The hazard is a writer W naming a state S that a
concurrent collection C finds unnamed (C's snapshot does not see W's uncommitted objects) and
deletes, after which W commits. On PostgreSQL (READ COMMITTED) it is excluded by row locks:

1. W, before it commits, either inserts S (a row C cannot see, so cannot delete, until W has
   committed — and then W's objects name it) or locks the existing row: ``FOR NO KEY UPDATE``
   through ``ON CONFLICT DO UPDATE ... WHERE false`` (:data:`NAME_STATE`: the row is locked, no
   new version written) or ``FOR KEY SHARE`` (:func:`name_states` of a state whose bytes the
   caller no longer holds). Either lock conflicts with the ``FOR UPDATE`` that C takes; neither
   conflicts with another writer's ``FOR KEY SHARE``. W holds it until it commits.
2. C first locks its candidates ``FOR UPDATE SKIP LOCKED`` (a candidate a writer holds is
   skipped), then — in a later statement, so with a snapshot taken after every lock was granted
   — deletes those of them still unnamed. A writer that locked S before C did had committed
   before C's lock was granted, so C's deleting snapshot sees its objects naming S; a writer
   that comes after waits for C's commit, and then finds S deleted: ``ON CONFLICT`` retries the
   insert (W has the bytes), ``FOR KEY SHARE`` returns no row and :func:`name_states` reports
   it missing (the caller rolls back: :class:`app.services.snapshots.StateGone`).

On SQLite one writer runs at a time and its transaction is serializable: C's ``DELETE`` and
W's insert-or-ignore plus its objects' update cannot interleave.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import psycopg
from sqlalchemy import (
    Executable,
    FromClause,
    Table,
    bindparam,
    column,
    delete,
    exists,
    false,
    func,
    select,
    table,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import Insert

from app.db.models import LikelihoodStateRecord, ProtectedObject
from app.store import compiled
from app.store import ids as ids_
from app.store.base import Tx, is_postgres

STATES = cast(Table, LikelihoodStateRecord.__table__)
_OBJECTS = cast(Table, ProtectedObject.__table__)


def _or_lock(statement: Insert) -> Insert:
    """``statement``, or the conflicting row locked without a new version (PostgreSQL)."""
    return statement.on_conflict_do_update(
        index_elements=[STATES.c.hash], set_={"err": STATES.c.err}, where=false()
    )


def _name_state(postgres: bool) -> Executable:
    """Insert the array, or lock the stored row of that key without writing it (PostgreSQL).

    ``ON CONFLICT DO UPDATE ... WHERE false`` locks the conflicting row (PostgreSQL's
    documentation: "all rows will be locked when the ON CONFLICT DO UPDATE action is taken")
    and updates none: no new row version. A row deleted meanwhile makes PostgreSQL retry the
    insert. SQLite: insert or ignore.
    """
    if postgres:
        return _or_lock(postgresql.insert(STATES))
    ignore: Executable = sqlite.insert(STATES).on_conflict_do_nothing(
        index_elements=[STATES.c.hash]
    )
    return ignore


#: Built once per dialect (a submit of a finite object runs one: parameters hash, state, err).
NAME_STATE = ids_.both(_name_state)


def name_state_rows(rows: FromClause, prefix: str) -> Insert:
    """:data:`NAME_STATE` (PostgreSQL) once per row of ``rows``, to run as a CTE of a statement.

    The parameters are ``prefix`` + ``hash``, ``state`` and ``err``. An accepted submit's one
    statement names its array this way once its query row is inserted (none when its
    compare-and-set missed): the row is inserted or locked by the same ``ON CONFLICT`` as
    :data:`NAME_STATE`'s, and held until the commit (the module's docstring: why that keeps the
    collection off it).
    """
    values = select(
        bindparam(prefix + "hash", type_=STATES.c.hash.type),
        bindparam(prefix + "state", type_=STATES.c.state.type),
        bindparam(prefix + "err", type_=STATES.c.err.type),
    ).select_from(rows)
    return _or_lock(postgresql.insert(STATES).from_select(["hash", "state", "err"], values))


_NAMED = exists().where(_OBJECTS.c.state_hash == STATES.c.hash)
#: PostgreSQL: lock stored rows against :func:`collect_unnamed` (the caller names them).
_LOCK_STATES = ids_.both(
    lambda postgres: (
        select(STATES.c.hash)
        .where(ids_.among(STATES.c.hash, postgres=postgres))
        .with_for_update(read=True, key_share=True)
    )
)
_LOCK_UNNAMED = select(STATES.c.hash).where(~_NAMED).with_for_update(skip_locked=True)
_DELETE_UNNAMED = ids_.where_among(delete(STATES).where(~_NAMED), STATES.c.hash)
_DELETE_ALL_UNNAMED = delete(STATES).where(~_NAMED)
#: PostgreSQL: run on psycopg in PostgreSQL's binary format (:func:`load_states`).
_LOAD_STATES = ids_.compiled_for_postgres(
    ids_.where_among(select(STATES.c.hash, STATES.c.state, STATES.c.err), STATES.c.hash),
    binary=True,
)
_COUNT = select(func.count()).select_from(STATES)
_COUNT_UNNAMED = select(func.count()).select_from(STATES).where(~_NAMED)


def insert_state(conn: Tx, *, key: str, state: bytes, err: float) -> None:
    """Store an array under ``key``, or lock the stored one (:data:`NAME_STATE`)."""
    conn.execute(NAME_STATE[is_postgres(conn)], {"hash": key, "state": state, "err": err})


#: The temporary table :func:`name_states` copies a chunk's new states into (PostgreSQL): one
#: per session, created by the first transaction that needs it (again if that one rolled back),
#: emptied at every commit (by a transaction that used it: PostgreSQL skips the others). Its
#: columns are the states table's, with its compression (lz4): a value compressed here is
#: inserted into the states table as it is, not compressed again.
_COPY_TABLE = "gk_states_in"
_CREATE_COPY_TABLE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_COPY_TABLE} "
    f"(LIKE {STATES.name} INCLUDING COMPRESSION) ON COMMIT DELETE ROWS"
)
#: Before PostgreSQL 14 there is no per-column compression to copy (nor lz4: migration 0018).
_CREATE_COPY_TABLE_13 = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_COPY_TABLE} (LIKE {STATES.name}) ON COMMIT DELETE ROWS"
)
_COPY_IN = f"COPY {_COPY_TABLE} (hash, state, err) FROM STDIN (FORMAT BINARY)"
_COPIED = table(_COPY_TABLE, column("hash"), column("state"), column("err"))
#: :data:`NAME_STATE` of every copied row, in key order (bytewise, as ``sorted`` orders them).
_NAME_COPIED = compiled.Compiled.of(
    _or_lock(
        postgresql.insert(STATES).from_select(
            ["hash", "state", "err"],
            select(_COPIED.c.hash, _COPIED.c.state, _COPIED.c.err).order_by(
                _COPIED.c.hash.collate("C")
            ),
        )
    )
)


def _name_each(conn: Tx, rows: Sequence[tuple[str, bytes, float]]) -> None:
    """:data:`NAME_STATE` per row, one ``executemany`` in key order (both dialects)."""
    conn.execute(
        NAME_STATE[is_postgres(conn)],
        [{"hash": key, "state": state, "err": err} for key, state, err in sorted(rows)],
    )


def _name_copied(conn: Tx, rows: Sequence[tuple[str, bytes, float]]) -> None:
    """:data:`NAME_STATE` per row on PostgreSQL: the rows copied (binary), then one ``INSERT``.

    The same ``ON CONFLICT`` per row as :func:`_name_each`'s, in the same (key) order, from
    :data:`_COPY_TABLE` — no parameter set per row, no statement execution per row.
    """
    raw = compiled.raw_connection(conn)
    text = _COPY_IN
    try:
        with raw.cursor() as cursor:
            cursor.execute(
                _CREATE_COPY_TABLE if raw.info.server_version >= 140000 else _CREATE_COPY_TABLE_13
            )
            with cursor.copy(_COPY_IN) as copy:
                copy.set_types(["text", "bytea", "float8"])
                for row in rows:
                    copy.write_row(row)
            text = _NAME_COPIED.text
            cursor.execute(text, _NAME_COPIED.params({}), prepare=False)
    except psycopg.Error as exc:
        raise compiled.wrapped(conn, raw, text, exc) from exc


def name_states(
    conn: Tx, rows: Sequence[tuple[str, bytes, float]], known: Sequence[str] = ()
) -> set[str]:
    """Make sure the states the caller's objects are about to name stay stored; those missing.

    ``rows``: ``(key, state, err)`` of distinct keys whose arrays the caller holds: each is
    inserted or its row locked (:data:`NAME_STATE`, in key order: two writers lock common rows
    in one order; on PostgreSQL copied first, :func:`_name_copied`). ``known``: keys the
    caller holds no bytes for (a survey run stored them in an earlier chunk): locked ``FOR KEY
    SHARE``; the returned set is those of them not stored any more (the caller must not name
    them: roll back). Either way the rows stay until the caller's transaction ends (the
    module's docstring proves it).
    """
    postgres = is_postgres(conn)
    if rows:
        (_name_copied if postgres else _name_each)(conn, rows)
    if not known:
        return set()
    wanted = sorted(set(known))
    found = {key for (key,) in ids_.rows_among(conn, _LOCK_STATES, wanted)}
    return set(wanted) - found


def collect_unnamed(conn: Tx) -> int:
    """Delete the stored arrays no object names; how many.

    PostgreSQL: the candidates are locked ``FOR UPDATE SKIP LOCKED`` first, and deleted by a
    later statement only if still unnamed in its own snapshot (the module's docstring: why a
    concurrent writer cannot lose its array). Each statement scans ``objects`` once
    (``state_hash`` has no index: an index would end the HOT updates every accepted query
    makes), so the candidates are deleted in one statement, however many: two scans in all.
    SQLite: one ``DELETE``. Run it in a transaction of its own at READ COMMITTED (the store's
    isolation).
    """
    if not is_postgres(conn):
        return int(conn.execute(_DELETE_ALL_UNNAMED).rowcount)
    locked = [key for (key,) in conn.execute(_LOCK_UNNAMED)]
    if not locked:
        return 0
    # all candidates in one statement, whatever their number: each statement scans ``objects``
    # once, so ids_.execute_among's batches of PG_PER_STATEMENT would scan it once per 10,000
    return int(
        conn.execute(_DELETE_UNNAMED[True], {"ids": ids_.parameter(locked, postgres=True)}).rowcount
    )


def load_states(conn: Tx, keys: set[str]) -> dict[str, tuple[bytes, float]]:
    """The stored arrays (and rounding errors) of the given state keys (those stored).

    On PostgreSQL the rows come in its binary format, by psycopg directly: an array travels
    as its bytes, not as twice as many hex digits that the server writes and psycopg parses
    (8 kB against 16 kB for 1,000 points), and no SQLAlchemy ``Row`` is built per state.
    """
    return {
        key: (bytes(state), float(err))
        for key, state, err in ids_.rows_among(conn, _LOAD_STATES, sorted(keys))
    }


def count_states(conn: Tx) -> int:
    """How many arrays are stored."""
    return int(conn.execute(_COUNT).scalar_one())


def count_unnamed(conn: Tx) -> int:
    """How many stored arrays no object names (garbage until :func:`collect_unnamed`)."""
    return int(conn.execute(_COUNT_UNNAMED).scalar_one())

"""Stored likelihood arrays (table ``likelihood_states``), shared by reference count.

A finite object's ``state_hash`` names one row here (by content for an exact history, else by
history: :func:`app.services.snapshots.content_key`); ``refs`` counts the objects naming it
(:func:`app.services.snapshots.move_state_refs` keeps the count) and a row at zero is deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import Executable, Table, bindparam, delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from app.db.models import LikelihoodStateRecord
from app.store import ids as ids_
from app.store.base import Tx, is_postgres

STATES = cast(Table, LikelihoodStateRecord.__table__)


def _insert_state(postgres: bool) -> Executable:
    """``INSERT INTO likelihood_states ... ON CONFLICT (hash) DO UPDATE refs = refs + n``."""
    statement = (postgresql if postgres else sqlite).insert(STATES)
    upsert: Executable = statement.on_conflict_do_update(
        index_elements=[STATES.c.hash], set_={"refs": STATES.c.refs + statement.excluded.refs}
    )
    return upsert


#: Built once per dialect (a submit of a finite object runs one).
INSERT_STATE = {postgres: _insert_state(postgres) for postgres in (True, False)}
ADD_REFS = (
    update(STATES)
    .where(STATES.c.hash == bindparam("key"))
    .values(refs=STATES.c.refs + bindparam("count"))
)
_ADD_REFS_MANY = text(
    "UPDATE likelihood_states AS t SET refs = t.refs + v.n FROM unnest(CAST(:keys AS text[]), "
    "CAST(:counts AS int[])) AS v(hash, n) WHERE t.hash = v.hash"
)
_DROP_UNUSED = ids_.where_among(delete(STATES).where(STATES.c.refs <= 0), STATES.c.hash)
#: One key's array deleted if no object uses it (an accepted submit's old state).
DROP_UNUSED_ONE = delete(STATES).where(STATES.c.hash == bindparam("key"), STATES.c.refs <= 0)
_LOAD_STATES = ids_.where_among(select(STATES.c.hash, STATES.c.state, STATES.c.err), STATES.c.hash)
_COUNT = select(func.count()).select_from(STATES)


def insert_state(conn: Tx, *, key: str, state: bytes, err: float, refs: int) -> None:
    """Store an array under ``key`` with ``refs`` users (added to the count if it is there)."""
    conn.execute(
        INSERT_STATE[is_postgres(conn)],
        {"hash": key, "state": state, "err": err, "refs": refs},
    )


def insert_states(conn: Tx, rows: Sequence[tuple[str, bytes, float, int]]) -> None:
    """:func:`insert_state` for many ``(key, state, err, refs)`` at once (distinct keys).

    One ``executemany`` (batched into multi-row statements on PostgreSQL): a survey chunk
    storing a thousand new states pays a few round trips, not one per state.
    """
    if not rows:
        return
    conn.execute(
        INSERT_STATE[is_postgres(conn)],
        [{"hash": key, "state": state, "err": err, "refs": refs} for key, state, err, refs in rows],
    )


def add_refs(conn: Tx, changes: Sequence[tuple[str, int]]) -> int:
    """Add ``count`` to the references of each ``(key, count)``; how many rows it hit.

    PostgreSQL: one statement for all (``unnest`` of two arrays); SQLite: an ``executemany``.
    """
    if not changes:
        return 0
    if is_postgres(conn):
        keys, counts = zip(*changes, strict=True)
        return int(
            conn.execute(_ADD_REFS_MANY, {"keys": list(keys), "counts": list(counts)}).rowcount
        )
    rows = [{"key": key, "count": count} for key, count in changes]
    return int(conn.execute(ADD_REFS, rows).rowcount)


def drop_unused(conn: Tx, keys: Sequence[str]) -> None:
    """Delete the arrays among ``keys`` that no object uses any more.

    One statement per :func:`app.store.ids.per_statement` keys (a survey chunk drops the
    states of thousands of groups at once).
    """
    ids_.execute_among(conn, _DROP_UNUSED, keys)


def load_states(conn: Tx, keys: set[str]) -> dict[str, tuple[bytes, float]]:
    """The stored arrays (and rounding errors) of the given state keys."""
    return {
        key: (bytes(state), float(err))
        for key, state, err in ids_.rows_among(conn, _LOAD_STATES, sorted(keys))
    }


def count_states(conn: Tx) -> int:
    """How many arrays are stored."""
    return int(conn.execute(_COUNT).scalar_one())

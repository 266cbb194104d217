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
from app.store.base import Tx, is_postgres

STATES = cast(Table, LikelihoodStateRecord.__table__)

#: Keys per ``IN (...)`` list: well under SQLite's limit on bound parameters.
_BATCH = 500


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
_DROP_UNUSED = delete(STATES).where(
    STATES.c.hash.in_(bindparam("keys", expanding=True)), STATES.c.refs <= 0
)
_DROP_UNUSED_MANY = text(
    "DELETE FROM likelihood_states WHERE hash = ANY(CAST(:keys AS text[])) AND refs <= 0"
)
#: One key's array deleted if no object uses it (an accepted submit's old state).
DROP_UNUSED_ONE = delete(STATES).where(STATES.c.hash == bindparam("key"), STATES.c.refs <= 0)
_LOAD_STATES = select(STATES.c.hash, STATES.c.state, STATES.c.err).where(
    STATES.c.hash.in_(bindparam("keys", expanding=True))
)
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

    PostgreSQL: one statement for all (``= ANY`` of an array: a survey chunk drops the states
    of thousands of groups, once ten ``IN`` lists of 500, each a new statement text to parse
    and plan); SQLite, and a single key (a submit's): ``IN`` lists of :data:`_BATCH`.
    """
    if len(keys) > 1 and is_postgres(conn):
        conn.execute(_DROP_UNUSED_MANY, {"keys": list(keys)})
        return
    for start in range(0, len(keys), _BATCH):
        conn.execute(_DROP_UNUSED, {"keys": list(keys[start : start + _BATCH])})


def load_states(conn: Tx, keys: set[str]) -> dict[str, tuple[bytes, float]]:
    """The stored arrays (and rounding errors) of the given state keys."""
    found: dict[str, tuple[bytes, float]] = {}
    ordered = sorted(keys)
    for start in range(0, len(ordered), _BATCH):
        rows = conn.execute(_LOAD_STATES, {"keys": ordered[start : start + _BATCH]})
        for key, state, err in rows:
            found[key] = (bytes(state), float(err))
    return found


def count_states(conn: Tx) -> int:
    """How many arrays are stored."""
    return int(conn.execute(_COUNT).scalar_one())

"""Lookups for ``"reuse": true``: stored answers of an identical query, by its hash.

A single submit's row stores the hash of its query's canonical JSON as ``fingerprint`` and is
found by ``ix_queries_reuse`` ``(object_id, fingerprint)``; a survey stores the same hash as
``query_hash`` (``ix_surveys_query_hash``), and its answers are read from its decided chunks
(:mod:`app.store.chunks`) whose id range covers the object — found through
``ix_survey_chunks_first_id``. Every statement is built once, at import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Row, Select, String, Table, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY

from app.db.models import ApiKey, DomainRecord, ProtectedObject, QueryRecord, Survey
from app.store.base import Tx, is_postgres
from app.store.chunks import CHUNKS, Chunk, decode
from app.store.history import HistoryItem, submitted

_QUERIES = cast(Table, QueryRecord.__table__)
_SURVEYS = cast(Table, Survey.__table__)
_OBJECTS = cast(Table, ProtectedObject.__table__)
_KEYS = cast(Table, ApiKey.__table__)
_DOMAINS = cast(Table, DomainRecord.__table__)
_TEXTS = select(_DOMAINS.c.hash, _DOMAINS.c.text).where(
    _DOMAINS.c.hash.in_(bindparam("hashes", expanding=True))
)


def domain_texts(conn: Tx, hashes: set[str]) -> dict[str, str]:
    """The domains' texts by hash."""
    if not hashes:
        return {}
    return {str(h): str(t) for h, t in conn.execute(_TEXTS, {"hashes": sorted(hashes)})}


#: Ids per statement (a survey chunk's members in one or two).
_IDS_PER_STATEMENT = 5000


@dataclass(frozen=True)
class MemberBounds:
    """What a reuse reads of a member: its current version's history range and its domain."""

    id: str
    #: The current version's entries are numbered ``(version_start, accepted]``.
    version_start: int
    accepted: int
    retired: bool
    #: The domain's hash (:func:`domain_texts` reads the texts, one per distinct domain).
    domain_hash: str


def _among_ids(column: ColumnElement[str], postgres: bool) -> ColumnElement[bool]:
    """``column`` is one of the ``ids`` parameter's.

    One array parameter on PostgreSQL (an expanding ``IN`` of 5,000 parameters took ~0.3 s a
    statement to render and bind), an expanding ``IN`` elsewhere.
    """
    if postgres:
        return column == any_(bindparam("ids", type_=ARRAY(String)))
    return column.in_(bindparam("ids", expanding=True))


def _both(build: Callable[[bool], Select[Any]]) -> dict[bool, Select[Any]]:
    """A statement built once per dialect family (keyed by "is PostgreSQL")."""
    return {postgres: build(postgres) for postgres in (True, False)}


_BOUNDS = _both(
    lambda postgres: select(
        _OBJECTS.c.id,
        _OBJECTS.c.version_start,
        _OBJECTS.c.accepted,
        # a boolean: no timestamp to parse per row
        _OBJECTS.c.retired_at.is_not(None),
        _OBJECTS.c.domain_hash,
    ).where(_among_ids(_OBJECTS.c.id, postgres))
)


def member_bounds(conn: Tx, ids: Sequence[str]) -> list[MemberBounds]:
    """The members' current-version ranges, read without locking (a reuse writes nothing)."""
    found: list[MemberBounds] = []
    statement = _BOUNDS[is_postgres(conn)]
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        part = list(ids[start : start + _IDS_PER_STATEMENT])
        rows = conn.execute(statement, {"ids": part}).all()  # one fetch, not one per row
        found.extend(MemberBounds(r[0], r[1], r[2], bool(r[3]), r[4]) for r in rows)
    return found


_KEY = select(_KEYS.c.role, _KEYS.c.project_id).where(_KEYS.c.id == bindparam("key_id"))


def key_reach(conn: Tx, key_id: int) -> tuple[str | None, int | None]:
    """A key's role and project (None, None: no such key)."""
    row = conn.execute(_KEY, {"key_id": key_id}).one_or_none()
    return (None, None) if row is None else (row.role, row.project_id)


_SUBMIT_COLUMNS = (
    _QUERIES.c.id,
    _QUERIES.c.object_id,
    _QUERIES.c.seq,
    _QUERIES.c.query,
    _QUERIES.c.output,
    _QUERIES.c.epsilon,
    _QUERIES.c.epsilon_exact,
    _QUERIES.c.loss_lower,
    _QUERIES.c.loss_upper,
    _QUERIES.c.basic_after,
    _QUERIES.c.created_at,
    _QUERIES.c.survey_id,
    _QUERIES.c.analyst_key_id,
)
_SUBMITS = (
    select(*_SUBMIT_COLUMNS)
    .where(
        _QUERIES.c.object_id == bindparam("object_id"),
        _QUERIES.c.fingerprint == bindparam("fingerprint"),
        _QUERIES.c.seq > bindparam("after"),
        _QUERIES.c.seq <= bindparam("upto"),
    )
    .order_by(_QUERIES.c.seq)
)
_SUBMITS_OF_IDS = _both(
    lambda postgres: select(*_SUBMIT_COLUMNS).where(
        _among_ids(_QUERIES.c.object_id, postgres),
        _QUERIES.c.fingerprint == bindparam("fingerprint"),
    )
)


def first_submit(
    conn: Tx, *, object_id: str, fingerprint: str, after: int, upto: int, owner: int | None
) -> HistoryItem | None:
    """The earliest single submit of the object numbered in ``(after, upto]`` with that hash.

    ``owner``: only a submit of that key (None: anyone's).
    """
    rows = conn.execute(
        _SUBMITS,
        {"object_id": object_id, "fingerprint": fingerprint, "after": after, "upto": upto},
    )
    for row in rows:
        if owner is None or row.analyst_key_id == owner:
            return submitted(cast(Row[Any], row))
    return None


def submits_of(
    conn: Tx, *, ids: Sequence[str], fingerprint: str, owner: int | None
) -> dict[str, list[HistoryItem]]:
    """Per object of ``ids``: its single submits with that hash (``owner``: that key's only)."""
    found: dict[str, list[HistoryItem]] = {}
    statement = _SUBMITS_OF_IDS[is_postgres(conn)]
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        part = list(ids[start : start + _IDS_PER_STATEMENT])
        for row in conn.execute(statement, {"ids": part, "fingerprint": fingerprint}):
            if owner is None or row.analyst_key_id == owner:
                found.setdefault(row.object_id, []).append(submitted(row))
    return found


_ASKING = select(_SURVEYS.c.id, _SURVEYS.c.analyst_key_id).where(
    _SURVEYS.c.query_hash == bindparam("query_hash")
)


def surveys_asking(conn: Tx, *, query_hash: str, owner: int | None) -> set[int]:
    """The surveys whose query has that hash (``owner``: only those that key created)."""
    return {
        int(sid)
        for sid, key in conn.execute(_ASKING, {"query_hash": query_hash})
        if owner is None or key == owner
    }


_OVERLAPPING = select(CHUNKS).where(
    CHUNKS.c.survey_id == bindparam("survey_id"),
    CHUNKS.c.decided_at.is_not(None),
    CHUNKS.c.first_id <= bindparam("last"),
    CHUNKS.c.last_id >= bindparam("first"),
)


def chunks_overlapping(conn: Tx, *, survey_id: int, first: str, last: str) -> list[Chunk]:
    """The survey's decided chunks whose id range meets ``[first, last]``, decoded."""
    return [
        decode(row)
        for row in conn.execute(
            _OVERLAPPING, {"survey_id": survey_id, "first": first, "last": last}
        )
    ]

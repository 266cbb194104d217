"""Lookups for ``"reuse": true``: stored answers of an identical query, by its hash.

A single submit's row stores the hash of its query's canonical JSON as ``fingerprint`` and is
found by ``ix_queries_reuse`` ``(object_id, fingerprint)``; a survey stores the same hash as
``query_hash`` (``ix_surveys_query_hash``), and its answers are read from its decided chunks
(:mod:`app.store.chunks`) whose id range covers the object — found through
``ix_survey_chunks_first_id``. Every statement is built once, at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, Row, String, Table, bindparam, func, select
from sqlalchemy import cast as cast_

from app.db.models import ApiKey, ProtectedObject, QueryRecord, Survey
from app.store import ids as ids_
from app.store.base import Tx
from app.store.chunks import CHUNKS, Chunk, decode
from app.store.history import HistoryItem, submitted

_QUERIES = cast(Table, QueryRecord.__table__)
_SURVEYS = cast(Table, Survey.__table__)
_OBJECTS = cast(Table, ProtectedObject.__table__)
_KEYS = cast(Table, ApiKey.__table__)


def _joined(column: ColumnElement[Any], postgres: bool) -> ColumnElement[str]:
    """The group's values of ``column`` as one text, joined by newlines."""
    text = cast_(column, String)
    if postgres:
        return func.string_agg(text, "\n")
    return func.group_concat(text, "\n")


#: The members' ranges grouped by domain and retirement: one row per distinct (domain,
#: retired) with the ids and numbers joined in texts — two or three rows for a chunk of 5,000
#: members, where a row per member cost ~5 µs each to fetch and convert. The aggregates of one
#: group read its rows in one pass, so the three texts list the members in the same order.
_BOUNDS = ids_.both(
    lambda postgres: (
        select(
            _OBJECTS.c.domain_hash,
            # a boolean: no timestamp to parse
            _OBJECTS.c.retired_at.is_not(None),
            _joined(_OBJECTS.c.id, postgres),
            _joined(_OBJECTS.c.version_start, postgres),
            _joined(_OBJECTS.c.accepted, postgres),
        )
        .where(ids_.among(_OBJECTS.c.id, postgres=postgres))
        .group_by(_OBJECTS.c.domain_hash, _OBJECTS.c.retired_at.is_not(None))
    )
)


@dataclass(frozen=True)
class MemberBounds:
    """What a reuse reads of a chunk's members, as arrays by position in the chunk's ids.

    A member's current version's entries are numbered ``(version_start, accepted]``. Arrays,
    not an object per member: a chunk has 5,000 of them and a survey up to millions.
    """

    #: The member has an object row.
    found: npt.NDArray[np.bool_]
    version_start: npt.NDArray[np.int64]
    accepted: npt.NDArray[np.int64]
    retired: npt.NDArray[np.bool_]
    #: The member's domain, an index into ``domain_hashes`` (the texts:
    #: :func:`app.store.domains.domain_texts`, one per distinct domain).
    domain: npt.NDArray[np.int64]
    domain_hashes: list[str]


def member_bounds(conn: Tx, ids: Sequence[str]) -> MemberBounds:
    """The members' current-version ranges (``ids`` sorted), read without locking.

    A reuse writes nothing, so nothing is locked.
    """
    n = len(ids)
    bounds = MemberBounds(
        found=np.zeros(n, np.bool_),
        version_start=np.zeros(n, np.int64),
        accepted=np.zeros(n, np.int64),
        retired=np.zeros(n, np.bool_),
        domain=np.zeros(n, np.int64),
        domain_hashes=[],
    )
    codes: dict[str, int] = {}
    for domain_hash, retired, members, starts, accepted in ids_.rows_among(conn, _BOUNDS, ids):
        at = positions(ids, members.split("\n"))
        bounds.found[at] = True
        bounds.version_start[at] = np.array(starts.split("\n"), np.int64)
        bounds.accepted[at] = np.array(accepted.split("\n"), np.int64)
        bounds.retired[at] = bool(retired)
        bounds.domain[at] = codes.setdefault(domain_hash, len(codes))
    bounds.domain_hashes.extend(codes)
    return bounds


def positions(ids: Sequence[str], some: Sequence[str]) -> npt.NDArray[np.int64]:
    """Where each of ``some`` is in the sorted ``ids`` (every one of them must be there)."""
    if list(some) == list(ids):
        return np.arange(len(ids), dtype=np.int64)
    return np.searchsorted(np.asarray(ids), np.asarray(some)).astype(np.int64)


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
_SUBMITS_OF_IDS = ids_.where_among(
    select(*_SUBMIT_COLUMNS).where(_QUERIES.c.fingerprint == bindparam("fingerprint")),
    _QUERIES.c.object_id,
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
    rows = ids_.rows_among(conn, _SUBMITS_OF_IDS, ids, params={"fingerprint": fingerprint})
    for row in rows:
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

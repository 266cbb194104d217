"""What ``gatekeeper verify`` reads: every object's stored state, likelihood states, surveys.

Read only, in id order, each as a typed row; the replay and the comparisons are the service's
(:mod:`app.services.verify`). A whole run reads in pages (:func:`object_page` and the readers
of a page's submits, closed versions, likelihood arrays and chunks): a handful of statements per
thousands of objects instead of four or five per object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, func, select

from app.db.models import (
    DomainRecord,
    LikelihoodStateRecord,
    ProtectedObject,
    QueryRecord,
    Survey,
    SurveyChunk,
    domain_text_of,
)
from app.store import ids as ids_
from app.store.base import Tx
from app.store.history import HistoryItem
from app.store.history import submitted as history_item
from app.store.states import load_states

_OBJECTS = cast(Table, ProtectedObject.__table__)
_STATES = cast(Table, LikelihoodStateRecord.__table__)
_SURVEYS = cast(Table, Survey.__table__)
_CHUNKS = cast(Table, SurveyChunk.__table__)
_DOMAINS = cast(Table, DomainRecord.__table__)
_QUERIES = cast(Table, QueryRecord.__table__)


@dataclass(frozen=True)
class StoredObject:
    """An object's accounting state as stored (what its history must reproduce)."""

    id: str
    #: The domain's canonical JSON text.
    domain: str
    budget: float
    budget_delta: float | None
    accepted: int
    basic_total: str
    f0_account: str
    history_hash: str | None
    state_hash: str | None
    #: Last history entries the array does not hold (``objects.state_pending``).
    state_pending: int
    loss_lower: float
    loss_upper: float
    data_version: int
    version_start: int
    lifetime_exact: str | None
    lifetime_lower: float
    lifetime_upper: float


@dataclass(frozen=True)
class StoredState:
    """A likelihood array as stored: its bytes and float error bound."""

    state: bytes
    err: float


@dataclass(frozen=True)
class SurveyCounters:
    """A survey's counters as stored."""

    id: int
    total: int
    decided: int
    accepted: int


@dataclass(frozen=True)
class ChunkRow:
    """A ``survey_chunks`` row as stored (``app.store.chunks.decode`` reads it)."""

    survey_id: int
    chunk: int
    size: int
    first_id: str
    last_id: str
    members: str
    decided_at: datetime | None
    picks: str | None
    seqs: str | None
    variants: str | None


_COUNT = select(func.count()).select_from(_OBJECTS)
_ALL = select(
    _OBJECTS.c.id,
    domain_text_of(_OBJECTS.c.domain_hash),
    _OBJECTS.c.budget,
    _OBJECTS.c.budget_delta,
    _OBJECTS.c.accepted,
    _OBJECTS.c.basic_total,
    _OBJECTS.c.f0_account,
    _OBJECTS.c.history_hash,
    _OBJECTS.c.state_hash,
    _OBJECTS.c.state_pending,
    _OBJECTS.c.loss_lower,
    _OBJECTS.c.loss_upper,
    _OBJECTS.c.data_version,
    _OBJECTS.c.version_start,
    _OBJECTS.c.lifetime_exact,
    _OBJECTS.c.lifetime_lower,
    _OBJECTS.c.lifetime_upper,
).order_by(_OBJECTS.c.id)
_REST = list(_ALL.selected_columns)[2:]  # after the id and the domain's text
#: A page of objects by id (keyset: the primary key's index, no offset), with the domain's hash
#: instead of its text (read once, :func:`domains`).
_PAGE = select(_OBJECTS.c.id, _OBJECTS.c.domain_hash, *_REST).order_by(_OBJECTS.c.id)
_IDS = select(_OBJECTS.c.id).order_by(_OBJECTS.c.id).offset(bindparam("at")).limit(1)
_DOMAIN_TEXTS = select(_DOMAINS.c.hash, _DOMAINS.c.text)
_USERS = (
    select(_OBJECTS.c.state_hash, func.count())
    .where(_OBJECTS.c.state_hash.is_not(None))
    .group_by(_OBJECTS.c.state_hash)
)
_STORED_KEYS = select(_STATES.c.hash)
_COUNTERS = select(_SURVEYS.c.id, _SURVEYS.c.total, _SURVEYS.c.decided, _SURVEYS.c.accepted)
_CHUNK_ROWS = select(
    _CHUNKS.c.survey_id,
    _CHUNKS.c.chunk,
    _CHUNKS.c.size,
    _CHUNKS.c.first_id,
    _CHUNKS.c.last_id,
    _CHUNKS.c.members,
    _CHUNKS.c.decided_at,
    _CHUNKS.c.picks,
    _CHUNKS.c.seqs,
    _CHUNKS.c.variants,
).order_by(_CHUNKS.c.survey_id, _CHUNKS.c.chunk)


def object_count(conn: Tx) -> int:
    """How many objects are stored."""
    return int(conn.execute(_COUNT).scalar_one())


def objects(conn: Tx) -> Iterator[StoredObject]:
    """Every object (retired ones too), in id order."""
    for row in conn.execute(_ALL):
        yield StoredObject(*row)


def domains(conn: Tx) -> dict[str, str]:
    """Every stored domain's canonical text, by hash."""
    return {str(h): str(text) for h, text in conn.execute(_DOMAIN_TEXTS)}


def object_page(
    conn: Tx,
    *,
    after: str | None,
    upto: str | None = None,
    size: int,
    domain_texts: dict[str, str],
) -> list[StoredObject]:
    """At most ``size`` objects with ids in ``(after, upto]`` (None: unbounded), in id order.

    ``domain_texts``: :func:`domains` (a domain stored since is read and added to it).
    """
    statement = _PAGE.limit(size)
    if after is not None:
        statement = statement.where(_OBJECTS.c.id > after)
    if upto is not None:
        statement = statement.where(_OBJECTS.c.id <= upto)
    page = []
    for object_id, domain_hash, *rest in conn.execute(statement):
        text = domain_texts.get(domain_hash)
        if text is None:
            domain_texts.update(domains(conn))
            text = domain_texts[domain_hash]
        page.append(StoredObject(object_id, text, *rest))
    return page


def ids_at(conn: Tx, positions: Sequence[int]) -> list[str]:
    """The ids at these positions (0-based) of the id order (positions past the end: none)."""
    found = []
    for at in positions:
        object_id = conn.execute(_IDS, {"at": at}).scalar_one_or_none()
        if object_id is not None:
            found.append(str(object_id))
    return found


_SUBMITS_OF = ids_.where_among(
    select(_QUERIES).order_by(_QUERIES.c.object_id, _QUERIES.c.seq), _QUERIES.c.object_id
)


def submits_of(conn: Tx, ids: Sequence[str]) -> dict[str, list[HistoryItem]]:
    """Every stored single submit of the objects ``ids``, by object, in ``seq`` order."""
    found: dict[str, list[HistoryItem]] = {}
    for row in ids_.rows_among(conn, _SUBMITS_OF, ids):
        found.setdefault(row.object_id, []).append(history_item(row))
    return found


def likelihood_states(conn: Tx, keys: Sequence[str]) -> dict[str, StoredState]:
    """The likelihood arrays stored under ``keys`` (the ones that exist), by key."""
    return {key: StoredState(*found) for key, found in load_states(conn, set(keys)).items()}


@dataclass(frozen=True)
class ChunkRange:
    """Where a survey chunk sits in id order, without its members.

    Enough to know which chunk covers an id, as :func:`app.store.chunks.chunks_covering` finds it.
    """

    survey_id: int
    chunk: int
    first_id: str
    last_id: str
    decided: bool


_RANGES = select(
    _CHUNKS.c.survey_id,
    _CHUNKS.c.chunk,
    _CHUNKS.c.first_id,
    _CHUNKS.c.last_id,
    _CHUNKS.c.decided_at.is_not(None),
).order_by(_CHUNKS.c.survey_id, _CHUNKS.c.first_id, _CHUNKS.c.chunk)


def chunk_ranges(conn: Tx) -> list[ChunkRange]:
    """Every survey chunk's range, by survey and first id."""
    return [
        ChunkRange(int(s), int(c), f, last, bool(d)) for s, c, f, last, d in conn.execute(_RANGES)
    ]


def likelihood_state(conn: Tx, *, key: str) -> StoredState | None:
    """The likelihood array stored under ``key``, or None (:func:`load_states`' read)."""
    found = load_states(conn, {key}).get(key)
    return None if found is None else StoredState(*found)


def state_users(conn: Tx) -> dict[str, int]:
    """How many objects name each likelihood state key."""
    return {key: int(count) for key, count in conn.execute(_USERS)}


def stored_state_keys(conn: Tx) -> set[str]:
    """The keys of every stored likelihood state."""
    return {key for (key,) in conn.execute(_STORED_KEYS)}


def survey_counters(conn: Tx) -> dict[int, SurveyCounters]:
    """Every survey's counters, by id."""
    return {row.id: SurveyCounters(*row) for row in conn.execute(_COUNTERS)}


def chunks(conn: Tx) -> Iterator[ChunkRow]:
    """Every survey chunk, by survey and chunk number."""
    for row in conn.execute(_CHUNK_ROWS):
        yield ChunkRow(
            survey_id=row.survey_id,
            chunk=row.chunk,
            size=row.size,
            first_id=row.first_id,
            last_id=row.last_id,
            members=row.members,
            decided_at=row.decided_at,
            picks=row.picks,
            seqs=row.seqs,
            variants=row.variants,
        )

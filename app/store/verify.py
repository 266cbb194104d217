"""What ``gatekeeper verify`` reads: every object's stored state, likelihood states, surveys.

Read only, in id order, each as a typed row; the replay and the comparisons are the service's
(:mod:`app.services.verify`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, func, select

from app.db.models import (
    LikelihoodStateRecord,
    ProtectedObject,
    Survey,
    SurveyChunk,
    domain_text_of,
)
from app.store.base import Tx

_OBJECTS = cast(Table, ProtectedObject.__table__)
_STATES = cast(Table, LikelihoodStateRecord.__table__)
_SURVEYS = cast(Table, Survey.__table__)
_CHUNKS = cast(Table, SurveyChunk.__table__)


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
_STATE = select(_STATES.c.state, _STATES.c.err).where(_STATES.c.hash == bindparam("key"))
_USERS = (
    select(_OBJECTS.c.state_hash, func.count())
    .where(_OBJECTS.c.state_hash.is_not(None))
    .group_by(_OBJECTS.c.state_hash)
)
_REFS = select(_STATES.c.hash, _STATES.c.refs)
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


def likelihood_state(conn: Tx, *, key: str) -> StoredState | None:
    """The likelihood array stored under ``key``, or None."""
    row = conn.execute(_STATE, {"key": key}).one_or_none()
    return None if row is None else StoredState(*row)


def state_users(conn: Tx) -> dict[str, int]:
    """How many objects name each likelihood state key."""
    return {key: int(count) for key, count in conn.execute(_USERS)}


def state_refs(conn: Tx) -> dict[str, int]:
    """The user count each stored likelihood state records."""
    return {key: int(refs) for key, refs in conn.execute(_REFS)}


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

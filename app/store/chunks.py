"""A survey's members and answers, packed per chunk (the ``survey_chunks`` table).

A survey's membership is fixed at creation and cut into chunks of ``SURVEY_CHUNK_SIZE`` members
in sorted id order; a chunk is decided in one transaction (:mod:`app.services.survey_runs`) and
then holds every member's decision. One row per chunk instead of a member row and a history row
per member: a million answers take ~10 MB instead of ~380 MB (PostgreSQL compresses the texts;
measured in docs/benchmarks.md). This module is the table's format and every statement on it.

The format (all JSON, compact separators):

* ``members``: the ids, sorted (Python string order: ids are ASCII), joined by newlines;
* ``picks``: per member, an index into ``variants`` when accepted, else a refusal code
  (:data:`REFUSAL_CODES`);
* ``seqs``: per member, the answer's sequence number in its object's history (0: refused;
  negative: answered by reuse, the number of the stored answer it repeats, no entry of its own);
* ``variants``: the distinct history entries the chunk's answers are (:class:`Variant`) — the
  members of a decision group that drew the same output share one.

The chunks of one survey hold disjoint, consecutive runs of the sorted ids, so an object's
answers are in the decided chunks whose ``[first_id, last_id]`` covers its id
(:func:`chunks_covering`); :mod:`app.services.history` merges them into the object's history.
Nothing is written to the object's row but its accounting columns, whose size a survey does not
change — which keeps PostgreSQL's updates of it in place (HOT; docs/benchmarks.md).

>>> rows = list(pack_sorted(sorted(["b", "a", "c"]), survey_id=7, size=2))
>>> [(r["chunk"], r["members"].split()) for r in rows]
[(0, ['a', 'b']), (1, ['c'])]
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, cast

import orjson
from sqlalchemy import String, Table, bindparam, insert, select, true, tuple_, update

from app.db.models import Survey, SurveyChunk
from app.store.base import Tx, is_postgres

CHUNKS = cast(Table, SurveyChunk.__table__)
_SURVEYS = cast(Table, Survey.__table__)

#: A refused member's code in ``picks``, by reason (``app.services.survey_groups.Refusal``).
REFUSAL_CODES = {
    "budget-exhausted": -1,
    "invalid-for-domain": -2,
    "retired": -3,
    "lifetime-exhausted": -4,
    "quota-exhausted": -5,
}
REASONS = {code: reason for reason, code in REFUSAL_CODES.items()}


@dataclass(frozen=True)
class Variant:
    """One history entry shared by answers of a chunk: what a history row held."""

    query: str
    output: str
    epsilon: float
    epsilon_exact: str
    loss_lower: float
    loss_upper: float
    basic_after: float


@dataclass(frozen=True)
class MemberDecision:
    """A member's decision as read from its chunk."""

    object_id: str
    status: str  # "pending" | "accepted" | "refused" ("invalid": a damaged chunk row)
    reason: str | None
    seq: int
    variant: Variant | None
    #: Answered by reuse (``"reuse": true``): ``seq`` is the stored answer's own number, and
    #: this member adds no entry to the object's history (stored as ``-seq`` in ``seqs``).
    reused: bool = False


@dataclass(frozen=True)
class Chunk:
    """A decoded ``survey_chunks`` row."""

    survey_id: int
    chunk: int
    members: list[str]
    decided_at: datetime | None
    picks: list[int] | None
    seqs: list[int] | None
    #: The stored variants as parsed JSON objects (:meth:`decision` makes the one it needs).
    variants: list[dict[str, Any]]

    def position(self, object_id: str) -> int | None:
        """Where ``object_id`` is among the members (None: not a member)."""
        at = bisect.bisect_left(self.members, object_id)
        if at < len(self.members) and self.members[at] == object_id:
            return at
        return None

    def decision(self, at: int) -> MemberDecision:
        """The decision of the member at position ``at``."""
        object_id = self.members[at]
        if self.picks is None or self.seqs is None:
            return MemberDecision(object_id, "pending", None, 0, None)
        if at >= min(len(self.picks), len(self.seqs)) or self.picks[at] >= len(self.variants):
            # a damaged row (``gatekeeper verify`` says how): no answer can be read from it
            return MemberDecision(object_id, "invalid", None, 0, None)
        pick = self.picks[at]
        if pick < 0:
            return MemberDecision(object_id, "refused", REASONS.get(pick, "unknown"), 0, None)
        variant = Variant(**self.variants[pick])
        seq = self.seqs[at]
        return MemberDecision(object_id, "accepted", None, abs(seq), variant, reused=seq < 0)

    def answer(self, object_id: str) -> MemberDecision | None:
        """``object_id``'s decision, when it is a member."""
        at = self.position(object_id)
        return None if at is None else self.decision(at)


def pack_sorted(ids: Iterable[str], *, survey_id: int, size: int) -> Iterator[dict[str, Any]]:
    """``survey_chunks`` rows (pending) of ids arriving in increasing order, as they come.

    Raises ValueError when an id is not above the one before (a database that ordered them
    otherwise than bytewise, or a repeated id): the chunks' lookups rely on that order.
    """
    part: list[str] = []
    previous: str | None = None
    number = 0
    for object_id in ids:
        if previous is not None and object_id <= previous:
            raise ValueError(f"member ids out of order: {object_id!r} after {previous!r}")
        previous = object_id
        part.append(object_id)
        if len(part) == size:
            yield _pending_row(survey_id, number, part)
            number, part = number + 1, []
    if part:
        yield _pending_row(survey_id, number, part)


def _pending_row(survey_id: int, number: int, part: list[str]) -> dict[str, Any]:
    return {
        "survey_id": survey_id,
        "chunk": number,
        "size": len(part),
        "first_id": part[0],
        "last_id": part[-1],
        "members": "\n".join(part),
    }


def decided_columns(picks: list[int], seqs: list[int], variants: list[Variant]) -> dict[str, str]:
    """The texts a decided chunk stores (compact JSON; orjson writes dataclasses as objects)."""
    return {
        "picks": orjson.dumps(picks).decode(),
        "seqs": orjson.dumps(seqs).decode(),
        "variants": orjson.dumps(variants).decode(),
    }


def decode(row: Any) -> Chunk:
    """A ``survey_chunks`` row (any object with its columns) as a :class:`Chunk`."""
    return Chunk(
        survey_id=int(row.survey_id),
        chunk=int(row.chunk),
        members=row.members.split("\n"),
        decided_at=row.decided_at,
        picks=orjson.loads(row.picks) if row.picks is not None else None,
        seqs=orjson.loads(row.seqs) if row.seqs is not None else None,
        variants=orjson.loads(row.variants) if row.variants else [],
    )


def chunks_covering(conn: Tx, object_id: str) -> list[tuple[int, int]]:
    """``(survey_id, chunk)`` of the decided chunks whose id range covers ``object_id``.

    A survey's chunks hold disjoint runs of its sorted ids, so per survey only the last chunk
    starting at or before the id can cover it. PostgreSQL finds it with one probe of
    ``ix_survey_chunks_first_id`` per survey (a ``LATERAL`` subquery); SQLite, the embedded
    default, compares every chunk's range. Measured on PostgreSQL (``bench/history_read.py``,
    docs/benchmarks.md): 0.17 / 0.22 / 0.61 ms a lookup at 602 / 10,602 / 100,602 chunks (3 /
    53 / 503 surveys), the scan 0.14 / 0.76 / 1.49 ms. Ids compare bytewise (``COLLATE "C"``
    columns on PostgreSQL, SQLite's default). A covering chunk may still not hold the id (a
    cohort need not be every object): :meth:`Chunk.answer` says.
    """
    statement = _PROBE if is_postgres(conn) else _SCAN
    return [(int(s), int(c)) for s, c in conn.execute(statement, {"x": object_id})]


_ID = bindparam("x", type_=String)
#: Every decided chunk's range compared with the id (SQLite).
_SCAN = select(CHUNKS.c.survey_id, CHUNKS.c.chunk).where(
    CHUNKS.c.decided_at.is_not(None), CHUNKS.c.first_id <= _ID, CHUNKS.c.last_id >= _ID
)
#: Per survey, the last chunk starting at or before the id: an index probe (PostgreSQL).
_LAST_STARTING = (
    select(CHUNKS.c.survey_id, CHUNKS.c.chunk, CHUNKS.c.last_id, CHUNKS.c.decided_at)
    .where(CHUNKS.c.survey_id == _SURVEYS.c.id, CHUNKS.c.first_id <= _ID)
    .order_by(CHUNKS.c.first_id.desc())
    .limit(1)
    .lateral()
)
_PROBE = (
    select(_LAST_STARTING.c.survey_id, _LAST_STARTING.c.chunk)
    .select_from(_SURVEYS.join(_LAST_STARTING, true()))
    .where(_LAST_STARTING.c.decided_at.is_not(None), _LAST_STARTING.c.last_id >= _ID)
)


class ChunkSpan(NamedTuple):
    """A decided chunk's key and the range of ids it covers."""

    survey_id: int
    chunk: int
    first_id: str
    last_id: str


def chunks_overlapping(conn: Tx, low: str, high: str) -> list[ChunkSpan]:
    """The decided chunks whose id range meets ``[low, high]`` (one statement).

    :func:`chunks_covering` for a run of ids at once (a survey chunk's members): every chunk
    covering one of them is among these (its range meets the run's); which of them covers
    which id is for the caller to compare (ids compare bytewise, as Python compares ``str``).
    """
    statement = select(
        CHUNKS.c.survey_id, CHUNKS.c.chunk, CHUNKS.c.first_id, CHUNKS.c.last_id
    ).where(CHUNKS.c.decided_at.is_not(None), CHUNKS.c.first_id <= high, CHUNKS.c.last_id >= low)
    return [ChunkSpan(int(s), int(c), f, last) for s, c, f, last in conn.execute(statement)]


def load_chunks(conn: Tx, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Chunk]:
    """The chunks named by ``(survey_id, chunk)`` pairs, decoded."""
    found: dict[tuple[int, int], Chunk] = {}
    wanted = sorted(set(keys))
    for start in range(0, len(wanted), 100):
        part = wanted[start : start + 100]
        condition = tuple_(CHUNKS.c.survey_id, CHUNKS.c.chunk).in_(part)
        for row in conn.execute(select(CHUNKS).where(condition)):
            decoded = decode(row)
            found[(decoded.survey_id, decoded.chunk)] = decoded
    return found


class ChunkCache:
    """Decoded *decided* chunks, the most recent ``capacity`` of them; thread-safe.

    A decided chunk never changes (only a pending one is written, once), so holding it is safe
    for as long as its database exists; pending chunks are never held. A scan in id order
    (``gatekeeper verify``) reuses each chunk for its 5,000 members.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._chunks: dict[tuple[int, int], Chunk] = {}
        self._guard = threading.Lock()

    def get_many(self, conn: Tx, keys: Sequence[tuple[int, int]]) -> list[Chunk]:
        """The chunks of ``keys`` (loading the ones not held)."""
        with self._guard:
            held = {k: self._chunks[k] for k in keys if k in self._chunks}
        missing = [k for k in keys if k not in held]
        if missing:
            loaded = load_chunks(conn, missing)
            for key in missing:
                if key not in loaded:
                    raise LookupError(f"survey {key[0]} has no chunk {key[1]}")
            held.update(loaded)
            with self._guard:
                for key, chunk in loaded.items():
                    if chunk.picks is None:
                        continue
                    self._chunks.pop(key, None)
                    while len(self._chunks) >= self.capacity:
                        self._chunks.pop(next(iter(self._chunks)))
                    self._chunks[key] = chunk
        return [held[k] for k in keys]


#: Decoded chunks per database (its URL without the password), shared by this process's
#: history reads: a dashboard paging through objects of one survey reads each chunk once.
_SHARED: dict[str, ChunkCache] = {}
_SHARED_GUARD = threading.Lock()
SHARED_CHUNKS = 32


def shared_cache(conn: Tx) -> ChunkCache:
    """The process's chunk cache for ``conn``'s database."""
    name = conn.engine.url.render_as_string(hide_password=True)
    with _SHARED_GUARD:
        found = _SHARED.get(name)
        if found is None:
            found = _SHARED[name] = ChunkCache(SHARED_CHUNKS)
        return found


# ------------------------------------------------------------------------------ a survey's chunks
#: Pending chunk rows inserted per statement while a survey's membership is stored.
_INSERT_BATCH = 20


def store_members(
    conn: Tx, *, survey_id: int, ids: Iterable[str], size: int, max_members: int
) -> int:
    """Store the members (``ids`` in increasing order, streamed) as pending chunks of ``size``.

    Returns how many there are, counting stopping past ``max_members``: the caller refuses the
    cohort then and its transaction rolls back, so a huge cohort is never stored whole.
    """
    count = 0
    batch: list[dict[str, Any]] = []
    for row in pack_sorted(ids, survey_id=survey_id, size=size):
        count += int(row["size"])
        if count > max_members:
            return count
        batch.append(row)
        if len(batch) == _INSERT_BATCH:
            conn.execute(insert(CHUNKS), batch)
            batch = []
    if batch:
        conn.execute(insert(CHUNKS), batch)
    return count


_ENDS = (
    select(CHUNKS.c.chunk, CHUNKS.c.last_id)
    .where(CHUNKS.c.survey_id == bindparam("survey_id"))
    .order_by(CHUNKS.c.chunk)
)


def chunk_ends(conn: Tx, *, survey_id: int) -> list[tuple[int, str]]:
    """``(chunk, last member id)`` of every chunk of the survey, in order."""
    return [(int(n), str(last)) for n, last in conn.execute(_ENDS, {"survey_id": survey_id})]


_PENDING = (
    select(CHUNKS.c.chunk)
    .where(CHUNKS.c.survey_id == bindparam("survey_id"), CHUNKS.c.decided_at.is_(None))
    .order_by(CHUNKS.c.chunk)
)


def pending_chunks(conn: Tx, *, survey_id: int) -> list[int]:
    """The numbers of the survey's chunks not decided yet, in order."""
    return [int(n) for n in conn.execute(_PENDING, {"survey_id": survey_id}).scalars()]


_PENDING_MEMBERS = select(CHUNKS.c.members).where(
    CHUNKS.c.survey_id == bindparam("survey_id"),
    CHUNKS.c.chunk == bindparam("chunk"),
    CHUNKS.c.decided_at.is_(None),
)
_PENDING_MEMBERS_LOCKED = _PENDING_MEMBERS.with_for_update()


def take_pending(conn: Tx, *, survey_id: int, chunk: int) -> list[str] | None:
    """The chunk's member ids if it is still pending (None: decided already).

    Locked ``FOR UPDATE`` on PostgreSQL: a second worker on the same chunk waits, then finds it
    decided (SQLite has one writer at a time anyway).
    """
    statement = _PENDING_MEMBERS_LOCKED if is_postgres(conn) else _PENDING_MEMBERS
    members = conn.execute(statement, {"survey_id": survey_id, "chunk": chunk}).scalar()
    return None if members is None else str(members).split("\n")


_DECIDE = (
    update(CHUNKS)
    .where(
        CHUNKS.c.survey_id == bindparam("where_survey"),
        CHUNKS.c.chunk == bindparam("where_chunk"),
        CHUNKS.c.decided_at.is_(None),
    )
    .values(
        decided_at=bindparam("decided_at"),
        picks=bindparam("picks"),
        seqs=bindparam("seqs"),
        variants=bindparam("variants"),
    )
)


def mark_decided(
    conn: Tx,
    *,
    survey_id: int,
    chunk: int,
    decided_at: datetime,
    picks: list[int],
    seqs: list[int],
    variants: list[Variant],
) -> bool:
    """Store the chunk's decisions, only from pending (a member is decided at most once).

    False when the chunk was not pending any more: the caller rolls its transaction back.
    """
    parameters = {
        "where_survey": survey_id,
        "where_chunk": chunk,
        "decided_at": decided_at,
        **decided_columns(picks, seqs, variants),
    }
    return conn.execute(_DECIDE, parameters).rowcount == 1

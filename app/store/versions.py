"""Data versions: closing an object's version and opening the next; reading closed versions.

Closing copies the version's value as stored (its ciphertext, never decrypted) and its final
accounting; opening writes the new value and resets the object's accounting columns with the
same compare-and-set on ``objects.version`` that a submit uses, and drops the projects'
sub-histories of the object. On PostgreSQL the writes of a whole batch are one statement, its
rows one JSON text (:func:`replace_versions`; measured in docs/benchmarks.md, "Bulk versions");
on SQLite an ``executemany`` each.

Two layouts of a closed version, one reader (:func:`closed_versions_among`):

* a single version (``POST /v1/objects/{id}/versions``) is one ``object_versions`` row;
* a bulk request's closed versions are packed into one ``version_batches`` row (migration
  0016), its objects in id order: ``accounts`` is JSON ``{"ids": the ids, sorted as Python
  sorts them, joined by newlines, "variants": [[data_version,
  seq_start, seq_end, repr(loss_lower), repr(loss_upper), loss_exact or null, basic_total],
  ...], "picks": [index into variants per position]}`` (a population's objects share a few
  accountings), ``rejected`` the rejection counts joined by commas and ``ciphertexts`` the
  closed values as stored joined by newlines. The object's row names the batches holding its
  packed versions in ``packed_versions``, their ids comma-separated, oldest first (its position
  in a batch is found by bisecting the ids) — written by the same statement that opens the new
  version (the row is rewritten anyway), a few bytes per version so that PostgreSQL's update
  of the row still fits in its page as often as before (HOT), and no per-version index entry.
  About 16 bytes per version beyond the ciphertext instead of 131 (docs/benchmarks.md,
  "Packed closed versions").

>>> parse_refs("7,9")
[7, 9]
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from itertools import pairwise
from typing import Any, NamedTuple, cast

import orjson
from sqlalchemy import Table, Text, bindparam, func, insert, select, text, type_coerce, update

from app.crypto import active
from app.db.models import ObjectVersion, VersionBatch
from app.store import ids as ids_
from app.store.base import Tx, is_postgres
from app.store.objects import OBJECTS
from app.store.projects import drop_sub_histories

VERSIONS = cast(Table, ObjectVersion.__table__)
BATCHES = cast(Table, VersionBatch.__table__)


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
    basic_total: str


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
#: PostgreSQL: a bulk batch of new versions, its closed versions packed into one
#: ``version_batches`` row. As :data:`_REPLACE_PG`, one statement and one snapshot: the batch
#: copies each object's value (its ciphertext) and rejection count in the request's order
#: (``pos``), and only if every object is still at the version read (``HAVING``: else no batch
#: and no row updated, which the caller rolls back); each opened row adds the batch's id at the
#: end of ``packed_versions``. ``pos``: the object's position in the batch (id order).
_PACK_PG = text(
    "WITH v AS MATERIALIZED (SELECT * FROM json_to_recordset(CAST(:rows AS json)) AS v("
    "object_id text, where_version int, pos int, value text, lifetime_exact text, "
    "lifetime_lower float8, lifetime_upper float8)), "
    "batch AS (INSERT INTO version_batches (closed_at, size, accounts, rejected, ciphertexts) "
    "SELECT :now, count(*), :accounts, "
    "string_agg(CAST(o.rejected AS text), ',' ORDER BY v.pos), "
    "string_agg(o.value, chr(10) ORDER BY v.pos) "
    "FROM v JOIN objects AS o ON o.id = v.object_id AND o.version = v.where_version "
    "HAVING count(*) = :size RETURNING id), "
    "dropped AS (DELETE FROM project_states AS p USING v WHERE p.object_id = v.object_id), "
    "opened AS (UPDATE objects AS o SET value = v.value, version = o.version + 1, "
    "data_version = o.data_version + 1, version_start = o.accepted, state_hash = NULL, "
    "state_pending = 0, history_hash = NULL, loss_lower = 0, loss_upper = 0, "
    "basic_total = '0', f0_account = '0', rejected = 0, lifetime_exact = v.lifetime_exact, "
    "lifetime_lower = v.lifetime_lower, lifetime_upper = v.lifetime_upper, updated_at = :now, "
    "packed_versions = coalesce(o.packed_versions || ',', '') || CAST(b.id AS text) "
    "FROM v, batch AS b WHERE o.id = v.object_id AND o.version = v.where_version RETURNING 1) "
    "SELECT count(*) FROM opened"
).bindparams(bindparam("now", type_=BATCHES.c.closed_at.type))

#: SQLite: what a packed batch copies of each object, its value as stored (not decrypted).
_PACK_READ = ids_.where_among(
    select(OBJECTS.c.id, OBJECTS.c.version, type_coerce(OBJECTS.c.value, Text), OBJECTS.c.rejected),
    OBJECTS.c.id,
)
_OPEN_PACKED_SQLITE = _OPEN_SQLITE.values(
    packed_versions=func.coalesce(OBJECTS.c.packed_versions + ",", "") + bindparam("ref")
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


def parse_refs(stored: str | None) -> list[int]:
    """The batches ``objects.packed_versions`` names (its packed versions'), oldest first."""
    return [int(batch) for batch in stored.split(",")] if stored else []


#: A packed accounting: data_version, seq_start, seq_end, loss_lower, loss_upper, loss_exact,
#: basic_total (the same for most objects of a population).
Account = tuple[int, int, int, float, float, str | None, str]


def pack_accounts(rows: Sequence[ClosingRow], new: Sequence[NewVersion]) -> str:
    """A batch's ``accounts`` text: each row's closing accounting at its position (id order)."""
    accounts: list[Account] = []
    for row, version in zip(rows, new, strict=True):
        if row.id != version.object_id:
            raise ValueError("the closing rows and the new versions are not in one order")
        accounts.append(
            (
                row.data_version,
                row.version_start,
                row.accepted,
                version.loss_lower,
                version.loss_upper,
                version.loss_exact,
                row.basic_total,
            )
        )
    return encode_accounts([row.id for row in rows], accounts)


def encode_accounts(ids: Sequence[str], accounts: Sequence[Account]) -> str:
    r"""The ``accounts`` text of a batch holding ``accounts[i]`` of object ``ids[i]``.

    ``ids`` sorted (Python's order, each once: a batch is bisected). Equal accountings are
    written once; the loss bounds as ``repr`` texts (an exact round trip, infinities included).

    >>> text = encode_accounts(["a", "b"], [(1, 0, 2, 0.5, 0.5, "1/2", "1")] * 2)
    >>> print(text)
    {"ids":"a\nb","variants":[[1,0,2,"0.5","0.5","1/2","1"]],"picks":[0,0]}
    >>> at = datetime(2026, 1, 1)
    >>> batch = PackedBatch.decode(1, at, text, "0,3")
    >>> [(v.object_id, v.loss_upper, v.rejected) for v in batch.rows()]
    [('a', 0.5, 0), ('b', 0.5, 3)]
    """
    if any(a >= b for a, b in pairwise(ids)):
        raise ValueError("a batch's ids must be sorted and distinct")
    variants: dict[tuple[Any, ...], int] = {}
    picks = []
    for n, start, end, lower, upper, exact, basic in accounts:
        key = (int(n), int(start), int(end), repr(float(lower)), repr(float(upper)), exact, basic)
        picks.append(variants.setdefault(key, len(variants)))
    body = {"ids": "\n".join(ids), "variants": [list(key) for key in variants], "picks": picks}
    return orjson.dumps(body).decode()


@dataclass(frozen=True)
class PackedBatch:
    """A ``version_batches`` row decoded (without its ciphertexts)."""

    id: int
    closed_at: datetime
    ids: list[str]
    accounts: list[Account]
    picks: list[int]
    rejected: list[int]

    @classmethod
    def decode(cls, batch: int, closed: datetime, accounts: str, rejected: str) -> PackedBatch:
        """Read a stored batch; ``ValueError`` if its texts do not fit together."""
        try:
            body = orjson.loads(accounts)
            ids = str(body["ids"]).split("\n")
            variants: list[Account] = [
                (
                    int(n),
                    int(s),
                    int(e),
                    float(lo),
                    float(up),
                    None if x is None else str(x),
                    str(b),
                )
                for n, s, e, lo, up, x, b in body["variants"]
            ]
            picks = [int(p) for p in body["picks"]]
            counts = [int(r) for r in rejected.split(",")]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"version batch {batch} is malformed ({type(exc).__name__})") from None
        if (
            not len(ids) == len(picks) == len(counts)
            or any(not 0 <= p < len(variants) for p in picks)
            or any(a >= b for a, b in pairwise(ids))
        ):
            raise ValueError(f"version batch {batch}: its columns do not fit together")
        return cls(batch, closed, ids, variants, picks, counts)

    def position_of(self, object_id: str) -> int | None:
        """Where the object's closed version is in the batch, or None if it is not there."""
        at = bisect.bisect_left(self.ids, object_id)
        return at if at < len(self.ids) and self.ids[at] == object_id else None

    def version(self, position: int) -> ClosedVersion:
        """The closed version at ``position``."""
        n, start, end, lower, upper, exact, basic = self.accounts[self.picks[position]]
        return ClosedVersion(
            object_id=self.ids[position],
            data_version=n,
            seq_start=start,
            seq_end=end,
            loss_lower=lower,
            loss_upper=upper,
            loss_exact=exact,
            basic_total=basic,
            rejected=self.rejected[position],
            closed_at=self.closed_at,
        )

    def rows(self) -> Iterator[ClosedVersion]:
        """Every closed version of the batch, by position."""
        return (self.version(i) for i in range(len(self.ids)))


def _text(found: object) -> str | None:
    return None if found is None else str(found)


class BatchCache:
    """Decoded batches by id, the most recently used kept (a reader of many objects' versions).

    Batches never change but for their ciphertexts (key rotation), which are not decoded: a
    cache lives as long as one reader (a ``gatekeeper verify`` run), never across databases.
    """

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = capacity
        self._batches: OrderedDict[int, PackedBatch] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, batch: int) -> PackedBatch | None:
        """The batch if it is kept."""
        with self._lock:
            found = self._batches.get(batch)
            if found is not None:
                self._batches.move_to_end(batch)
            return found

    def put(self, batch: PackedBatch) -> None:
        """Keep a decoded batch (the least recently used one goes past the capacity)."""
        with self._lock:
            self._batches[batch.id] = batch
            self._batches.move_to_end(batch.id)
            while len(self._batches) > self._capacity:
                self._batches.popitem(last=False)


class BrokenVersions(Exception):
    """A packed version's reference does not lead to that object's closed version."""


#: Version batches read per statement (their integer ids in an expanding ``IN``).
_BATCHES_PER_STATEMENT = 1000
_BATCH_ROWS = select(
    BATCHES.c.id, BATCHES.c.closed_at, BATCHES.c.accounts, BATCHES.c.rejected
).where(BATCHES.c.id.in_(bindparam("ids", expanding=True)))
_REFS_OF = ids_.where_among(
    select(OBJECTS.c.id, OBJECTS.c.packed_versions).where(OBJECTS.c.packed_versions.is_not(None)),
    OBJECTS.c.id,
)
_ROWS = select(*(VERSIONS.c[f.name] for f in fields(ClosedVersion)))
_ROWS_OF = ids_.where_among(_ROWS, VERSIONS.c.object_id)


def load_batches(
    conn: Tx, ids: Sequence[int], cache: BatchCache | None = None
) -> tuple[dict[int, PackedBatch], list[str]]:
    """The batches ``ids`` that exist and decode, by id, and a problem for each that does not."""
    found: dict[int, PackedBatch] = {}
    wanted = []
    for batch in sorted(set(ids)):
        cached = cache.get(batch) if cache is not None else None
        if cached is not None:
            found[batch] = cached
        else:
            wanted.append(batch)
    problems = []
    for start in range(0, len(wanted), _BATCHES_PER_STATEMENT):
        part = wanted[start : start + _BATCHES_PER_STATEMENT]
        for batch, closed, accounts, rejected in conn.execute(_BATCH_ROWS, {"ids": part}):
            try:
                decoded = PackedBatch.decode(int(batch), closed, accounts, rejected)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            found[decoded.id] = decoded
            if cache is not None:
                cache.put(decoded)
    problems.extend(f"version batch {b} is missing" for b in wanted if b not in found)
    return found, problems


def packed_versions(
    conn: Tx,
    refs: dict[str, str | None],
    cache: BatchCache | None = None,
    only: int | None = None,
) -> tuple[dict[str, list[ClosedVersion]], list[str]]:
    """The packed closed versions ``objects.packed_versions`` names, by object id.

    ``refs``: each object's ``packed_versions`` text; ``only``: just that data version. The
    second item lists every reference that does not lead to a version of its object (a missing
    or malformed batch, a batch without the object).
    """
    parsed = {oid: parse_refs(text) for oid, text in refs.items()}
    batches, problems = load_batches(
        conn, [batch for found in parsed.values() for batch in found], cache
    )
    versions: dict[str, list[ClosedVersion]] = {}
    for oid, found in parsed.items():
        for batch in found:
            packed = batches.get(batch)
            if packed is None:
                problems.append(f"{oid}: its version batch {batch} is not readable")
                continue
            position = packed.position_of(oid)
            if position is None:
                problems.append(f"{oid}: version batch {batch} has no version of it")
                continue
            version = packed.version(position)
            if only is None or version.data_version == only:
                versions.setdefault(oid, []).append(version)
    return versions, problems


def closed_versions_among(
    conn: Tx, ids: Sequence[str], cache: BatchCache | None = None, only: int | None = None
) -> tuple[dict[str, list[ClosedVersion]], list[str]]:
    """The closed versions of the objects ``ids`` (both layouts), by object, oldest first.

    ``only``: just that data version. The second item: the broken packed references
    (:func:`packed_versions`) — ``gatekeeper verify`` reports them, the other readers raise.
    """
    found: dict[str, list[ClosedVersion]] = {}
    refs: dict[str, str | None] = {}
    statements = (
        _ROWS_OF
        if only is None
        else ids_.where_among(_ROWS.where(VERSIONS.c.data_version == only), VERSIONS.c.object_id)
    )
    for row in ids_.rows_among(conn, statements, ids):
        found.setdefault(row.object_id, []).append(ClosedVersion(**row._mapping))
    refs.update((str(oid), text) for oid, text in ids_.rows_among(conn, _REFS_OF, ids))
    packed, problems = packed_versions(conn, refs, cache, only)
    for oid, versions in packed.items():
        found.setdefault(oid, []).extend(versions)
    for versions in found.values():
        versions.sort(key=lambda v: v.data_version)
    return found, problems


def _closed_version(conn: Tx, object_id: str, data_version: int) -> ClosedVersion | None:
    found, problems = closed_versions_among(conn, [object_id], only=data_version)
    if problems:
        raise BrokenVersions("; ".join(problems))
    versions = found.get(object_id, [])
    return versions[0] if versions else None


_CURRENT = select(OBJECTS.c.id, OBJECTS.c.data_version, OBJECTS.c.version_start)
_CURRENT_AMONG = ids_.where_among(_CURRENT, OBJECTS.c.id)


def versions_answered(conn: Tx, answers: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The data version each ``(object id, seq)`` answer was given from.

    Ids without an object row are left out.
    """
    if not answers:
        return {}
    ids = sorted({object_id for object_id, _ in answers})
    current: dict[str, tuple[int, int]] = {}
    for oid, number, version_start in ids_.rows_among(conn, _CURRENT_AMONG, ids):
        current[str(oid)] = (int(number), int(version_start))
    earlier = sorted({oid for oid, seq in answers if oid in current and seq <= current[oid][1]})
    spans, problems = closed_versions_among(conn, earlier) if earlier else ({}, [])
    if problems:
        raise BrokenVersions("; ".join(problems))
    found: dict[str, int] = {}
    for object_id, seq in answers:
        if object_id not in current:
            continue
        number, version_start = current[object_id]
        if seq > version_start:
            found[object_id] = number
            continue
        for closed in spans.get(object_id, []):
            if closed.seq_start < seq <= closed.seq_end:
                found[object_id] = closed.data_version
    return found


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
    conn: Tx,
    rows: Sequence[NewVersion],
    *,
    now: datetime,
    sealed: bool = False,
    packed: Sequence[ClosingRow] | None = None,
) -> int:
    """Close each row's object's version and open the next with its value; rows updated.

    Each object is written only if it is still at ``where_version`` (the compare-and-set): the
    closed version copies its value (the ciphertext, never decrypted) and accounting, the
    object gets the new value, its counters start afresh at its accepted count and every
    project's sub-history of it is dropped. Fewer rows than given means a concurrent writer
    came first: the caller must roll back. ``sealed``: the values are already encrypted with
    the process's cipher (else they are encrypted here). ``packed``: the objects' closing rows
    as read in this transaction, in ``rows``' order — the closed versions go into one
    ``version_batches`` row, in id order (else one ``object_versions`` row each).
    """
    if not rows:
        return 0
    accounts = None
    if packed is not None:  # a batch holds its objects in id order (it is bisected)
        order = sorted(range(len(rows)), key=lambda i: rows[i].object_id)
        rows, packed = [rows[i] for i in order], [packed[i] for i in order]
        accounts = pack_accounts(packed, rows)
    if is_postgres(conn):
        if not sealed:
            cipher = active()
            rows = [row._replace(value=cipher.encrypt(row.value)) for row in rows]
        if accounts is not None:
            items = [{**row._asdict(), "pos": pos} for pos, row in enumerate(rows)]
            payload = orjson.dumps(items).decode()
            packing = {"rows": payload, "now": now, "accounts": accounts, "size": len(rows)}
            return int(conn.execute(_PACK_PG, packing).scalar_one())
        # orjson: the C encoder (docs/benchmarks.md, "Import: before and after")
        payload = orjson.dumps([row._asdict() for row in rows]).decode()
        return int(conn.execute(_REPLACE_PG, {"rows": payload, "now": now}).scalar_one())
    if sealed:
        raise ValueError("SQLite encrypts values by the column type: pass them in plaintext")
    # the closing loss under names that are no column of ``objects`` (an executemany's keys
    # named like a column would be added to the UPDATE's SET clause)
    params: list[dict[str, Any]] = [
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
    if packed is not None and accounts is not None:
        batch = _insert_batch_sqlite(conn, rows, accounts, now)
        if batch is None:
            return 0
        for param in params:
            param["ref"] = str(batch)
        updated = int(conn.execute(_OPEN_PACKED_SQLITE, params).rowcount)
    else:
        conn.execute(_CLOSE_SQLITE, params)
        updated = int(conn.execute(_OPEN_SQLITE, params).rowcount)
    drop_sub_histories(conn, object_ids=[row.object_id for row in rows])
    return updated


def _insert_batch_sqlite(
    conn: Tx, rows: Sequence[NewVersion], accounts: str, now: datetime
) -> int | None:
    """Write the batch of ``rows``' closed versions; its id, or None if one object moved on."""
    stored: dict[str, tuple[int, str, int]] = {}
    ids = [row.object_id for row in rows]
    for oid, version, value, rejected in ids_.rows_among(conn, _PACK_READ, ids):
        stored[str(oid)] = (int(version), str(value), int(rejected))
    copied = [stored.get(row.object_id) for row in rows]
    if any(c is None or c[0] != row.where_version for c, row in zip(copied, rows, strict=True)):
        return None
    found = [c for c in copied if c is not None]
    inserted = conn.execute(
        insert(BATCHES)
        .returning(BATCHES.c.id)
        .values(
            closed_at=now,
            size=len(rows),
            accounts=accounts,
            rejected=",".join(str(c[2]) for c in found),
            ciphertexts="\n".join(c[1] for c in found),
        )
    )
    return int(inserted.scalar_one())


def version_range(conn: Tx, *, object_id: str, data_version: int) -> tuple[int, int] | None:
    """The ``seq`` range ``(start, end]`` of a closed version, or None if it is not closed."""
    found = _closed_version(conn, object_id, data_version)
    return None if found is None else (found.seq_start, found.seq_end)


def closed_at(conn: Tx, *, object_id: str, data_version: int) -> datetime | None:
    """When a version was closed (its successor opened), or None if it is not closed."""
    found = _closed_version(conn, object_id, data_version)
    return None if found is None else found.closed_at


def closed_versions(conn: Tx, *, object_id: str) -> list[ClosedVersion]:
    """The object's closed versions, oldest first (``BrokenVersions``: a broken reference)."""
    found, problems = closed_versions_among(conn, [object_id])
    if problems:
        raise BrokenVersions("; ".join(problems))
    return found.get(object_id, [])


_ROW_VALUES = select(
    VERSIONS.c.object_id, VERSIONS.c.data_version, type_coerce(VERSIONS.c.value, Text)
)
_WRITE_ROW_VALUE = (
    update(VERSIONS)
    .where(VERSIONS.c.object_id == bindparam("oid"), VERSIONS.c.data_version == bindparam("number"))
    .values(value=type_coerce(bindparam("stored"), Text))
)
_BATCH_IDS = select(BATCHES.c.id).order_by(BATCHES.c.id)
_CIPHERTEXTS = select(BATCHES.c.ciphertexts).where(BATCHES.c.id == bindparam("batch"))
_WRITE_CIPHERTEXTS = (
    update(BATCHES).where(BATCHES.c.id == bindparam("batch")).values(ciphertexts=bindparam("texts"))
)


def recrypt_closed_values(conn: Tx, recrypt: Callable[[str], str]) -> int:
    """Replace every closed version's stored value ``v`` by ``recrypt(v)``; how many values.

    Both layouts (``gatekeeper encryption rotate``): ``object_versions`` row by row, each
    ``version_batches`` row's ciphertexts in one update (its accounts are not touched).
    """
    rows = [
        {"oid": oid, "number": number, "stored": recrypt(str(stored))}
        for oid, number, stored in conn.execute(_ROW_VALUES)
    ]
    if rows:
        conn.execute(_WRITE_ROW_VALUE, rows)
    count = len(rows)
    for batch in [int(b) for b in conn.execute(_BATCH_IDS).scalars()]:
        stored = str(conn.execute(_CIPHERTEXTS, {"batch": batch}).scalar_one())
        values = [recrypt(value) for value in stored.split("\n")]
        conn.execute(_WRITE_CIPHERTEXTS, {"batch": batch, "texts": "\n".join(values)})
        count += len(values)
    return count

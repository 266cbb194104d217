"""Protected objects (table ``objects``): their rows, the submit's compare-and-set, cohorts.

Two row shapes: :class:`ObjectState`, what a decision reads (with the value and the stored
likelihood array, for a submit or a dry-run), and :class:`ObjectRecord`, the public metadata
(never the value: reading it would decrypt it for nothing). The statements a submit runs are
built once at import time.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Numeric,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.expression import Executable, FromClause
from sqlalchemy.sql.util import ClauseAdapter

from app import crypto
from app.db.models import ObjectCount, ProtectedObject, RejectionRecord
from app.engine.limits import MIN_EPSILON, NEAR_EXHAUSTION_FRACTION
from app.store import compiled
from app.store import ids as ids_
from app.store.base import Tx, is_postgres
from app.store.domains import DOMAIN_TEXT
from app.store.queries import QUERIES, StoredAnswer
from app.store.states import STATES

OBJECTS = cast(Table, ProtectedObject.__table__)
_REJECTIONS = cast(Table, RejectionRecord.__table__)
COUNTS = cast(Table, ObjectCount.__table__)


class PrivateValue:
    """An object's private value as stored, decrypted only when :meth:`reveal` is called.

    A decision never reads the value; only the sampling of an accepted query does
    (:func:`app.services.queries` ``_record_acceptance``), so a rejected or replayed submit, a
    dry run and every error before the sampling never decrypt it. Its ``repr`` shows nothing.
    """

    __slots__ = ("_plain", "_stored")

    def __init__(self, stored: str) -> None:
        self._stored = stored
        self._plain: str | None = None

    def reveal(self) -> str:
        """The value's JSON (decrypted on the first call; raises ``EncryptionKeyError``)."""
        if self._plain is None:
            self._plain = crypto.active().decrypt(self._stored)
        return self._plain

    def __repr__(self) -> str:
        return "PrivateValue(…)"

    def __eq__(self, other: object) -> bool:  # the same stored value (the same ciphertext)
        return isinstance(other, PrivateValue) and other._stored == self._stored

    def __hash__(self) -> int:
        return hash(self._stored)


@dataclass(frozen=True)
class ObjectState:
    """The columns of an object that a decision reads, and its stored likelihood array."""

    id: str
    domain: str
    #: The private value, still encrypted: revealed by a submit only after its decision.
    value: PrivateValue
    budget: float
    filter: str
    finite: bool
    state_hash: str | None
    #: Last history entries the array does not hold yet (``objects.state_pending``).
    state_pending: int
    history_hash: str | None
    #: The likelihood array ``state_hash`` names (None: no accepted query, or continuous).
    state: bytes | None
    state_err: float
    loss_lower: float
    loss_upper: float
    basic_total: str
    accepted: int
    rejected: int
    version: int
    updated_at: datetime | None
    retired_at: datetime | None
    budget_delta: float | None
    f0_account: str
    data_version: int
    version_start: int
    lifetime_budget: float | None
    lifetime_exact: str | None
    lifetime_lower: float
    lifetime_upper: float
    #: Public metadata (a project key sees the object only if they include its scope).
    labels: dict[str, str] | None = None


_NOT_OBJECTS_COLUMNS: dict[str, ColumnElement[Any]] = {
    "domain": DOMAIN_TEXT,
    # as stored (the column type would decrypt it): ObjectState wraps it in a PrivateValue
    "value": type_coerce(OBJECTS.c.value, Text).label("value"),
    "state": STATES.c.state,
    "state_err": func.coalesce(STATES.c.err, 0.0).label("state_err"),
}
#: The columns of :class:`ObjectState` in its fields' order: a row of them is its arguments.
_DECISION_COLUMNS = tuple(
    _NOT_OBJECTS_COLUMNS[f.name] if f.name in _NOT_OBJECTS_COLUMNS else OBJECTS.c[f.name]
    for f in fields(ObjectState)
)
_WITH_STATE = OBJECTS.outerjoin(STATES, STATES.c.hash == OBJECTS.c.state_hash)
#: The condition of an unscoped read of one object: its id (a scoped read: :func:`_in_scope`).
_BY_ID = OBJECTS.c.id == bindparam("object_id")
#: The object's row and its stored likelihood array (finite domains), before :data:`_BY_ID`.
_READ_STATE = select(*_DECISION_COLUMNS).select_from(_WITH_STATE)
#: The object's row and its stored likelihood array, in one statement.
_LOAD_STATE = _READ_STATE.where(_BY_ID)
#: :data:`_LOAD_STATE` on psycopg, in binary format (as :data:`_LOAD_FOR_SUBMIT_PG`).
_LOAD_STATE_PG = compiled.Compiled.of(_LOAD_STATE, binary=True)
#: The same, with the rejection stored under a submit's Idempotency-Key (unique on
#: ``(object, key)``: at most one row joins): a submit reads both in one round trip.
_READ_FOR_SUBMIT = select(
    *_DECISION_COLUMNS,
    QUERIES.c.id.label("answer_id"),
    func.coalesce(QUERIES.c.analyst_key_id, _REJECTIONS.c.analyst_key_id).label("owner"),
    func.coalesce(QUERIES.c.fingerprint, _REJECTIONS.c.fingerprint).label("fingerprint"),
    func.coalesce(QUERIES.c.response, _REJECTIONS.c.response).label("response"),
).select_from(
    _WITH_STATE.outerjoin(
        _REJECTIONS,
        (_REJECTIONS.c.object_id == OBJECTS.c.id)
        & (_REJECTIONS.c.idempotency_key == bindparam("key")),
    ).outerjoin(
        QUERIES,
        (QUERIES.c.object_id == OBJECTS.c.id) & (QUERIES.c.idempotency_key == bindparam("key")),
    )
)
_LOAD_FOR_SUBMIT = _READ_FOR_SUBMIT.where(_BY_ID)
#: :data:`_LOAD_FOR_SUBMIT` run on psycopg directly (:mod:`app.store.compiled`): a single
#: submit's load without SQLAlchemy's execution context and result (the columns' types still
#: process the row; the value is left as stored, see :class:`PrivateValue`), in PostgreSQL's
#: binary format (the likelihood array as its bytes, not as twice as many hex digits).
_LOAD_FOR_SUBMIT_PG = compiled.Compiled.of(_LOAD_FOR_SUBMIT, binary=True)


def _probes(start: FromClause, asked: ColumnElement[str]) -> tuple[FromClause, ColumnElement[str]]:
    """``start`` (one row) joined to two index probes for the ``asked`` id, and the id to read.

    Two probes whatever the id names, of which exactly one finds an entry: the id (found or
    not), then the decoy (:func:`_decoy`, a registered object's id) if it was not found, or
    else ``''`` (never an id: found by nobody). The id to read is the id's own if there is
    such an object, else the decoy's; :func:`_kept` then judges that one row. An object out
    of scope and a missing id so cost the same work: an object's own row read where a missing
    id ended at the index's miss was measurably slower (docs/reliability.md "Timing").
    """
    own, decoy = OBJECTS.alias("own"), OBJECTS.alias("decoy")
    instead = case((own.c.id.is_(None), bindparam("decoy", type_=Text)), else_=literal(""))
    joined = start.outerjoin(own, own.c.id == asked).outerjoin(decoy, decoy.c.id == instead)
    return joined, func.coalesce(own.c.id, decoy.c.id)


def _judged(names: tuple[str, ...]) -> ColumnElement[str]:
    """The row's id if it carries the scope's labels, else NULL: ``CASE WHEN <labels> THEN id``.

    The labels are compared first, on whichever row was read (:func:`_probes`), and the id
    after them (:func:`_kept`): the decoy's row is judged by the same work as the object's own
    (an ``AND`` could end at the id, before reading any label). The label values are
    parameters :func:`_scope_parameter`.
    """
    labels = label_conditions(
        [(name, bindparam(_scope_parameter(i), type_=Text)) for i, name in enumerate(names)]
    )
    return case((and_(true(), *labels), OBJECTS.c.id))


def _kept(names: tuple[str, ...], asked: ColumnElement[str]) -> ColumnElement[bool]:
    """The row read (:func:`_probes`) is the ``asked`` id's own and carries the scope's labels."""
    return _judged(names) == asked


_ASKED = select(bindparam("object_id", type_=OBJECTS.c.id.type).label("id")).subquery("asked")
_PROBED, _TARGET_ID = _probes(_ASKED, _ASKED.c.id)
#: The id whose row a scoped read of ``object_id`` reads (:func:`_probes`).
_TARGET = select(_TARGET_ID).select_from(_PROBED).correlate(None).scalar_subquery()
#: The most scoped reads kept (:func:`_in_scope`): one per read and tuple of label names a
#: project scope has; more are built again when needed (a scope's names come from a project's
#: configuration, not from a request).
_SCOPED_KEPT = 64
_scoped_reads: dict[tuple[Select[Any], tuple[str, ...]], Select[Any]] = {}
_scoped_compiled: dict[Select[Any], compiled.Compiled] = {}
#: Per database, the id of a registered object (:func:`_decoy`).
_decoys: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()
_FIRST_ID = select(func.min(OBJECTS.c.id))


def _decoy(conn: Tx) -> str:
    """A registered object's id, read once per database (objects are never deleted).

    ``''`` while there is none (read again on the next call): with no object, none is hidden.
    """
    found = _decoys.get(conn.engine)
    if found is None:
        found = conn.execute(_FIRST_ID).scalar()
        if found is None:
            return ""
        _decoys[conn.engine] = found
    return found


def _scope_parameter(i: int) -> str:
    return f"scope_value_{i}"


def _scoped(read: Select[Any], names: tuple[str, ...]) -> Select[Any]:
    """``read`` of the row :data:`_TARGET` names, kept if it is ``object_id``'s and in scope."""
    return read.where(
        OBJECTS.c.id == _TARGET, _kept(names, bindparam("object_id", type_=OBJECTS.c.id.type))
    )


def _in_scope(
    conn: Tx, read: Select[Any], scope: list[tuple[str, str]]
) -> tuple[Select[Any], dict[str, str]]:
    """``read`` (one of ``object_id``'s) in ``scope`` (:func:`_scoped`), and its parameters.

    The parameters beside ``object_id``: the scope's values and the decoy (:func:`_decoy`).
    """
    names = tuple(name for name, _ in scope)
    found = _scoped_reads.get((read, names))
    if found is None:
        if len(_scoped_reads) >= _SCOPED_KEPT:
            _scoped_reads.clear()
            _scoped_compiled.clear()
        found = _scoped_reads[read, names] = _scoped(read, names)
    return found, _scope_values(conn, scope)


def _scope_values(conn: Tx, scope: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The parameters of a scoped read beside its ids: the scope's values and the decoy."""
    values = {_scope_parameter(i): value for i, (_, value) in enumerate(scope)}
    values["decoy"] = _decoy(conn)
    return values


_scoped_among: dict[tuple[bool, tuple[str, ...]], Select[Any]] = {}
_ONE = select(literal(1).label("one")).subquery("one")


def ids_in_scope(conn: Tx, ids: Sequence[str], scope: Iterable[tuple[str, str]]) -> Iterator[str]:
    """Those of ``ids`` that name an object in ``scope`` (an ids cohort's check).

    Each id costs what a missing one does when its object is out of scope (:func:`_probes`):
    a cohort of many ids would otherwise add up their differences.
    """
    pairs = list(scope)
    postgres = is_postgres(conn)
    names = tuple(name for name, _ in pairs)
    statement = _scoped_among.get((postgres, names))
    if statement is None:
        if len(_scoped_among) >= _SCOPED_KEPT:
            _scoped_among.clear()
        asked = ids_.listed(postgres=postgres)
        # each id's single read (its probes, its row, its labels judged) in a subquery run
        # once per id: never the ids joined to the objects as a set (a hash or merge join
        # probes the index for all the ids at once and leaves the decoy's probe as the one
        # difference, or judges the labels of every object)
        probed, target = _probes(_ONE, asked.c.id)
        judged = (
            select(_judged(names))
            .select_from(probed.join(OBJECTS, OBJECTS.c.id == target))
            .correlate(asked)
            .scalar_subquery()
        )
        statement = select(asked.c.id).where(judged == asked.c.id)
        _scoped_among[postgres, names] = statement
    values = _scope_values(conn, pairs)
    for part in ids_.batches(ids, size=ids_.per_statement(postgres)):
        listed = ids_.listed_parameter(part, postgres=postgres)
        for row in conn.execute(statement, {"ids": listed, **values}):
            yield str(row.id)


def _compiled_load(
    conn: Tx, read: Select[Any], unscoped: compiled.Compiled, scope: list[tuple[str, str]] | None
) -> tuple[compiled.Compiled, dict[str, str]]:
    """``read`` (a load) in ``scope``, compiled for psycopg (binary), and the scope's values.

    ``unscoped``: ``read`` by :data:`_BY_ID`, compiled, for no scope. The label names are part
    of the statement's text (one compiled statement per tuple of names), their values are its
    parameters (:func:`_in_scope`).
    """
    if scope is None:
        return unscoped, {}
    statement, values = _in_scope(conn, read, scope)
    found = _scoped_compiled.get(statement)
    if found is None:
        found = _scoped_compiled[statement] = compiled.Compiled.of(statement, binary=True)
    return found, values


# Built once: statements with literal ``.values(...)`` are rebuilt and re-keyed for the compiled
# cache on every call, which the profile showed (docs/benchmarks.md). The SET columns of the
# compare-and-set come from the keys of the parameters passed at execution.
COMPARE_AND_SET = update(OBJECTS).where(
    OBJECTS.c.id == bindparam("where_id"), OBJECTS.c.version == bindparam("where_version")
)
#: A rejection is counted under the same compare-and-set as an accepted query (and bumps the
#: version too): counted on the version its decision read, never on one a concurrent new data
#: version opened, and a new version that read the row before it misses its own compare-and-set.
COUNT_REJECTION = (
    update(OBJECTS)
    .where(OBJECTS.c.id == bindparam("where_id"), OBJECTS.c.version == bindparam("where_version"))
    .values(rejected=OBJECTS.c.rejected + 1, version=OBJECTS.c.version + 1)
)
_ACCEPTED = select(OBJECTS.c.accepted).where(OBJECTS.c.id == bindparam("object_id"))


def load_state(
    conn: Tx, *, object_id: str, scope: Iterable[tuple[str, str]] | None = None
) -> ObjectState | None:
    """The object as a decision reads it (one ``SELECT``), or None if there is none.

    With ``scope``: None also when the object is outside it — the statement reads one row and
    its labels whether the id names an object or not (:func:`_scoped`), so an object out of
    scope costs what a missing one does.
    """
    pairs = None if scope is None else list(scope)
    params = {"object_id": object_id}
    if is_postgres(conn):  # psycopg's row in binary format, typed as below
        statement, values = _compiled_load(conn, _READ_STATE, _LOAD_STATE_PG, pairs)
        row = compiled.fetch_one(conn, statement, {**params, **values})
    else:
        scoped, values = (_LOAD_STATE, {}) if pairs is None else _in_scope(conn, _READ_STATE, pairs)
        found = conn.execute(scoped, {**params, **values}).one_or_none()
        row = None if found is None else tuple(found)
    return None if row is None else _state(row)


#: The position of ``value`` in :class:`ObjectState`'s fields (and in a row of its columns).
_VALUE_AT = [f.name for f in fields(ObjectState)].index("value")


def _state(columns: tuple[Any, ...] | list[Any]) -> ObjectState:
    """An :class:`ObjectState` from a row of :data:`_DECISION_COLUMNS` (the value kept sealed)."""
    values = list(columns)
    values[_VALUE_AT] = PrivateValue(values[_VALUE_AT])
    return ObjectState(*values)


def load_for_submit(
    conn: Tx, *, object_id: str, key: str | None, scope: Iterable[tuple[str, str]] | None = None
) -> tuple[ObjectState, StoredAnswer | None] | None:
    """:func:`load_state` and the answer stored under ``key`` (if any), in one ``SELECT``.

    The answer is an accepted query's (its ``query_id`` set) or a rejection's (``query_id``
    None): a key has at most one (a rejected key's retries replay it and are never accepted, an
    accepted key's are never rejected; each table is unique on ``(object, key)``). None when
    there is no such object (or it is outside ``scope``, at the same cost: :func:`load_state`);
    without a key, no answer.
    """
    pairs = None if scope is None else list(scope)
    params = {"object_id": object_id, "key": key}
    if is_postgres(conn):  # the hot path: psycopg's row in binary format, typed as below
        statement, values = _compiled_load(conn, _READ_FOR_SUBMIT, _LOAD_FOR_SUBMIT_PG, pairs)
        row = compiled.fetch_one(conn, statement, {**params, **values})
    else:
        scoped, values = (
            (_LOAD_FOR_SUBMIT, {}) if pairs is None else _in_scope(conn, _READ_FOR_SUBMIT, pairs)
        )
        found = conn.execute(scoped, {**params, **values}).one_or_none()
        row = None if found is None else tuple(found)
    if row is None:
        return None
    *columns, query_id, owner, print_, response = row
    answer = None if print_ is None else StoredAnswer(owner, print_, response, query_id)
    return _state(columns), answer


def compare_and_set(
    conn: Tx,
    *,
    object_id: str,
    version: int,
    accepted: int,
    updated_at: datetime,
    columns: Mapping[str, Any],
) -> bool:
    """Advance the object past one accepted query if it is still at ``version``.

    ``columns`` are its new accounting columns
    (:attr:`app.services.snapshots.Advance.columns`); the version becomes ``version + 1``.
    False when another writer advanced it first (no row hit).
    """
    result = conn.execute(
        COMPARE_AND_SET,
        {
            "where_id": object_id,
            "where_version": version,
            "version": version + 1,
            "accepted": accepted,
            "updated_at": updated_at,
            **columns,
        },
    )
    return bool(result.rowcount == 1)


def count_rejection(conn: Tx, *, object_id: str, version: int) -> bool:
    """Count one more rejected submit on the object if it is still at ``version``.

    The version becomes ``version + 1`` (so a writer that read the row before, such as a new
    data version closing this one with its rejection count, misses its compare-and-set and
    retries). False when another writer advanced the object first (no row hit): the caller rolls
    back and decides again.
    """
    result = conn.execute(COUNT_REJECTION, {"where_id": object_id, "where_version": version})
    return bool(result.rowcount == 1)


def accepted_count(conn: Tx, *, object_id: str) -> int:
    """How many queries the object has accepted (0 for no object)."""
    return int(conn.execute(_ACCEPTED, {"object_id": object_id}).scalar() or 0)


@dataclass(frozen=True)
class ObjectRecord:
    """An object's public columns (everything but its value)."""

    id: str
    domain: str
    budget: float
    budget_delta: float | None
    filter: str
    finite: bool
    labels: dict[str, str] | None
    loss_lower: float
    loss_upper: float
    basic_total: str
    f0_account: str
    accepted: int
    rejected: int
    version: int
    created_at: datetime | None
    updated_at: datetime | None
    retired_at: datetime | None
    data_version: int
    version_start: int
    lifetime_budget: float | None
    lifetime_exact: str | None
    lifetime_lower: float
    lifetime_upper: float


_RECORD_COLUMNS = [
    DOMAIN_TEXT if f.name == "domain" else OBJECTS.c[f.name] for f in fields(ObjectRecord)
]
#: The columns of a record that are the row's own (``domain`` is read through its hash).
_RECORD_FIELDS = [f.name for f in fields(ObjectRecord) if f.name != "domain"]
_READ_RECORD = select(*_RECORD_COLUMNS)
_GET = _READ_RECORD.where(_BY_ID)
_RETIRE = (
    update(OBJECTS)
    .where(OBJECTS.c.id == bindparam("object_id"), OBJECTS.c.retired_at.is_(None))
    .values(
        retired_at=bindparam("at", type_=OBJECTS.c.retired_at.type), version=OBJECTS.c.version + 1
    )
)


def get_object(
    conn: Tx, *, object_id: str, scope: Iterable[tuple[str, str]] | None = None
) -> ObjectRecord | None:
    """The object's public columns, or None if there is none (or it is outside ``scope``).

    Out of scope costs what a missing id does (:func:`_scoped`).
    """
    statement, values = (_GET, {}) if scope is None else _in_scope(conn, _READ_RECORD, list(scope))
    found = conn.execute(statement, {"object_id": object_id, **values}).one_or_none()
    return None if found is None else ObjectRecord(**found._mapping)


def insert_object(conn: Tx, *, columns: Mapping[str, Any], domain: str) -> ObjectRecord:
    """Insert a new object's row (its value in plaintext: the column type encrypts it).

    Its domain (the text ``columns["domain_hash"]`` names) must be stored first
    (:func:`app.store.domains.store_domains`); :class:`~app.store.Conflict` if the id is taken.
    Returns the row as written (no statement reads it back; a column left out is NULL).
    """
    conn.execute(OBJECTS.insert(), dict(columns))
    written: dict[str, Any] = {k: columns.get(k) for k in _RECORD_FIELDS}
    return ObjectRecord(domain=domain, **written)


def retire(conn: Tx, *, object_id: str, at: datetime) -> bool:
    """Mark an active object retired at ``at`` (a new version); False if it already was."""
    return bool(conn.execute(_RETIRE, {"object_id": object_id, "at": at}).rowcount == 1)


def label_conditions(
    labels: Mapping[str, str] | Iterable[tuple[str, str | BindParameter[str]]],
) -> list[ColumnElement[bool]]:
    """SQL conditions: the object carries every ``name: value`` given (all must hold).

    A value may be a parameter (a scoped read binds the values at each execution: :func:`_scoped`).
    """
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return [OBJECTS.c.labels[name].as_string() == value for name, value in pairs]


#: A scope: the ``(name, value)`` labels an object must all carry (None: unscoped).
ScopeLabels = Iterable[tuple[str, str]] | None


def scope_conditions(scope: ScopeLabels) -> list[ColumnElement[bool]]:
    """SQL conditions on ``objects``: in a project's ``scope`` (none at all when unscoped).

    Composes with any other condition of a statement on ``objects`` (``.where(*...)``): every
    listing, total and cohort a project key reads adds it.
    """
    return [] if scope is None else label_conditions(scope)


# --- Which objects: one definition of each status, shared by the odometers list, its totals
# (the dashboard) and the Prometheus gauges (app.store.counts), as small SQL conditions that a
# caller combines (a project's scope is one more condition).

ACTIVE: ColumnElement[bool] = OBJECTS.c.retired_at.is_(None)
RETIRED: ColumnElement[bool] = OBJECTS.c.retired_at.is_not(None)
# In NUMERIC, not double precision: PostgreSQL raises "value out of range: underflow" when a
# float product rounds to zero (0.1 * a budget of 5e-324, stored before budgets had a
# floor), and one such row made every scrape a 500. NUMERIC arithmetic is exact here.
_BUDGET = sql_cast(OBJECTS.c.budget, Numeric)
#: The remaining budget as the odometer computes it (``budget - loss_upper``; the odometer
#: shows it floored at 0, which changes no comparison with a positive bound).
_REMAINING = _BUDGET - sql_cast(OBJECTS.c.loss_upper, Numeric)


def _exact(number: float) -> ColumnElement[Decimal]:
    return literal(Decimal(repr(number)), Numeric)


#: Exhausted: active, and less than the smallest ε a query may declare is left (MIN_EPSILON):
#: no query fits any more.
EXHAUSTED: ColumnElement[bool] = ACTIVE & (_exact(MIN_EPSILON) > _REMAINING)
#: Near exhaustion (the ``gatekeeper_objects_near_exhaustion`` gauge): active, and the remaining
#: budget is below NEAR_EXHAUSTION_FRACTION of the budget — the exhausted ones included.
NEAR_EXHAUSTION: ColumnElement[bool] = ACTIVE & (
    _exact(NEAR_EXHAUSTION_FRACTION) * _BUDGET > _REMAINING
)
#: The statuses a list may ask for, each one condition.
STATUSES: dict[str, ColumnElement[bool]] = {
    "active": ACTIVE,
    "exhausted": EXHAUSTED,
    "near_exhaustion": NEAR_EXHAUSTION,
    "retired": RETIRED,
}


def id_prefix_condition(conn: Tx, prefix: str) -> ColumnElement[bool]:
    r"""The object's id starts with ``prefix`` (case-sensitive), as an indexed search.

    SQLite compares text bytewise, so the prefix is the range ``[prefix, successor)`` of the
    primary key's index. On PostgreSQL, whose collation need not be bytewise, it is ``LIKE
    'prefix%'`` (the prefix's ``%``, ``_`` and ``\`` escaped), which the
    ``varchar_pattern_ops`` index of migration 0011 answers whatever the collation.
    """
    if is_postgres(conn):
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return OBJECTS.c.id.like(escaped + "%", escape="\\")
    successor = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return (OBJECTS.c.id >= prefix) & (OBJECTS.c.id < successor)


@dataclass(frozen=True)
class ObjectFilter:
    """Which objects a list or its totals cover; every part given must hold.

    ``status`` is one of :data:`STATUSES` (``retired`` lists retired objects only); without
    it, active objects, and retired ones too with ``include_retired``. Remaining bounds compare
    ``budget - loss_upper`` in floating point (the odometer's ``remaining_lt``/``_gt``).
    """

    labels: tuple[tuple[str, str], ...] = ()
    id_prefix: str | None = None
    status: str | None = None
    include_retired: bool = False
    remaining_lt: float | None = None
    remaining_gt: float | None = None
    #: A project key's scope: labels every object must carry (None: unscoped).
    scope: tuple[tuple[str, str], ...] | None = None

    def unfiltered(self) -> bool:
        """Whether only the status selects: the counts of ``object_counts`` answer it."""
        return (
            not self.labels
            and not self.id_prefix
            and self.remaining_lt is None
            and self.remaining_gt is None
            and self.scope is None
        )

    def conditions(self, conn: Tx, *, statuses: bool = True) -> list[ColumnElement[bool]]:
        """The SQL conditions (``statuses=False``: all but the status, for totals by status)."""
        found = label_conditions(self.labels) + scope_conditions(self.scope)
        if self.id_prefix:
            found.append(id_prefix_condition(conn, self.id_prefix))
        remaining = OBJECTS.c.budget - OBJECTS.c.loss_upper
        if self.remaining_lt is not None:
            found.append(remaining < self.remaining_lt)
        if self.remaining_gt is not None:
            found.append(remaining > self.remaining_gt)
        if statuses:
            if self.status is not None:
                found.append(STATUSES[self.status])
            elif not self.include_retired:
                found.append(ACTIVE)
        return found


def page_objects(
    conn: Tx,
    *,
    where: ObjectFilter,
    limit: int,
    offset: int = 0,
    after: str | None = None,
    count: bool = True,
) -> tuple[int | None, list[ObjectRecord]]:
    """How many objects match (None unless ``count``), and one page of them in id order.

    The page starts after the id ``after`` (a keyset page: the primary key's index finds its
    first row, however deep) and then skips ``offset`` rows.
    """
    conditions = where.conditions(conn)
    page = select(*_RECORD_COLUMNS).where(*conditions)
    if after is not None:
        page = page.where(OBJECTS.c.id > after)
    page = page.order_by(OBJECTS.c.id).limit(limit).offset(offset)
    total = None
    if count and where.unfiltered():
        total = _kept_count(conn, where)
    elif count:
        counted = select(func.count()).select_from(OBJECTS).where(*conditions)
        total = int(conn.execute(counted).scalar() or 0)
    return total, [ObjectRecord(**r._mapping) for r in conn.execute(page)]


@dataclass(frozen=True)
class ObjectTotals:
    """Counts over the objects a filter covers, by the one definition of each status."""

    #: The objects the filter lists without a status: active ones (and retired ones with
    #: ``include_retired``) — the ``total`` of its list.
    objects: int
    active: int
    retired: int
    exhausted: int
    near_exhaustion: int
    #: Rejected submits, summed over ``objects``.
    rejected: int


def _counted(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return case((condition, 1), else_=0)


#: What ``object_counts`` keeps, as one object row's share of each count (its sum over the
#: rows is the count): the statuses above, and the rejected submits of active and of all rows.
ROW_COUNTS: dict[str, ColumnElement[int]] = {
    "active": _counted(ACTIVE),
    "retired": _counted(RETIRED),
    "exhausted": _counted(EXHAUSTED),
    "near_exhaustion": _counted(NEAR_EXHAUSTION),
    "rejected_active": case((ACTIVE, func.coalesce(OBJECTS.c.rejected, 0)), else_=0),
    "rejected_all": func.coalesce(OBJECTS.c.rejected, 0),
}


def row_counts_sql(dialect: Dialect, row: str) -> dict[str, str]:
    """:data:`ROW_COUNTS` as SQL text over the row or table named ``row``, for ``dialect``.

    The triggers that keep ``object_counts`` (migration 0014) are written with these, over a
    trigger's ``NEW``/``OLD`` row (SQLite) or its transition tables (PostgreSQL).
    """
    adapter = ClauseAdapter(OBJECTS.alias(row))
    return {
        name: str(
            adapter.traverse(share).compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        )
        for name, share in ROW_COUNTS.items()
    }


def _sums(shares: Mapping[str, ColumnElement[int]]) -> list[ColumnElement[int]]:
    return [func.coalesce(func.sum(share), 0) for share in shares.values()]


KEPT_TOTALS = select(*_sums({name: COUNTS.c[name] for name in ROW_COUNTS}))
SCANNED_TOTALS = select(*_sums(ROW_COUNTS)).select_from(OBJECTS)


def _totals(counts: Iterable[int], include_retired: bool) -> ObjectTotals:
    found = dict(zip(ROW_COUNTS, (int(c) for c in counts), strict=True))
    return ObjectTotals(
        objects=found["active"] + (found["retired"] if include_retired else 0),
        active=found["active"],
        retired=found["retired"],
        exhausted=found["exhausted"],
        near_exhaustion=found["near_exhaustion"],
        rejected=found["rejected_all" if include_retired else "rejected_active"],
    )


def kept_totals(conn: Tx, *, include_retired: bool = False) -> ObjectTotals:
    """Every object's totals as ``object_counts`` keeps them (a sum over its few rows)."""
    return _totals(conn.execute(KEPT_TOTALS).one(), include_retired)


#: The key of the transaction-level advisory lock that runs folds of ``object_counts`` one at a
#: time ("gk_count" in ASCII): two folds never wait for each other's rows.
_FOLD_LOCK = 0x676B5F636F756E74


def _fold_statement() -> Executable:
    """Every row but slot 0 that no open transaction holds, deleted and added to slot 0."""
    names = list(ROW_COUNTS)
    free = select(COUNTS.c.slot).where(COUNTS.c.slot != 0).with_for_update(skip_locked=True)
    gone = (
        delete(COUNTS)
        .where(COUNTS.c.slot.in_(free))
        .returning(*(COUNTS.c[name] for name in names))
        .cte("gone")
    )
    sums = (
        select(literal(0), *(func.sum(gone.c[name]) for name in names))
        .select_from(gone)
        .having(func.count() > 0)
    )
    add = pg_insert(COUNTS).from_select(["slot", *names], sums)
    add = add.on_conflict_do_update(
        index_elements=[COUNTS.c.slot],
        set_={name: COUNTS.c[name] + add.excluded[name] for name in names},
    )
    return select(func.count()).select_from(gone).add_cte(add.cte("added"))


_FOLD = _fold_statement()


def fold_counts(conn: Tx) -> int:
    """Fold the rows of ``object_counts`` into the row ``slot = 0``; answer how many were folded.

    On PostgreSQL a writer adds to the row of its backend's process id (migration 0014), so the
    table gains a row per process that ever wrote. One statement deletes every other row and adds
    their sums to slot 0 (created if a ``TRUNCATE`` of ``objects`` removed it), in the caller's
    transaction: a reader, which sums every row in one snapshot, sees the counts before or after,
    never a part. A row that an open transaction has written (its writer's backend is alive) is
    skipped (``FOR UPDATE SKIP LOCKED``) and left for a later fold, so a fold never waits for a
    writer, and a writer whose row it is deleting waits only for this statement (then writes its
    row anew): no deadlock between them. Folds run one at a time (an advisory lock). A row
    updated by a transaction that committed after the statement began is deleted with its newest
    counts (PostgreSQL re-reads a locked row's newest version). SQLite keeps one row (slot 0):
    nothing to fold.
    """
    if not is_postgres(conn):
        return 0
    conn.execute(select(func.pg_advisory_xact_lock(_FOLD_LOCK)))
    return int(conn.execute(_FOLD).scalar_one())


def scanned_totals(conn: Tx, where: ObjectFilter | None = None) -> ObjectTotals:
    """The totals counted over the matching rows (one aggregate statement, a scan)."""
    where = where or ObjectFilter()
    statement = SCANNED_TOTALS.where(*where.conditions(conn, statuses=False))
    return _totals(conn.execute(statement).one(), where.include_retired)


def kept_and_counted(conn: Tx) -> tuple[list[int], list[int]]:
    """The sums ``object_counts`` keeps and the same sums counted over every row.

    In one statement, so one snapshot: writers running meanwhile cannot make them differ.
    """
    kept, counted = KEPT_TOTALS.subquery(), SCANNED_TOTALS.subquery()
    both = select(kept, counted).select_from(kept.join(counted, true()))
    found = [int(n) for n in conn.execute(both).one()]
    return found[: len(ROW_COUNTS)], found[len(ROW_COUNTS) :]


def totals(conn: Tx, where: ObjectFilter | None = None) -> ObjectTotals:
    """The counts of the objects ``where`` selects (its status is ignored).

    ``active``, ``retired``, ``exhausted`` and ``near_exhaustion`` count every matching object;
    ``objects`` and ``rejected`` only those the list shows (retired ones with
    ``include_retired``). Without a condition but the status: ``object_counts``'s sums, kept in
    each writer's transaction (so exact, and consistent with one another); else an aggregate
    over the matching rows.
    """
    where = where or ObjectFilter()
    if where.unfiltered():
        return kept_totals(conn, include_retired=where.include_retired)
    return scanned_totals(conn, where)


def _kept_count(conn: Tx, where: ObjectFilter) -> int:
    """How many objects a list selected by its status alone holds, from ``object_counts``."""
    kept = kept_totals(conn, include_retired=where.include_retired)
    if where.status is None:
        return kept.objects
    return int(
        {
            "active": kept.active,
            "retired": kept.retired,
            "exhausted": kept.exhausted,
            "near_exhaustion": kept.near_exhaustion,
        }[where.status]
    )


@dataclass(frozen=True)
class StoredValue:
    """An object's private value as stored: ciphertext, or plaintext JSON from before 0.2."""

    object_id: str
    stored: str


#: CAST to plain text reads the stored string as is (no decryption).
_STORED_VALUES = select(OBJECTS.c.id, sql_cast(OBJECTS.c.value, Text))
_WRITE_VALUE = (
    update(OBJECTS)
    .where(OBJECTS.c.id == bindparam("object_id"))
    .values(value=bindparam("plaintext", type_=OBJECTS.c.value.type))
)


def stored_values(conn: Tx) -> list[StoredValue]:
    """Every object's value as stored (for the encryption jobs of the CLI)."""
    return [StoredValue(object_id, str(text)) for object_id, text in conn.execute(_STORED_VALUES)]


def write_value(conn: Tx, *, object_id: str, value: str) -> None:
    """Store ``value`` (plaintext JSON) as the object's value, encrypted by the column type."""
    conn.execute(_WRITE_VALUE, {"object_id": object_id, "plaintext": value})

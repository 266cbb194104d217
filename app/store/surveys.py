"""Surveys: the ``surveys`` rows (lifecycle, lease, counters) and what a survey reads of objects.

Rows come back as :class:`SurveyRow`; a cohort is read as ids (bytewise order, the order the
chunks rely on: :mod:`app.store.chunks`), distinct domains, or decision groups counted by the
database (:class:`CohortGroup`); a chunk's members as :class:`MemberRow` (locked on
PostgreSQL, so a concurrent single submit waits and then loses its compare-and-set). The
statements a run issues per chunk are built here once, at import.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, cast

import psycopg
from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast

from app.db.models import ApiKey, ProjectState, ProtectedObject, Survey
from app.store import bulk, compiled
from app.store import ids as ids_
from app.store.base import Tx, is_postgres
from app.store.domains import DOMAIN_TEXT, domain_texts
from app.store.objects import ScopeLabels, ids_in_scope, label_conditions, scope_conditions

_OBJECTS = cast(Table, ProtectedObject.__table__)
_SURVEYS = cast(Table, Survey.__table__)
_KEYS = cast(Table, ApiKey.__table__)
_PROJECT_STATES = cast(Table, ProjectState.__table__)


class SurveyStatus(StrEnum):
    """A survey's lifecycle."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


#: The statuses of a survey with members still to decide (a run may hold it).
ACTIVE = (SurveyStatus.QUEUED.value, SurveyStatus.RUNNING.value)


# ------------------------------------------------------------------------------ survey rows
@dataclass(frozen=True)
class SurveyRow:
    """A ``surveys`` row. ``query``, ``cohort``, ``refused`` and ``tally`` are the stored JSON."""

    id: int
    name: str
    query: str
    cohort: str
    analyst_key_id: int | None
    idempotency_key: str | None
    fingerprint: str
    status: str
    total: int
    decided: int
    accepted: int
    refused: str
    tally: str
    groups: int
    #: The accepted members' one domain text; ``""`` when they have several, None before any.
    domain: str | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lease_owner: str | None
    lease_until: datetime | None
    #: The hash of the query's canonical JSON (``app.services.reuse.query_hash``).
    query_hash: str | None = None
    #: Whether members answer from stored identical answers (``"reuse": true``).
    reuse: bool = False
    #: Accepted members answered by reuse (counted in ``accepted`` too).
    reused: int = 0


def _survey(row: Any) -> SurveyRow:
    return SurveyRow(**row._mapping)


_BY_ID = select(_SURVEYS).where(_SURVEYS.c.id == bindparam("survey_id"))


def get_survey(conn: Tx, survey_id: int) -> SurveyRow | None:
    """The survey's row, or None."""
    row = conn.execute(_BY_ID, {"survey_id": survey_id}).one_or_none()
    return None if row is None else _survey(row)


def find_by_key(conn: Tx, *, analyst_key_id: int | None, idempotency_key: str) -> SurveyRow | None:
    """The survey this analyst created with this Idempotency-Key, if any."""
    row = conn.execute(
        select(_SURVEYS).where(
            _SURVEYS.c.analyst_key_id == analyst_key_id,
            _SURVEYS.c.idempotency_key == idempotency_key,
        )
    ).one_or_none()
    return None if row is None else _survey(row)


def insert_survey(
    conn: Tx,
    *,
    name: str,
    query: str,
    cohort: str,
    analyst_key_id: int | None,
    idempotency_key: str | None,
    fingerprint: str,
    created_at: datetime,
    query_hash: str | None = None,
    reuse: bool = False,
) -> int:
    """Store a ``queued`` survey with no members yet (:func:`set_total` counts them); its id.

    Raises ``Conflict`` when the analyst's Idempotency-Key was stored meanwhile.
    """
    return int(
        conn.execute(
            insert(_SURVEYS).returning(_SURVEYS.c.id),
            {
                "name": name,
                "query": query,
                "cohort": cohort,
                "analyst_key_id": analyst_key_id,
                "idempotency_key": idempotency_key,
                "fingerprint": fingerprint,
                "query_hash": query_hash,
                "reuse": reuse,
                "reused": 0,
                "status": SurveyStatus.QUEUED.value,
                "total": 0,
                "decided": 0,
                "accepted": 0,
                "refused": "{}",
                "tally": "{}",
                "groups": 0,
                "created_at": created_at,
            },
        ).scalar_one()
    )


def set_total(conn: Tx, *, survey_id: int, total: int) -> None:
    """Record how many members the survey has."""
    conn.execute(update(_SURVEYS).where(_SURVEYS.c.id == survey_id).values(total=total))


def _of_project(project_id: int) -> ColumnElement[bool]:
    """The survey was created by a key of project ``project_id``."""
    keys = select(_KEYS.c.id).where(_KEYS.c.project_id == project_id)
    return _SURVEYS.c.analyst_key_id.in_(keys.scalar_subquery())


def list_page(
    conn: Tx, *, limit: int, before: int | None, project_id: int | None = None
) -> list[SurveyRow]:
    """Up to ``limit`` surveys with ids below ``before`` (all when None), newest first.

    With ``project_id``: only the surveys created by that project's keys.
    """
    statement = select(_SURVEYS).order_by(_SURVEYS.c.id.desc()).limit(limit)
    if before is not None:
        statement = statement.where(_SURVEYS.c.id < before)
    if project_id is not None:
        statement = statement.where(_of_project(project_id))
    return [_survey(r) for r in conn.execute(statement)]


def project_of_key(conn: Tx, key_id: int | None) -> int | None:
    """The project of API key ``key_id`` (None: unscoped, or no key)."""
    if key_id is None:
        return None
    found = conn.execute(select(_KEYS.c.project_id).where(_KEYS.c.id == key_id)).scalar()
    return None if found is None else int(found)


def _end(conn: Tx, survey_id: int, **values: Any) -> bool:
    """Move an active survey to a final status, releasing its lease; whether it was active."""
    result = conn.execute(
        update(_SURVEYS)
        .where(_SURVEYS.c.id == survey_id, _SURVEYS.c.status.in_(ACTIVE))
        .values(lease_owner=None, **values)
    )
    return bool(result.rowcount == 1)


def cancel(conn: Tx, *, survey_id: int, finished_at: datetime) -> bool:
    """Cancel the survey if still active (its undecided members are never queried)."""
    return _end(conn, survey_id, status=SurveyStatus.CANCELLED.value, finished_at=finished_at)


def fail(conn: Tx, *, survey_id: int, error: str, finished_at: datetime) -> bool:
    """Mark the survey failed with ``error`` if still active."""
    return _end(
        conn, survey_id, status=SurveyStatus.FAILED.value, error=error, finished_at=finished_at
    )


def finish(conn: Tx, *, survey_id: int, finished_at: datetime) -> bool:
    """Mark the survey done if still active; whether this call did (one caller audits it)."""
    return _end(conn, survey_id, status=SurveyStatus.DONE.value, finished_at=finished_at)


def claim(conn: Tx, *, survey_id: int, owner: str, now: datetime, lease_until: datetime) -> bool:
    """Take (or renew) the lease on an active survey, marking it running; False if held.

    A compare-and-set: the lease is free, ``owner``'s already, or expired before ``now``.
    """
    result = conn.execute(
        update(_SURVEYS)
        .where(
            _SURVEYS.c.id == survey_id,
            _SURVEYS.c.status.in_(ACTIVE),
            or_(
                _SURVEYS.c.lease_owner.is_(None),
                _SURVEYS.c.lease_owner == owner,
                _SURVEYS.c.lease_until < now,
            ),
        )
        .values(
            status=SurveyStatus.RUNNING.value,
            lease_owner=owner,
            lease_until=lease_until,
            started_at=func.coalesce(_SURVEYS.c.started_at, now),
        )
    )
    return bool(result.rowcount == 1)


def unclaimed(conn: Tx, *, now: datetime) -> list[int]:
    """Active surveys nobody holds (queued, or whose lease expired before ``now``), oldest first."""
    statement = (
        select(_SURVEYS.c.id)
        .where(
            _SURVEYS.c.status.in_(ACTIVE),
            or_(_SURVEYS.c.lease_owner.is_(None), _SURVEYS.c.lease_until < now),
        )
        .order_by(_SURVEYS.c.id)
    )
    return [int(i) for i in conn.execute(statement).scalars()]


@dataclass(frozen=True)
class Counters:
    """The columns a chunk adds to, read locked (:func:`lock_counters`)."""

    status: str
    refused: dict[str, int]
    tally: dict[str, int]
    domain: str | None


_COUNTERS = (
    select(_SURVEYS.c.status, _SURVEYS.c.refused, _SURVEYS.c.tally, _SURVEYS.c.domain)
    .where(_SURVEYS.c.id == bindparam("survey_id"))
    .with_for_update()
)


def lock_counters(conn: Tx, *, survey_id: int) -> Counters:
    """The survey's status and counters, its row locked until the transaction ends.

    A chunk takes this lock last: it serialises the chunks of one survey for the shortest time.
    """
    row = conn.execute(_COUNTERS, {"survey_id": survey_id}).one()
    return Counters(row.status, json.loads(row.refused), json.loads(row.tally), row.domain)


_ADD_COUNTS = (
    update(_SURVEYS)
    .where(_SURVEYS.c.id == bindparam("where_id"))
    .values(
        decided=_SURVEYS.c.decided + bindparam("add_decided"),
        accepted=_SURVEYS.c.accepted + bindparam("add_accepted"),
        reused=_SURVEYS.c.reused + bindparam("add_reused"),
        groups=_SURVEYS.c.groups + bindparam("add_groups"),
        refused=bindparam("refused"),
        tally=bindparam("tally"),
        domain=bindparam("domain"),
    )
)


def add_counts(
    conn: Tx,
    *,
    survey_id: int,
    decided: int,
    accepted: int,
    groups: int,
    refused: Mapping[str, int],
    tally: Mapping[str, int],
    domain: str | None,
    reused: int = 0,
) -> None:
    """Add a chunk's counts; ``refused``, ``tally`` and ``domain`` are the new totals.

    ``reused``: accepted members answered by reuse (also in ``accepted``).
    """
    conn.execute(
        _ADD_COUNTS,
        {
            "where_id": survey_id,
            "add_decided": decided,
            "add_accepted": accepted,
            "add_reused": reused,
            "add_groups": groups,
            "refused": json.dumps(dict(refused)),
            "tally": json.dumps(dict(tally)),
            "domain": domain,
        },
    )


def uncount_groups(conn: Tx, *, survey_id: int, groups: int) -> None:
    """Take back ``groups`` decision groups counted twice (two child processes, chunk tasks)."""
    conn.execute(
        update(_SURVEYS).where(_SURVEYS.c.id == survey_id).values(groups=_SURVEYS.c.groups - groups)
    )


# ------------------------------------------------------------------------------ cohorts
class GroupKey(NamedTuple):
    """The public state members of one decision group share (``objects`` columns)."""

    domain: str
    budget: float
    filter: str
    basic_total: str
    history_hash: str | None
    state_hash: str | None
    #: Last history entries ``state_hash``'s array does not hold (``objects.state_pending``).
    state_pending: int
    loss_lower: float
    loss_upper: float
    budget_delta: float | None
    f0_account: str
    lifetime_budget: float | None
    lifetime_exact: str | None
    lifetime_lower: float
    lifetime_upper: float


_KEY_COLUMNS = [DOMAIN_TEXT if n == "domain" else _OBJECTS.c[n] for n in GroupKey._fields]
if GroupKey._fields[0] != "domain":  # member_rows reads the domain's hash in its place
    raise TypeError("GroupKey must start with the domain")
_KEY_SIZE = len(GroupKey._fields)


def _labelled(labels: Mapping[str, str]) -> ColumnElement[bool]:
    """The object carries every ``name: value`` given (:func:`label_conditions`, all of them)."""
    return and_(*label_conditions(labels))


_KNOWN_IDS = ids_.where_among(select(_OBJECTS.c.id), _OBJECTS.c.id)


def unknown_ids(conn: Tx, ids: Sequence[str], scope: ScopeLabels = None) -> list[str]:
    """The ids of ``ids`` that name no registered object (in ``scope``), in their order.

    An id out of ``scope`` costs what a missing one does (:func:`app.store.objects.ids_in_scope`).
    """
    if scope is None:
        known = {row.id for row in ids_.rows_among(conn, _KNOWN_IDS, ids)}
    else:
        known = set(ids_in_scope(conn, ids, scope))
    return [i for i in ids if i not in known]


def labelled_ids(conn: Tx, labels: Mapping[str, str], scope: ScopeLabels = None) -> Iterator[str]:
    """The ids of the objects carrying ``labels`` (in ``scope``), in bytewise order, streamed.

    ``COLLATE "C"`` on PostgreSQL; SQLite's default order is bytewise already.
    """
    order: ColumnElement[str] = _OBJECTS.c.id
    if is_postgres(conn):
        order = order.collate("C")
    statement = (
        select(_OBJECTS.c.id)
        .where(_labelled(labels), *scope_conditions(scope))
        .order_by(order)
        .execution_options(yield_per=10_000)
    )
    for object_id in conn.execute(statement).scalars():
        yield str(object_id)


def cohort_domains(
    conn: Tx,
    *,
    labels: Mapping[str, str] | None = None,
    ids: Sequence[str] = (),
    scope: ScopeLabels = None,
) -> set[str]:
    """The distinct domain texts of the objects carrying ``labels`` (when given) or of ``ids``.

    Only objects in ``scope`` count. The distinct domain hashes first, then their texts
    (:func:`_domain_texts`): a text per row (:data:`DOMAIN_TEXT`, a subquery per object) made
    PostgreSQL sort every member's ~250-byte text to find the few distinct ones, on disk past
    ``work_mem`` — 1.4–2.3 s at 2·10^5 objects against 0.4–0.5 s (docs/benchmarks.md, "h/plans").
    """
    statement = select(_OBJECTS.c.domain_hash).distinct().where(*scope_conditions(scope))
    if labels is not None:
        hashes = set(conn.execute(statement.where(_labelled(labels))).scalars())
    else:
        statements = ids_.where_among(statement, _OBJECTS.c.id)
        hashes = {row[0] for row in ids_.rows_among(conn, statements, ids)}
    return set(_domain_texts(conn, hashes).values())


class CohortGroup(NamedTuple):
    """Cohort members sharing public state and retirement, counted by the database."""

    key: GroupKey
    retired: bool
    members: int
    #: The least id among them (a representative).
    first: str
    #: With a project: the hash chain of its stored sub-history of these objects (None: empty).
    sub_history: str | None = None


_RETIRED = _OBJECTS.c.retired_at.is_not(None).label("retired")
_GROUPED = select(
    *_KEY_COLUMNS, _RETIRED, func.count().label("n"), func.min(_OBJECTS.c.id)
).group_by(*_KEY_COLUMNS, _RETIRED)


def _grouped(project_id: int | None) -> Select[Any]:
    """Cohort groups; with a project, also by its stored sub-history (``project_states``)."""
    if project_id is None:
        return _GROUPED
    sub = _PROJECT_STATES.c.history_hash
    joined = _OBJECTS.outerjoin(
        _PROJECT_STATES,
        and_(
            _PROJECT_STATES.c.object_id == _OBJECTS.c.id,
            _PROJECT_STATES.c.project_id == project_id,
        ),
    )
    return (
        select(*_KEY_COLUMNS, _RETIRED, func.count().label("n"), func.min(_OBJECTS.c.id), sub)
        .select_from(joined)
        .group_by(*_KEY_COLUMNS, _RETIRED, sub)
    )


def cohort_groups(
    conn: Tx,
    *,
    labels: Mapping[str, str] | None = None,
    ids: Sequence[str] = (),
    scope: ScopeLabels = None,
    project_id: int | None = None,
) -> Iterator[CohortGroup]:
    """The groups of the objects carrying ``labels`` (when given) or of ``ids`` (SQL GROUP BY).

    Only objects in ``scope`` count; with ``project_id``, groups are also split by the
    project's stored sub-history of their objects. An ids cohort is read in statements of
    :func:`app.store.ids.per_statement` ids: a group may come once per statement.
    """
    grouped = _grouped(project_id).where(*scope_conditions(scope))
    if labels is not None:
        rows: Iterator[Any] = iter(conn.execute(grouped.where(_labelled(labels))))
    else:
        rows = ids_.rows_among(conn, ids_.where_among(grouped, _OBJECTS.c.id), ids)
    for row in rows:
        values = tuple(row)
        yield CohortGroup(
            GroupKey(*values[:_KEY_SIZE]),
            bool(values[_KEY_SIZE]),
            int(values[_KEY_SIZE + 1]),
            str(values[_KEY_SIZE + 2]),
            None if project_id is None else values[_KEY_SIZE + 3],
        )


_VERSIONS = ids_.where_among(
    select(_OBJECTS.c.id, _OBJECTS.c.version, _OBJECTS.c.version_start), _OBJECTS.c.id
)


def versions(conn: Tx, ids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """The current row version of each object of ``ids``, and where its data version starts."""
    return {str(i): (int(v), int(s)) for i, v, s in ids_.rows_among(conn, _VERSIONS, ids)}


# ------------------------------------------------------------------------------ a chunk's members
class MemberRow(NamedTuple):
    """A member's object row as a run decides it (a named tuple: a chunk builds thousands)."""

    id: str
    version: int
    #: Accepted queries so far (the next answer's sequence number is this plus one).
    accepted: int
    #: Accepted queries of the closed data versions (the current one's history follows).
    version_start: int
    retired: bool
    #: The encrypted value, as stored.
    sealed: str
    key: GroupKey


_MEMBER_COLUMNS = select(
    _OBJECTS.c.id,
    _OBJECTS.c.version,
    _OBJECTS.c.accepted,
    _OBJECTS.c.version_start,
    # a boolean: the timestamp's result processor, per row, cost more than the rest of a row
    _RETIRED,
    sql_cast(_OBJECTS.c.value, Text).label("sealed"),
    # the domain's hash, not its text (:data:`DOMAIN_TEXT`): a population shares a few domains,
    # whose texts (~250 bytes each) were read, sent and decoded once per member
    _OBJECTS.c.domain_hash,
    *_KEY_COLUMNS[1:],
).order_by(_OBJECTS.c.id)
_MEMBERS = ids_.where_among(_MEMBER_COLUMNS, _OBJECTS.c.id)
_MEMBERS_LOCKED = {
    postgres: statement.with_for_update(of=_OBJECTS) if postgres else statement
    for postgres, statement in _MEMBERS.items()
}
#: The PostgreSQL statements compiled once, run on the psycopg connection (all rows at once).
_MEMBERS_PG = {
    lock: compiled.Compiled.of(_MEMBERS_LOCKED[True] if lock else _MEMBERS[True])
    for lock in (True, False)
}
#: Where the group key's columns start in a :data:`_MEMBERS` row (they end it; the first is
#: the domain's hash, replaced by its text).
_KEY_START = 6
#: Domain texts by hash, for every process's member rows: a hash names one text forever
#: (:func:`app.store.domains.domain_hash`), so nothing here can be stale.
_DOMAIN_TEXTS: dict[str, str] = {}
_DOMAIN_TEXTS_MAX = 10_000


def _domain_texts(conn: Tx, hashes: set[str]) -> dict[str, str]:
    """The texts of the domains ``hashes`` name (cached: :data:`_DOMAIN_TEXTS`).

    A dict of the caller's own: another thread's chunk may empty the cache meanwhile.
    """
    found = {h: known for h in hashes if (known := _DOMAIN_TEXTS.get(h)) is not None}
    missing = hashes - found.keys()
    if missing:
        fetched = domain_texts(conn, missing)
        if len(_DOMAIN_TEXTS) + len(fetched) > _DOMAIN_TEXTS_MAX:
            _DOMAIN_TEXTS.clear()
        _DOMAIN_TEXTS.update(fetched)
        found.update(fetched)
    return found


def member_rows(conn: Tx, ids: Sequence[str], *, lock: bool = True) -> list[MemberRow]:
    """The members' object rows, locked ``FOR UPDATE`` on PostgreSQL; every id must have one.

    ``lock`` False: read only (a dry-run). Raises LookupError naming members without a row.
    """
    if is_postgres(conn):
        statement = _MEMBERS_PG[lock]
        found: list[Any] = []
        for part in ids_.batches(ids, size=ids_.PG_PER_STATEMENT):
            found += compiled.fetch_all(
                conn, statement, {"ids": ids_.parameter(part, postgres=True)}
            )
    else:  # SQLite's booleans are integers
        found = [(*r[:4], bool(r[4]), *r[5:]) for r in ids_.rows_among(conn, _MEMBERS, ids)]
    texts = _domain_texts(conn, {r[_KEY_START] for r in found})
    # the named tuples built by ``tuple.__new__`` (their ``_make``/``__new__`` are Python
    # calls, a chunk builds two per member; the statement gives every field)
    new = tuple.__new__
    start = _KEY_START + 1
    # tuples joined, not unpacked into displays (RUF005): 680 instructions less per member
    # (callgrind, docs/benchmarks.md "h/member2")
    rows = [
        new(
            MemberRow,
            r[:_KEY_START] + (new(GroupKey, (texts[r[_KEY_START]],) + r[start:]),),  # noqa: RUF005
        )
        for r in found
    ]
    if len(rows) != len(ids):
        missing = sorted(set(ids) - {row.id for row in rows})[:5]
        raise LookupError(f"survey members without an object row: {missing}")
    return rows


#: PostgreSQL types of an accepted member's new ``objects`` columns (the compare-and-set).
_ADVANCE_TYPES = {
    "where_id": "text",
    "where_version": "int",
    "version": "int",
    "accepted": "int",
    "updated_at": "timestamptz",
    "state_hash": "text",
    "state_pending": "int",
    "history_hash": "text",
    "loss_lower": "float8",
    "loss_upper": "float8",
    "basic_total": "text",
    "f0_account": "text",
}


#: An accepted member's new accounting columns (``app.services.snapshots.Advance.columns``).
_ADVANCE_COLUMNS = {
    name: kind
    for name, kind in _ADVANCE_TYPES.items()
    if name not in ("where_id", "where_version", "version", "accepted", "updated_at")
}
_ADVANCE_NAMES = sorted(_ADVANCE_COLUMNS)
#: The accounting columns members of one answer share: all but the history hash, which a
#: diverged survey's members each have their own of.
_ADVANCE_SHARED = tuple(name for name in _ADVANCE_COLUMNS if name != "history_hash")
#: The temporary table :func:`advance_members` copies a chunk's members into (PostgreSQL): one
#: per session, created by the first transaction that needs it (again if that one rolled back),
#: emptied at every commit (``ON COMMIT DELETE ROWS``) and by the call itself before it copies
#: (a second call in one transaction must not see the first one's rows).
_ADVANCE_TABLE = "gk_advance_in"
_ADVANCE_IN = {"id": "text", "version": "int", "accepted": "int", **_ADVANCE_COLUMNS}
_ADVANCE_KINDS = {"text": "text", "int": "int4", "float8": "float8"}
_ADVANCE_PREPARE = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_ADVANCE_TABLE} ("  # noqa: S608 - our names
    + ", ".join(f"{name} {kind}" for name, kind in _ADVANCE_IN.items())
    + f") ON COMMIT DELETE ROWS; DELETE FROM {_ADVANCE_TABLE}"  # noqa: S608
)
_ADVANCE_COPY = (
    f"COPY {_ADVANCE_TABLE} (id, version, accepted, history_hash, "
    + ", ".join(_ADVANCE_SHARED)
    + ") FROM STDIN (FORMAT BINARY)"
)
_ADVANCE_COPY_TYPES = [
    _ADVANCE_KINDS[_ADVANCE_IN[name]]
    for name in ("id", "version", "accepted", "history_hash", *_ADVANCE_SHARED)
]
#: The compare-and-set of a chunk's accepted members on PostgreSQL (:func:`advance_members`):
#: one index probe of ``objects`` per copied row (the plan sees the table's size: it is planned
#: for each call, never prepared — :func:`_advance_copied`).
_ADVANCE_PG = (
    "UPDATE objects AS t SET "  # noqa: S608 - names from the models
    + ", ".join(f"{name} = v.{name}" for name in _ADVANCE_COLUMNS)
    + f", version = v.version + 1, accepted = v.accepted, updated_at = %(updated_at)s "
    f"FROM {_ADVANCE_TABLE} AS v WHERE t.id = v.id AND t.version = v.version"
)


def _shared_row(given: Mapping[str, Any]) -> tuple[Any, ...]:
    """A member's accounting columns but its history hash, typed as the copy sends them.

    Raises ValueError for a dict without exactly the statement's keys (a missing key would be
    NULL) or a NaN loss (NOT NULL columns: JSON had sent it as null, refused by the table).
    """
    if given.keys() != _ADVANCE_COLUMNS.keys():
        raise ValueError(f"accounting columns {sorted(given)} are not {_ADVANCE_NAMES}")
    state_hash = given["state_hash"]
    lower, upper = float(given["loss_lower"]), float(given["loss_upper"])
    if lower != lower or upper != upper:
        raise ValueError("a NaN loss cannot be stored")
    return (
        None if state_hash is None else str(state_hash),
        int(given["state_pending"]),
        lower,
        upper,
        str(given["basic_total"]),
        str(given["f0_account"]),
    )


def _advance_copied(conn: Tx, members: Sequence[Advanced], *, updated_at: datetime) -> int:
    """:func:`advance_members` on PostgreSQL: the members copied (binary), then one ``UPDATE``.

    Each distinct accounting dict is checked and typed once (members of one answer share it,
    a diverged survey's with their own history hashes: :func:`app.services.survey_runs.
    _answer`); a member's row is its id, version, sequence number, history hash (its own,
    else the dict's) and that dict's typed columns. ``COPY ... (FORMAT BINARY)`` sends them
    without a text form to build or parse, where the earlier statement (one JSON object per
    distinct dict, the rest as joined texts) took 37.5 ms of PostgreSQL's CPU and 7.4 ms of the
    client's per chunk of 5,000 with ~5,000 distinct dicts against 26.8 and 2.8 ms this way
    (docs/benchmarks.md, "h/pgsurv").
    """
    typed: dict[int, tuple[Any, ...]] = {}  # by the dict's identity: ``members`` keeps it alive
    raw = compiled.raw_connection(conn)
    sent = _ADVANCE_PREPARE
    try:
        with raw.cursor() as cursor:
            cursor.execute(_ADVANCE_PREPARE)
            sent = _ADVANCE_COPY
            with cursor.copy(_ADVANCE_COPY) as copy:
                copy.set_types(_ADVANCE_COPY_TYPES)
                write = copy.write_row
                for object_id, version, accepted, given, own in members:
                    shared = typed.get(id(given))
                    if shared is None:
                        shared = typed[id(given)] = _shared_row(given)
                    # joined, not unpacked (RUF005): 500 instructions less per member
                    write(
                        (  # noqa: RUF005
                            object_id,
                            version,
                            accepted,
                            given["history_hash"] if own is None else own,
                        )
                        + shared
                    )
            sent = _ADVANCE_PG
            cursor.execute(_ADVANCE_PG, {"updated_at": updated_at}, prepare=False)
            return cursor.rowcount
    except psycopg.Error as exc:
        raise compiled.wrapped(conn, raw, sent, exc) from exc


class Advanced(NamedTuple):
    """An accepted member's compare-and-set: the version read, the new accounting columns."""

    id: str
    version: int
    #: Accepted queries after this one (its sequence number).
    accepted: int
    #: The new ``objects`` accounting columns (``app.services.snapshots.Advance.columns``).
    columns: Mapping[str, Any]
    #: The member's own new history hash when not ``columns["history_hash"]`` (None: that
    #: one). A diverged survey's members share their answer's columns but for this hash: one
    #: dict shared by them all (checked and typed once, :func:`_advance_copied`), not a copy
    #: per member.
    history_hash: str | None = None


def advance_members(conn: Tx, members: Sequence[Advanced], *, updated_at: datetime) -> int:
    """Compare-and-set the members' rows; returns how many still had the version read.

    Fewer than given means another writer moved an object meanwhile: the caller rolls back.

    On PostgreSQL the members are copied into a temporary table and updated by one statement
    (:func:`_advance_copied`).
    """
    if not members:
        return 0
    if not is_postgres(conn):
        rows = [
            {
                "where_id": m.id,
                "where_version": m.version,
                "version": m.version + 1,
                "accepted": m.accepted,
                "updated_at": updated_at,
                **m.columns,
                **({} if m.history_hash is None else {"history_hash": m.history_hash}),
            }
            for m in members
        ]
        return bulk.update_rows(
            conn,
            _OBJECTS,
            rows,
            where={"where_id": "id", "where_version": "version"},
            values=_ADVANCE_TYPES,
        )
    return _advance_copied(conn, members, updated_at=updated_at)


def count_refusals(conn: Tx, ids: Sequence[str]) -> None:
    """Count one more refused query on each object of ``ids``."""
    bulk.increment(conn, _OBJECTS, "rejected", ids)

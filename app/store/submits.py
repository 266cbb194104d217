"""An accepted single submit's writes, sent to PostgreSQL in one round trip.

An accepted submit writes its query record (:mod:`app.store.queries`), the object's
compare-and-set (:mod:`app.store.objects`) and, for a finite object, the likelihood array it
names now (:mod:`app.store.states`: inserted, or the stored row locked until the commit; the
array it named before is left to the collection of unnamed states) and adds the decision's
audit event (:mod:`app.store.audit`). Each was its own round trip once: six of a submit's ten
(the profile in docs/benchmarks.md); now they are one statement.

On PostgreSQL that statement is one network round trip (with a ``BEGIN`` before it in psycopg's
pipeline mode when the transaction stays open for more writes; alone, without the pipeline's
machinery, otherwise): the compare-and-set, the query row, the audit event and the array
named are data-modifying CTEs of one statement (:func:`_accept_sql`: the row is inserted only if
the compare-and-set hit, the array only if the row was, and the statement fails when the
compare-and-set missed), compiled once from those modules' SQLAlchemy constructs
(:mod:`app.store.compiled`). In the caller's transaction it runs in it; on a
:func:`app.store.submitting` connection with nothing open yet it is, with ``commit``, a
transaction of its own (autocommit: committed if it succeeded, rolled back whole if it failed)
and without ``commit`` a ``BEGIN`` goes first and the transaction stays open. Elsewhere (SQLite,
the embedded default) the modules' own functions run the writes one by one. Either way the
compare-and-set decides: a lost race returns None and the caller rolls the transaction back, so
nothing of it stays; a unique constraint raises :class:`~app.store.Conflict` and a failed
database :class:`~app.store.Unavailable`, as from any other statement of this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus
from sqlalchemy import (
    Integer,
    Text,
    bindparam,
    case,
    func,
    insert,
    literal,
    select,
    type_coerce,
)
from sqlalchemy import cast as sql_cast

from app.store import audit as audit_store
from app.store import objects as object_store
from app.store import queries as query_store
from app.store import states as state_store
from app.store.base import Tx, is_postgres
from app.store.compiled import DIALECT, Compiled, fetch_one, wrapped


@dataclass(frozen=True)
class AcceptedQuery:
    """The columns of an accepted single submit's ``queries`` row."""

    object_id: str
    seq: int
    query: str
    output: str
    epsilon: float
    epsilon_exact: str
    loss_lower: float
    loss_upper: float
    basic_after: float
    analyst_key_id: int | None
    idempotency_key: str | None
    fingerprint: str
    response: str
    created_at: datetime


@dataclass(frozen=True)
class NewState:
    """The likelihood array an object names after the submit (``likelihood_states`` row)."""

    key: str
    state: bytes
    err: float


_QUERY_COLUMNS = tuple(AcceptedQuery.__dataclass_fields__)
_sql = Compiled.of


#: The accepted write's statement by the set of ``objects`` columns it sets and whether it names
#: a likelihood array (two on the hot path: a finite object's and a continuous one's).
_ACCEPT: dict[tuple[frozenset[str], bool], Compiled] = {}


#: The prefix of the ``queries`` row's parameters in :func:`_accept_sql` (apart from the
#: ``objects`` columns of the compare-and-set, some of which have the same names).
_QUERY_PARAM = "query_"
#: The prefix of the named array's parameters (``hash``, ``state``, ``err``) likewise.
_STATE_PARAM = "named_"

#: The message of the error that aborts a submit whose compare-and-set hit no row.
LOST_RACE = "gatekeeper: lost race"


def _accept_sql(columns: frozenset[str], names_state: bool) -> Compiled:
    """The compare-and-set, the query row, its audit event and the array named, one statement.

    Data-modifying CTEs, in order: the compare-and-set (``UPDATE objects … WHERE id = … AND
    version = …``, :data:`app.store.objects.COMPARE_AND_SET`), the ``queries`` row inserted
    once per row the compare-and-set hit (:data:`app.store.queries.QUERIES`), the audit
    event made around that row's id (:func:`app.store.audit.for_query_rows`) and, with
    ``names_state``, the array the object names now, inserted or its row locked once per
    query row (:func:`app.store.states.name_state_rows`: the lock that keeps the collection of
    unnamed states off it until the commit, as the statement of its own it was). The statement
    returns the new row's id — and when the compare-and-set hit no row it inserts nothing and
    fails: it casts ``'gatekeeper: lost race N'`` to an integer unless N = 1 row was inserted
    (an error whose text says why; not folded at plan time, it depends on ``count(*)``), so the
    transaction is aborted and nothing of it takes effect.
    With ``COMMIT`` in the same pipeline that is what a lost race must do. Under READ
    COMMITTED the ``UPDATE`` waits for a concurrent writer of the row and then rechecks the
    version on the row it committed, as a plain ``UPDATE`` does; a used idempotency key fails
    the ``queries`` unique index (:class:`~app.store.Conflict`).
    """
    text = _ACCEPT.get((columns, names_state))
    if text is None:
        queries = query_store.QUERIES
        cas = (
            object_store.COMPARE_AND_SET.values({name: bindparam(name) for name in sorted(columns)})
            .returning(object_store.OBJECTS.c.id)
            .cte("cas")
        )
        row = (
            insert(queries)
            .from_select(
                list(_QUERY_COLUMNS),
                select(
                    *(
                        cas.c.id
                        if name == "object_id"
                        else bindparam(_QUERY_PARAM + name, type_=queries.c[name].type)
                        for name in _QUERY_COLUMNS
                    )
                ),
            )
            .returning(queries.c.id, queries.c.object_id)
            .cte("query_row")
        )
        add_event = audit_store.for_query_rows(row)
        # one namespace of parameters: no objects column may take the event's or the row's
        taken = set(audit_store.for_query_rows(queries).compile(dialect=DIALECT).params)
        clash = {n for n in columns if n in taken or n.startswith((_QUERY_PARAM, _STATE_PARAM))}
        if clash:
            raise ValueError(f"objects columns clash with the statement's parameters: {clash}")
        event = add_event.cte("event")
        hit = func.count()
        miss = type_coerce(literal(f"{LOST_RACE} "), Text) + sql_cast(hit, Text)
        guarded = (
            select(case((hit == 1, func.max(row.c.id)), else_=sql_cast(miss, Integer)))
            .select_from(row)
            .add_cte(event)
        )
        if names_state:
            guarded = guarded.add_cte(state_store.name_state_rows(row, _STATE_PARAM).cte("named"))
        text = _ACCEPT[columns, names_state] = _sql(guarded)
    return text


def _lost_race(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is the guarded compare-and-set's miss (not any other failed cast)."""
    message = exc.diag.message_primary or ""
    return isinstance(exc, psycopg.errors.InvalidTextRepresentation) and LOST_RACE in message


def record_accepted(
    conn: Tx,
    *,
    query: AcceptedQuery,
    version: int,
    columns: Mapping[str, Any],
    new_state: NewState | None,
    event: audit_store.QueryEvent,
    commit: bool = False,
) -> int | None:
    """Write an accepted submit: query row, compare-and-set, the state it names, audit event.

    ``version`` is the object's version the decision read (it becomes ``version + 1``);
    ``columns`` its new ``objects`` columns (:attr:`app.services.snapshots.Advance.columns`,
    with ``accepted`` and ``updated_at``); ``new_state`` the array it names now (None:
    continuous; it may be the one it named before — a query whose output's likelihood is the same
    at every point of the domain leaves an exact state's content as it was — and the one it
    named is not written to: a state no object names is left to
    :func:`app.store.states.collect_unnamed`); ``event`` the
    decision's audit event (:func:`app.services.audit.query_event`: its detail gets the query
    row's id, so it goes out with the rest). The new query's id, or None when another writer
    advanced the object first (the caller must roll back).

    On a :func:`app.store.submitting` connection with no transaction open yet, with ``commit``
    the statement is the whole transaction (autocommit: nothing of it stays after a lost race or
    a conflict); without ``commit`` a ``BEGIN`` goes out before it in one pipeline and the
    transaction stays open for more writes, which the block commits.
    In a transaction of the caller's (or on SQLite) ``commit`` changes nothing.
    """
    if not is_postgres(conn):
        return _record_one_by_one(conn, query, version, columns, new_state, event)
    cas = {"where_id": query.object_id, "where_version": version, "version": version + 1}
    cas.update(columns)
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):  # PostgreSQL is reached through psycopg 3
        raise TypeError("record_accepted needs a psycopg connection")
    # a submitting() block's transaction, not opened yet: BEGIN goes first when more writes follow
    own = raw.autocommit and raw.pgconn.transaction_status == TransactionStatus.IDLE
    accept = _accept_sql(frozenset(columns) | {"version"}, new_state is not None)
    params = {_QUERY_PARAM + n: getattr(query, n) for n in _QUERY_COLUMNS}
    params.update(audit_store.query_event_params(event))
    params.update(cas)  # the objects columns' names (none is another's: _accept_sql)
    if new_state is not None:
        params[_STATE_PARAM + "hash"] = new_state.key
        params[_STATE_PARAM + "state"] = new_state.state
        params[_STATE_PARAM + "err"] = new_state.err
    accepted = raw.cursor()
    try:
        if own and not commit:  # BEGIN and the statement in one pipeline: one round trip
            with raw.pipeline():
                raw.cursor().execute(b"BEGIN", prepare=False)
                accepted.execute(accept.text, accept.params(params))
        else:
            # one statement, no pipeline (its machinery costs more Python than the statement
            # saves): in autocommit it is a transaction of its own, committed when it succeeds
            # and rolled back whole when it fails — the protocol's implicit transaction, as the
            # pipeline's one Sync made it; in the caller's transaction it runs in that
            accepted.execute(accept.text, accept.params(params))
    except psycopg.errors.InvalidTextRepresentation as exc:
        if _lost_race(exc):
            return None
        raise
    except psycopg.Error as exc:  # SQLAlchemy's, as from Connection.execute: Conflict, ...
        raise wrapped(conn, raw, "accepted submit", exc) from exc
    row = accepted.fetchone()
    if row is None:
        return None
    return int(row[0])


def _record_one_by_one(
    conn: Tx,
    query: AcceptedQuery,
    version: int,
    columns: Mapping[str, Any],
    new_state: NewState | None,
    event: audit_store.QueryEvent,
) -> int | None:
    """:func:`record_accepted` as the modules' functions, one statement at a time."""
    query_id = query_store.insert_query(conn, **{n: getattr(query, n) for n in _QUERY_COLUMNS})
    rest = dict(columns)
    accepted, updated_at = rest.pop("accepted"), rest.pop("updated_at")
    if not object_store.compare_and_set(
        conn,
        object_id=query.object_id,
        version=version,
        accepted=accepted,
        updated_at=updated_at,
        columns=rest,
    ):
        return None
    if new_state is not None:
        state_store.insert_state(conn, key=new_state.key, state=new_state.state, err=new_state.err)
    audit_store.add_for_query(conn, event)
    return query_id


@dataclass(frozen=True)
class StoredRejection:
    """A keyed rejection's answer (``rejections`` row): a retry of the key replays it."""

    idempotency_key: str
    analyst_key_id: int | None
    fingerprint: str
    response: str
    created_at: datetime


def _reject_sql(keyed: bool) -> Compiled:
    """The rejection's count, its stored answer (``keyed``) and its audit event, one statement.

    Data-modifying CTEs: the count under the compare-and-set
    (:data:`app.store.objects.COUNT_REJECTION`, which also bumps the version), then the answer
    (:func:`app.store.queries.insert_rejection_for`) and the event
    (:func:`app.store.audit.add_for`), each inserted once per row the count hit; the statement
    returns that number (0: a lost race, and nothing was written).
    """
    counted = object_store.COUNT_REJECTION.returning(object_store.OBJECTS.c.id).cte("counted")
    statement = select(func.count()).select_from(counted)
    if keyed:
        statement = statement.add_cte(
            query_store.insert_rejection_for(counted.c.id, counted).cte("stored")
        )
    return Compiled.of(statement.add_cte(audit_store.add_for(counted.c.id, counted).cte("event")))


_REJECT = {keyed: _reject_sql(keyed) for keyed in (False, True)}


def record_rejected(
    conn: Tx,
    *,
    object_id: str,
    version: int,
    stored: StoredRejection | None,
    event: audit_store.NewEvent,
) -> bool:
    """Count a rejected submit at ``version``, store its answer (keyed) and add its event.

    The count is a compare-and-set on the version the decision read; ``stored`` is a keyed
    submit's answer. False, and nothing written, when another writer advanced the object first
    (the caller decides again); a used key is a :class:`~app.store.Conflict`. On PostgreSQL the
    three are one statement (:func:`_reject_sql`): on a :func:`app.store.submitting`
    connection with no transaction open it is a transaction of its own, one round trip with
    nothing to commit after. Elsewhere the modules' own functions run them one by one in the
    caller's transaction.
    """
    if not is_postgres(conn):
        if not object_store.count_rejection(conn, object_id=object_id, version=version):
            return False
        if stored is not None:
            query_store.insert_rejection(conn, object_id=object_id, **vars(stored))
        audit_store.add(
            conn,
            at=event.at,
            kind=event.kind,
            actor_key_id=event.actor_key_id,
            object_id=object_id,
            detail=event.detail,
        )
        return True
    params: dict[str, Any] = {"where_id": object_id, "where_version": version}
    params.update(at=event.at, kind=event.kind, actor_key_id=event.actor_key_id)
    params["detail"] = event.detail
    if stored is not None:
        params.update(vars(stored))
    row = fetch_one(conn, _REJECT[stored is not None], params)
    return row is not None and row[0] == 1

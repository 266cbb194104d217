"""SQLAlchemy statements compiled once for PostgreSQL and run on the ``Tx``'s psycopg connection.

The hot statements of a single submit (its load, :mod:`app.store.objects`, and its writes,
:mod:`app.store.submits`) skip SQLAlchemy's per-execution work — the execution context, the
cursor's ``description`` turned into a result's metadata (a psycopg ``Column`` per column), the
``Row`` — which the profile of a submit showed to cost about as much as psycopg's own execute
(docs/benchmarks.md, "h/submitdb"). The statement is still the module's SQLAlchemy construct:
:class:`Compiled` keeps its PostgreSQL text, the values SQLAlchemy bound for its literals and,
for a ``SELECT``, each column's result processor from the column's type (so a row comes back
typed exactly as ``Connection.execute`` would type it: an encrypted column decrypted, say).
Every read of stored likelihood arrays runs here too, in PostgreSQL's binary format
(:attr:`Compiled.binary`): an object's loads (:mod:`app.store.objects`) and
:func:`app.store.states.load_states` (through :func:`app.store.ids.rows_among`).

Errors are SQLAlchemy's, as from ``Connection.execute``: psycopg's error is wrapped by
``DBAPIError.instance`` (a unique constraint is :class:`~app.store.Conflict`, a failed database
:class:`~app.store.Unavailable`), and a connection psycopg reports broken is invalidated so the
pool does not hand it out again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import ClauseElement
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.types import TypeEngine

from app.store.base import Tx

DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]

_Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class Compiled:
    """A statement's PostgreSQL text, its literals' values and its columns' result processors.

    The text has ``%(name)s`` parameters (psycopg's style); a literal such as the ``0`` of
    ``refs <= 0`` becomes a parameter of its own, whose value is kept here.
    """

    text: str
    literals: dict[str, Any]
    #: Per result column (in order): its SQLAlchemy type.
    types: tuple[TypeEngine[Any], ...] = ()
    #: Its rows in PostgreSQL's binary format (:func:`fetch_one`, :func:`fetch_all`): for a
    #: statement whose columns psycopg's binary loaders give the same Python values as its text
    #: ones (a ``bytea`` then travels as its bytes, not as twice as many hex digits that the
    #: server writes and psycopg parses: a likelihood array of 1,000 points is 8 kB).
    binary: bool = False
    #: The types' result processors (None: the value as psycopg gives it), by the result's
    #: column type codes (a processor may depend on them, a float's say: SQLAlchemy asks the
    #: cursor's description too). One entry in practice, made by the first row.
    _processors: dict[tuple[int, ...], tuple[_Processor | None, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, statement: ClauseElement, *, binary: bool = False) -> Compiled:
        """``statement`` compiled for PostgreSQL (psycopg), once (``binary``: :attr:`binary`)."""
        compiled = statement.compile(dialect=DIALECT)
        literals = {name: value for name, value in compiled.params.items() if value is not None}
        types = tuple(column.type for column in getattr(compiled, "_result_columns", ()))
        return cls(str(compiled), literals, types, binary=binary)

    def params(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The execution's parameters: ``given`` and the literals' values."""
        return {**self.literals, **given}

    def processors(self, cursor: psycopg.Cursor[Any]) -> tuple[_Processor | None, ...]:
        """The result processors of the columns ``cursor``'s result has (by their type codes)."""
        pgresult = cursor.pgresult
        if pgresult is None:
            raise TypeError("the statement returned no result")
        codes = tuple(pgresult.ftype(i) for i in range(pgresult.nfields))
        found = self._processors.get(codes)
        if found is None:
            if len(codes) != len(self.types):
                raise TypeError(f"{len(codes)} columns for {len(self.types)} types")
            found = self._processors[codes] = tuple(
                kind.dialect_impl(DIALECT).result_processor(DIALECT, code)
                for kind, code in zip(self.types, codes, strict=True)
            )
        return found


def raw_connection(conn: Tx) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn`` (PostgreSQL is reached through psycopg 3)."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError("a compiled statement needs a psycopg connection")
    return raw


def wrapped(
    conn: Tx, raw: psycopg.Connection[Any], text: str, exc: psycopg.Error
) -> StatementError:
    """``exc`` as ``Connection.execute`` would raise it (and ``conn`` invalidated if broken)."""
    if raw.broken or raw.closed:  # the pool must not hand this connection out again
        conn.invalidate()
    return DBAPIError.instance(text, None, exc, psycopg.Error, hide_parameters=True)


def fetch_one(
    conn: Tx, statement: Compiled, params: Mapping[str, Any], *, binary: bool | None = None
) -> tuple[Any, ...] | None:
    """The first row of ``statement`` (typed by its columns' processors), or None for no row.

    Runs in ``conn``'s transaction (or, in autocommit, on its own), as a prepared statement
    from its first use on the connection. ``binary``: the row in PostgreSQL's binary format
    or not (None: as the statement's :attr:`Compiled.binary` says; a bench compares both).
    """
    raw = raw_connection(conn)
    try:
        with raw.cursor(binary=statement.binary if binary is None else binary) as cursor:
            cursor.execute(statement.text, statement.params(params), prepare=True)
            row = cursor.fetchone()
            if row is None:
                return None
            processors = statement.processors(cursor)
    except psycopg.Error as exc:
        raise wrapped(conn, raw, statement.text, exc) from exc
    return _typed(row, processors)


def _typed(row: tuple[Any, ...], processors: tuple[_Processor | None, ...]) -> tuple[Any, ...]:
    """``row`` with each column's result processor applied."""
    return tuple(
        value if process is None else process(value)
        for value, process in zip(row, processors, strict=True)
    )


def fetch_all(
    conn: Tx, statement: Compiled, params: Mapping[str, Any], *, binary: bool | None = None
) -> list[tuple[Any, ...]]:
    """Every row of ``statement`` (typed by its columns' processors), fetched at once.

    As :func:`fetch_one`, but psycopg builds all the rows in one call (``fetchall``) instead of
    SQLAlchemy asking for them one by one, each wrapped in a ``Row`` (a survey chunk reads 5,000).
    """
    raw = raw_connection(conn)
    try:
        with raw.cursor(binary=statement.binary if binary is None else binary) as cursor:
            cursor.execute(statement.text, statement.params(params), prepare=True)
            rows = cursor.fetchall()
            processors = statement.processors(cursor)
    except psycopg.Error as exc:
        raise wrapped(conn, raw, statement.text, exc) from exc
    if all(process is None for process in processors):
        return rows
    return [_typed(row, processors) for row in rows]


def execute_planned(conn: Tx, statement: Compiled, params: Mapping[str, Any]) -> int:
    """Run ``statement`` planned for these values, never prepared; the rows it changed.

    psycopg prepares a statement it has run five times on a connection (``prepare_threshold``),
    and PostgreSQL may then plan it once for any values (a generic plan). A statement whose good
    plan depends on its values' sizes — a set-returning function over a parameter, whose row
    count only a custom plan sees — is run this way: a survey chunk's compare-and-set, whose
    generic plan took 3.6 s instead of 61 ms for 5,000 members with 5,000 distinct accounting
    dicts (docs/benchmarks.md, "Diverging surveys after the tenth session's merges").
    """
    raw = raw_connection(conn)
    try:
        with raw.cursor() as cursor:
            cursor.execute(statement.text, statement.params(params), prepare=False)
            return cursor.rowcount
    except psycopg.Error as exc:
        raise wrapped(conn, raw, statement.text, exc) from exc

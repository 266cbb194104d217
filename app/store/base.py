"""Transactions, the dialect test and the errors services see (see the package docstring)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError as Conflict
from sqlalchemy.exc import OperationalError as Unavailable

#: The database a service is handed (an engine with its pool).
Database = Engine
#: One open connection, inside a transaction when it came from :func:`transaction`.
Tx = Connection

__all__ = [
    "Conflict",
    "Database",
    "Tx",
    "Unavailable",
    "begin_writes",
    "is_postgres",
    "reading",
    "submitting",
    "transaction",
]


@contextmanager
def transaction(db: Database) -> Iterator[Tx]:
    """One transaction: committed when the block ends, rolled back if it raises."""
    with db.begin() as conn:
        yield conn


@contextmanager
def reading(db: Database) -> Iterator[Tx]:
    """A connection for reads only (nothing to commit; closed when the block ends)."""
    with db.connect() as conn:
        yield conn


@contextmanager
def submitting(db: Database) -> Iterator[Tx]:
    """A transaction whose ``BEGIN`` goes out with its first write (a single submit's).

    On PostgreSQL the connection runs in autocommit until :func:`begin_writes` opens the
    transaction (:mod:`app.store.submits` writes a submit's outcome as one round trip that is a
    transaction of its own, or sends ``BEGIN`` with it when more writes follow): the reads
    before it run each on its own, which
    under READ COMMITTED (the isolation every transaction here runs at) is what they were
    inside the transaction too — every statement takes its own snapshot, so the write must not
    trust them and does not (the compare-and-set on the object's version). ``BEGIN`` alone
    was a round trip of its own before the first read. The block's end commits what is still
    open and rolls it back if the block raises. Elsewhere (SQLite) this is :func:`transaction`.
    """
    if db.dialect.name != "postgresql":
        with db.begin() as conn:
            yield conn
        return
    with db.connect() as conn:
        raw = conn.connection.driver_connection
        if not isinstance(raw, psycopg.Connection):  # PostgreSQL is reached through psycopg 3
            raise TypeError("submitting needs a psycopg connection")
        # psycopg's own switch (no round trip), not SQLAlchemy's isolation-level option, whose
        # bookkeeping on the way out and back to the pool cost more than the switch itself
        raw.autocommit = True
        try:
            try:
                yield conn
            except BaseException:
                _end(conn, raw, commit=False)
                raise
            _end(conn, raw, commit=True)
        finally:
            _restore(conn, raw)


def _end(conn: Tx, raw: Any, *, commit: bool) -> None:
    """COMMIT (or ROLLBACK) the transaction a :func:`submitting` block opened, if any is open."""
    status = raw.info.transaction_status
    if status == TransactionStatus.IDLE:
        return
    try:
        if commit and status == TransactionStatus.INTRANS:
            raw.commit()
        else:
            raw.rollback()
    except psycopg.IntegrityError as exc:
        raise Conflict("COMMIT", None, exc, hide_parameters=True) from exc
    except psycopg.Error as exc:
        if raw.broken or raw.closed:  # the pool must not hand this connection out again
            conn.invalidate()
        raise Unavailable("COMMIT" if commit else "ROLLBACK", None, exc) from exc


def _restore(conn: Tx, raw: psycopg.Connection[Any]) -> None:
    """Leave autocommit before ``conn`` goes back to the pool (or make the pool drop it).

    Every other user of the pool expects SQLAlchemy's transactions (``BEGIN`` sent by psycopg
    before a statement): a connection still in autocommit, or whose state is unknown (a statement
    interrupted, a failed ``COMMIT``), is invalidated instead of returned.
    """
    if conn.invalidated:
        return
    if not (raw.closed or raw.broken) and raw.info.transaction_status == TransactionStatus.IDLE:
        raw.autocommit = False
    else:
        conn.invalidate()


def begin_writes(conn: Tx) -> None:
    """Open a :func:`submitting` block's transaction before its writes (nothing elsewhere)."""
    if not is_postgres(conn):
        return
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):  # PostgreSQL is reached through psycopg 3
        raise TypeError("begin_writes needs a psycopg connection")
    if raw.autocommit and raw.info.transaction_status == TransactionStatus.IDLE:
        conn.exec_driver_sql("BEGIN")


def is_postgres(conn: Tx) -> bool:
    """Whether ``conn`` talks to PostgreSQL (else SQLite, the embedded default)."""
    return conn.dialect.name == "postgresql"

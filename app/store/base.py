"""Transactions, the dialect test and the errors services see (see the package docstring)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError as Conflict
from sqlalchemy.exc import OperationalError as Unavailable

#: The database a service is handed (an engine with its pool).
Database = Engine
#: One open connection, inside a transaction when it came from :func:`transaction`.
Tx = Connection

__all__ = ["Conflict", "Database", "Tx", "Unavailable", "is_postgres", "reading", "transaction"]


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


def is_postgres(conn: Tx) -> bool:
    """Whether ``conn`` talks to PostgreSQL (else SQLite, the embedded default)."""
    return conn.dialect.name == "postgresql"

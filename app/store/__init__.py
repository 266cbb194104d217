"""Persistence: every SQL statement, dialect branch and row shape, behind typed functions.

``app/services`` orchestrates (load → decide → persist) and never writes SQL: it opens a transaction
with :func:`transaction` (or reads with :func:`reading`; a single submit uses :func:`submitting`,
whose ``BEGIN`` goes out with its first write on PostgreSQL) and calls the repository functions of
this package with the connection it got. The conventions every module here follows:

- **One persistence style**: SQLAlchemy Core on a :data:`Tx` (a ``Connection``); no ORM sessions.
  Statements that run on the hot path are built once at import time (bound parameters), not per
  call, so the compiled cache keeps them. One exception, on PostgreSQL only: a single submit's
  load and writes go through the ``Tx``'s psycopg connection (:mod:`app.store.compiled`: the same
  constructs compiled once, rows typed by their columns' types, errors SQLAlchemy's) — the
  accepted write one statement, a :func:`submitting` block's whole transaction in one round
  trip (:mod:`app.store.submits`).
- **Typed**: functions are keyword-only after the connection and return frozen dataclasses (the
  row shapes, defined beside the statements that read them), plain values or ``None`` — never a
  ``Row`` or a mapping the caller must know the columns of.
- **Dialects here only**: a ``postgresql`` / ``sqlite`` branch lives in this package, never in a
  service.
- **Errors**: a unique constraint surfaces as :class:`Conflict`, a busy or failed database as
  :class:`Unavailable` (both the SQLAlchemy classes, re-exported so services need not import
  SQLAlchemy); the compare-and-set reports a lost race by its return value.
"""

from app.store.base import (
    Conflict,
    Database,
    Tx,
    Unavailable,
    begin_writes,
    is_postgres,
    reading,
    submitting,
    transaction,
)

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

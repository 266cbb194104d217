r"""Rows whose key is one of a list of texts (object ids, state hashes): one way, both dialects.

Every statement here that filters by a list of keys is built with :func:`among` and run
with :func:`rows_among` (or binds :func:`parameter` itself), so the rule is written once:

- **PostgreSQL**: one ``text`` parameter, the keys joined by newlines and split in the
  database by ``string_to_array`` (``column = ANY(string_to_array(:ids, E'\n'))``), up to
  :data:`PG_PER_STATEMENT` keys a statement. Client CPU per statement for 5,000 ids, median of
  5, side by side in one run at load 15.4 (``bench/ids_param.py``): joined text 2.0 ms, a
  ``text[]`` parameter 4.2 ms (psycopg dumps an array element by element), an expanding ``IN``
  of 5,000 placeholders 20.9 ms (SQLAlchemy renders and psycopg parses a ~100 KB statement
  every time). Keys never hold a newline: object ids
  match ``OBJECT_ID_PATTERN`` (no control characters) and hashes are hex.
- **SQLite**: an expanding ``IN``, :data:`SQLITE_PER_STATEMENT` keys a statement (below the
  999 host parameters of old SQLite builds).

Statements are dialect-specific, so a module builds each once per dialect family with
:func:`both` and picks it with :func:`app.store.base.is_postgres`. A statement whose rows are
many or large (stored likelihood arrays) may be run on psycopg directly on PostgreSQL
(:func:`compiled_for_postgres`: no SQLAlchemy result, and PostgreSQL's binary format if asked).

>>> from sqlalchemy import column
>>> str(among(column("id"), postgres=True))
'id = ANY (string_to_array(:ids, :string_to_array_1))'
>>> parameter(["a", "b"], postgres=True), parameter(["a", "b"], postgres=False)
('a\nb', ['a', 'b'])
>>> list(batches(list("abcde"), size=2))
[['a', 'b'], ['c', 'd'], ['e']]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Delete, Select, String, Subquery, Update, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.expression import ColumnElement, Executable, literal_column

from app.store import compiled
from app.store.base import Tx, is_postgres

#: Keys per statement on PostgreSQL (a bulk batch of versions or imports: one statement).
PG_PER_STATEMENT = 10_000
#: Keys per statement on SQLite.
SQLITE_PER_STATEMENT = 500

T = TypeVar("T")
S = TypeVar("S", Select[Any], Update, Delete)


def among(column: ColumnElement[Any], *, postgres: bool, name: str = "ids") -> ColumnElement[bool]:
    """``column`` is one of the keys of the parameter ``name`` (bind it with :func:`parameter`)."""
    if postgres:
        split = func.string_to_array(bindparam(name, type_=String), "\n", type_=ARRAY(String))
        return column == any_(split)
    return column.in_(bindparam(name, expanding=True))


def listed(*, postgres: bool, name: str = "ids") -> Subquery:
    """The keys of the parameter ``name`` as rows: a subquery ``listed`` of one column ``id``.

    Bind it with :func:`listed_parameter`: on PostgreSQL the keys joined by newlines (as
    :func:`among`'s), on SQLite a JSON array (``json_each``: one host parameter).
    """
    if postgres:
        split = func.string_to_array(bindparam(name, type_=String), "\n", type_=ARRAY(String))
        return select(func.unnest(split).label("id")).subquery("listed")
    rows = func.json_each(bindparam(name, type_=String))
    return select(literal_column("value", String).label("id")).select_from(rows).subquery("listed")


def listed_parameter(keys: Sequence[str], *, postgres: bool) -> str:
    """The value of :func:`listed`'s parameter for ``keys`` (at most one statement's worth)."""
    return "\n".join(keys) if postgres else json.dumps(list(keys))


def parameter(keys: Sequence[str], *, postgres: bool) -> str | list[str]:
    """The value of :func:`among`'s parameter for ``keys`` (at most one statement's worth)."""
    return "\n".join(keys) if postgres else list(keys)


def per_statement(postgres: bool) -> int:
    """How many keys one statement takes on this dialect."""
    return PG_PER_STATEMENT if postgres else SQLITE_PER_STATEMENT


def batches(keys: Sequence[str], *, size: int) -> Iterator[list[str]]:
    """``keys`` in consecutive lists of at most ``size``."""
    for start in range(0, len(keys), size):
        yield list(keys[start : start + size])


def both(build: Callable[[bool], T]) -> dict[bool, T]:
    """``build(postgres)`` once per dialect family, keyed by "is PostgreSQL"."""
    return {postgres: build(postgres) for postgres in (True, False)}


def where_among(statement: S, column: ColumnElement[Any], *, name: str = "ids") -> dict[bool, S]:
    """``statement`` filtered by :func:`among` on ``column``, once per dialect family."""
    return both(lambda postgres: statement.where(among(column, postgres=postgres, name=name)))


def compiled_for_postgres(
    statements: Mapping[bool, Select[Any]], *, binary: bool = False
) -> dict[bool, Executable | compiled.Compiled]:
    """``statements`` (:func:`both`), PostgreSQL's compiled once for psycopg (:mod:`compiled`).

    :func:`rows_among` runs it with :func:`app.store.compiled.fetch_all` — psycopg builds a
    statement's rows in one call, typed by the columns' result processors as SQLAlchemy's would
    be — in PostgreSQL's binary format when ``binary`` (:attr:`app.store.compiled.Compiled.binary`:
    only for columns whose binary and text loaders give the same values). SQLite's is unchanged.
    """
    return {True: compiled.Compiled.of(statements[True], binary=binary), False: statements[False]}


def rows_among(
    conn: Tx,
    statements: Mapping[bool, Executable | compiled.Compiled],
    keys: Sequence[str],
    *,
    name: str = "ids",
    params: Mapping[str, Any] | None = None,
    size: int | None = None,
) -> Iterator[Any]:
    """The rows of the dialect's statement (built with :func:`among`), for every key of ``keys``.

    One statement per :func:`per_statement` keys (``size``: fewer), each bound with the other
    ``params`` as given. A compiled statement (:func:`compiled_for_postgres`) gives plain
    tuples, not SQLAlchemy ``Row`` s: read its rows by position.
    """
    postgres = is_postgres(conn)
    statement = statements[postgres]
    limit = per_statement(postgres) if size is None else min(size, per_statement(postgres))
    for part in batches(keys, size=limit):
        values = {**(params or {}), name: parameter(part, postgres=postgres)}
        if isinstance(statement, compiled.Compiled):
            yield from compiled.fetch_all(conn, statement, values)
        else:
            yield from conn.execute(statement, values)


def execute_among(
    conn: Tx,
    statements: Mapping[bool, Executable],
    keys: Sequence[str],
    *,
    name: str = "ids",
    params: Mapping[str, Any] | None = None,
) -> int:
    """Run the dialect's writing statement (built with :func:`among`) for every key of ``keys``.

    One statement per :func:`per_statement` keys; returns the rows it changed in all.
    """
    postgres = is_postgres(conn)
    changed = 0
    for part in batches(keys, size=per_statement(postgres)):
        values = {**(params or {}), name: parameter(part, postgres=postgres)}
        changed += int(conn.execute(statements[postgres], values).rowcount)
    return changed

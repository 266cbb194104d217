"""Many rows in one statement: inserts and compare-and-set updates of a survey chunk.

On PostgreSQL each operation is one statement whose rows arrive as one JSON text, unpacked by
the server (``json_to_recordset``): a chunk of 5,000 members costs three statements instead of
15,000 pipelined ones, and the client encodes the rows with the C JSON encoder instead of
adapting each array element in Python (the profiles of both earlier versions are in
docs/benchmarks.md). Elsewhere
(SQLite, the embedded default) the same rows go through SQLAlchemy's ``executemany``. Both
return how many rows each update hit, which the caller compares with what it expected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy import Table, bindparam, text, update

from app.crypto import active
from app.store import ids as ids_
from app.store.base import Tx, is_postgres


def _recordset(rows: Sequence[Mapping[str, Any]], types: Mapping[str, str]) -> str:
    """``json_to_recordset(:rows) AS v(name type, ...)`` for rows with the keys of ``types``."""
    return (
        "json_to_recordset(CAST(:rows AS json)) AS v("
        + ", ".join(f"{name} {kind}" for name, kind in types.items())
        + ")"
    )


def rows_json(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """``rows`` (their ``keys``) as the JSON text a recordset statement unpacks."""
    return _rows_json(rows, keys)["rows"]


def json_text(value: Any) -> str:
    """``value`` as JSON text (orjson; see :func:`_rows_json` for why, and its one caveat)."""
    return orjson.dumps(value).decode()


def _rows_json(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, str]:
    # orjson: the standard encoder was a large part of an import's profile (docs/benchmarks.md,
    # "Import: before and after"); datetimes come out as RFC 3339. Its one difference that
    # matters here, NaN/inf written as null, cannot pass silently: every float column these
    # statements write is NOT NULL.
    return {"rows": orjson.dumps([{k: row[k] for k in keys} for row in rows]).decode()}


def insert_rows(
    conn: Tx,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    types: Mapping[str, str],
    *,
    constants: Mapping[str, Any] | None = None,
    encrypted: Sequence[str] = (),
) -> None:
    """Insert ``rows`` (dicts with the keys of ``types``: column → PostgreSQL type).

    ``constants`` are columns with one value for every row (also typed in ``types``, absent
    from the rows): sent once as a parameter instead of once a row (an import's new objects
    share ten of their seventeen columns). ``encrypted`` names columns of type
    :class:`app.db.types.EncryptedText`: the statement built here bypasses column types, so
    their values are encrypted with the process's cipher first (elsewhere the column type does
    it).
    """
    if not rows:
        return
    constants = constants or {}
    if not is_postgres(conn):
        conn.execute(table.insert(), [{**row, **constants} for row in rows])
        return
    if encrypted:
        cipher = active()
        rows = [{**row, **{c: cipher.encrypt(row[c]) for c in encrypted}} for row in rows]
    varying = {name: kind for name, kind in types.items() if name not in constants}
    fixed = {name: kind for name, kind in types.items() if name in constants}
    columns = ", ".join([*varying, *fixed])
    selected = ", ".join(
        [
            *(f"v.{name}" for name in varying),
            *(f"CAST(:c_{name} AS {kind})" for name, kind in fixed.items()),
        ]
    )
    statement = f"INSERT INTO {table.name} ({columns}) SELECT {selected} FROM "  # noqa: S608
    parameters: dict[str, Any] = {f"c_{name}": constants[name] for name in fixed}
    parameters.update(_rows_json(rows, list(varying)))
    conn.execute(text(statement + _recordset(rows, varying)), parameters)


def update_rows(
    conn: Tx,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    where: Mapping[str, str],
    values: Mapping[str, str],
    fixed: str = "",
    encrypted: Sequence[str] = (),
    shaped: bool = False,
) -> int:
    """Update one row per item; returns the number of rows updated.

    ``where`` maps a row key to its column (``{"where_id": "id"}``), ``values`` maps a column to
    its PostgreSQL type (``{"version": "int"}``; its row key is the column's name), the
    ``where`` keys' types are given in ``values`` under the key (``"where_id": "text"``).
    ``fixed`` is an extra SQL condition on the table (alias ``t``), e.g. ``t.status = 0``.
    ``encrypted`` names :class:`app.db.types.EncryptedText` columns given in plaintext: the
    PostgreSQL statement bypasses column types, so they are encrypted here first.
    ``shaped``: every row holds exactly the keys of ``where`` and ``values`` (sent as they are,
    not copied key by key: a survey chunk updates 5,000 rows).
    """
    if not rows:
        return 0
    if not is_postgres(conn):
        statement = update(table).where(
            *(table.c[column] == bindparam(key) for key, column in where.items())
        )
        if fixed:
            statement = statement.where(text(fixed.replace("t.", f"{table.name}.")))
        updated = [{k: v for k, v in row.items() if k in values or k in where} for row in rows]
        return int(conn.execute(statement, updated).rowcount)
    if encrypted:
        cipher = active()
        rows = [{**row, **{c: cipher.encrypt(row[c]) for c in encrypted}} for row in rows]
    keys = list(where) + [c for c in values if c not in where]
    assignments = ", ".join(f"{c} = v.{c}" for c in values if c not in where)
    conditions = " AND ".join(f"t.{column} = v.{key}" for key, column in where.items())
    if fixed:
        conditions += f" AND {fixed}"
    recordset = _recordset(rows, {key: values[key] for key in keys})
    many = text(
        f"UPDATE {table.name} AS t SET {assignments} "  # noqa: S608 - names from the models
        f"FROM {recordset} WHERE {conditions}"
    )
    if shaped and (
        set(rows[0]) != set(keys) or any(len(row) != len(keys) for row in rows)
    ):  # a missing key would be NULL in the recordset: never sent as it is
        raise ValueError("rows not shaped as the statement's keys")
    sent = {"rows": orjson.dumps(rows).decode()} if shaped else _rows_json(rows, keys)
    return int(conn.execute(many, sent).rowcount)


def increment(conn: Tx, table: Table, column: str, ids: Sequence[str]) -> None:
    """``column = column + 1`` on the rows whose ``id`` is in ``ids``."""
    if not ids:
        return
    target = table.c[column]
    statement = update(table).values({target: target + 1})
    ids_.execute_among(conn, ids_.where_among(statement, table.c.id), ids)

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

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, bindparam, func, text, update

from app.crypto import active


def _postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _recordset(rows: Sequence[Mapping[str, Any]], types: Mapping[str, str]) -> str:
    """``json_to_recordset(:rows) AS v(name type, ...)`` for rows with the keys of ``types``."""
    return (
        "json_to_recordset(CAST(:rows AS json)) AS v("
        + ", ".join(f"{name} {kind}" for name, kind in types.items())
        + ")"
    )


def _rows_json(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, str]:
    # a chunk's rows share a few timestamps: each is formatted once, not once per row (measured:
    # 80,000 isoformat calls were 4% of a survey's time)
    formatted: dict[datetime, str] = {}

    def iso(value: Any) -> str:
        if not isinstance(value, datetime):
            raise TypeError(type(value).__name__)
        found = formatted.get(value)
        if found is None:
            found = formatted[value] = value.isoformat()
        return found

    return {"rows": json.dumps([{k: row[k] for k in keys} for row in rows], default=iso)}


def insert_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    types: Mapping[str, str],
    *,
    encrypted: Sequence[str] = (),
) -> None:
    """Insert ``rows`` (dicts with the keys of ``types``: column → PostgreSQL type).

    ``encrypted`` names columns of type :class:`app.db.types.EncryptedText`: the statement
    built here bypasses column types, so their values are encrypted with the process's cipher
    first (elsewhere the column type does it).
    """
    if not rows:
        return
    if not _postgres(conn):
        conn.execute(table.insert(), list(rows))
        return
    if encrypted:
        cipher = active()
        rows = [{**row, **{c: cipher.encrypt(row[c]) for c in encrypted}} for row in rows]
    columns = ", ".join(types)
    statement = f"INSERT INTO {table.name} ({columns}) SELECT {columns} FROM "  # noqa: S608
    conn.execute(text(statement + _recordset(rows, types)), _rows_json(rows, list(types)))


def update_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    where: Mapping[str, str],
    values: Mapping[str, str],
    fixed: str = "",
) -> int:
    """Update one row per item; returns the number of rows updated.

    ``where`` maps a row key to its column (``{"where_id": "id"}``), ``values`` maps a column to
    its PostgreSQL type (``{"version": "int"}``; its row key is the column's name), the
    ``where`` keys' types are given in ``values`` under the key (``"where_id": "text"``).
    ``fixed`` is an extra SQL condition on the table (alias ``t``), e.g. ``t.status = 0``.
    """
    if not rows:
        return 0
    if not _postgres(conn):
        statement = update(table).where(
            *(table.c[column] == bindparam(key) for key, column in where.items())
        )
        if fixed:
            statement = statement.where(text(fixed.replace("t.", f"{table.name}.")))
        updated = [{k: v for k, v in row.items() if k in values or k in where} for row in rows]
        return int(conn.execute(statement, updated).rowcount)
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
    return int(conn.execute(many, _rows_json(rows, keys)).rowcount)


def increment(conn: Connection, table: Table, column: str, ids: Sequence[str]) -> None:
    """``column = column + 1`` on the rows whose ``id`` is in ``ids``."""
    if not ids:
        return
    target = table.c[column]
    if _postgres(conn):
        conn.execute(
            update(table)
            .where(table.c.id == func.any(bindparam("ids")))
            .values({target: target + 1}),
            {"ids": list(ids)},
        )
        return
    for start in range(0, len(ids), 500):
        conn.execute(
            update(table)
            .where(table.c.id.in_(bindparam("ids", expanding=True)))
            .values({target: target + 1}),
            {"ids": list(ids[start : start + 500])},
        )

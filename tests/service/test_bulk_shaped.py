"""``bulk.update_rows(..., shaped=True)``: rows sent as they are, and only when shaped so.

A survey chunk's compare-and-set (``advance_members``) builds each row with exactly the
statement's keys, so they are encoded without a second copy. A row missing a key would be NULL
in PostgreSQL's recordset — such rows are refused, never sent.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, Text, select

from app.db.session import make_engine
from app.store import bulk, transaction

VALUES = {"where_id": "text", "where_version": "int", "version": "int", "note": "text"}
WHERE = {"where_id": "id", "where_version": "version"}


@pytest.mark.parametrize("shaped", [True, False])
def test_shaped_rows_update_as_copied_ones(database_url: str, shaped: bool) -> None:
    engine = make_engine(database_url)
    meta = MetaData()
    table = Table(
        f"bulk_shaped_{int(shaped)}",
        meta,
        Column("id", Text, primary_key=True),
        Column("version", Integer, nullable=False),
        Column("note", Text, nullable=True),
    )
    meta.create_all(engine)
    try:
        with transaction(engine) as conn:
            conn.execute(table.insert(), [{"id": i, "version": 1, "note": None} for i in "abc"])
        rows = [
            {"where_id": "a", "where_version": 1, "version": 2, "note": "x"},
            {"where_id": "b", "where_version": 5, "version": 6, "note": "y"},  # moved: no hit
            {"note": "z", "version": 2, "where_version": 1, "where_id": "c"},  # any key order
        ]
        with transaction(engine) as conn:
            hit = bulk.update_rows(conn, table, rows, where=WHERE, values=VALUES, shaped=shaped)
        assert hit == 2
        with engine.connect() as conn:
            found = {r.id: (r.version, r.note) for r in conn.execute(select(table))}
        assert found == {"a": (2, "x"), "b": (1, None), "c": (2, "z")}
        if shaped and engine.dialect.name == "postgresql":
            short = [{"where_id": "a", "where_version": 2, "version": 3}]
            with pytest.raises(ValueError, match="shaped"), transaction(engine) as conn:
                bulk.update_rows(conn, table, short, where=WHERE, values=VALUES, shaped=True)
            with engine.connect() as conn:
                assert conn.execute(select(table.c.note).where(table.c.id == "a")).scalar() == "x"
    finally:
        meta.drop_all(engine)
        engine.dispose()

"""Counts of the objects by status kept in the writers' transactions (issue 25, item 5).

``object_counts`` holds, summed over its rows, how many objects are active, retired, exhausted
and near exhaustion, and the rejected submits of the active ones and of all: the dashboard's
summary and the list's ``total`` without filters, and the ``/metrics`` gauges, read it instead
of scanning every object (3.8 s at 10^6 objects on PostgreSQL before; docs/benchmarks.md).

Triggers on ``objects`` keep it, so every writer — submits, surveys, imports, data versions,
retirement, a repair by hand — changes the counts in the statement that changes an object:

* PostgreSQL: one trigger per statement (``INSERT``, ``UPDATE``, ``DELETE``, with its
  transition tables; ``TRUNCATE`` empties the counts) adds the statement's change of each count
  to the row ``slot = pg_backend_pid()``, created by the first change of that slot: no two live
  connections share a process id, so a transaction never waits for another's row, nor
  deadlocks through it (with ``pid % N`` two connections could share a row, and a transaction
  holding it and waiting for an object that the other had locked would deadlock). There is
  one row per server process that ever changed a count, bounded by the process ids.
* SQLite (one writer at a time): one trigger per row adds its change to the row ``slot = 0``.

The counts' expressions are the status conditions of :mod:`app.store.objects`
(:func:`~app.store.objects.row_counts_sql`), as they were when this revision ran: a later change
of a definition needs a revision that recreates the triggers (``gatekeeper verify`` compares
the counts with a count of the rows). The upgrade counts the existing objects once.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from app.store.objects import ROW_COUNTS, row_counts_sql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_NAMES = list(ROW_COUNTS)
_COLUMNS = ", ".join(_NAMES)


def _postgres_function(event: str) -> str:
    """The function the statement trigger of ``event`` runs (``n``: new rows, ``o``: old)."""
    dialect = op.get_bind().dialect
    new, old = row_counts_sql(dialect, "n"), row_counts_sql(dialect, "o")
    parts = []
    if event in {"insert", "update"}:
        parts.append("SELECT " + ", ".join(f"{new[k]} AS {k}" for k in _NAMES) + " FROM n")
    if event in {"update", "delete"}:
        parts.append("SELECT " + ", ".join(f"-({old[k]}) AS {k}" for k in _NAMES) + " FROM o")
    sums = ", ".join(f"sum(d.{k})" for k in _NAMES)
    changed = " OR ".join(f"sum(d.{k}) <> 0" for k in _NAMES)
    add = ", ".join(f"{k} = c.{k} + excluded.{k}" for k in _NAMES)
    return f"""
CREATE FUNCTION gatekeeper_object_counts_{event}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO object_counts AS c (slot, {_COLUMNS})
    SELECT pg_backend_pid(), {sums}
    FROM ({" UNION ALL ".join(parts)}) AS d
    HAVING {changed}
    ON CONFLICT (slot) DO UPDATE SET {add};
    RETURN NULL;
END
$body$"""


_REFERENCING = {
    "insert": "NEW TABLE AS n",
    "update": "OLD TABLE AS o NEW TABLE AS n",
    "delete": "OLD TABLE AS o",
}


def _sqlite_trigger(event: str) -> str:
    dialect = op.get_bind().dialect
    new, old = row_counts_sql(dialect, "new"), row_counts_sql(dialect, "old")
    changes = []
    for k in _NAMES:
        change = {"insert": f"({new[k]})", "update": f"({new[k]}) - ({old[k]})"}.get(
            event, f"-({old[k]})"
        )
        changes.append(f"{k} = {k} + {change}")
    return (
        f"CREATE TRIGGER object_counts_{event} AFTER {event.upper()} ON objects "
        f"BEGIN UPDATE object_counts SET {', '.join(changes)} WHERE slot = 0; END"
    )


def upgrade() -> None:
    counts = [sa.Column(k, sa.BigInteger(), nullable=False, server_default="0") for k in _NAMES]
    op.create_table(
        "object_counts",
        sa.Column("slot", sa.Integer(), primary_key=True, autoincrement=False),
        *counts,
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for event, referencing in _REFERENCING.items():
            op.execute(_postgres_function(event))
            op.execute(
                f"CREATE TRIGGER object_counts_{event} AFTER {event.upper()} ON objects "
                f"REFERENCING {referencing} FOR EACH STATEMENT "
                f"EXECUTE FUNCTION gatekeeper_object_counts_{event}()"
            )
        op.execute(
            "CREATE FUNCTION gatekeeper_object_counts_truncate() RETURNS trigger "
            "LANGUAGE plpgsql AS $body$ BEGIN DELETE FROM object_counts; RETURN NULL; END $body$"
        )
        op.execute(
            "CREATE TRIGGER object_counts_truncate AFTER TRUNCATE ON objects "
            "FOR EACH STATEMENT EXECUTE FUNCTION gatekeeper_object_counts_truncate()"
        )
    else:
        for event in ("insert", "update", "delete"):
            op.execute(_sqlite_trigger(event))
    # after the triggers, in the same transaction: no change is missed or counted twice
    shares = row_counts_sql(bind.dialect, "objects")
    sums = ", ".join(f"coalesce(sum({shares[k]}), 0)" for k in _NAMES)
    op.execute(f"INSERT INTO object_counts (slot, {_COLUMNS}) SELECT 0, {sums} FROM objects")


def downgrade() -> None:
    bind = op.get_bind()
    for event in ("insert", "update", "delete", "truncate"):
        if bind.dialect.name == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS object_counts_{event} ON objects")
            op.execute(f"DROP FUNCTION IF EXISTS gatekeeper_object_counts_{event}()")
        elif event != "truncate":
            op.execute(f"DROP TRIGGER IF EXISTS object_counts_{event}")
    op.drop_table("object_counts")

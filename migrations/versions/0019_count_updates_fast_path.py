"""The object-count UPDATE trigger skips its sums when no share can change (issue 27, item 1).

The statement trigger of revision 0014 (shares as 0018 decides them) runs, after every
``UPDATE objects``, one query over its transition tables: six shares per old and new row —
large ``CASE`` trees with 0018's float tests and the NUMERIC ones behind them — summed, and the
sums added to ``object_counts`` when one is not zero. A single accepted submit's
compare-and-set is such an ``UPDATE``, of one row whose shares do not change (the loss moves,
far from the budget). Setting up that query's executor (its expressions, the ``INSERT … ON
CONFLICT``) cost PostgreSQL ≈ 65–90 µs per one-row ``UPDATE`` on this machine: the largest part of
the accepted write that is not a write (docs/benchmarks.md, "h/pgsub").

Here the function first asks a small question of the same transition tables, reading at most
two rows of each: did the statement change exactly one row, and are its old and new versions
both *quiet* — active (``retired_at IS NULL``), the budget in 0018's float range and
``loss_upper`` below both of 0018's thresholds that decide "not exhausted" and "not near
exhaustion" (``loss_upper < budget - 1e-5`` and ``loss_upper < 0.89 * budget``, written as
0018 writes them) — with the same ``rejected``? Then every share is known without the ``CASE``
trees: 0018's expressions take their ``THEN 0`` branch for exhausted and near exhaustion (the
same tests), the row is active (1) and not retired (0) before and after, and both rejected
shares are its ``coalesce(rejected, 0)``, unchanged; every sum is zero — what the full query
would find — and the function returns without it. Otherwise (a statement of several rows or
none, a rejection counted, a retirement, a loss near a threshold, a budget out of the range,
NaN) 0018's query runs unchanged, so a statement over thousands of rows (a survey chunk's) pays
only the two-row look on top of it. The kept counts are the same either way; only the work to
find that a single submit does not change them is smaller.

PostgreSQL only (SQLite's row triggers compare one row at a time: nothing to gain). The
INSERT and DELETE functions change every count they see and stay as 0018 made them. Downgrade
restores 0018's UPDATE function.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def revision_0018() -> ModuleType:
    """Revision 0018's module (its shares and function text are this one's full path)."""
    path = Path(__file__).with_name("0018_cheaper_object_counts.py")
    spec = importlib.util.spec_from_file_location("gatekeeper_revision_0018", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quiet(row: str) -> str:
    """Whether ``row`` (a transition table's alias) is active with both float shares 0.

    The conjunction of 0018's range test and its two ``false_when`` tests (the same text), so
    0018's exhausted and near-exhaustion expressions are 0 for it.
    """
    r0018 = revision_0018()
    double = r0018._FLOAT
    return (
        f"{row}.retired_at IS NULL AND {r0018._in_range(row)} "
        f"AND {row}.loss_upper < {row}.budget - CAST(0.00001 AS {double}) "
        f"AND {row}.loss_upper < CAST(0.89 AS {double}) * {row}.budget"
    )


#: What the function asks first (at most two rows of each table read): one row changed, quiet
#: before and after, with the same ``rejected``. ``count(*) = 2`` and ``sum(sign) = 0``: one
#: row on each side (a side of two or more rows makes the count larger or the sum not zero).
UNCHANGED = (
    "SELECT count(*) = 2 AND sum(q.sign) = 0 AND bool_and(q.quiet) AND sum(q.rejected) = 0 "
    "INTO unchanged "
    "FROM ((SELECT 1 AS sign, {new} AS quiet, coalesce(n.rejected, 0) AS rejected FROM n "
    "LIMIT 2) UNION ALL (SELECT -1, {old}, -coalesce(o.rejected, 0) FROM o LIMIT 2)) AS q"
)


def update_function(full: str) -> str:
    """The UPDATE trigger's function: the quiet test, then 0018's function body ``full``.

    ``full`` is 0018's ``CREATE OR REPLACE FUNCTION`` text for ``update``; its ``BEGIN`` gets
    the declaration and the test in front.
    """
    head, body = full.split("$body$\nBEGIN\n", 1)
    test = UNCHANGED.format(new=quiet("n"), old=quiet("o"))
    return (
        f"{head}$body$\nDECLARE\n    unchanged boolean;\nBEGIN\n"
        f"    {test};\n    IF unchanged THEN\n        RETURN NULL;\n    END IF;\n{body}"
    )


def upgrade() -> None:
    """Replace the PostgreSQL UPDATE function (SQLite: nothing)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    full = revision_0018().postgres_function("update", fast=True)
    op.execute(update_function(full))


def downgrade() -> None:
    """Restore 0018's UPDATE function."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(revision_0018().postgres_function("update", fast=True))

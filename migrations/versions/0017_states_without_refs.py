"""Likelihood states without reference counts: ``likelihood_states.refs`` dropped (issue 27).

The count was written on every accepted query (the new state up, the old one down, a delete
at zero): three statements of each single submit and a new version of every state row a
survey chunk touched, the array copied each time (docs/benchmarks.md, "h/refs"). A state is
now kept while an object names it, and rows no object names are deleted by a collection
(:mod:`app.store.states`).

Upgrade deletes any stored state no object names (none, if the counts were right: a row at
zero was deleted) and drops the column. Downgrade adds it back with each state's count of the
objects naming it, deleting the states none names (garbage a collection had not reclaimed yet).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_UNNAMED = (
    "DELETE FROM likelihood_states WHERE NOT EXISTS "
    "(SELECT 1 FROM objects o WHERE o.state_hash = likelihood_states.hash)"
)
#: Each state's users, counted in one pass over ``objects`` (no index on ``state_hash``).
_COUNT = (
    "UPDATE likelihood_states SET refs = c.n FROM (SELECT state_hash, count(*) AS n "
    "FROM objects WHERE state_hash IS NOT NULL GROUP BY state_hash) AS c "
    "WHERE c.state_hash = likelihood_states.hash"
)


def upgrade() -> None:
    """Drop the unnamed states and the count."""
    op.execute(_UNNAMED)
    with op.batch_alter_table("likelihood_states") as batch:
        batch.drop_column("refs")


def downgrade() -> None:
    """Count each state's users again; drop the states no object names."""
    op.add_column("likelihood_states", sa.Column("refs", sa.Integer(), nullable=True))
    op.execute(_UNNAMED)
    op.execute(_COUNT)  # UPDATE ... FROM: PostgreSQL, and SQLite since 3.33
    with op.batch_alter_table("likelihood_states") as batch:
        batch.alter_column("refs", existing_type=sa.Integer(), nullable=False)

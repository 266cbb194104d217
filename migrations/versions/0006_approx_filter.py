"""The (ε, δ) filter ``approx_bayesian`` (Algorithm 4, issue #15).

* ``objects.budget_delta`` (nullable float): δ_g of an ``approx_bayesian`` object (NULL for the
  pure-ε filters).
* ``objects.squares_total`` (text, an exact rational like ``basic_total``): ``Σ ε_i²`` of the
  accepted history, the account of the output-independent filter F₀
  (:mod:`app.engine.approx`). Existing objects get theirs from their stored queries'
  ``epsilon_exact``.

Likelihood states keep their format: the exact form of a randomized-response history is appended
to new arrays (``app.engine.likelihood``); arrays stored before have none and are decided by the
float rule as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from fractions import Fraction

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("objects") as batch:
        batch.add_column(sa.Column("budget_delta", sa.Float()))
        batch.add_column(sa.Column("squares_total", sa.Text(), nullable=False, server_default="0"))
    _sum_squares()


def _sum_squares() -> None:
    """``squares_total`` of every object with accepted queries, from their exact epsilons."""
    conn = op.get_bind()
    queries = sa.table(
        "queries", sa.column("object_id", sa.String), sa.column("epsilon_exact", sa.Text)
    )
    objects = sa.table("objects", sa.column("id", sa.String), sa.column("squares_total", sa.Text))
    totals: dict[str, Fraction] = {}
    rows = conn.execute(sa.select(queries.c.object_id, queries.c.epsilon_exact))
    for object_id, epsilon in rows:
        eps = Fraction(epsilon)
        totals[object_id] = totals.get(object_id, Fraction(0)) + eps * eps
    for object_id, total in totals.items():
        conn.execute(
            objects.update().where(objects.c.id == object_id).values(squares_total=str(total))
        )


def downgrade() -> None:
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("squares_total")
        batch.drop_column("budget_delta")

"""The (ε, δ) filter ``approx_bayesian`` (Algorithm 4, issue #15).

* ``objects.budget_delta`` (nullable float): δ_g of an ``approx_bayesian`` object (NULL for the
  pure-ε filters).
* ``objects.f0_account`` (text, an exact rational like ``basic_total``): the account of the
  output-independent filter F₀ (:mod:`app.engine.approx`) over the accepted history, ``"0"`` for
  the pure-ε filters — every object existing before this revision, so nothing to backfill.

Likelihood states keep their format: the exact form of a randomized-response history is appended
to new arrays (``app.engine.likelihood``); arrays stored before have none and are decided by the
float rule as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("objects") as batch:
        batch.add_column(sa.Column("budget_delta", sa.Float()))
        batch.add_column(sa.Column("f0_account", sa.Text(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("f0_account")
        batch.drop_column("budget_delta")

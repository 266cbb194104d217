"""Exact ε sums as unbounded text: a Σε of tiny ε no longer overflows ``VARCHAR(400)``.

``objects.basic_total`` and ``queries.epsilon_exact`` hold rationals as text. With ε = 1e-200 the
text of a sum outgrew 400 characters and every later submit on the object failed on PostgreSQL
(issue #11). New queries are now refused below ``MIN_EPSILON`` (which bounds a sum's digits);
this migration makes rows written before that limit, and any future growth, storable.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("objects") as batch:
        batch.alter_column("basic_total", type_=sa.Text(), existing_type=sa.String(400))
    with op.batch_alter_table("queries") as batch:
        batch.alter_column(
            "epsilon_exact", type_=sa.Text(), existing_type=sa.String(400), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.alter_column(
            "epsilon_exact", type_=sa.String(400), existing_type=sa.Text(), existing_nullable=False
        )
    with op.batch_alter_table("objects") as batch:
        batch.alter_column("basic_total", type_=sa.String(400), existing_type=sa.Text())

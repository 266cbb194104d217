"""Rejected submits that carried an Idempotency-Key keep their answer.

A retry of a rejected submit with the same key used to be decided again: each replay counted
another rejection and wrote another ``decision.rejected`` audit event (issue #11). The stored
answer is now returned and nothing changes.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rejections",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("object_id", sa.String(128), sa.ForeignKey("objects.id"), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("analyst_key_id", sa.Integer(), sa.ForeignKey("api_keys.id")),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "object_id", "idempotency_key", name="uq_rejections_object_idempotency"
        ),
    )


def downgrade() -> None:
    op.drop_table("rejections")

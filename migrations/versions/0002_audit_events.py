"""Audit log: registrations, retirements, key creation/revocation and every submit decision.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("actor_key_id", sa.Integer()),
        sa.Column("object_id", sa.String(128)),
        sa.Column("detail", sa.Text(), nullable=False),
    )
    op.create_index("ix_audit_object", "audit_events", ["object_id", "id"])
    op.create_index("ix_audit_kind", "audit_events", ["kind", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_kind", table_name="audit_events")
    op.drop_index("ix_audit_object", table_name="audit_events")
    op.drop_table("audit_events")

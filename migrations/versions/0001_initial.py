"""Initial schema: API keys, protected objects, accepted queries.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("label", sa.String(200)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "objects",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("domain", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("budget", sa.Float(), nullable=False),
        sa.Column("filter", sa.String(16), nullable=False),
        sa.Column("finite", sa.Boolean(), nullable=False),
        sa.Column("state", sa.LargeBinary()),
        sa.Column("state_err", sa.Float(), nullable=False),
        sa.Column("loss_lower", sa.Float(), nullable=False),
        sa.Column("loss_upper", sa.Float(), nullable=False),
        sa.Column("basic_total", sa.String(400), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "queries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("object_id", sa.String(128), sa.ForeignKey("objects.id"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("query", sa.Text(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("epsilon_exact", sa.String(400), nullable=False),
        sa.Column("loss_lower", sa.Float(), nullable=False),
        sa.Column("loss_upper", sa.Float(), nullable=False),
        sa.Column("basic_after", sa.Float(), nullable=False),
        sa.Column("analyst_key_id", sa.Integer(), sa.ForeignKey("api_keys.id")),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("object_id", "seq", name="uq_queries_object_seq"),
        sa.UniqueConstraint("object_id", "idempotency_key", name="uq_queries_object_idempotency"),
    )
    op.create_index("ix_queries_object_created", "queries", ["object_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_queries_object_created", table_name="queries")
    op.drop_table("queries")
    op.drop_table("objects")
    op.drop_table("api_keys")

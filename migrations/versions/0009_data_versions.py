"""Data versions and lifetime budgets (issue 24).

* ``objects.data_version`` (1 at registration) and ``objects.version_start`` (the accepted
  queries of the closed versions: the current version's history is ``seq > version_start``);
* ``objects.lifetime_budget`` (ε_L, nullable) and the closed versions' realized-loss sums:
  ``lifetime_exact`` (an exact rational's text while every closed loss was exact, else NULL),
  ``lifetime_lower`` and ``lifetime_upper`` (certified bounds);
* ``object_versions``: one row per closed version (its value's ciphertext, its seq range, its
  final loss, Σε and rejections).

Every existing object is at data version 1 with no closed version: nothing to backfill. The
downgrade refuses a database that holds a closed version (its histories would lose their
versions).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from app.db.types import EncryptedText, UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the version and lifetime columns and the closed versions' table."""
    with op.batch_alter_table("objects") as batch:
        batch.add_column(
            sa.Column("data_version", sa.Integer(), server_default="1", nullable=False)
        )
        batch.add_column(
            sa.Column("version_start", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("lifetime_budget", sa.Float()))
        batch.add_column(sa.Column("lifetime_exact", sa.Text(), server_default="0"))
        batch.add_column(
            sa.Column("lifetime_lower", sa.Float(), server_default="0", nullable=False)
        )
        batch.add_column(
            sa.Column("lifetime_upper", sa.Float(), server_default="0", nullable=False)
        )
    op.create_table(
        "object_versions",
        sa.Column("object_id", sa.String(128), sa.ForeignKey("objects.id"), nullable=False),
        sa.Column("data_version", sa.Integer(), nullable=False),
        sa.Column("value", EncryptedText(), nullable=False),
        sa.Column("seq_start", sa.Integer(), nullable=False),
        sa.Column("seq_end", sa.Integer(), nullable=False),
        sa.Column("loss_lower", sa.Float(), nullable=False),
        sa.Column("loss_upper", sa.Float(), nullable=False),
        sa.Column("loss_exact", sa.Text()),
        sa.Column("basic_total", sa.Text(), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.Column("closed_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("object_id", "data_version"),
    )


def downgrade() -> None:
    """Drop them, refusing while a closed version exists."""
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT COUNT(*) FROM object_versions")).scalar():
        raise RuntimeError(
            "cannot downgrade below 0009: objects have closed data versions whose histories "
            "would lose their versions"
        )
    op.drop_table("object_versions")
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("lifetime_upper")
        batch.drop_column("lifetime_lower")
        batch.drop_column("lifetime_exact")
        batch.drop_column("lifetime_budget")
        batch.drop_column("version_start")
        batch.drop_column("data_version")

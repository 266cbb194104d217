"""Deleted projects (issue 25): ``projects.deleted_at``.

A deleted project keeps its row — its name (never reused), scope and quota — so that the
project's sub-histories (``project_states``) and the history its keys asked stay attributed to
it: admins' odometers keep showing its loss. Its keys are revoked when it is deleted.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.drop_column("deleted_at")

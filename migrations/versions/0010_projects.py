"""Tenants (issue 25): ``projects`` and ``api_keys.project_id``.

* ``projects``: a unique name, a label scope (JSON, at least one label) and an ε quota.
* ``api_keys.project_id``: the project a key was created in (NULL: an unscoped key, as every
  key before this revision).
* ``project_states``: per (object, project), the project's sub-history summary (count, hash
  chain, loss bounds, exact Σε) that its quota is checked against; empty at first (no key had a
  project before).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("quota", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("project_id", sa.Integer()))
        batch.create_foreign_key("fk_api_keys_project", "projects", ["project_id"], ["id"])
    op.create_table(
        "project_states",
        sa.Column("object_id", sa.String(128), sa.ForeignKey("objects.id"), primary_key=True),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), primary_key=True),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("history_hash", sa.String(32), nullable=False),
        sa.Column("loss_lower", sa.Float(), nullable=False),
        sa.Column("loss_upper", sa.Float(), nullable=False),
        sa.Column("basic_total", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("project_states")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint("fk_api_keys_project", type_="foreignkey")
        batch.drop_column("project_id")
    op.drop_table("projects")

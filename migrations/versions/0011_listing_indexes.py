"""Indexes for lists at scale (issue 25, items 4 and 5): objects by id prefix, events by time.

- ``ix_objects_id_pattern``: ``objects (id varchar_pattern_ops)`` on PostgreSQL, so that the
  odometers list's search by id prefix (``LIKE 'prefix%'``) is an index range whatever the
  database's collation (the primary key's index answers ``LIKE`` only under the C collation).
  SQLite compares text bytewise, and its primary key answers the prefix as a range; the plain
  index is created there too only so that the schema matches the models on both databases.
- ``ix_audit_at``: ``audit_events (at)``, so that an export ``since`` a time starts without
  scanning the log before it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_objects_id_pattern", "objects", ["id"], postgresql_ops={"id": "varchar_pattern_ops"}
    )
    op.create_index("ix_audit_at", "audit_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_audit_at", table_name="audit_events")
    op.drop_index("ix_objects_id_pattern", table_name="objects")

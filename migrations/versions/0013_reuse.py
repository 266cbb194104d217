"""Reuse of identical answers (issue 24, item 3): lookups by the canonical query's hash.

- ``ix_queries_reuse``: ``queries (object_id, fingerprint)`` where a fingerprint is stored (single
  submits; the fingerprint is the hash of the query's canonical JSON,
  :func:`app.services.reuse.query_hash`), so a ``"reuse": true`` submit finds an identical
  answer of the object with one index probe.
- ``surveys.query_hash`` (the same hash of the survey's query) with ``ix_surveys_query_hash``,
  ``surveys.reuse`` (whether the survey reuses) and ``surveys.reused`` (members answered by
  reuse). Existing surveys get their hash computed from their stored query here; none reused.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

from app.services.reuse import query_hash

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_SURVEYS = sa.text("SELECT id, query FROM surveys ORDER BY id")
_SET = sa.text("UPDATE surveys SET query_hash = :hash WHERE id = :id")


def upgrade() -> None:
    op.create_index(
        "ix_queries_reuse",
        "queries",
        ["object_id", "fingerprint"],
        postgresql_where=sa.text("fingerprint IS NOT NULL"),
        sqlite_where=sa.text("fingerprint IS NOT NULL"),
    )
    with op.batch_alter_table("surveys") as batch:
        batch.add_column(sa.Column("query_hash", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("reuse", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("reused", sa.Integer(), nullable=False, server_default="0"))
    conn = op.get_bind()
    for survey_id, text in conn.execute(_SURVEYS).all():
        conn.execute(_SET, {"hash": query_hash(json.loads(text)), "id": survey_id})
    op.create_index("ix_surveys_query_hash", "surveys", ["query_hash"])


def downgrade() -> None:
    op.drop_index("ix_surveys_query_hash", table_name="surveys")
    with op.batch_alter_table("surveys") as batch:
        batch.drop_column("reused")
        batch.drop_column("reuse")
        batch.drop_column("query_hash")
    op.drop_index("ix_queries_reuse", table_name="queries")

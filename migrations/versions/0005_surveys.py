"""Population surveys (issue #13): labels, shared likelihood states, history hashes, surveys.

* ``objects.labels`` (JSON): public metadata that selects cohorts.
* ``likelihood_states``: a finite ``log P`` array is stored once per (domain, history) and shared
  by every object with that history, with a count of the objects that use it (a state nobody
  uses is deleted); ``objects.state``/``state_err`` move there and ``objects.state_hash`` names
  them. A million objects with ten distinct histories store ten arrays, not a million.
* ``objects.history_hash``: a hash chain of the accepted history, computed here for existing rows
  by replaying their queries in sequence order.
* ``queries.survey_id``; ``fingerprint`` and ``response`` become nullable (a survey's rows have
  neither: they are replayed through the survey, never by key); the unique index on
  ``(object_id, idempotency_key)`` becomes partial (keyed rows only) and the unused index on
  ``(object_id, created_at)`` goes: a survey writes a history row per member.
* ``surveys`` and ``survey_members``; ``idempotent_requests`` (stored answers of bulk imports).
* ``domains``: each distinct domain text once, by its hash; ``objects.domain`` becomes
  ``objects.domain_hash``.
* PostgreSQL: ``objects`` and ``survey_members`` get ``fillfactor = 50``, room in each page for the
  new row versions a survey writes (HOT updates; pages written from now on — an existing table
  is repacked by ``VACUUM FULL``, which an operator can run when convenient).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from app.services.snapshots import next_history_hash, state_key
from app.store.domains import domain_hash

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "likelihood_states",
        sa.Column("hash", sa.String(32), primary_key=True),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("err", sa.Float(), nullable=False),
        sa.Column("refs", sa.Integer(), nullable=False),
    )
    with op.batch_alter_table("objects") as batch:
        batch.add_column(sa.Column("labels", sa.JSON()))
        batch.add_column(sa.Column("state_hash", sa.String(32)))
        batch.add_column(sa.Column("history_hash", sa.String(32)))
    _hash_histories()
    _move_states()
    op.create_table(
        "domains",
        sa.Column("hash", sa.String(32), primary_key=True),
        sa.Column("text", sa.Text(), nullable=False),
    )
    with op.batch_alter_table("objects") as batch:
        batch.add_column(sa.Column("domain_hash", sa.String(32)))
    _store_domains()
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("state")
        batch.drop_column("state_err")
        batch.drop_column("domain")
        batch.alter_column("domain_hash", existing_type=sa.String(32), nullable=False)
        batch.create_foreign_key("fk_objects_domain_hash", "domains", ["domain_hash"], ["hash"])
    # unused (history is read by (object_id, seq)); a survey adds a row per member
    op.drop_index("ix_queries_object_created", table_name="queries")
    with op.batch_alter_table("queries") as batch:
        batch.alter_column("fingerprint", existing_type=sa.String(64), nullable=True)
        batch.alter_column("response", existing_type=sa.Text(), nullable=True)
        batch.add_column(sa.Column("survey_id", sa.Integer()))
        batch.drop_constraint("uq_queries_object_idempotency", type_="unique")
    # partial: rows without a key (a survey's) take no entry in it
    op.create_index(
        "uq_queries_object_idempotency",
        "queries",
        ["object_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "surveys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("query", sa.Text(), nullable=False),
        sa.Column("cohort", sa.Text(), nullable=False),
        sa.Column("analyst_key_id", sa.Integer(), sa.ForeignKey("api_keys.id")),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("decided", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("refused", sa.Text(), nullable=False),
        sa.Column("tally", sa.Text(), nullable=False),
        sa.Column("groups", sa.Integer(), nullable=False),
        sa.Column("domain", sa.Text()),
        sa.Column("error", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("lease_owner", sa.String(64)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("analyst_key_id", "idempotency_key", name="uq_surveys_idempotency"),
    )
    op.create_table(
        "survey_members",
        sa.Column("survey_id", sa.Integer(), sa.ForeignKey("surveys.id"), primary_key=True),
        sa.Column("object_id", sa.String(128), primary_key=True),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("reason", sa.String(32)),
        sa.Column("output", sa.Text()),
    )
    op.create_table(
        "idempotent_requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(32), nullable=False),
        sa.Column("owner_key_id", sa.Integer()),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "scope", "owner_key_id", "idempotency_key", name="uq_idempotent_requests"
        ),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE objects SET (fillfactor = 50)")
        op.execute("ALTER TABLE survey_members SET (fillfactor = 50)")


def _store_domains() -> None:
    """Each distinct ``objects.domain`` into ``domains``, and its hash into the objects."""
    conn = op.get_bind()
    for (text,) in conn.execute(sa.text("SELECT DISTINCT domain FROM objects")).all():
        digest = domain_hash(text)
        conn.execute(
            sa.text("INSERT INTO domains (hash, text) VALUES (:h, :t)"), {"h": digest, "t": text}
        )
        conn.execute(
            sa.text("UPDATE objects SET domain_hash = :h WHERE domain = :t"),
            {"h": digest, "t": text},
        )


def _move_states() -> None:
    """Each stored array into ``likelihood_states`` (once per domain and history)."""
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, domain, history_hash, state, state_err FROM objects "
            "WHERE state IS NOT NULL AND history_hash IS NOT NULL"
        )
    )
    refs: dict[str, int] = {}
    for object_id, domain, history, state, err in rows.all():
        digest = state_key(domain, history)
        if digest not in refs:
            conn.execute(
                sa.text(
                    "INSERT INTO likelihood_states (hash, state, err, refs) VALUES (:h, :s, :e, 0)"
                ),
                {"h": digest, "s": bytes(state), "e": float(err or 0.0)},
            )
        refs[digest] = refs.get(digest, 0) + 1
        conn.execute(
            sa.text("UPDATE objects SET state_hash = :h WHERE id = :id"),
            {"h": digest, "id": object_id},
        )
    for digest, count in refs.items():
        conn.execute(
            sa.text("UPDATE likelihood_states SET refs = :n WHERE hash = :h"),
            {"n": count, "h": digest},
        )


def _hash_histories() -> None:
    """The hash chain of every object's stored history, replayed in sequence order."""
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT object_id, query, output FROM queries ORDER BY object_id, seq")
    )
    chains: dict[str, str] = {}
    for object_id, query, output in rows.all():
        chains[object_id] = next_history_hash(chains.get(object_id), query, output)
    for object_id, digest in chains.items():
        conn.execute(
            sa.text("UPDATE objects SET history_hash = :h WHERE id = :id"),
            {"h": digest, "id": object_id},
        )


def downgrade() -> None:
    op.drop_table("idempotent_requests")
    op.drop_table("survey_members")
    op.drop_table("surveys")
    op.drop_index("uq_queries_object_idempotency", table_name="queries")
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("survey_id")
        batch.create_unique_constraint(
            "uq_queries_object_idempotency", ["object_id", "idempotency_key"]
        )
    op.create_index("ix_queries_object_created", "queries", ["object_id", "created_at"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE objects RESET (fillfactor)")
    with op.batch_alter_table("objects") as batch:
        batch.add_column(sa.Column("state", sa.LargeBinary()))
        batch.add_column(sa.Column("state_err", sa.Float()))
        batch.add_column(sa.Column("domain", sa.Text()))
    conn = op.get_bind()
    conn.execute(
        sa.text(
            "UPDATE objects SET domain = "
            "(SELECT d.text FROM domains d WHERE d.hash = objects.domain_hash)"
        )
    )
    conn.execute(
        sa.text(
            "UPDATE objects SET state = (SELECT s.state FROM likelihood_states s "
            "WHERE s.hash = objects.state_hash), state_err = COALESCE((SELECT s.err FROM "
            "likelihood_states s WHERE s.hash = objects.state_hash), 0)"
        )
    )
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("labels")
        batch.drop_column("state_hash")
        batch.drop_column("history_hash")
        batch.drop_constraint("fk_objects_domain_hash", type_="foreignkey")
        batch.drop_column("domain_hash")
        batch.alter_column("domain", existing_type=sa.Text(), nullable=False)
    op.drop_table("domains")
    op.drop_table("likelihood_states")

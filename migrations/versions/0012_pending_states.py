"""Survey answers folded lazily into finite states (issue 26): ``objects.state_pending``.

An ``olh`` answer makes its member's history unique (a fresh public seed each), so storing the
member's new likelihood array (8 KB at k = 1,000) made every member its own state row. Since
this revision a survey keeps such a member on the state it had and counts the answers the
state does not hold yet in ``objects.state_pending`` (the last ``state_pending`` entries of its
history); the state is that array plus those entries, folded when the object is next decided.
Every object existing before has its whole history in its state: the column starts at 0.

The downgrade stores the full array of every object with pending entries (folded from its
history by the engine's own replay) and moves its reference from the old array to it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

from app.engine.domain import parse_domain
from app.engine.limits import EngineLimits
from app.engine.pipeline import fold_history, history_entry
from app.services.history import object_history
from app.services.snapshots import state_key

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_STORED = EngineLimits(max_attributes=2**31, max_points=2**63, max_values_per_attribute=2**63)

_PENDING = sa.text(
    "SELECT o.id, o.state_hash, o.history_hash, d.text FROM objects o "
    "JOIN domains d ON d.hash = o.domain_hash WHERE o.state_pending > 0 ORDER BY o.id"
)
_FIND = sa.text("SELECT refs FROM likelihood_states WHERE hash = :hash")
_INSERT = sa.text(
    "INSERT INTO likelihood_states (hash, state, err, refs) VALUES (:hash, :state, :err, 1)"
)
_ADD = sa.text("UPDATE likelihood_states SET refs = refs + :n WHERE hash = :hash")
_DROP = sa.text("DELETE FROM likelihood_states WHERE hash = :hash AND refs <= 0")
_SET = sa.text("UPDATE objects SET state_hash = :key WHERE id = :id")


def upgrade() -> None:
    with op.batch_alter_table("objects") as batch:
        batch.add_column(
            sa.Column("state_pending", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    conn = op.get_bind()
    for oid, old_key, history_hash, domain_text in conn.execute(_PENDING).all():
        domain = parse_domain(json.loads(domain_text), limits=_STORED)
        entries = [
            history_entry(domain, json.loads(item.query), json.loads(item.output))
            for item in object_history(conn, oid)
        ]
        state, _ = fold_history(domain, entries)
        key = state_key(domain_text, history_hash)
        if conn.execute(_FIND, {"hash": key}).first() is None:
            data = state.to_bytes()  # type: ignore[union-attr]  # a finite domain
            conn.execute(_INSERT, {"hash": key, "state": data, "err": state.err})  # type: ignore[union-attr]
        else:
            conn.execute(_ADD, {"hash": key, "n": 1})
        if old_key is not None:
            conn.execute(_ADD, {"hash": old_key, "n": -1})
            conn.execute(_DROP, {"hash": old_key})
        conn.execute(_SET, {"key": key, "id": oid})
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("state_pending")

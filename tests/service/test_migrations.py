"""The migrations build exactly the schema the models declare (SQLite and PostgreSQL).

Alembic compares a database migrated from scratch with ``app.db.models``: a column, index or
constraint added to a model without a migration (or the reverse) fails here.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from app import crypto
from app.crypto import ValueCipher, new_key
from app.db.migrate import alembic_config, upgrade
from app.db.models import Base
from app.db.session import make_engine, make_session_factory
from app.engine.domain import parse_domain
from app.engine.likelihood import LikelihoodState
from app.engine.pipeline import fold_history, history_entry
from app.services.domains import domain_hash
from app.services.verify import verify_all

DOMAIN = {"attributes": [{"name": "c", "type": "categorical", "values": ["x", "y", "z"]}]}


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": False})
            differences = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert differences == []


def test_0005_moves_states_and_hashes_histories(tmp_path: Path) -> None:
    """Objects stored before 0005 (array on the row) verify clean after upgrading to head."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0004")
    domain = parse_domain(DOMAIN)
    grr = {"mechanism": "grr", "attribute": "c", "epsilon": 0.5}
    engine = make_engine(url)
    crypto.configure(ValueCipher([new_key().encode()]))
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            for oid, outputs in (("a", ["x", "y"]), ("b", ["x", "y"]), ("c", ["y"]), ("d", [])):
                entries = [history_entry(domain, grr, out) for out in outputs]
                state, basic = fold_history(domain, entries)
                assert isinstance(state, LikelihoodState)
                loss = state.loss(basic)
                conn.execute(
                    text(
                        "INSERT INTO objects (id, domain, value, budget, filter, finite, state, "
                        "state_err, loss_lower, loss_upper, basic_total, accepted, rejected, "
                        "version, created_at, updated_at) VALUES (:id, :domain, :value, 9, "
                        "'bayesian', 1, :state, :err, :lo, :up, :basic, :n, 0, :n, :now, :now)"
                    ),
                    {
                        "id": oid,
                        "domain": json.dumps(domain.to_json()),
                        "value": crypto.active().encrypt(json.dumps({"c": "x"})),
                        "state": state.to_bytes() if outputs else None,
                        "err": state.err,
                        "lo": loss.lower,
                        "up": loss.upper,
                        "basic": str(basic),
                        "n": len(outputs),
                        "now": now,
                    },
                )
                for seq, out in enumerate(outputs, start=1):
                    conn.execute(
                        text(
                            "INSERT INTO queries (object_id, seq, query, output, epsilon, "
                            "epsilon_exact, loss_lower, loss_upper, basic_after, fingerprint, "
                            "response, created_at) VALUES (:id, :seq, :q, :o, 0.5, '1/2', 0, 0, "
                            "0, 'f', '{}', :now)"
                        ),
                        {
                            "id": oid,
                            "seq": seq,
                            "q": json.dumps(grr),
                            "o": json.dumps(out),
                            "now": now,
                        },
                    )
        upgrade(url)
        report = verify_all(make_session_factory(engine))
        assert report.ok, report.problems
        with engine.connect() as conn:
            refs = dict(conn.execute(text("SELECT hash, refs FROM likelihood_states")).all())
            domains = conn.execute(text("SELECT hash, text FROM domains")).all()
            named = set(conn.execute(text("SELECT DISTINCT domain_hash FROM objects")).scalars())
        assert sorted(refs.values()) == [1, 2]  # a and b share one array; c has its own
        # the three objects' one domain is stored once, under its hash, with its text unchanged
        assert [(h, json.loads(t)) for h, t in domains] == [
            (domain_hash(json.dumps(domain.to_json())), domain.to_json())
        ]
        assert named == {domains[0][0]}
    finally:
        engine.dispose()


def test_0005_downgrades_and_upgrades_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cycle.db'}"
    upgrade(url)
    command.downgrade(alembic_config(url), "0004")
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": False})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_postgres_leaves_room_in_pages_for_a_surveys_updates(postgres_url: str) -> None:
    """``fillfactor = 50``: a survey's new row versions fit in their page (docs/benchmarks.md)."""
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            options = dict(
                conn.execute(
                    text(
                        "SELECT relname, reloptions FROM pg_class "
                        "WHERE relname IN ('objects', 'survey_chunks')"
                    )
                ).all()
            )
    finally:
        engine.dispose()
    # survey_chunks: one update per chunk (pending -> decided), its texts stored out of line
    assert options == {"objects": ["fillfactor=50"], "survey_chunks": None}

"""The migrations build exactly the schema the models declare (SQLite and PostgreSQL).

Alembic compares a database migrated from scratch with ``app.db.models``: a column, index or
constraint added to a model without a migration (or the reverse) fails here.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import DateTime, bindparam, inspect, text

from app import crypto
from app.bootstrap import create_app
from app.crypto import ValueCipher, new_key
from app.db.migrate import alembic_config, upgrade
from app.db.models import Base
from app.db.session import make_engine
from app.engine import pipeline
from app.engine.approx import OutputIndependentFilter
from app.engine.domain import parse_domain
from app.engine.likelihood import LikelihoodState
from app.engine.pipeline import fold_history, history_entry
from app.services import objects as object_service
from app.services.history import object_history
from app.services.verify import verify_all
from app.store.domains import domain_hash
from tests.service.conftest import ADMIN_KEY, auth, make_settings
from tests.service.conftest import new_key as new_api_key

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
        report = verify_all(engine)
        assert report.ok, report.problems
        with engine.connect() as conn:
            users = conn.execute(
                text(
                    "SELECT count(*) FROM likelihood_states s JOIN objects o "
                    "ON o.state_hash = s.hash GROUP BY s.hash"
                )
            ).scalars()
            domains = conn.execute(text("SELECT hash, text FROM domains")).all()
            named = set(conn.execute(text("SELECT DISTINCT domain_hash FROM objects")).scalars())
        assert sorted(users) == [1, 2]  # a and b share one array; c has its own
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


# ---------------------------------------------------------------- 0007: packed survey answers
T1 = datetime(2026, 11, 20, 10, 0, 0, 123456, tzinfo=UTC)
T2 = datetime(2026, 11, 21, 11, 30, 0, tzinfo=UTC)
Q1 = json.dumps({"mechanism": "grr", "attribute": "c", "epsilon": 0.5})
Q2 = json.dumps({"mechanism": "grr", "attribute": "c", "epsilon": 0.25})
#: (object, seq, query, output, loss_lower, loss_upper, basic_after, survey, created_at): the
#: single submits (survey None) interleave with the answers of surveys 1 and 2
HISTORY: list[tuple[Any, ...]] = [
    ("a", 1, Q1, '"x"', 0.1, 0.5, 0.5, None, T1),
    ("a", 2, Q1, '"x"', 0.2, 1.0, 1.0, 1, T1),
    ("a", 3, Q1, '"y"', 0.3, 1.5, 1.5, None, T1),
    ("a", 4, Q2, '"z"', 0.35, 1.75, 1.75, 2, T2),
    ("b", 1, Q2, '"z"', 0.05, 0.25, 0.25, 2, T2),
    ("b", 2, Q1, '"y"', 0.2, 0.75, 0.75, 1, T1),
    ("c", 1, Q1, '"x"', 0.2, 1.0, 1.0, 1, T1),
]
#: survey -> [(object, status, reason)]: accepted (1), refused (2) and pending (0) members
MEMBERS: dict[int, list[tuple[str, int, str | None]]] = {
    1: [
        ("e", 2, "retired"),
        ("a", 1, None),
        ("h", 2, "invalid-for-domain"),
        ("f", 0, None),
        ("b", 1, None),
        ("g", 0, None),
        ("d", 2, "budget-exhausted"),
        ("c", 1, None),
    ],
    2: [("b", 1, None), ("c", 0, None), ("a", 1, None)],
}


def _variant(query: str, output: str, lower: float, upper: float, basic: float) -> dict[str, Any]:
    eps, exact = (0.5, "1/2") if query == Q1 else (0.25, "1/4")
    return {
        "query": query,
        "output": output,
        "epsilon": eps,
        "epsilon_exact": exact,
        "loss_lower": lower,
        "loss_upper": upper,
        "basic_after": basic,
    }


def _store_surveys_of_0006(url: str, history: list[tuple[Any, ...]]) -> None:
    """Objects a..h with ``history``, surveys 1 and 2 with :data:`MEMBERS`, as 0006 stored them."""
    engine = make_engine(url)
    stamp = bindparam("t", type_=DateTime(timezone=True))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, key_hash, prefix, role, created_at) "
                    "VALUES (7, 'h', 'p', 'analyst', :t)"
                ).bindparams(stamp),
                {"t": T1},
            )
            conn.execute(text("INSERT INTO domains (hash, text) VALUES ('d', '{}')"))
            accepted = {oid: seq for oid, seq, *_ in history}
            conn.execute(
                text(
                    "INSERT INTO objects (id, domain_hash, value, budget, filter, finite, "
                    "loss_lower, loss_upper, basic_total, accepted, rejected, version, "
                    "created_at, updated_at) VALUES (:id, 'd', 'v', 9, 'bayesian', true, 0, 0, "
                    "'0', :n, 0, :n, :t, :t)"
                ).bindparams(stamp),
                [{"id": oid, "n": accepted.get(oid, 0), "t": T1} for oid in "abcdefgh"],
            )
            for survey_id, query in ((1, Q1), (2, Q2)):
                statuses = [status for _, status, _ in MEMBERS[survey_id]]
                conn.execute(
                    text(
                        "INSERT INTO surveys (id, name, query, cohort, analyst_key_id, "
                        "fingerprint, status, total, decided, accepted, refused, tally, groups, "
                        "created_at) VALUES (:id, 'n', :q, '{}', 7, 'f', 'running', :total, "
                        ":decided, :accepted, '{}', '{}', 0, :t)"
                    ).bindparams(stamp),
                    {
                        "id": survey_id,
                        "q": query,
                        "t": T1,
                        "total": len(statuses),
                        "decided": sum(1 for status in statuses if status != 0),
                        "accepted": statuses.count(1),
                    },
                )
            outputs = {(row[0], row[7]): row[3] for row in history if row[7] is not None}
            conn.execute(
                text(
                    "INSERT INTO survey_members (survey_id, object_id, status, reason, output) "
                    "VALUES (:s, :o, :st, :r, :out)"
                ),
                [
                    {"s": s, "o": o, "st": st, "r": r, "out": outputs.get((o, s))}
                    for s, members in MEMBERS.items()
                    for o, st, r in members
                ],
            )
            for oid, seq, query, output, lower, upper, basic, survey, created in history:
                eps, exact = (0.5, "1/2") if query == Q1 else (0.25, "1/4")
                single = survey is None
                conn.execute(
                    text(
                        "INSERT INTO queries (object_id, seq, query, output, epsilon, "
                        "epsilon_exact, loss_lower, loss_upper, basic_after, analyst_key_id, "
                        "idempotency_key, fingerprint, response, survey_id, created_at) VALUES "
                        "(:o, :seq, :q, :out, :eps, :exact, :lo, :up, :basic, 7, :key, :fp, "
                        ":resp, :s, :t)"
                    ).bindparams(stamp),
                    {
                        "o": oid,
                        "seq": seq,
                        "q": query,
                        "out": output,
                        "eps": eps,
                        "exact": exact,
                        "lo": lower,
                        "up": upper,
                        "basic": basic,
                        "key": f"k{seq}" if single else None,
                        "fp": "f" if single else None,
                        "resp": "{}" if single else None,
                        "s": survey,
                        "t": created,
                    },
                )
    finally:
        engine.dispose()


def _old_rows(url: str) -> tuple[list[Any], list[Any]]:
    """The ``survey_members`` rows and the ``queries`` rows (without ids), in key order."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            members = conn.execute(
                text(
                    "SELECT survey_id, object_id, status, reason, output FROM survey_members "
                    "ORDER BY survey_id, object_id"
                )
            ).all()
            queries = conn.execute(
                text(
                    "SELECT object_id, seq, query, output, epsilon, epsilon_exact, loss_lower, "
                    "loss_upper, basic_after, analyst_key_id, idempotency_key, fingerprint, "
                    "response, survey_id, created_at FROM queries ORDER BY object_id, seq"
                ).columns(created_at=DateTime(timezone=True))
            ).all()
    finally:
        engine.dispose()
    utc = [(*row[:-1], _as_utc(row[-1])) for row in queries]
    return [tuple(row) for row in members], utc


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _chunks(url: str) -> list[dict[str, Any]]:
    """The ``survey_chunks`` rows, JSON decoded, ``decided_at`` in UTC."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT survey_id, chunk, size, first_id, last_id, members, decided_at, "
                    "picks, seqs, variants FROM survey_chunks ORDER BY survey_id, chunk"
                ).columns(decided_at=DateTime(timezone=True))
            ).all()
    finally:
        engine.dispose()
    chunks = []
    for row in rows:
        chunk = dict(row._mapping)
        if chunk["decided_at"] is not None:
            chunk["decided_at"] = _as_utc(chunk["decided_at"])
        for column in ("picks", "seqs", "variants"):
            if chunk[column] is not None:
                chunk[column] = json.loads(chunk[column])
        chunks.append(chunk)
    return chunks


@pytest.fixture
def empty_postgres_url(postgres_url: str) -> Iterator[str]:
    """An empty PostgreSQL database on the server of ``postgres_url``, dropped afterwards."""
    import psycopg

    name = "gk_migration_" + secrets.token_hex(6)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


def _tables_and_history(url: str) -> tuple[set[str], list[Any], list[Any]]:
    """The tables, ``(object, seq, survey)`` of the ``queries`` rows, and — once migrated —
    ``(object, seq, survey, output)`` of every object's history as the service reads it
    (single submits and survey answers, :mod:`app.services.history`)."""
    engine = make_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT object_id, seq, survey_id FROM queries ORDER BY object_id, seq")
            ).all()
            read = []
            if "survey_chunks" in tables:
                for oid in "abcdefgh":
                    read.extend(
                        (oid, h.seq, h.survey_id, h.output) for h in object_history(conn, oid)
                    )
    finally:
        engine.dispose()
    return tables, [tuple(r) for r in rows], read


#: HISTORY as :func:`_tables_and_history` reads it back after the upgrade.
READ_BACK = [(oid, seq, survey, output) for oid, seq, _, output, *_, survey, _ in HISTORY]


def _fillfactor(url: str, table: str) -> Any:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT reloptions FROM pg_class WHERE relname = :t"), {"t": table}
            ).scalar_one_or_none()
    finally:
        engine.dispose()


def test_0007_packs_survey_answers_per_chunk_and_downgrades(empty_url: str) -> None:
    """0006's members and history rows become chunks (each object's history unchanged as the
    service reads it), and come back."""
    url = empty_url
    command.upgrade(alembic_config(url), "0006")
    _store_surveys_of_0006(url, HISTORY)
    members_before, queries_before = _old_rows(url)
    started = datetime.now(UTC)
    command.upgrade(alembic_config(url), "0007")
    ended = datetime.now(UTC)

    chunks = _chunks(url)
    refused_only = chunks[2]["decided_at"]  # no accepted member: decided "now"
    assert started <= refused_only <= ended
    x = _variant(Q1, '"x"', 0.2, 1.0, 1.0)  # a's and c's answer to survey 1: one variant
    assert chunks == [
        {
            "survey_id": 1,
            "chunk": 0,
            "size": 5,
            "first_id": "a",
            "last_id": "e",
            "members": "a\nb\nc\nd\ne",
            "decided_at": T1,
            "picks": [0, 1, 0, -1, -3],
            "seqs": [2, 2, 1, 0, 0],
            "variants": [x, _variant(Q1, '"y"', 0.2, 0.75, 0.75)],
        },
        {
            "survey_id": 1,
            "chunk": 1,
            "size": 2,
            "first_id": "f",
            "last_id": "g",
            "members": "f\ng",
            "decided_at": None,
            "picks": None,
            "seqs": None,
            "variants": None,
        },
        {
            "survey_id": 1,
            "chunk": 2,
            "size": 1,
            "first_id": "h",
            "last_id": "h",
            "members": "h",
            "decided_at": refused_only,
            "picks": [-2],
            "seqs": [0],
            "variants": [],
        },
        {
            "survey_id": 2,
            "chunk": 0,
            "size": 2,
            "first_id": "a",
            "last_id": "b",
            "members": "a\nb",
            "decided_at": T2,
            "picks": [0, 1],  # one output, two loss bounds: two variants
            "seqs": [4, 1],
            "variants": [
                _variant(Q2, '"z"', 0.35, 1.75, 1.75),
                _variant(Q2, '"z"', 0.05, 0.25, 0.25),
            ],
        },
        {
            "survey_id": 2,
            "chunk": 1,
            "size": 1,
            "first_id": "c",
            "last_id": "c",
            "members": "c",
            "decided_at": None,
            "picks": None,
            "seqs": None,
            "variants": None,
        },
    ]
    tables, history, read = _tables_and_history(url)
    assert "survey_members" not in tables
    assert history == [("a", 1, None), ("a", 3, None)]  # the single submits stay
    # b answered survey 2 before survey 1; a's answers interleave with its submits
    assert read == READ_BACK

    command.downgrade(alembic_config(url), "0006")
    tables, _, _ = _tables_and_history(url)
    assert "survey_chunks" not in tables
    assert _old_rows(url) == (members_before, queries_before)
    if url.startswith("postgresql"):
        assert _fillfactor(url, "survey_members") == ["fillfactor=50"]


def test_0007_cuts_chunks_of_the_configured_size(tmp_path: Path) -> None:
    """Smaller chunks: each has its own variants; ``decided_at`` is its latest history row's."""
    url = f"sqlite:///{tmp_path / 'small.db'}"
    command.upgrade(alembic_config(url), "0006")
    later = [(*row[:8], T2) if row[:2] == ("b", 2) else row for row in HISTORY]
    _store_surveys_of_0006(url, later)
    members_before, queries_before = _old_rows(url)
    config = alembic_config(url)
    config.attributes["survey_chunk_size"] = 2
    command.upgrade(config, "0007")

    chunks = _chunks(url)
    x = _variant(Q1, '"x"', 0.2, 1.0, 1.0)
    summary = [
        (c["survey_id"], c["chunk"], c["members"], c["picks"], c["seqs"], c["variants"])
        for c in chunks
    ]
    assert summary == [
        (1, 0, "a\nb", [0, 1], [2, 2], [x, _variant(Q1, '"y"', 0.2, 0.75, 0.75)]),
        (1, 1, "c\nd", [0, -1], [1, 0], [x]),
        (1, 2, "e", [-3], [0], []),
        (1, 3, "f\ng", None, None, None),
        (1, 4, "h", [-2], [0], []),
        (
            2,
            0,
            "a\nb",
            [0, 1],
            [4, 1],
            [
                _variant(Q2, '"z"', 0.35, 1.75, 1.75),
                _variant(Q2, '"z"', 0.05, 0.25, 0.25),
            ],
        ),
        (2, 1, "c", None, None, None),
    ]
    assert [c["decided_at"] for c in chunks][:2] == [T2, T1]  # the later of a's and b's rows
    assert [(c["first_id"], c["last_id"], c["size"]) for c in chunks][:2] == [
        ("a", "b", 2),
        ("c", "d", 2),
    ]
    assert _tables_and_history(url)[2] == READ_BACK

    command.downgrade(alembic_config(url), "0006")
    members_after, queries_after = _old_rows(url)
    assert members_after == members_before
    # a's answer to survey 1 now carries its chunk's time (b's, the later)
    expected = [(*row[:-1], T2) if row[:2] == ("a", 2) else row for row in queries_before]
    assert queries_after == expected


def test_0007_refuses_an_accepted_member_without_history(tmp_path: Path) -> None:
    """A member marked accepted whose history row is missing stops the migration before it
    changes anything (SQLite's DDL is not rolled back)."""
    url = f"sqlite:///{tmp_path / 'broken.db'}"
    command.upgrade(alembic_config(url), "0006")
    _store_surveys_of_0006(url, [row for row in HISTORY if row[:2] != ("c", 1)])
    with pytest.raises(RuntimeError, match="member 'c' is accepted but has no history row"):
        command.upgrade(alembic_config(url), "0007")
    tables, _, _ = _tables_and_history(url)
    assert "survey_chunks" not in tables
    assert "survey_members" in tables


def _bits_query(j: int) -> dict[str, Any]:
    """Bit ``j`` of ``x`` in ``0 .. 2047`` by binary RR of ε₀ = 0.1 (issue 22's reproduction)."""
    members = [v for v in range(2048) if v >> j & 1]
    pred = {"attribute": "x", "op": "in", "value": members}
    return {"mechanism": "binary_rr", "epsilon": 0.1, "predicate": pred}


def test_0008_recomputes_f0_accounts_and_moves_objects_past_the_new_count(
    empty_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accounts written by the pairwise F₀ are recomputed over all ordered pairs.

    The objects are written by the service running the pairwise rule (``f0_filter`` patched to
    one pair, which is exactly the rule of 0006): ``bits`` took the 11 bit queries of issue 22
    in its output-independent phase (realized loss 1.1 > 1.0); ``binary`` took 3 queries of 0.1.
    After 0008, ``bits`` is past the new F₀ count (6) and in the Bayesian phase, which refuses
    everything while the loss is above ε_g; ``binary`` stays F₀'s; a continuous object (no F₀
    any more) has account 0 and the Bayesian phase. The downgrade restores the pairwise accounts.
    """
    url = empty_url
    upgrade(url)
    pairwise = OutputIndependentFilter
    budget = {"epsilon": 1.0, "delta": 0.05}
    bits = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 2047}]}
    binary = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
    real = {"attributes": [{"name": "r", "type": "real", "low": 0, "high": 1}]}
    rr_b = {
        "mechanism": "binary_rr",
        "epsilon": 0.1,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }
    linear = {
        "mechanism": "linear",
        "weights": {"r": 0.5},
        "intercept": 0.0,
        "range": [-0.5, 0.5],
        "epsilon": 0.1,
    }

    def objects(client: TestClient, specs: list[tuple[str, Any, Any, str, list[Any]]]) -> None:
        analyst = new_api_key(client, "analyst")
        for oid, domain, value, filter_name, queries in specs:
            body = {"id": oid, "domain": domain, "value": value, "filter": filter_name}
            body["budget"] = budget if filter_name == "approx_bayesian" else {"epsilon": 1.0}
            r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
            assert r.status_code == 201, r.text
            for query in queries:
                r = client.post(
                    f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": query}
                )
                assert r.status_code == 201, r.text

    with monkeypatch.context() as patch:
        # the old rule everywhere F₀ is built: the pipeline and the odometer's phase (which
        # binds the name at import: patched here, not captured, however the tests are ordered)
        old_rule = lambda eps, delta, domain: pairwise(eps, delta, 1)  # noqa: E731
        patch.setattr(pipeline, "f0_filter", old_rule)
        patch.setattr(object_service, "f0_filter", old_rule)
        with TestClient(create_app(make_settings(url))) as client:
            objects(
                client,
                [
                    (
                        "bits",
                        bits,
                        {"x": 1234},
                        "approx_bayesian",
                        [_bits_query(j) for j in range(11)],
                    ),
                    ("binary", binary, {"b": 1}, "approx_bayesian", [rr_b] * 3),
                    ("real", real, {"r": 0.25}, "bayesian", [linear] * 2),
                ],
            )
    engine = make_engine(url)
    old_charge = pairwise(1.0, 0.05, 1).charge(Fraction(1, 10))
    select_accounts = text("SELECT id, f0_account FROM objects ORDER BY id")
    try:
        with engine.begin() as conn:  # a continuous approx_bayesian object of before 0008
            exact = conn.execute(text("SELECT epsilon_exact FROM queries WHERE object_id = 'real'"))
            real_account = sum(pairwise(1.0, 0.05, 1).charge(Fraction(e)) for (e,) in exact)
            conn.execute(
                text(
                    "UPDATE objects SET filter = 'approx_bayesian', budget_delta = 0.05, "
                    "f0_account = :a WHERE id = 'real'"
                ),
                {"a": str(real_account)},
            )
            before: dict[str, str] = dict(conn.execute(select_accounts).all())
        assert before == {
            "binary": str(3 * old_charge),
            "bits": str(11 * old_charge),
            "real": str(real_account),
        }
        command.downgrade(alembic_config(url), "0007")
        with engine.connect() as conn:
            assert dict(conn.execute(select_accounts).all()) == before
        command.upgrade(alembic_config(url), "head")  # 0008, and the later revisions the app needs
        with engine.connect() as conn:
            after: dict[str, str] = dict(conn.execute(select_accounts).all())
        command.upgrade(alembic_config(url), "head")  # the app below reads later revisions
    finally:
        engine.dispose()
    new_bits = OutputIndependentFilter.for_points(1.0, 0.05, 2048)
    new_binary = OutputIndependentFilter.for_points(1.0, 0.05, 2)
    assert after == {
        "binary": str(3 * new_binary.charge(Fraction(1, 10))),
        "bits": str(11 * new_bits.charge(Fraction(1, 10))),
        "real": "0",
    }
    with TestClient(create_app(make_settings(url))) as client:
        analyst = new_api_key(client, "analyst")
        phases = {}
        for oid in ("binary", "bits", "real"):
            odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
            phases[oid] = odometer["phase"]
        assert phases == {"binary": "output-independent", "bits": "bayesian", "real": "bayesian"}
        # the Bayesian phase refuses while the loss (1.1) is above ε_g, even a tiny query
        tiny = {**_bits_query(0), "epsilon": 0.001}
        r = client.post("/v1/objects/bits/queries", headers=auth(analyst), json={"query": tiny})
        assert r.status_code == 409, r.text
        assert "already exceeds" in r.text
        r = client.post("/v1/objects/binary/queries", headers=auth(analyst), json={"query": rr_b})
        assert r.status_code == 201, r.text
        assert r.json()["odometer"]["phase"] == "output-independent"
    report = verify_all(make_engine(url))
    assert report.ok, report.problems


def test_0012_downgrade_stores_the_arrays_of_pending_survey_answers(empty_url: str) -> None:
    """Members an ``olh`` survey left pending get their whole history's array on downgrade.

    Each array is folded from the history by the engine's replay and the reference moves to
    it from the array the member named; after upgrading again ``verify`` is clean.
    """
    url = empty_url
    domain = {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": 19}]}
    grr = {"mechanism": "grr", "attribute": "v", "epsilon": 0.5}
    olh = {"mechanism": "olh", "attribute": "v", "epsilon": 1.0}
    upgrade(url)
    with TestClient(create_app(make_settings(url, survey_chunk_size=2))) as client:
        analyst = auth(new_api_key(client, "analyst"))
        body = {
            "objects": [
                {"id": f"m{i}", "domain": domain, "value": {"v": i}, "budget": {"epsilon": 5},
                 "labels": {"study": "s"}}
                for i in range(5)
            ]
        }  # fmt: skip
        assert client.post("/v1/imports", headers=auth(ADMIN_KEY), json=body).status_code == 200
        r = client.post("/v1/objects/m0/queries", headers=analyst, json={"query": grr})
        assert r.status_code == 201, r.text
        survey = {"name": "o", "query": olh, "cohort": {"labels": {"study": "s"}}}
        sid = client.post("/v1/surveys", headers=analyst, json=survey).json()["id"]
        for _ in range(600):
            if client.get(f"/v1/surveys/{sid}", headers=analyst).json()["status"] == "done":
                break
            time.sleep(0.05)
    engine = make_engine(url)
    select_rows = text("SELECT id, state_hash, state_pending FROM objects ORDER BY id")
    try:
        with engine.connect() as conn:
            rows = conn.execute(select_rows).all()
        assert [r[2] for r in rows] == [1] * 5
        assert [r[1] is None for r in rows] == [False] + [True] * 4  # m0 names its grr array
        command.downgrade(alembic_config(url), "0012-1")
        with engine.connect() as conn:
            hashes = [r[0] for r in conn.execute(text("SELECT state_hash FROM objects"))]
            refs = dict(conn.execute(text("SELECT hash, refs FROM likelihood_states")).all())
        assert None not in hashes
        assert refs == dict.fromkeys(hashes, 1)  # m0's grr array is gone: nobody names it
        upgrade(url)
        assert verify_all(engine).ok
    finally:
        engine.dispose()


def test_0017_drops_the_counts_and_downgrade_counts_again(empty_url: str) -> None:
    """States lose ``refs`` on upgrade; downgrade counts each one's objects and drops garbage.

    Three objects answer one, one and two queries (exact arrays: objects with the same outputs
    share one); the arrays they moved on from may be left unnamed, and one more unnamed row is
    added by hand: downgrade keeps exactly the named arrays, with their objects' counts.
    """
    url = empty_url
    upgrade(url)
    with TestClient(create_app(make_settings(url))) as client:
        analyst = auth(new_api_key(client, "analyst"))
        body = {
            "objects": [
                {"id": f"r{i}", "domain": DOMAIN, "value": {"c": "x"}, "budget": {"epsilon": 9}}
                for i in range(3)
            ]
        }
        assert client.post("/v1/imports", headers=auth(ADMIN_KEY), json=body).status_code == 200
        query = {"mechanism": "grr", "attribute": "c", "epsilon": 0.5}
        for oid in ("r0", "r1", "r2", "r2"):
            r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": query})
            assert r.status_code == 201, r.text
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO likelihood_states (hash, state, err) VALUES ('junk', :s, 0)"),
                {"s": b"\x00" * 8},
            )
            named = conn.execute(
                text("SELECT state_hash, count(*) FROM objects GROUP BY state_hash")
            ).all()
        users = {key: n for key, n in named if key is not None}
        assert sum(users.values()) == 3
        command.downgrade(alembic_config(url), "0016")
        with engine.connect() as conn:
            refs = dict(conn.execute(text("SELECT hash, refs FROM likelihood_states")).all())
        assert refs == users  # the named arrays, each with its objects' count; no garbage
        with engine.begin() as conn:  # a row at zero (a 0016 writer would have deleted it)
            conn.execute(
                text(
                    "INSERT INTO likelihood_states (hash, state, err, refs) VALUES ('z', :s, 0, 0)"
                ),
                {"s": b"\x00" * 8},
            )
        upgrade(url)
        with engine.connect() as conn:
            stored = set(conn.execute(text("SELECT hash FROM likelihood_states")).scalars())
            context = MigrationContext.configure(conn, opts={"compare_type": False})
            assert compare_metadata(context, Base.metadata) == []
        assert stored == set(users)
        report = verify_all(engine)
        assert report.ok, report.problems
        assert report.unnamed_states == 0
    finally:
        engine.dispose()

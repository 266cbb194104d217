"""An accepted submit's writes in one round trip (``app.store.submits``), SQLite and PostgreSQL.

On PostgreSQL the query row, the compare-and-set, the named state and the audit event are one
statement (no pipeline mode unless a ``BEGIN`` goes with it); these tests hold both dialects
to the same outcomes: every likelihood array an object names is stored, and once the
collection ran none is left unnamed; a lost compare-and-set returns None and the rolled-back
transaction leaves nothing; a used
``(object, seq)`` is a :class:`~app.store.Conflict` that leaves the connection usable; a
:func:`~app.store.submitting` block, whose write is a transaction of its own on PostgreSQL,
commits nothing after a lost compare-and-set; and the keyed rejection read with the
object's row is replayed, never a second decision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import DataError

from app.bootstrap import create_app
from app.db.session import make_engine
from app.services import audit
from app.services.snapshots import collect_states
from app.store import Conflict, begin_writes, is_postgres, submitting, transaction
from app.store import objects as objects_store
from app.store.objects import load_for_submit, load_state
from app.store.submits import AcceptedQuery, NewState, record_accepted
from tests.service import factories
from tests.service.conftest import auth, make_settings, new_key
from tests.service.factories import grr_query, integer_domain
from tests.service.formats import record_result_formats


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def _register(client: TestClient, budget: float = 100.0) -> str:
    return factories.register(
        client,
        domain=integer_domain(4),
        value={"x": 1},
        budget=budget,
        filter="bayesian",
        prefix="store",
    )


def _submit(client: TestClient, key: str, oid: str, idem: str, epsilon: float = 0.5) -> Any:
    headers = {**auth(key), "Idempotency-Key": idem}
    return client.post(
        f"/v1/objects/{oid}/queries", headers=headers, json={"query": grr_query(epsilon)}
    )


def _states(engine: Engine) -> tuple[set[str], dict[str, int]]:
    """The stored arrays' keys, and how many objects name each array."""
    with engine.connect() as conn:
        refs = set(conn.execute(text("SELECT hash FROM likelihood_states")).scalars())
        named = dict(
            conn.execute(
                text(
                    "SELECT state_hash, count(*) FROM objects WHERE state_hash IS NOT NULL "
                    "GROUP BY state_hash"
                )
            ).all()
        )
    return refs, named


def _query(oid: str, seq: int) -> AcceptedQuery:
    return AcceptedQuery(
        object_id=oid,
        seq=seq,
        query="{}",
        output="0",
        epsilon=0.5,
        epsilon_exact="1/2",
        loss_lower=0.0,
        loss_upper=0.0,
        basic_after=0.5,
        analyst_key_id=None,
        idempotency_key=None,
        fingerprint="f" * 64,
        response="{}",
        created_at=datetime.now(UTC),
    )


def _event(oid: str, seq: int) -> Any:
    return audit.query_event(
        kind=audit.AuditKind.DECISION_ACCEPTED,
        actor_key_id=None,
        object_id=oid,
        seq=seq,
        detail={"seq": seq},
    )


def test_the_accepted_event_names_the_query_row_it_was_written_with(
    client: TestClient, engine: Engine
) -> None:
    key = new_key(client, "analyst")
    oid = _register(client)
    bodies = [_submit(client, key, oid, f"{oid}-{i}").json() for i in range(3)]
    with engine.connect() as conn:
        events = conn.execute(
            text(
                "SELECT detail FROM audit_events WHERE object_id = :o "
                "AND kind = 'decision.accepted' ORDER BY id"
            ),
            {"o": oid},
        ).scalars()
        details = list(events)
    assert [json.loads(d)["query_id"] for d in details] == [b["query_id"] for b in bodies]
    assert [json.loads(d)["seq"] for d in details] == [1, 2, 3]
    # the text is what the audit log writes for any other event: sorted keys, json.dumps
    assert details == [json.dumps(json.loads(d), sort_keys=True) for d in details]


def test_submits_keep_every_named_array_and_the_collection_deletes_the_rest(
    client: TestClient, engine: Engine
) -> None:
    key = new_key(client, "analyst")
    ids = [_register(client) for _ in range(3)]
    for round_ in range(4):
        for oid in ids:
            r = _submit(client, key, oid, f"{oid}-{round_}")
            assert r.status_code == 201, r.text
    stored, named = _states(engine)
    assert set(named) <= stored  # every array an object names is there
    # the arrays of the objects' first three answers (at least one each: every current array
    # holds four) are unnamed until the collection deletes them
    assert len(stored - set(named)) >= 3
    assert collect_states(engine) == len(stored - set(named))
    stored, named = _states(engine)
    assert stored == set(named)
    with engine.connect() as conn:
        for oid in ids:
            row = load_state(conn, object_id=oid)
            assert row is not None
            assert row.accepted == 4
            assert row.state is not None  # the array it names is there


def test_a_lost_compare_and_set_returns_none_and_leaves_nothing(
    client: TestClient, engine: Engine
) -> None:
    key = new_key(client, "analyst")
    oid = _register(client)
    assert _submit(client, key, oid, f"{oid}-1").status_code == 201
    stored_before, _ = _states(engine)
    with transaction(engine) as conn:
        row = load_state(conn, object_id=oid)
        assert row is not None
    found: list[int | None] = []

    def lose() -> None:
        with transaction(engine) as conn:
            found.append(
                record_accepted(
                    conn,
                    query=_query(oid, row.accepted + 1),
                    version=row.version - 1,  # stale: another writer "won"
                    columns={"accepted": row.accepted + 1, "updated_at": datetime.now(UTC)},
                    new_state=NewState("lost-" + oid[-20:], b"\x00" * 8, 0.0),
                    event=_event(oid, row.accepted + 1),
                )
            )
            raise RuntimeError("roll back, as the service does on a lost race")

    with pytest.raises(RuntimeError):
        lose()
    assert found == [None]
    with engine.connect() as conn:
        after = load_state(conn, object_id=oid)
        count = conn.execute(
            text("SELECT count(*) FROM queries WHERE object_id = :o"), {"o": oid}
        ).scalar_one()
    assert after == row
    assert count == 1
    assert _states(engine)[0] == stored_before


def test_a_used_seq_is_a_conflict_and_the_connection_stays_usable(
    client: TestClient, engine: Engine
) -> None:
    key = new_key(client, "analyst")
    oid = _register(client)
    assert _submit(client, key, oid, f"{oid}-1").status_code == 201
    with engine.connect() as conn:
        row = load_state(conn, object_id=oid)
        assert row is not None
    with pytest.raises(Conflict), transaction(engine) as conn:
        record_accepted(
            conn,
            query=_query(oid, row.accepted),  # already stored
            version=row.version,
            columns={"accepted": row.accepted, "updated_at": datetime.now(UTC)},
            new_state=None,
            event=_event(oid, row.accepted),
        )
    # the pool's connections still work, and the submit path still accepts
    assert _submit(client, key, oid, f"{oid}-2").status_code == 201
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


@pytest.mark.parametrize("raise_after", [True, False])
def test_a_lost_race_in_one_round_trip_commits_nothing(
    client: TestClient, engine: Engine, raise_after: bool
) -> None:
    """A ``submitting`` block's pipelined BEGIN … COMMIT: the missed compare-and-set aborts it.

    The COMMIT went out with the writes, so the miss itself must stop it: nothing of the
    query row, the state references or the audit event stays, whether the caller then raises
    (as the service does) or, on PostgreSQL, leaves the block normally; the pooled connection
    is usable after.
    """
    if not raise_after and engine.dialect.name != "postgresql":
        pytest.skip("on SQLite the caller must roll back (the service does): no pipeline to abort")
    key = new_key(client, "analyst")
    oid = _register(client)
    assert _submit(client, key, oid, f"{oid}-1").status_code == 201
    stored_before, _ = _states(engine)
    with engine.connect() as conn:
        row = load_state(conn, object_id=oid)
        assert row is not None
    found: list[int | None] = []

    def lose() -> None:
        with submitting(engine) as conn:
            found.append(
                record_accepted(
                    conn,
                    query=_query(oid, row.accepted + 1),
                    version=row.version - 1,  # stale: another writer "won"
                    columns={"accepted": row.accepted + 1, "updated_at": datetime.now(UTC)},
                    new_state=NewState("lost-" + oid[-20:], b"\x00" * 8, 0.0),
                    event=_event(oid, row.accepted + 1),
                    commit=True,
                )
            )
            if raise_after:
                raise RuntimeError("roll back, as the service does on a lost race")

    if raise_after:
        with pytest.raises(RuntimeError):
            lose()
    else:
        lose()
    assert found == [None]
    with engine.connect() as conn:
        after = load_state(conn, object_id=oid)
        count = conn.execute(
            text("SELECT count(*) FROM queries WHERE object_id = :o"), {"o": oid}
        ).scalar_one()
        events = conn.execute(
            text("SELECT count(*) FROM audit_events WHERE object_id = :o AND kind = :k"),
            {"o": oid, "k": "decision.accepted"},
        ).scalar_one()
    assert after == row
    assert (count, events) == (1, 1)
    assert _states(engine)[0] == stored_before
    # the pool's connections are back in transactions of their own, and submits still accept
    with transaction(engine) as conn:
        conn.execute(text("SELECT 1"))
        if engine.dialect.name == "postgresql":
            assert not conn.connection.driver_connection.autocommit
    assert _submit(client, key, oid, f"{oid}-2").status_code == 201


def test_a_submitting_block_commits_what_it_wrote_and_only_on_success(engine: Engine) -> None:
    """Writes after :func:`begin_writes` commit at the block's end, and roll back on an error."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS submit_block_probe (n INTEGER)"))
    try:
        with submitting(engine) as conn:
            conn.execute(text("SELECT count(*) FROM submit_block_probe"))  # a read first
            begin_writes(conn)
            conn.execute(text("INSERT INTO submit_block_probe VALUES (1)"))

        def fail_after_a_write() -> None:
            with submitting(engine) as conn:
                begin_writes(conn)
                conn.execute(text("INSERT INTO submit_block_probe VALUES (2)"))
                raise RuntimeError("the block fails after its write")

        with pytest.raises(RuntimeError):
            fail_after_a_write()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT n FROM submit_block_probe")).scalars().all()
        assert rows == [1]
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE submit_block_probe"))


def test_a_submitting_connection_goes_back_to_the_pool_in_transactions(database_url: str) -> None:
    """After a :func:`submitting` block — committed, failed, or with a failed statement — the
    pool's next user gets SQLAlchemy's transactions again, never the block's autocommit."""
    engine = make_engine(database_url, pool_size=1, max_overflow=0)  # one connection, reused
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS submit_pool_probe (n INTEGER)"))

        def fails(broken_statement: bool) -> None:
            with submitting(engine) as conn:
                begin_writes(conn)
                conn.execute(text("INSERT INTO submit_pool_probe VALUES (9)"))
                if broken_statement:
                    conn.execute(text("SELECT 1/0"))
                raise RuntimeError("the block fails")

        with submitting(engine) as conn:
            conn.execute(text("SELECT 1"))
        for broken in (False, True):
            with pytest.raises((RuntimeError, DataError)):
                fails(broken)
            with engine.connect() as conn:  # the same connection, out of the pool again
                if is_postgres(conn):
                    assert conn.connection.driver_connection.autocommit is False
                conn.execute(text("INSERT INTO submit_pool_probe VALUES (1)"))
                conn.rollback()  # a transaction: the insert is undone
            with engine.connect() as conn:
                count = conn.execute(text("SELECT count(*) FROM submit_pool_probe")).scalar()
            assert count == 0
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS submit_pool_probe"))
        engine.dispose()


def test_the_keys_stored_answer_comes_with_the_row(client: TestClient, engine: Engine) -> None:
    key = new_key(client, "analyst")
    oid = _register(client, budget=0.6)
    assert _submit(client, key, oid, "first", 0.5).status_code == 201
    rejected = _submit(client, key, oid, "second", 0.5)
    assert rejected.status_code == 409, rejected.text
    with engine.connect() as conn:
        found = load_for_submit(conn, object_id=oid, key="second")
        accepted = load_for_submit(conn, object_id=oid, key="first")  # accepted, not rejected
        no_key = load_for_submit(conn, object_id=oid, key=None)
    assert found is not None
    assert found[1] is not None
    assert found[1].response
    assert found[1].fingerprint
    assert found[1].query_id is None  # a rejection
    assert accepted is not None
    assert accepted[1] is not None  # the accepted query's answer, with its id
    with engine.connect() as conn:
        first_id = conn.execute(
            text("SELECT id FROM queries WHERE object_id = :o AND idempotency_key = 'first'"),
            {"o": oid},
        ).scalar_one()
    assert accepted[1].query_id == first_id
    assert json.loads(accepted[1].response)["seq"] == 1
    assert no_key is not None
    assert no_key[1] is None
    assert found[0] == accepted[0] == no_key[0]
    # the same key again replays the stored rejection and counts nothing
    again = _submit(client, key, oid, "second", 0.5)
    assert again.status_code == 409
    assert again.json() == rejected.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    with engine.connect() as conn:
        counted = conn.execute(
            text("SELECT rejected FROM objects WHERE id = :o"), {"o": oid}
        ).scalar_one()
    assert counted == 1


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(database_url))) as test_client:
        yield test_client


@contextmanager
def _through_sqlalchemy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The loads of :mod:`app.store.objects` through SQLAlchemy (text format), as on SQLite.

    On PostgreSQL they run on psycopg directly, in binary format: this is their reference.
    """
    with monkeypatch.context() as patched:
        patched.setattr(objects_store, "is_postgres", lambda _conn: False)
        yield


def test_the_submit_load_types_its_row_as_sqlalchemy_does(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the loads run on psycopg directly (``app.store.compiled``).

    Their rows must come back as ``Connection.execute`` types them (the same statements through
    SQLAlchemy, :func:`_through_sqlalchemy`): the value as stored (decrypted when revealed),
    datetimes aware, the labels a dict, the likelihood array bytes — for a fresh object, one
    with a history, a labelled one (in and out of a scope) and a retired one; unscoped, scoped
    to no label and scoped to labels.
    """
    key = new_key(client, "analyst")
    fresh = _register(client)
    used = _register(client)
    labelled = factories.unique_id("store")
    body = {
        "id": labelled,
        "domain": integer_domain(4),
        "value": {"x": 2},
        "budget": {"epsilon": 100.0},
        "labels": {"team": "a", "unit": "b"},
        "filter": "bayesian",
    }
    assert client.post("/v1/objects", headers=auth(factories.ADMIN_KEY), json=body).is_success
    for i in range(3):
        r = _submit(client, key, used, f"{used}-{i}")
        assert r.status_code == 201, r.text
    assert _submit(client, key, labelled, f"{labelled}-0").status_code == 201
    retired = _register(client)
    assert client.delete(f"/v1/objects/{retired}", headers=auth(factories.ADMIN_KEY)).is_success
    team = [("team", "a"), ("unit", "b")]
    other = [("team", "a"), ("unit", "c")]
    for oid in (fresh, used, labelled, retired):
        with engine.connect() as conn:
            with _through_sqlalchemy(monkeypatch):
                expected = load_state(conn, object_id=oid)
                expected_in = load_state(conn, object_id=oid, scope=team)
                assert load_state(conn, object_id=oid, scope=other) is None
            got = load_for_submit(conn, object_id=oid, key="none")
            scoped = load_for_submit(conn, object_id=oid, key="none", scope=[])
            state = load_state(conn, object_id=oid)
            in_team = load_for_submit(conn, object_id=oid, key="none", scope=team)
            state_in_team = load_state(conn, object_id=oid, scope=team)
            assert load_state(conn, object_id=oid, scope=other) is None
            assert load_for_submit(conn, object_id=oid, key="none", scope=other) is None
        assert expected is not None
        assert state is not None
        assert got == scoped == (expected, None)
        assert state == expected
        if oid == labelled:
            assert expected_in == expected
            assert in_team == (expected, None)
            assert state_in_team == expected
        else:
            assert expected_in is None
            assert in_team is None
            assert state_in_team is None
        assert json.loads(got[0].value.reveal()) == ({"x": 2} if oid == labelled else {"x": 1})
        for name, value in vars(expected).items():  # the same types, not only equal values
            assert type(getattr(got[0], name)) is type(value), name
            assert type(getattr(state, name)) is type(value), name
    assert got[0].retired_at is not None
    assert got[0].retired_at.tzinfo is not None
    with engine.connect() as conn:
        assert load_for_submit(conn, object_id="store-missing", key=None) is None
        assert load_state(conn, object_id="store-missing") is None
        assert load_state(conn, object_id="store-missing", scope=team) is None


def test_the_loads_read_their_row_in_binary_with_the_same_values(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL every load of an object asks for PostgreSQL's binary format, every column.

    A likelihood array then travels as its bytes (in text, ``bytea`` is twice as many hex
    digits, written by the server and parsed by psycopg: docs/benchmarks.md, "Seventeenth
    session, h/state"). The row, and the keyed answer with it (accepted or rejected), are the
    values and types SQLAlchemy's text-format load gives, unscoped and scoped, and so is the
    dry-run's :func:`load_state`.
    """
    if engine.dialect.name != "postgresql":
        pytest.skip("the binary format is PostgreSQL's (SQLite's load goes through SQLAlchemy)")

    formats: list[tuple[int, ...]] = []

    key = new_key(client, "analyst")
    oid = _register(client, budget=0.7)
    accepted = _submit(client, key, oid, "yes", 0.5)
    assert accepted.status_code == 201, accepted.text
    rejected = _submit(client, key, oid, "no", 0.5)
    assert rejected.status_code == 409, rejected.text
    for idem in ("yes", "no", "none"):
        with engine.connect() as conn:
            with _through_sqlalchemy(monkeypatch):
                expected = load_for_submit(conn, object_id=oid, key=idem)
                expected_state = load_state(conn, object_id=oid)
            with monkeypatch.context() as patched:
                record_result_formats(patched, formats)
                got = load_for_submit(conn, object_id=oid, key=idem)
                scoped = load_for_submit(conn, object_id=oid, key=idem, scope=[])
                state = load_state(conn, object_id=oid)
                state_scoped = load_state(conn, object_id=oid, scope=[])
        assert expected is not None
        assert got is not None
        assert scoped is not None
        assert state is not None
        assert state_scoped is not None
        assert got == scoped == expected
        assert state == state_scoped == expected_state == expected[0]
        assert got[0].state is not None
        assert type(got[0].state) is bytes
        for name, value in vars(expected[0]).items():
            for found in (got[0], scoped[0], state, state_scoped):
                assert type(getattr(found, name)) is type(value), name
        assert (got[1] is None) == (idem == "none")
        if got[1] is not None and expected[1] is not None:
            for name, value in vars(expected[1]).items():
                assert type(getattr(got[1], name)) is type(value), name
    assert len(formats) == 12
    assert all(set(found) == {1} for found in formats), formats  # 1: binary, every column


def test_a_write_failing_after_the_compare_and_set_leaves_nothing(
    client: TestClient, engine: Engine
) -> None:
    """A ``submitting`` block's accepted write is one transaction whichever statement fails.

    On PostgreSQL the pipeline has no ``BEGIN`` or ``COMMIT`` of its own: its statements up to
    the one ``Sync`` are the protocol's implicit transaction. Here the compare-and-set, the
    query row and the audit event succeed and the array's ``INSERT`` after them fails (a hash
    longer than its column): none of them may stay, and the pooled connection stays usable.
    """
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite does not enforce a column's length (and runs no pipeline)")
    key = new_key(client, "analyst")
    oid = _register(client)
    assert _submit(client, key, oid, f"{oid}-1").status_code == 201
    refs_before, _ = _states(engine)
    with engine.connect() as conn:
        row = load_state(conn, object_id=oid)
        assert row is not None
    with pytest.raises(DataError, match="too long"), submitting(engine) as conn:
        record_accepted(
            conn,
            query=_query(oid, row.accepted + 1),
            version=row.version,  # current: the compare-and-set hits
            columns={"accepted": row.accepted + 1, "updated_at": datetime.now(UTC)},
            new_state=NewState("x" * 300, b"\x00" * 8, 0.0),
            event=_event(oid, row.accepted + 1),
            commit=True,
        )
    with engine.connect() as conn:
        after = load_state(conn, object_id=oid)
        count = conn.execute(
            text("SELECT count(*) FROM queries WHERE object_id = :o"), {"o": oid}
        ).scalar_one()
        events = conn.execute(
            text("SELECT count(*) FROM audit_events WHERE object_id = :o AND kind = :k"),
            {"o": oid, "k": "decision.accepted"},
        ).scalar_one()
    assert after == row
    assert (count, events) == (1, 1)
    assert _states(engine)[0] == refs_before
    assert _submit(client, key, oid, f"{oid}-2").status_code == 201


def test_a_keyed_rejection_is_two_statements(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a rejected submit with a fresh key reads the object (with any answer
    stored under the key) and writes its count, its stored answer and its audit event in one
    statement: two statements, no ``BEGIN`` or ``COMMIT`` (before: seven on the cursor — the
    load, two key lookups, ``BEGIN``, three writes — and the connection's ``COMMIT``). What it
    wrote is all there, once; the key's retry replays it."""
    if engine.dialect.name != "postgresql":
        pytest.skip("statements counted on psycopg's cursor")
    import psycopg

    key = new_key(client, "analyst")
    oid = _register(client, budget=0.6)
    assert _submit(client, key, oid, "first", 0.5).status_code == 201
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query)[:60])
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    rejected = _submit(client, key, oid, "second", 0.5)
    monkeypatch.undo()
    assert rejected.status_code == 409, rejected.text
    assert len(sent) == 2, sent
    with engine.connect() as conn:
        found = load_for_submit(conn, object_id=oid, key="second")
        events = conn.execute(
            text("SELECT detail FROM audit_events WHERE object_id = :o AND kind = :k"),
            {"o": oid, "k": "decision.rejected"},
        ).all()
    assert found is not None
    assert found[0].rejected == 1
    assert found[1] is not None
    assert json.loads(found[1].response)["detail"] == rejected.json()["detail"]
    assert len(events) == 1
    assert json.loads(events[0][0])["refusal"] == "budget-exhausted"
    again = _submit(client, key, oid, "second", 0.5)
    assert again.json() == rejected.json()
    assert again.headers.get("Idempotent-Replayed") == "true"


def test_an_accepted_submit_is_one_statement_without_pipeline_mode(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL an accepted submit with a fresh key sends two statements — the load and
    the write — and opens no pipeline: the write is a transaction of its own in autocommit
    (before: the one statement went out in pipeline mode, whose machinery cost more Python than
    it saved). What it wrote is there, and the key's retry replays it."""
    if engine.dialect.name != "postgresql":
        pytest.skip("statements counted on psycopg's cursor")
    import psycopg

    key = new_key(client, "analyst")
    oid = _register(client)
    assert _submit(client, key, oid, "warm", 0.5).status_code == 201
    sent: list[str] = []
    pipelines: list[object] = []
    execute, pipeline = psycopg.Cursor.execute, psycopg.Connection.pipeline

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query)[:60])
        return execute(self, query, *args, **kwargs)

    def opened(self: Any) -> Any:
        pipelines.append(self)
        return pipeline(self)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    monkeypatch.setattr(psycopg.Connection, "pipeline", opened)
    accepted = _submit(client, key, oid, "second", 0.5)
    monkeypatch.undo()
    assert accepted.status_code == 201, accepted.text
    assert (len(sent), pipelines) == (2, []), sent
    with engine.connect() as conn:
        found = load_for_submit(conn, object_id=oid, key="second")
    assert found is not None
    assert found[0].accepted == 2
    assert found[1] is not None
    assert found[1].query_id == accepted.json()["query_id"]
    again = _submit(client, key, oid, "second", 0.5)
    assert again.json() == accepted.json()
    assert again.headers.get("Idempotent-Replayed") == "true"


def test_only_an_accepted_submit_decrypts_the_value(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value is decrypted when the accepted query's output is sampled, once, and never for
    a rejected submit, a replayed one or a dry run (none of which reads it)."""
    from app import crypto

    key = new_key(client, "analyst")
    oid = _register(client, budget=0.6)
    opened: list[str] = []
    decrypt = crypto.ValueCipher.decrypt

    def counted(self: Any, stored: str) -> str:
        opened.append(stored)
        return decrypt(self, stored)

    monkeypatch.setattr(crypto.ValueCipher, "decrypt", counted)
    assert _submit(client, key, oid, "first", 0.5).status_code == 201
    assert len(opened) == 1
    dry = client.post(
        f"/v1/objects/{oid}/dry-run", headers=auth(key), json={"query": grr_query(0.5)}
    )
    assert dry.status_code == 200, dry.text
    assert _submit(client, key, oid, "second", 0.5).status_code == 409
    assert _submit(client, key, oid, "second", 0.5).status_code == 409  # replayed
    assert _submit(client, key, oid, "first", 0.5).status_code == 201  # replayed
    assert len(opened) == 1
    assert "x" not in repr(load_state_of(client, oid).value)


def test_the_next_submit_finds_the_committed_exact_form(client: TestClient) -> None:
    """An accepted submit keeps its new exact form; the object's next decision reads the stored
    array with it (found by the stored bytes, its loss already computed), and answers as a
    fresh parse would: the same realized loss in the odometer as from the row's bounds."""
    from app.services.snapshots import EXACT_FORMS

    key = new_key(client, "analyst")
    oid = _register(client)
    EXACT_FORMS.clear()
    first = _submit(client, key, oid, "first", 0.5)
    assert first.status_code == 201, first.text
    hits = EXACT_FORMS.hits
    second = _submit(client, key, oid, "second", 0.5)
    assert second.status_code == 201, second.text
    assert EXACT_FORMS.hits == hits + 1
    row = load_state_of(client, oid)
    assert row.state is not None
    loss = second.json()["odometer"]["realized_loss"]
    assert (loss["lower"], loss["upper"]) == (row.loss_lower, row.loss_upper)
    EXACT_FORMS.clear()  # a fresh parse of the same bytes: the same exact loss
    dry = client.post(
        f"/v1/objects/{oid}/dry-run", headers=auth(key), json={"query": grr_query(0.5)}
    )
    assert dry.status_code == 200, dry.text
    assert dry.json()["realized_loss"]["upper"] == row.loss_upper


def load_state_of(client: TestClient, oid: str) -> Any:
    engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:
        return load_state(conn, object_id=oid)


def test_a_rejection_under_a_used_key_is_a_conflict_that_counts_nothing(
    client: TestClient, engine: Engine
) -> None:
    """``record_rejected`` with a key already stored: :class:`Conflict`, the count not kept.

    On PostgreSQL the count, the answer and the event are one statement, so the unique
    violation of the answer undoes the count with it; on SQLite the caller's transaction is
    rolled back (as the service's is). A stale version writes nothing and returns False.
    """
    from app.services.audit import AuditKind, new_event
    from app.store.submits import StoredRejection, record_rejected

    oid = _register(client)

    def stored(key: str) -> StoredRejection:
        return StoredRejection(key, None, "f" * 64, '{"detail": "no"}', datetime.now(UTC))

    def event() -> Any:
        return new_event(
            kind=AuditKind.DECISION_REJECTED, actor_key_id=None, object_id=oid, detail={}
        )

    with submitting(engine) as conn:
        row = load_state(conn, object_id=oid)
        assert row is not None
        assert record_rejected(
            conn, object_id=oid, version=row.version, stored=stored("k1"), event=event()
        )
    with pytest.raises(Conflict), submitting(engine) as conn:
        record_rejected(
            conn, object_id=oid, version=row.version + 1, stored=stored("k1"), event=event()
        )
    with submitting(engine) as conn:  # stale: another writer advanced the object
        assert not record_rejected(
            conn, object_id=oid, version=row.version, stored=stored("k2"), event=event()
        )
    with engine.connect() as conn:
        after = load_state(conn, object_id=oid)
        keys = conn.execute(
            text("SELECT idempotency_key FROM rejections WHERE object_id = :o"), {"o": oid}
        ).scalars()
        events = conn.execute(
            text("SELECT count(*) FROM audit_events WHERE object_id = :o AND kind = :k"),
            {"o": oid, "k": "decision.rejected"},
        ).scalar_one()
        assert sorted(keys) == ["k1"]
    assert after is not None
    assert (after.rejected, after.version) == (1, row.version + 1)
    assert events == 1

"""A survey chunk's member rows and its compare-and-set, on both dialects (``h/member``).

``member_rows`` reads each member's domain by its hash (the text looked up once, cached) and
its retirement as a boolean; on PostgreSQL all rows in one fetch. ``advance_members`` copies,
on PostgreSQL, the members into a temporary table and updates from it: a member must get its
own dict's columns whoever shares it, and only members still at the version read move.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.bootstrap import create_app
from app.db.models import ProtectedObject
from app.db.session import make_engine
from app.store import surveys as survey_store
from app.store import transaction
from app.store.domains import domain_hash
from app.store.surveys import Advanced
from tests.service.conftest import make_settings, unique_id
from tests.service.factories import register

DOMAIN = {"attributes": [{"name": "a", "type": "integer", "low": 0, "high": 3}]}
OTHER = {"attributes": [{"name": "b", "type": "categorical", "values": ["x", "y"]}]}


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(database_url))) as test_client:
        yield test_client


def _columns(n: int) -> dict[str, Any]:
    return {
        "state_hash": None,
        "state_pending": n,
        "history_hash": f"{n:032x}",
        "loss_lower": 0.1 * n,
        "loss_upper": 0.1 * n + 1e-12,
        "basic_total": f"{n}/7",
        "f0_account": f"{n}/3",
    }


def test_member_rows_read_domains_by_hash_and_retirement(
    client: TestClient, database_url: str
) -> None:
    ids = [register(client, domain=DOMAIN, value={"a": n % 4}, prefix="mr") for n in range(5)]
    ids.append(register(client, domain=OTHER, value={"b": "y"}, prefix="mr"))
    engine = make_engine(database_url)
    try:
        with transaction(engine) as conn:
            conn.execute(
                update(ProtectedObject).where(ProtectedObject.id == ids[1]),
                {"retired_at": datetime.now(UTC)},
            )
        with transaction(engine) as conn:
            read = select(ProtectedObject.id, ProtectedObject.domain_hash)
            hashes = {r.id: r.domain_hash for r in conn.execute(read)}
            survey_store._DOMAIN_TEXTS.clear()  # read from the table once
            for lock in (True, False):
                rows = survey_store.member_rows(conn, ids[::-1], lock=lock)
                assert [r.id for r in rows] == sorted(ids)
                by_id = {r.id: r for r in rows}
                assert [by_id[i].retired for i in ids] == [False, True, False, False, False, False]
                for i in ids:
                    domain = by_id[i].key.domain
                    assert domain_hash(domain) == hashes[i]
                    assert json.loads(domain) == (OTHER if i == ids[-1] else DOMAIN)
                    assert by_id[i].sealed.startswith("fernet:")
            with pytest.raises(LookupError, match="without an object row"):
                survey_store.member_rows(conn, [ids[0], unique_id("absent")])
    finally:
        engine.dispose()


def test_advance_members_sets_each_members_own_columns(
    client: TestClient, database_url: str
) -> None:
    ids = [register(client, domain=DOMAIN, value={"a": n % 4}, prefix="adv") for n in range(6)]
    engine = make_engine(database_url)
    now = datetime(2026, 11, 26, 12, 0, 0, 123456, tzinfo=UTC)
    try:
        with transaction(engine) as conn:
            rows = survey_store.member_rows(conn, ids)
        shared, own = _columns(1), _columns(2)
        given = {  # two members share a dict, one has its own, one moved meanwhile
            rows[0].id: (rows[0].version, shared),
            rows[1].id: (rows[1].version, own),
            rows[2].id: (rows[2].version, shared),
            rows[3].id: (rows[3].version + 5, _columns(3)),
            rows[4].id: (rows[4].version, dict(shared)),  # equal, another dict
        }
        advanced = [
            Advanced(i, version, 10 + n, columns)
            for n, (i, (version, columns)) in enumerate(given.items())
        ]
        with transaction(engine) as conn:
            assert survey_store.advance_members(conn, advanced, updated_at=now) == 4
            assert survey_store.advance_members(conn, [], updated_at=now) == 0
        with engine.connect() as conn:
            found = {
                r.id: r
                for r in conn.execute(select(ProtectedObject).where(ProtectedObject.id.in_(ids)))
            }
        before = {r.id: r for r in rows}
        for n, (i, (version, columns)) in enumerate(given.items()):
            row = found[i]
            if i == rows[3].id:  # not at the version read: untouched
                assert (row.version, row.accepted) == (before[i].version, before[i].accepted)
                continue
            assert (row.version, row.accepted) == (version + 1, 10 + n)
            assert row.updated_at.replace(tzinfo=UTC) == now
            assert {c: getattr(row, c) for c in columns} == columns
        assert found[rows[5].id].version == before[rows[5].id].version
    finally:
        engine.dispose()


def test_advance_members_refuses_columns_missing_a_key(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("the PostgreSQL statement's own check (SQLite binds each row's keys)")
    engine = make_engine(database_url)
    short = _columns(1)
    del short["f0_account"]
    try:
        with pytest.raises(ValueError, match="accounting columns"), transaction(engine) as conn:
            survey_store.advance_members(
                conn, [Advanced("nobody", 1, 1, short)], updated_at=datetime.now(UTC)
            )
    finally:
        engine.dispose()


def test_advance_members_is_never_a_prepared_statement(
    client: TestClient, database_url: str
) -> None:
    """psycopg prepares what a connection ran five times, and PostgreSQL may then keep one
    generic plan for any values — for this statement 3.6 s instead of 61 ms per chunk of 5,000
    members with 5,000 distinct dicts (docs/benchmarks.md). Run many times on one connection,
    it must still be planned for its values each time: never among the prepared statements."""
    if not database_url.startswith("postgresql"):
        pytest.skip("psycopg's automatic preparation is PostgreSQL's")
    oid = register(client, domain=DOMAIN, value={"a": 1}, prefix="prep")
    engine = make_engine(database_url, pool_size=1, max_overflow=0)
    now = datetime.now(UTC)
    try:
        with transaction(engine) as conn:
            for _ in range(8):
                (row,) = survey_store.member_rows(conn, [oid])
                advanced = [Advanced(oid, row.version, row.accepted + 1, _columns(row.version))]
                assert survey_store.advance_members(conn, advanced, updated_at=now) == 1
            prepared = conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements")
            texts = [str(text) for (text,) in prepared]
        assert texts  # the member rows' load is prepared (compiled.fetch_all): the view works
        assert not [text for text in texts if "UPDATE objects AS t" in text]
    finally:
        engine.dispose()


def test_advance_members_gives_each_member_its_own_history_hash(
    client: TestClient, database_url: str
) -> None:
    """A diverged survey's members each have their own history hash (their own dict), the rest
    of their columns shared: each member gets its own hash (``None`` included) and the shared
    columns. On PostgreSQL the rows are copied in binary: a hash holding a newline, or an empty
    one, is stored as given (the earlier text form joined the hashes by newlines and had to
    refuse both)."""
    ids = [register(client, domain=DOMAIN, value={"a": n % 4}, prefix="advh") for n in range(7)]
    engine = make_engine(database_url)
    now = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)
    try:
        with transaction(engine) as conn:
            rows = survey_store.member_rows(conn, ids)
        hashes = [f"{n + 9:032x}" for n in range(4)] + [None, "a\nb", ""]
        other = _columns(2)
        given = [{**_columns(1), "history_hash": h} for h in hashes[:4]]
        given += [{**other, "history_hash": h} for h in hashes[4:]]
        advanced = [
            Advanced(row.id, row.version, 20 + n, columns)
            for n, (row, columns) in enumerate(zip(rows, given, strict=True))
        ]
        with transaction(engine) as conn:
            assert survey_store.advance_members(conn, advanced, updated_at=now) == 7
        with engine.connect() as conn:
            found = {
                r.id: r
                for r in conn.execute(select(ProtectedObject).where(ProtectedObject.id.in_(ids)))
            }
        for n, (row, columns) in enumerate(zip(rows, given, strict=True)):
            got = found[row.id]
            assert (got.version, got.accepted) == (row.version + 1, 20 + n)
            assert {c: getattr(got, c) for c in columns} == columns
    finally:
        engine.dispose()


def test_advance_members_twice_in_a_transaction_and_after_a_rollback(
    client: TestClient, database_url: str
) -> None:
    """PostgreSQL copies the members into a session's temporary table: a later call in the
    same transaction applies only its own members — a row an earlier call copied and did not
    apply (its version was ahead of the object's) must not move the object once another call
    has brought it to that version — and a call after a rolled-back one on the same connection
    (whose transaction created the table, so dropped it) works."""
    ids = [register(client, domain=DOMAIN, value={"a": n % 4}, prefix="adv2") for n in range(3)]
    engine = make_engine(database_url, pool_size=1, max_overflow=0)
    now = datetime(2026, 11, 27, 1, 0, 0, tzinfo=UTC)
    try:
        with transaction(engine) as conn:
            rows = survey_store.member_rows(conn, ids)
        x, y = rows[0], rows[1]
        ahead = [Advanced(x.id, x.version + 1, 40, _columns(4))]
        conn = engine.connect()
        try:  # the transaction that creates the temporary table (PostgreSQL) rolls back
            assert survey_store.advance_members(conn, ahead, updated_at=now) == 0
        finally:
            conn.rollback()
            conn.close()
        with transaction(engine) as conn:
            assert survey_store.advance_members(conn, ahead, updated_at=now) == 0
            moved = [Advanced(x.id, x.version, 41, _columns(5))]
            assert survey_store.advance_members(conn, moved, updated_at=now) == 1
            # x is at version + 1 now, as ``ahead`` said: only y may move
            other = [Advanced(y.id, y.version, 42, _columns(6))]
            assert survey_store.advance_members(conn, other, updated_at=now) == 1
        with engine.connect() as conn:
            found = {
                r.id: r
                for r in conn.execute(select(ProtectedObject).where(ProtectedObject.id.in_(ids)))
            }
        assert (found[x.id].version, found[x.id].accepted) == (x.version + 1, 41)
        assert {c: getattr(found[x.id], c) for c in _columns(5)} == _columns(5)
        assert (found[y.id].version, found[y.id].accepted) == (y.version + 1, 42)
        assert found[rows[2].id].version == rows[2].version
    finally:
        engine.dispose()


def test_advance_members_refuses_a_nan_loss(client: TestClient, database_url: str) -> None:
    """A NaN loss is never stored: PostgreSQL's copy carries NaN, so it is refused before."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite stores NaN as NULL, which its NOT NULL column refuses")
    oid = register(client, domain=DOMAIN, value={"a": 1}, prefix="nan")
    engine = make_engine(database_url)
    try:
        with transaction(engine) as conn:
            (row,) = survey_store.member_rows(conn, [oid])
        for name in ("loss_lower", "loss_upper"):
            bad = [Advanced(oid, row.version, row.accepted + 1, {**_columns(1), name: math.nan})]
            with pytest.raises(ValueError, match="NaN"), transaction(engine) as conn:
                survey_store.advance_members(conn, bad, updated_at=datetime.now(UTC))
    finally:
        engine.dispose()

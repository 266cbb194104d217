"""Closed versions packed per bulk request (``version_batches``, migration 0016), SQLite and PG.

A single version stays one ``object_versions`` row; a bulk request's closed versions are one
batch row, each object naming its own in ``objects.packed_versions``. Whatever the layout,
every read is the same: the history of each closed version, its odometer history and start,
the lifetime sums, the version a survey answer was given from, ``gatekeeper verify`` — shown
here by running the same operations on one object through single versions and on another
through bulk ones, mixed, and comparing everything read. ``verify`` reports a tampered batch or
reference; key rotation re-encrypts packed ciphertexts; 0016 packs existing rows and unpacks
them again, values byte for byte.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import text

from app import crypto
from app.bootstrap import create_app
from app.db.migrate import alembic_config, upgrade
from app.db.session import make_engine
from app.services.verify import verify_all
from app.store import reading
from app.store import versions as version_store
from app.store.versions import ClosedVersion, parse_refs
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.factories import run_cli

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
ADMIN = auth(ADMIN_KEY)


def rr(epsilon: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": epsilon,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }


def register(client: TestClient, oid: str | None = None) -> str:
    oid = oid or unique_id("pk")
    body = {
        "id": oid,
        "domain": BINARY,
        "value": {"b": 1},
        "budget": {"epsilon": 1.0},
        "lifetime": {"epsilon": 50.0},
    }
    r = client.post("/v1/objects", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return oid


def bulk(client: TestClient, ids: list[str], value: int) -> None:
    body = {"versions": [{"id": oid, "value": {"b": value}} for oid in ids]}
    r = client.post("/v1/versions", headers=ADMIN, json=body)
    assert r.status_code == 200, r.text


def single(client: TestClient, oid: str, value: int) -> None:
    r = client.post(f"/v1/objects/{oid}/versions", headers=ADMIN, json={"value": {"b": value}})
    assert r.status_code == 201, r.text


def work(client: TestClient, analyst: dict[str, str], oid: str, accepted: int) -> None:
    """``accepted`` answers of ε = 0.1, then one refused (ε = 5 is over the budget)."""
    for _ in range(accepted):
        r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": rr(0.1)})
        assert r.status_code == 201, r.text
    r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": rr(5.0)})
    assert r.status_code == 409, r.text


def reads(client: TestClient, oid: str, version: int | None) -> dict[str, Any]:
    """What the API says of one version of the object (its queries without the object id)."""
    query = "" if version is None else f"?version={version}"
    queries = client.get(f"/v1/objects/{oid}/queries{query}", headers=ADMIN).json()
    history = client.get(f"/v1/objects/{oid}/odometer/history{query}", headers=ADMIN).json()
    for item in queries["items"]:
        item.pop("object_id", None)
        item.pop("created_at", None)
    history.pop("object_id")
    history.pop("created_at")
    for point in history["points"]:
        point.pop("at")
    for rejection in history["rejections"]:
        rejection.pop("at")
    return {"queries": queries["items"], "history": history}


def check_verify(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        return verify_all(engine).problems
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


def test_every_read_is_the_same_packed_or_not(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    """``one`` only ever gets single versions, ``many`` only bulk ones (with ``other`` in the
    batch), ``mixed`` alternates; their histories are the same operations."""
    one, many, mixed, other = (register(client) for _ in range(4))
    seen: dict[str, dict[int, dict[str, Any]]] = {one: {}, many: {}, mixed: {}}
    starts: dict[str, dict[int, str]] = {one: {}, many: {}, mixed: {}}
    for round_ in range(1, 5):
        for oid in (one, many, mixed, other):
            work(client, analyst, oid, round_)
        for oid in seen:
            seen[oid][round_] = reads(client, oid, None)
            odometer = client.get(f"/v1/objects/{oid}/odometer/history", headers=ADMIN).json()
            starts[oid][round_] = odometer["created_at"]
        single(client, one, round_ % 2)
        if round_ % 2:
            bulk(client, [other, many, mixed], round_ % 2)
        else:
            bulk(client, [many, other], round_ % 2)
            single(client, mixed, round_ % 2)
    for oid in seen:
        for version in range(1, 5):
            assert reads(client, oid, version) == seen[oid][version], (oid, version)
            # a version began when its predecessor closed
            history = client.get(
                f"/v1/objects/{oid}/odometer/history?version={version}", headers=ADMIN
            ).json()
            assert history["created_at"] == starts[oid][version]
        assert client.get(f"/v1/objects/{oid}/queries?version=6", headers=ADMIN).status_code == 404
    odometers = [client.get(f"/v1/objects/{o}/odometer", headers=ADMIN).json() for o in seen]
    assert [o["version"] for o in odometers] == [5, 5, 5]
    engine = make_engine(database_url)
    try:
        with reading(engine) as conn:
            closed = {o: version_store.closed_versions(conn, object_id=o) for o in seen}
            # the layouts: one's versions are rows, many's packed, mixed's both
            rows = dict(
                conn.execute(
                    text(
                        "SELECT object_id, count(*) FROM object_versions "
                        "WHERE object_id IN (:a, :b, :c) GROUP BY object_id"
                    ),
                    {"a": one, "b": many, "c": mixed},
                ).all()
            )
            refs = {
                oid: parse_refs(
                    conn.execute(
                        text("SELECT packed_versions FROM objects WHERE id = :i"), {"i": oid}
                    ).scalar_one()
                )
                for oid in seen
            }
            spans = [
                version_store.versions_answered(conn, [(oid, seq) for oid in seen])
                for seq in range(1, 12)
            ]
    finally:
        engine.dispose()
    assert rows.get(one) == 4
    assert many not in rows
    assert rows.get(mixed) == 2
    assert refs[one] == []
    assert len(refs[many]) == 4
    assert refs[many] == sorted(set(refs[many]))
    assert refs[mixed] == [refs[many][0], refs[many][2]]  # the same requests
    for oid, odometer in zip(seen, odometers, strict=True):
        assert [(v.data_version, v.seq_start, v.seq_end, v.rejected) for v in closed[oid]] == [
            (1, 0, 1, 1),
            (2, 1, 3, 1),
            (3, 3, 6, 1),
            (4, 6, 10, 1),
        ]
        # each closed loss is exact and within its version's last odometer point; the
        # lifetime sum is theirs
        total = Fraction(0)
        for version in closed[oid]:
            assert version.loss_exact is not None
            loss = Fraction(version.loss_exact)
            assert version.loss_lower <= float(loss) <= version.loss_upper
            last = seen[oid][version.data_version]["history"]["points"][-1]["realized_loss"]
            assert last["lower"] <= float(loss) <= last["upper"]
            assert version.basic_total == str(Fraction(version.seq_end - version.seq_start, 10))
            total += loss
        lifetime = odometer["lifetime"]["realized_loss"]
        assert lifetime["exact"] is True
        assert lifetime["lower"] <= float(total) <= lifetime["upper"]
    for seq, found in enumerate(spans, start=1):
        expected = 1 if seq <= 1 else 2 if seq <= 3 else 3 if seq <= 6 else 4 if seq <= 10 else 5
        assert found == dict.fromkeys(seen, expected), seq
    assert check_verify(database_url) == []


def _tamper(url: str, statement: str, params: dict[str, Any]) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(statement), params)
    finally:
        engine.dispose()


def _read(url: str, statement: str, params: dict[str, Any]) -> Any:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(statement), params).scalar_one()
    finally:
        engine.dispose()


def test_verify_reports_a_tampered_batch_or_reference(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    first, second, third = register(client), register(client), register(client)
    for oid in (first, second):
        work(client, analyst, oid, 2)
    bulk(client, [third], 0)
    bulk(client, [second, first], 0)
    work(client, analyst, first, 1)
    bulk(client, [first, second], 1)
    assert check_verify(database_url) == []
    refs = _read(database_url, "SELECT packed_versions FROM objects WHERE id = :i", {"i": first})
    batch, _ = parse_refs(refs)
    elsewhere = parse_refs(
        _read(database_url, "SELECT packed_versions FROM objects WHERE id = :i", {"i": third})
    )[0]
    accounts = _read(
        database_url, "SELECT accounts FROM version_batches WHERE id = :b", {"b": batch}
    )
    rejected = _read(
        database_url, "SELECT rejected FROM version_batches WHERE id = :b", {"b": batch}
    )
    body = json.loads(accounts)
    position = body["ids"].split("\n").index(first)
    cases: list[tuple[str, dict[str, Any], str]] = []
    # a loss that is not the history's
    changed = json.loads(accounts)
    changed["variants"][changed["picks"][position]][5] = "1/3"
    cases.append(
        ("UPDATE version_batches SET accounts = :t WHERE id = :b", {"t": json.dumps(changed)}, "")
    )
    # a seq range that is not the history's
    shifted = json.loads(accounts)
    shifted["variants"][shifted["picks"][position]][2] += 1
    cases.append(
        ("UPDATE version_batches SET accounts = :t WHERE id = :b", {"t": json.dumps(shifted)}, "")
    )
    # rejection counts that are not one per position
    cases.append(
        ("UPDATE version_batches SET rejected = :t WHERE id = :b", {"t": "7"}, "do not fit")
    )
    # malformed texts
    cases.append(
        ("UPDATE version_batches SET accounts = :t WHERE id = :b", {"t": "{]"}, "malformed")
    )
    cases.append(
        (
            "UPDATE version_batches SET accounts = :t WHERE id = :b",
            {"t": json.dumps({**body, "picks": body["picks"][:1]})},
            "do not fit",
        )
    )
    # the reference names a batch without the object, a missing one, one twice
    rest = refs.split(",", 1)[1]
    for ref, words in (
        (str(elsewhere), "has no version of it"),
        ("999999", "not readable"),
        (f"{batch},{batch}", "not contiguous"),
    ):
        cases.append(
            (
                "UPDATE objects SET packed_versions = :t WHERE id = :i",
                {"t": f"{ref},{rest}", "i": first},
                words,
            )
        )
    for statement, params, words in cases:
        _tamper(database_url, statement, {"b": batch, **params})
        try:
            problems = check_verify(database_url)
            assert problems, statement
            assert any(first in p or str(batch) in p for p in problems), problems
            assert any(words in p for p in problems), problems
        finally:  # put it back
            _tamper(
                database_url,
                "UPDATE version_batches SET accounts = :a, rejected = :r WHERE id = :b",
                {"a": accounts, "r": rejected, "b": batch},
            )
            _tamper(
                database_url,
                "UPDATE objects SET packed_versions = :t WHERE id = :i",
                {"t": refs, "i": first},
            )
    assert check_verify(database_url) == []


@pytest.fixture
def fresh_postgres_url(postgres_url: str) -> Iterator[str]:
    import psycopg

    name = "gk_packed_" + secrets.token_hex(6)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'packed.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


def stored_values(url: str) -> dict[tuple[str, int], str]:
    """Every closed version's value as stored, by (object, version), from either layout."""
    engine = make_engine(url)
    found = {}
    try:
        with engine.connect() as conn:
            tables = {
                str(t)
                for (t,) in conn.execute(
                    text(
                        "SELECT name FROM sqlite_master WHERE type = 'table'"
                        if url.startswith("sqlite")
                        else "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                    )
                )
            }
            for oid, number, value in conn.execute(
                text("SELECT object_id, data_version, CAST(value AS TEXT) FROM object_versions")
            ):
                found[(oid, number)] = value
            if "version_batches" in tables:
                batches = {
                    batch: (json.loads(accounts), texts.split("\n"))
                    for batch, accounts, texts in conn.execute(
                        text("SELECT id, accounts, ciphertexts FROM version_batches")
                    )
                }
                for oid, refs in conn.execute(
                    text("SELECT id, packed_versions FROM objects WHERE packed_versions <> ''")
                ):
                    for batch in parse_refs(refs):
                        accounts, values = batches[batch]
                        at = accounts["ids"].split("\n").index(oid)
                        number = accounts["variants"][accounts["picks"][at]][0]
                        found[(oid, number)] = values[at]
    finally:
        engine.dispose()
    return found


def closed_of(url: str, ids: list[str]) -> dict[str, list[ClosedVersion]]:
    engine = make_engine(url)
    try:
        with reading(engine) as conn:
            found, problems = version_store.closed_versions_among(conn, ids)
    finally:
        engine.dispose()
    assert problems == []
    return found


def _population(client: TestClient, analyst: dict[str, str]) -> list[str]:
    """Five objects, two bulk versions and single ones between."""
    ids = [register(client, f"m{i}") for i in range(5)]
    for i, oid in enumerate(ids):
        work(client, analyst, oid, i % 3)
    bulk(client, ids, 0)
    single(client, ids[0], 1)
    single(client, ids[3], 1)
    work(client, analyst, ids[3], 2)
    bulk(client, ids[1:], 1)
    return ids


def test_0016_packs_existing_rows_and_unpacks_them(fresh_url: str) -> None:
    url = fresh_url
    upgrade(url)
    with TestClient(create_app(make_settings(url))) as client:
        analyst = auth(new_key(client, "analyst"))
        ids = _population(client, analyst)
        api = {(oid, v): reads(client, oid, v) for oid in ids for v in (1, 2, 3)}
    closed = closed_of(url, ids)
    values = stored_values(url)
    assert sorted(values) == sorted(
        (v.object_id, v.data_version) for c in closed.values() for v in c
    )
    assert sum(map(len, closed.values())) == 11

    command.downgrade(alembic_config(url), "0015")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            columns = [
                "object_id",
                "data_version",
                "seq_start",
                "seq_end",
                "loss_lower",
                "loss_upper",
                "loss_exact",
                "basic_total",
                "rejected",
            ]
            rows = conn.execute(
                text(f"SELECT {', '.join(columns)} FROM object_versions")  # noqa: S608
            ).all()
    finally:
        engine.dispose()
    expected = sorted(
        tuple(getattr(v, c) for c in columns) for found in closed.values() for v in found
    )
    assert sorted(tuple(r) for r in rows) == expected
    assert stored_values(url) == values  # the ciphertexts as they were, byte for byte

    upgrade(url)
    assert closed_of(url, ids) == closed
    assert stored_values(url) == values
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM object_versions")).scalar_one() == 0
            # the two bulk requests' rows: one batch each; the singles: one batch each
            sizes = sorted(n for (n,) in conn.execute(text("SELECT size FROM version_batches")))
    finally:
        engine.dispose()
    assert sizes == [1, 1, 4, 5]
    with TestClient(create_app(make_settings(url))) as client:
        assert {(oid, v): reads(client, oid, v) for oid in ids for v in (1, 2, 3)} == api
    assert check_verify(url) == []


def test_rotation_re_encrypts_packed_and_row_values(fresh_url: str) -> None:
    url = fresh_url
    upgrade(url)
    old, new = crypto.new_key(), crypto.new_key()
    with TestClient(create_app(make_settings(url, gatekeeper_encryption_keys=old))) as client:
        analyst = auth(new_key(client, "analyst"))
        ids = _population(client, analyst)
    before = stored_values(url)
    assert len(before) == 11
    reader = crypto.ValueCipher([old.encode()])
    plain = {key: reader.decrypt(value) for key, value in before.items()}
    assert {json.loads(p)["b"] for p in plain.values()} == {0, 1}
    rotated = run_cli(
        "encryption", "rotate", database_url=url, GATEKEEPER_ENCRYPTION_KEYS=f"{new},{old}"
    )
    assert rotated.returncode == 0, rotated.stderr
    assert "re-encrypted 16 " in rotated.stdout  # 5 objects' values and 11 closed versions'
    after = stored_values(url)
    assert after.keys() == before.keys()
    fresh = crypto.ValueCipher([new.encode()])
    for key, value in after.items():
        assert value != before[key]
        with pytest.raises(crypto.EncryptionKeyError):
            reader.decrypt(value)
        assert fresh.decrypt(value) == plain[key]
    assert closed_of(url, ids)  # the accounts untouched: still read
    assert check_verify(url) == []

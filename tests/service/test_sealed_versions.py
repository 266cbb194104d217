"""Bulk versions sealed ahead (``gatekeeper import --versions`` workers), on SQLite and PostgreSQL.

A worker checks each value against its object's domain and encrypts it
(:func:`app.services.versions.seal_bulk`); the storing transaction checks again that each object
exists, is live and has that domain, and stores the ciphertexts as they are. What cannot be
sealed (SQLite, an unknown object, a bad value) is None, and a seal that no longer fits is
refused with ``StaleSeal`` before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app import crypto
from app.db.session import make_engine
from app.services.errors import NotFound, Retired
from app.services.verify import verify_all
from app.services.versions import SealedBatch, StaleSeal, create_versions, parse_bulk, seal_bulk
from app.store import Database
from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import run_cli

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
OTHER = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 2}]}
ADMIN = auth(ADMIN_KEY)


def register(client: TestClient, domain: dict[str, Any] = BINARY) -> str:
    oid = unique_id("seal")
    body = {"id": oid, "domain": domain, "value": {"b": 1}, "budget": {"epsilon": 1.0}}
    r = client.post("/v1/objects", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return oid


@pytest.fixture
def engine(client: TestClient, database_url: str) -> Iterator[Database]:
    db = make_engine(database_url)
    yield db
    db.dispose()


def version_of(client: TestClient, oid: str) -> int:
    return int(client.get(f"/v1/objects/{oid}", headers=ADMIN).json()["version"])


def bulk(ids: list[str], values: list[Any]) -> Any:
    return parse_bulk(
        {"versions": [{"id": i, "value": v} for i, v in zip(ids, values, strict=True)]}
    )


def store(engine: Database, items: Any, key: str | None = None) -> Any:
    return create_versions(
        engine=engine,
        locks=None,
        items=items,
        actor_key_id=None,
        bulk=True,
        fingerprint=key,
        idempotency_key=key,
    )


def test_a_sealed_batch_stores_the_checked_values_encrypted(
    client: TestClient, engine: Database, database_url: str
) -> None:
    ids = [register(client) for _ in range(3)]
    sealed = seal_bulk(engine, bulk(ids, [{"b": 0}, {"b": 1}, {"b": 0}]))
    if not database_url.startswith("postgresql"):
        assert sealed is None  # SQLite encrypts by the column type: nothing sealed ahead
        return
    assert sealed is not None
    assert sealed.ids == ids
    # each value encrypted on its own (no two equal ciphertexts for equal values)
    assert len(set(sealed.values)) == 3
    assert crypto.active().decrypt(sealed.values[0]) == json.dumps({"b": 0})
    body = store(engine, sealed)
    assert body.created == 3
    assert [v.version for v in body.versions] == [2, 2, 2]
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id, value FROM objects WHERE id = ANY(:ids)"), {"ids": ids}
        )
        stored = {str(oid): str(value) for oid, value in found}
    assert stored == dict(
        zip(ids, sealed.values, strict=True)
    )  # stored as sealed, not encrypted again
    got = client.get(f"/v1/objects/{ids[1]}/odometer", headers=ADMIN).json()
    assert got["version"] == 2
    report = verify_all(engine)
    assert report.ok, report.problems[:5]


def test_what_cannot_be_sealed_is_left_to_the_storing_process(
    client: TestClient, engine: Database
) -> None:
    ids = [register(client) for _ in range(2)]
    assert seal_bulk(engine, bulk([ids[0], unique_id("missing")], [{"b": 0}, {"b": 0}])) is None
    assert seal_bulk(engine, bulk(ids, [{"b": 0}, {"b": 7}])) is None
    r = client.delete(f"/v1/objects/{ids[1]}", headers=ADMIN)
    assert r.status_code in (200, 204), r.text
    assert seal_bulk(engine, bulk(ids, [{"b": 0}, {"b": 0}])) is None


def _sealed_or_skip(engine: Database, ids: list[str]) -> SealedBatch:
    sealed = seal_bulk(engine, bulk(ids, [{"b": 0}] * len(ids)))
    if sealed is None:
        pytest.skip("SQLite seals nothing ahead")
    return sealed


def test_a_seal_is_checked_again_when_stored(client: TestClient, engine: Database) -> None:
    """An object retired after its batch was sealed is refused by name; a domain other than the
    one the value was checked against is ``StaleSeal``; nothing of either batch is stored."""
    ids = [register(client) for _ in range(3)]
    sealed = _sealed_or_skip(engine, ids)
    r = client.delete(f"/v1/objects/{ids[2]}", headers=ADMIN)
    assert r.status_code in (200, 204), r.text
    with pytest.raises(Retired, match=r"versions\[2\]\.id"):
        store(engine, sealed)
    other = register(client, OTHER)
    forged = replace(
        _sealed_or_skip(engine, [ids[0], other]),
        domain_hashes=[sealed.domain_hashes[0], sealed.domain_hashes[0]],
    )
    with pytest.raises(StaleSeal):
        store(engine, forged)
    missing = replace(sealed, ids=[ids[0], ids[1], unique_id("missing")])
    with pytest.raises(NotFound, match=r"versions\[2\]\.id"):
        store(engine, missing)
    assert {version_of(client, oid) for oid in [*ids, other]} == {1}


@pytest.mark.parametrize("jobs", ["0", "2"])
def test_cli_versions_with_and_without_workers(
    client: TestClient, database_url: str, tmp_path: Path, jobs: str
) -> None:
    """The same file stored with or without sealing workers; run again with the other setting,
    every batch is replayed (the batches' keys do not depend on who parsed them). The workers
    start for these few lines with ``--jobs-min-lines 0``."""
    ids = [register(client) for _ in range(7)]
    path = tmp_path / "versions.ndjson"
    path.write_text("".join(f'{{"id": "{oid}", "value": {{"b": 0}}}}\n' for oid in ids))
    done = run_cli(
        "import",
        "--versions",
        str(path),
        "--batch-size",
        "3",
        "--jobs",
        jobs,
        "--jobs-min-lines",
        "0",
        database_url=database_url,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"created": 7, "already": 0}
    other = "2" if jobs == "0" else "0"
    again = run_cli(
        "import",
        "--versions",
        str(path),
        "--batch-size",
        "3",
        "--jobs",
        other,
        "--jobs-min-lines",
        "0",
        database_url=database_url,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"created": 0, "already": 7}
    assert {version_of(client, oid) for oid in ids} == {2}
    bad = tmp_path / "bad.ndjson"
    bad.write_text(
        f'{{"id": "{ids[0]}", "value": {{"b": 1}}}}\n'
        f'{{"id": "{unique_id("missing")}", "value": {{"b": 1}}}}\n'
    )
    failed = run_cli(
        "import",
        "--versions",
        str(bad),
        "--jobs",
        jobs,
        "--jobs-min-lines",
        "0",
        database_url=database_url,
    )
    assert failed.returncode == 2
    assert "lines 1-2: versions[1].id: no object with that id" in failed.stderr
    assert version_of(client, ids[0]) == 2

"""API keys: the last active admin key cannot be revoked; keys are listed (issue #11, 3).

Before: ``DELETE /v1/keys/{own id}`` of the only admin key answered 200, and from then on every
request was 401, recoverable only from a shell. SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.bootstrap import create_app
from app.db.session import make_engine
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key
from tests.service.factories import run_cli


@pytest.fixture
def fresh(database_url: str) -> Iterator[TestClient]:
    """An app on this module's database; every admin key but the bootstrap one revoked."""
    with TestClient(create_app(make_settings(database_url))) as client:
        listing = client.get("/v1/keys", params={"limit": 1000}, headers=auth(ADMIN_KEY)).json()
        me = client.get("/v1/whoami", headers=auth(ADMIN_KEY)).json()["key_id"]
        for key in listing["items"]:
            if key["role"] == "admin" and key["revoked_at"] is None and key["id"] != me:
                r = client.delete(f"/v1/keys/{key['id']}", headers=auth(ADMIN_KEY))
                assert r.status_code == 200, r.text
        yield client


def key_id(client: TestClient, secret: str) -> int:
    return int(client.get("/v1/whoami", headers=auth(secret)).json()["key_id"])


def test_the_last_admin_key_cannot_revoke_itself(fresh: TestClient) -> None:
    me = key_id(fresh, ADMIN_KEY)
    r = fresh.delete(f"/v1/keys/{me}", headers=auth(ADMIN_KEY))
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == "last-admin-key"
    # nothing changed: the key still works
    assert fresh.get("/v1/keys", headers=auth(ADMIN_KEY)).status_code == 200


def test_an_admin_key_can_be_revoked_while_another_remains(fresh: TestClient) -> None:
    second = new_key(fresh, "admin")
    second_id = key_id(fresh, second)
    me = key_id(fresh, ADMIN_KEY)
    r = fresh.delete(f"/v1/keys/{second_id}", headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    assert fresh.get("/v1/whoami", headers=auth(second)).status_code == 401
    # now the bootstrap key is the last one again
    assert fresh.delete(f"/v1/keys/{me}", headers=auth(ADMIN_KEY)).status_code == 409


def _revoke_each_other(client: TestClient, ids: dict[str, int]) -> list[int]:
    first, second = ids
    statuses: list[int] = []
    barrier = threading.Barrier(2)

    def revoke(actor: str, target: str) -> None:
        barrier.wait()
        r = client.delete(f"/v1/keys/{ids[target]}", headers=auth(actor))
        statuses.append(r.status_code)

    threads = [
        threading.Thread(target=revoke, args=(first, second)),
        threading.Thread(target=revoke, args=(second, first)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_two_concurrent_revocations_leave_one_admin(fresh: TestClient, database_url: str) -> None:
    """The last two admins revoke each other at once: exactly one revocation lands."""
    engine = make_engine(database_url)
    try:
        for _ in range(5):
            other = new_key(fresh, "admin")
            ids = {ADMIN_KEY: key_id(fresh, ADMIN_KEY), other: key_id(fresh, other)}
            statuses = _revoke_each_other(fresh, ids)
            with engine.begin() as conn:
                active = conn.execute(
                    text("SELECT id FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL")
                ).all()
                assert len(active) == 1, (statuses, active)
                # the loser is 409, or 401 when its own revocation landed before it was heard
                assert sorted(statuses)[0] == 200, statuses
                assert sorted(statuses)[1] in (401, 409), statuses
                # put the bootstrap key back if it lost (the module's other tests use it)
                conn.execute(
                    text("UPDATE api_keys SET revoked_at = NULL WHERE id = :id"),
                    {"id": ids[ADMIN_KEY]},
                )
                conn.execute(
                    text("UPDATE api_keys SET revoked_at = CURRENT_TIMESTAMP WHERE id = :id"),
                    {"id": ids[other]},
                )
            fresh.app.state.runtime.keys.forget(ids[ADMIN_KEY])  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_keys_are_listed_without_secrets(fresh: TestClient) -> None:
    analyst = new_key(fresh, "analyst")
    listing = fresh.get("/v1/keys", params={"limit": 1000}, headers=auth(ADMIN_KEY))
    assert listing.status_code == 200, listing.text
    items = listing.json()["items"]
    assert {"id", "role", "label", "created_at", "revoked_at", "project"} == set(items[0])
    assert key_id(fresh, analyst) in {k["id"] for k in items}
    assert analyst not in listing.text
    assert analyst[:8] not in listing.text
    assert ADMIN_KEY not in listing.text
    # paging covers every key once
    seen, after = [], 0
    while True:
        page = fresh.get(
            "/v1/keys", params={"limit": 2, "after": after}, headers=auth(ADMIN_KEY)
        ).json()
        seen += [k["id"] for k in page["items"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert seen == sorted({k["id"] for k in items})
    for role in ("analyst", "viewer"):
        r = fresh.get("/v1/keys", headers=auth(new_key(fresh, role)))
        assert r.status_code == 403


@pytest.mark.slow
def test_keys_list_and_revoke_on_the_command_line(
    fresh: TestClient, database_url: str, tmp_path: Path
) -> None:
    viewer = new_key(fresh, "viewer")
    viewer_id = key_id(fresh, viewer)
    listed = run_cli("keys", "list", database_url=database_url)
    assert listed.returncode == 0, listed.stderr
    assert str(viewer_id) in listed.stdout
    assert viewer not in listed.stdout
    assert listed.stdout.splitlines()[0].split()[:4] == ["ID", "ROLE", "CREATED", "REVOKED"]
    done = run_cli("keys", "revoke", str(viewer_id), database_url=database_url)
    assert done.returncode == 0, done.stderr
    # `fresh` may trust the viewer key for AUTH_CACHE_SECONDS after its whoami above; an app
    # without that cache must refuse the key revoked by another process at once
    with TestClient(create_app(make_settings(database_url, auth_cache_seconds=0))) as uncached:
        assert uncached.get("/v1/whoami", headers=auth(viewer)).status_code == 401
    as_json = run_cli("keys", "list", "--json", database_url=database_url)
    rows = {r["id"]: r for r in map(json.loads, as_json.stdout.splitlines())}
    assert rows[viewer_id]["revoked_at"] is not None
    me = key_id(fresh, ADMIN_KEY)
    refused = run_cli("keys", "revoke", str(me), database_url=database_url)
    assert refused.returncode == 1
    assert "last active admin key" in refused.stderr
    missing = run_cli("keys", "revoke", "2147483000", database_url=database_url)
    assert missing.returncode == 1
    assert "no key with id" in missing.stderr

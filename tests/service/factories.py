"""Factories the service tests share: objects and credentials.

One way to register an object and one set of credentials per kind, instead of a copy per test
module (issue #12).
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id

#: Credential kinds of the authorization tests (``None`` secret: no Authorization header).
ADMIN, ANALYST, VIEWER = "admin", "analyst", "viewer"
MISSING, INVALID, REVOKED = "missing", "invalid", "revoked"
CREDENTIALS = [ADMIN, ANALYST, VIEWER, MISSING, INVALID, REVOKED]


def register(
    client: TestClient | httpx.Client,
    *,
    domain: Any,
    value: Any,
    budget: Any = 10_000.0,
    filter: str | None = None,
    oid: str | None = None,
    prefix: str = "obj",
) -> str:
    """Register an object as the bootstrap admin (201 asserted); returns its id."""
    object_id = oid or unique_id(prefix)
    body: dict[str, Any] = {
        "id": object_id,
        "domain": domain,
        "value": value,
        "budget": {"epsilon": budget},
    }
    if filter is not None:
        body["filter"] = filter
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 201, r.text
    return object_id


def credentials(client: TestClient | httpx.Client) -> dict[str, str | None]:
    """A secret per credential kind: one key per role, a revoked admin key, an invalid one.

    The revoked key is an admin key, so that only its revocation can refuse it.
    """
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": ADMIN})
    assert r.status_code == 201, r.text
    revoked = str(r.json()["key"])
    assert client.get("/v1/whoami", headers=auth(revoked)).status_code == 200
    revoked_id = r.json()["id"]
    r = client.delete(f"/v1/keys/{revoked_id}", headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    assert r.json() == {"id": revoked_id, "revoked": True}
    return {
        ADMIN: new_key(client, ADMIN),
        ANALYST: new_key(client, ANALYST),
        VIEWER: new_key(client, VIEWER),
        MISSING: None,
        INVALID: "gk_" + secrets.token_urlsafe(32),
        REVOKED: revoked,
    }

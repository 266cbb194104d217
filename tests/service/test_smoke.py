"""A minimal end-to-end check that the fixtures and the app work on both databases."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import integer_domain

DOMAIN = integer_domain(3)


def test_register_dry_run_submit(client: TestClient) -> None:
    oid = unique_id()
    r = client.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={"id": oid, "domain": DOMAIN, "value": {"x": 2}, "budget": {"epsilon": 1.0}},
    )
    assert r.status_code == 201, r.text
    analyst = new_key(client, "analyst")
    q = {"query": {"mechanism": "grr", "attribute": "x", "epsilon": 0.4}}
    d = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json=q)
    assert d.status_code == 200
    assert d.json()["decision"] == "accept"
    s = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json=q)
    assert s.status_code == 201, s.text
    assert s.json()["output"] in (0, 1, 2, 3)
    assert s.json()["odometer"]["accepted"] == 1

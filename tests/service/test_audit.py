"""The audit log: every registration, retirement, key event and submit decision, for admins.

A scripted session (register, create and revoke a key, accepted and rejected submits, retire)
must appear in ``GET /v1/audit`` in order, with the acting key, filterable by object and kind and
pageable; a rolled-back attempt leaves nothing; only admins may read it; and no event carries the
private value or an output.
"""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import grr_query, integer_domain

SENTINEL = 61  # the true value: appears in no event
DOMAIN = integer_domain(99)
QUERY = grr_query(0.4)


def events(client: TestClient, **params: object) -> list[dict[str, object]]:
    response = client.get("/v1/audit", params=params, headers=auth(ADMIN_KEY))
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


def test_a_session_is_recorded_in_order_with_its_actors(client: TestClient) -> None:
    object_id = unique_id("audit")
    registered = client.post(
        "/v1/objects",
        json={
            "id": object_id,
            "domain": DOMAIN,
            "value": {"x": SENTINEL},
            "budget": {"epsilon": 1.0},
            "filter": "basic",
        },
        headers=auth(ADMIN_KEY),
    )
    assert registered.status_code == 201, registered.text
    analyst = new_key(client, "analyst")
    outputs = []
    for _ in range(3):  # 0.4 + 0.4 fit the budget of 1.0; the third does not
        response = client.post(
            f"/v1/objects/{object_id}/queries", json={"query": QUERY}, headers=auth(analyst)
        )
        outputs.append(response)
    assert [r.status_code for r in outputs] == [201, 201, 409]
    assert client.delete(f"/v1/objects/{object_id}", headers=auth(ADMIN_KEY)).status_code == 200

    mine = events(client, object_id=object_id)
    assert [e["kind"] for e in mine] == [
        "object.registered",
        "decision.accepted",
        "decision.accepted",
        "decision.rejected",
        "object.retired",
    ]
    ids = [e["id"] for e in mine]
    assert ids == sorted(ids)
    admin_actor = mine[0]["actor_key_id"]
    assert admin_actor is not None
    assert mine[-1]["actor_key_id"] == admin_actor
    analyst_actor = mine[1]["actor_key_id"]
    assert analyst_actor not in (None, admin_actor)
    assert all(e["actor_key_id"] == analyst_actor for e in mine[1:4])
    accepted = [e["detail"] for e in mine[1:3]]
    assert [d["seq"] for d in accepted] == [1, 2]
    assert [d["query_id"] for d in accepted] == [r.json()["query_id"] for r in outputs[:2]]
    assert all(d["mechanism"] == "grr" and d["epsilon"] == 0.4 for d in accepted)
    rejected = mine[3]["detail"]
    assert rejected["filter"] == "basic"
    assert rejected["reason"]
    assert mine[0]["detail"] == {"budget": 1.0, "filter": "basic", "attributes": ["x"]}
    # public facts only: the value never, the outputs never
    text = json.dumps(mine)
    assert f'"x": {SENTINEL}' not in text
    assert "output" not in text


def test_key_events_and_filters(client: TestClient) -> None:
    viewer = client.post(
        "/v1/keys", json={"role": "viewer", "label": "wall"}, headers=auth(ADMIN_KEY)
    )
    assert viewer.status_code == 201
    key_id = viewer.json()["id"]
    assert client.delete(f"/v1/keys/{key_id}", headers=auth(ADMIN_KEY)).status_code == 200
    assert client.delete(f"/v1/keys/{key_id}", headers=auth(ADMIN_KEY)).status_code == 200
    created = [e for e in events(client, kind="key.created") if e["detail"]["key_id"] == key_id]
    revoked = [e for e in events(client, kind="key.revoked") if e["detail"]["key_id"] == key_id]
    assert len(created) == 1
    assert created[0]["detail"] == {"key_id": key_id, "role": "viewer", "label": "wall"}
    assert len(revoked) == 1, "revoking twice is one event"
    assert viewer.json()["key"] not in json.dumps(created + revoked)


def test_paging_covers_every_event_once(client: TestClient) -> None:
    everything = events(client, limit=1000)
    seen, after = [], 0
    while True:
        page = client.get(
            "/v1/audit", params={"after": after, "limit": 2}, headers=auth(ADMIN_KEY)
        ).json()
        seen += [e["id"] for e in page["events"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert seen == [e["id"] for e in everything]


def test_only_admins_read_the_audit_log(client: TestClient) -> None:
    for role in ("analyst", "viewer"):
        response = client.get("/v1/audit", headers=auth(new_key(client, role)))
        assert response.status_code == 403
        assert response.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/audit").status_code == 401
    bad = client.get("/v1/audit", params={"kind": "nope"}, headers=auth(ADMIN_KEY))
    assert bad.status_code == 422

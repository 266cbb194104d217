"""The odometers list searched, filtered, paged and counted by the server (issue 25, item 5).

The dashboard once filtered the rows it had loaded (the first 20,000): an id beyond them was
"No object matches", and its summary mixed the API's total with counts of loaded rows. Now
``GET /v1/odometers`` searches by id prefix, filters by status (active, exhausted, near
exhaustion, retired) and labels, and pages by keyset (``after``); ``GET /v1/odometers/totals``
counts by status with the definitions the Prometheus gauges use. On SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import grr_query, integer_domain

COUNT = 150
# one query's realized loss is its ε exactly (two grr outputs may cancel: the loss can be < Σε)
EXHAUSTED = {3, 77, 140}  # ε = 1.0 of a budget of 1.0: nothing left, then one refusal
NEAR = {5, 120}  # ε = 0.95 of 1.0: 0.05 left, below 0.1 of the budget
RETIRED = {7, 145}


def _gauges(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    found = {}
    for line in text.splitlines():
        if line.startswith("gatekeeper_objects"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


@pytest.fixture(scope="module")
def population(client: TestClient) -> dict[str, Any]:
    study = unique_id("study")
    prefix = unique_id("srch")
    ids = [f"{prefix}-{n:03d}" for n in range(COUNT)]
    objects = [
        {
            "id": object_id,
            "domain": integer_domain(3),
            "value": {"x": 1},
            "budget": {"epsilon": 1.0},
            "filter": "basic",
            "labels": {"study": study},
        }
        for object_id in ids
    ]
    imported = client.post("/v1/imports", json={"objects": objects}, headers=auth(ADMIN_KEY))
    assert imported.status_code == 200, imported.text
    analyst = auth(new_key(client, "analyst"))
    for n in EXHAUSTED:
        r = client.post(
            f"/v1/objects/{ids[n]}/queries", json={"query": grr_query(1.0)}, headers=analyst
        )
        assert r.status_code == 201, r.text
        r = client.post(
            f"/v1/objects/{ids[n]}/queries", json={"query": grr_query(0.1)}, headers=analyst
        )
        assert r.status_code == 409, r.text
    for n in NEAR:
        r = client.post(
            f"/v1/objects/{ids[n]}/queries", json={"query": grr_query(0.95)}, headers=analyst
        )
        assert r.status_code == 201, r.text
    for n in RETIRED:
        assert client.delete(f"/v1/objects/{ids[n]}", headers=auth(ADMIN_KEY)).status_code == 200
    return {"study": study, "prefix": prefix, "ids": ids, "viewer": auth(new_key(client, "viewer"))}


def listed(client: TestClient, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    """Every matching item, by keyset pages of ``limit`` (default 40)."""
    params.setdefault("limit", 40)
    found: list[dict[str, Any]] = []
    while True:
        r = client.get("/v1/odometers", params=params, headers=headers)
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        found.extend(items)
        if len(items) < params["limit"]:
            return found
        params = {**params, "after": items[-1]["id"]}


def test_status_filters_use_one_definition(client: TestClient, population: dict[str, Any]) -> None:
    ids, viewer = population["ids"], population["viewer"]
    label = f"study:{population['study']}"

    def listed_ids(**params: Any) -> list[str]:
        return [i["id"] for i in listed(client, viewer, label=label, **params)]

    def of(numbers: set[int]) -> list[str]:
        return [ids[n] for n in sorted(numbers)]

    assert listed_ids(status="exhausted") == of(EXHAUSTED)
    # near exhaustion is the gauge's: remaining below 0.1 of the budget, the exhausted included
    assert listed_ids(status="near_exhaustion") == of(EXHAUSTED | NEAR)
    assert listed_ids(status="retired") == of(RETIRED)
    active = set(range(COUNT)) - RETIRED
    assert listed_ids(status="active") == of(active)
    assert listed_ids() == of(active)
    assert listed_ids(include_retired="true") == ids
    for item in listed(client, viewer, label=label, status="exhausted"):
        assert item["remaining"] < 1e-6
    for item in listed(client, viewer, label=label, status="near_exhaustion"):
        assert item["remaining"] < 0.1 * item["budget"]


def test_keyset_pages_cover_every_object_once_in_order(
    client: TestClient, population: dict[str, Any]
) -> None:
    label = f"study:{population['study']}"
    for limit in (1, 7, 40, 149, 1000):
        items = listed(
            client, population["viewer"], label=label, include_retired="true", limit=limit
        )
        assert [i["id"] for i in items] == population["ids"]


def test_a_search_by_id_prefix_finds_objects_beyond_the_first_page(
    client: TestClient, population: dict[str, Any]
) -> None:
    ids, prefix, viewer = population["ids"], population["prefix"], population["viewer"]
    first = client.get("/v1/odometers", params={"limit": 100}, headers=viewer).json()
    assert ids[149] not in [i["id"] for i in first["items"]]
    r = client.get(
        "/v1/odometers", params={"id_prefix": f"{prefix}-14", "limit": 100}, headers=viewer
    )
    assert r.status_code == 200, r.text
    body = r.json()
    expected = [ids[n] for n in range(140, 150) if n not in RETIRED]
    assert [i["id"] for i in body["items"]] == expected
    assert body["total"] == len(expected)
    whole = client.get("/v1/odometers", params={"id_prefix": ids[149]}, headers=viewer).json()
    assert [i["id"] for i in whole["items"]] == [ids[149]]
    # a prefix is case-sensitive and literal: '_' ('any character' to LIKE) matches only '_'
    underscore = client.get("/v1/odometers", params={"id_prefix": f"{prefix}_1"}, headers=viewer)
    assert underscore.json()["total"] == 0
    assert (
        client.get("/v1/odometers", params={"id_prefix": prefix.upper()}, headers=viewer).json()[
            "total"
        ]
        == 0
    )
    dotted = client.get("/v1/odometers", params={"id_prefix": f"{prefix}.1"}, headers=viewer)
    assert dotted.json()["total"] == 0
    with_status = listed(client, viewer, id_prefix=f"{prefix}-1", status="exhausted")
    assert [i["id"] for i in with_status] == [ids[140]]


def test_totals_are_the_lists_and_the_gauges(
    client: TestClient, population: dict[str, Any]
) -> None:
    viewer, label = population["viewer"], f"study:{population['study']}"
    r = client.get("/v1/odometers/totals", params={"label": label}, headers=viewer)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "objects": COUNT - len(RETIRED),
        "active": COUNT - len(RETIRED),
        "retired": len(RETIRED),
        "exhausted": len(EXHAUSTED),
        "near_exhaustion": len(EXHAUSTED | NEAR),
        "rejected": len(EXHAUSTED),
    }
    with_retired = client.get(
        "/v1/odometers/totals", params={"label": label, "include_retired": "true"}, headers=viewer
    ).json()
    assert with_retired == {**r.json(), "objects": COUNT}  # retired ones had no refusal
    every = listed(client, viewer, include_retired="true", limit=1000)
    everything = client.get(
        "/v1/odometers/totals", params={"include_retired": "true"}, headers=viewer
    ).json()
    active = [i for i in every if i["status"] == "active"]
    assert everything["objects"] == len(every)
    only_active = client.get("/v1/odometers/totals", headers=viewer).json()
    assert only_active["objects"] == len(active)
    assert only_active["objects"] == client.get("/v1/odometers", headers=viewer).json()["total"]
    assert only_active["rejected"] == sum(i["rejected"] for i in active)
    assert everything["active"] == len(active)
    assert everything["exhausted"] == sum(i["remaining"] < 1e-6 for i in active)
    assert everything["near_exhaustion"] == sum(i["remaining"] < 0.1 * i["budget"] for i in active)
    assert everything["rejected"] == sum(i["rejected"] for i in every)
    gauges = _gauges(client)
    assert gauges['gatekeeper_objects{status="active"}'] == everything["active"]
    assert gauges['gatekeeper_objects{status="retired"}'] == everything["retired"]
    assert gauges["gatekeeper_objects_near_exhaustion"] == everything["near_exhaustion"]
    assert gauges["gatekeeper_objects_exhausted"] == everything["exhausted"]
    prefixed = client.get(
        "/v1/odometers/totals", params={"id_prefix": f"{population['prefix']}-14"}, headers=viewer
    ).json()
    assert prefixed["objects"] == 9
    assert prefixed["retired"] == 1
    assert prefixed["exhausted"] == 1


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/odometers", {"status": "tired"}, "status"),
        ("/v1/odometers", {"id_prefix": "a%"}, "id_prefix"),
        ("/v1/odometers", {"id_prefix": ""}, "id_prefix"),
        ("/v1/odometers", {"id_prefix": "x" * 129}, "id_prefix"),
        ("/v1/odometers", {"after": "a\x00"}, "after"),
        ("/v1/odometers/totals", {"id_prefix": "é"}, "id_prefix"),
        ("/v1/odometers/totals", {"label": "nocolon"}, "label"),
    ],
)
def test_bad_input_is_a_422_naming_the_parameter(
    client: TestClient, path: str, params: dict[str, Any], field: str
) -> None:
    r = client.get(path, params=params, headers=auth(ADMIN_KEY))
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.text


def test_any_role_reads_the_totals(client: TestClient) -> None:
    assert client.get("/v1/odometers/totals").status_code == 401
    for role in ("viewer", "analyst"):
        r = client.get("/v1/odometers/totals", headers=auth(new_key(client, role)))
        assert r.status_code == 200, r.text

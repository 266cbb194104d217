"""``olh`` and ``hadamard`` through the service: dry-run, submit, history, odometer, calculator."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id

DOMAIN = {"attributes": [{"name": "app", "type": "integer", "low": 0, "high": 9999}]}


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> str:
    return new_key(client, "analyst")


def _register(client: TestClient, budget: Any) -> str:
    oid = unique_id("oracle")
    body = {"id": oid, "domain": DOMAIN, "value": {"app": 4321}, "budget": {"epsilon": budget}}
    assert client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body).status_code == 201
    return oid


def test_olh_and_hadamard_are_charged_exactly_through_the_api(
    client: TestClient, analyst: str
) -> None:
    oid = _register(client, 0.3)
    olh = {"mechanism": "olh", "attribute": "app", "epsilon": 0.1}
    hr = {"mechanism": "hadamard", "attribute": "app", "epsilon": 0.1}
    dry = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": olh})
    assert dry.status_code == 200, dry.text
    decision = dry.json()
    assert decision["decision"] == "accept"
    assert decision["per_output_complete"] is False
    (worst,) = decision["per_output"]
    assert set(worst["output"]) == {"seed", "bucket"}
    assert isinstance(worst["output"]["seed"], str)
    outputs = []
    for query in (olh, hr, olh):
        r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": query})
        assert r.status_code == 201, r.text
        outputs.append(r.json()["output"])
    assert 0 <= outputs[0]["bucket"] < 2  # default g at ε = 0.1: round(e^0.1) + 1 = 2
    assert int(outputs[0]["seed"]) < 2**64
    assert isinstance(outputs[1], int)
    assert 0 <= outputs[1] < 16384
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    loss = odometer["realized_loss"]
    assert loss["exact"] is True
    # the third query's worst case, 0.3, tied the budget and was accepted: exact decimals
    assert loss["upper"] == loss["lower"] in (0.1, 0.2, 0.3)
    # the stored history replays through the calculator to the same exact loss
    history = client.get(f"/v1/objects/{oid}/queries", headers=auth(analyst)).json()
    entries = [{"query": item["query"], "output": item["output"]} for item in history["items"]]
    assert [e["output"] for e in entries] == outputs
    replay = client.post("/v1/loss", headers=auth(analyst),
                         json={"domain": DOMAIN, "history": entries})  # fmt: skip
    assert replay.status_code == 200, replay.text
    assert replay.json()["realized_loss"] == loss


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"mechanism": "olh", "attribute": "app", "epsilon": 1, "g": 1}, "query.g"),
        ({"mechanism": "olh", "attribute": "app", "epsilon": 1, "g": 10001}, "query.g"),
        ({"mechanism": "hadamard", "attribute": "app", "epsilon": 1, "g": 4}, "query.g"),
    ],
)
def test_bad_oracle_queries_are_422_naming_the_field(
    client: TestClient, analyst: str, query: dict[str, Any], field: str
) -> None:
    oid = _register(client, 1.0)
    r = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": query})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert field in r.text
    assert "4321" not in r.text


def test_a_calculator_output_that_is_not_a_seed_and_bucket_is_422(
    client: TestClient, analyst: str
) -> None:
    olh = {"mechanism": "olh", "attribute": "app", "epsilon": 1, "g": 4}
    body = {"domain": DOMAIN, "history": [{"query": olh, "output": {"seed": 7, "bucket": 1}}]}
    r = client.post("/v1/loss", headers=auth(analyst), json=body)
    assert r.status_code == 422, r.text
    assert "history[0].output.seed" in r.text

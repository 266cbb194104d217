"""Exact ties in the decimals as written, through the service (SQLite and PostgreSQL).

contract.md "Decimals as written": a ``bayesian`` object with budget 1.0 takes ``binary_rr`` of
ε = 0.1 until its loss is exactly 1.0; every bounds object says ``"exact": true``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db.session import make_engine
from app.engine import sampling
from app.services.verify import verify_all
from tests.service.conftest import auth, new_key
from tests.service.factories import register

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
RR = {
    "mechanism": "binary_rr",
    "epsilon": 0.1,
    "predicate": {"attribute": "b", "op": "==", "value": 1},
}
EXACT = {"exact": True}


@pytest.fixture
def honesty(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The randomized-response draws, in order: True reports the truth (then always True)."""
    draws: list[bool] = []

    def draw(self: sampling.RealProbability) -> bool:
        return draws.pop(0) if draws else True

    monkeypatch.setattr(sampling.RealProbability, "draw", draw)
    return draws


def _bounds(value: float) -> dict[str, Any]:
    return {"lower": value, "upper": value, "exact": True}


def test_a_bayesian_object_takes_binary_rr_of_0_1_until_its_loss_is_exactly_1(
    client: TestClient, database_url: str, honesty: list[bool]
) -> None:
    """Outputs 1, 0, then 1s: after 11 queries the loss is 0.9 and basic composition 1.1.

    The 12th query's worst case is exactly 1.0: accepted (the float rule answered 409 at loss
    0.9, since ten floats 0.1 sum above 1.0); the 13th would reach 1.1 and is refused.
    """
    honesty.extend([True, False])
    analyst = new_key(client, "analyst")
    oid = register(client, domain=BINARY, value={"b": 1}, budget=1.0, filter="bayesian")
    for i in range(11):
        r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": RR})
        assert r.status_code == 201, (i, r.text)
    odometer = r.json()["odometer"]
    assert odometer["realized_loss"] == _bounds(0.9)
    assert odometer["remaining"] == 0.1  # 1 − 9/10, not 1.0 − 0.9 = 0.09999999999999998
    assert odometer["basic_composition"] == pytest.approx(1.1)
    dry = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": RR})
    assert dry.status_code == 200, dry.text
    decision = dry.json()
    assert decision["decision"] == "accept", decision["reason"]
    assert decision["realized_loss"] == _bounds(0.9)
    assert decision["worst_case_after"] == 1.0
    assert sorted(decision["per_output"], key=lambda o: o["output"]) == [
        {"output": 0, **_bounds(0.8)},
        {"output": 1, **_bounds(1.0)},
    ]
    r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": RR})
    assert r.status_code == 201, r.text
    odometer = r.json()["odometer"]
    assert odometer["realized_loss"] == _bounds(1.0)
    assert odometer["remaining"] == 0.0
    refused = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": RR})
    assert refused.status_code == 409, refused.text
    problem = refused.json()
    assert problem["realized_loss"] == _bounds(1.0)
    assert problem["worst_case_after"] == 1.1
    # every bounds object the service shows says so
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odometer["realized_loss"] == _bounds(1.0)
    assert odometer["remaining"] == 0.0
    assert odometer["accepted"] == 12
    view = client.get(f"/v1/objects/{oid}", headers=auth(analyst)).json()
    assert view["odometer"]["realized_loss"] == _bounds(1.0)
    points = client.get(f"/v1/objects/{oid}/odometer/history", headers=auth(analyst)).json()
    assert [p["realized_loss"]["upper"] for p in points["points"]] == [
        0.1,
        0.0,
        0.1,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
    ]
    assert all(p["realized_loss"]["exact"] for p in points["points"])
    history = client.get(f"/v1/objects/{oid}/queries", headers=auth(analyst)).json()["items"]
    assert history[-1]["realized_loss_after"] == _bounds(1.0)
    listed = client.get("/v1/odometers", headers=auth(analyst), params={"limit": 500}).json()
    (item,) = [o for o in listed["items"] if o["id"] == oid]
    assert item["realized_loss"] == _bounds(1.0)
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems


def test_ten_binary_rr_of_0_1_fit_a_budget_of_1_under_every_filter(
    client: TestClient, honesty: list[bool]
) -> None:
    """All ten accepted and the loss (the truth every time) exactly 1.0; the 11th refused."""
    analyst = new_key(client, "analyst")
    for filter_kind in ("bayesian", "simplified", "basic"):
        oid = register(client, domain=BINARY, value={"b": 1}, budget=1.0, filter=filter_kind)
        for i in range(10):
            r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": RR})
            assert r.status_code == 201, (filter_kind, i, r.text)
        assert r.json()["odometer"]["realized_loss"] == _bounds(1.0)
        r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": RR})
        assert r.status_code == 409, (filter_kind, r.text)


def test_the_calculator_accepts_a_decimal_tie_and_says_exact(client: TestClient) -> None:
    analyst = new_key(client, "analyst")
    history = [{"query": RR, "output": out} for out in (1, 0, *[1] * 9)]
    body = {"domain": BINARY, "history": history, "candidate": RR, "budget": 1.0}
    r = client.post("/v1/loss", headers=auth(analyst), json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["realized_loss"] == _bounds(0.9)
    candidate = answer["candidate"]
    assert candidate["accepted"] == {"bayesian": True, "simplified": True, "basic": False}
    assert candidate["worst_case_upper"] == 1.0
    assert all(o["exact"] for o in candidate["per_output"])


def test_certified_bounds_say_they_are_not_exact(client: TestClient) -> None:
    """A ``matrix`` query's history keeps certified bounds, ``"exact": false``."""
    analyst = new_key(client, "analyst")
    matrix = {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[0.6, 0.4], [0.3, 0.7]]}
    oid = register(client, domain=BINARY, value={"b": 1}, budget=5.0)
    r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": matrix})
    assert r.status_code == 201, r.text
    bounds = r.json()["odometer"]["realized_loss"]
    assert bounds["exact"] is False
    assert bounds["lower"] < bounds["upper"]

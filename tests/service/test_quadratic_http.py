"""Quadratic weights through ``POST /v1/loss``: appendix A answered, bad keys a named 422."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import auth, new_key

DOMAIN = {"attributes": [{"name": "x", "type": "real", "low": -1, "high": 1}]}
MEAN = {"mechanism": "linear", "weights": {"x": 1}, "range": [-1, 1], "epsilon": 1}
SQUARE = {"mechanism": "linear", "weights": {"x^2": 1}, "range": [0, 1], "epsilon": 1}


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> str:
    return new_key(client, "analyst")


def test_appendix_a_through_the_calculator(client: TestClient, analyst: str) -> None:
    history = [{"query": MEAN, "output": 1}, {"query": SQUARE, "output": 0}]
    r = client.post("/v1/loss", headers=auth(analyst), json={"domain": DOMAIN, "history": history})
    assert r.status_code == 200, r.text
    loss = r.json()["realized_loss"]
    assert loss["lower"] <= 1.6914 <= loss["upper"]
    assert loss["upper"] - loss["lower"] <= 1e-4


@pytest.mark.parametrize(
    ("weights", "field"),
    [({"x^3": 1}, "history[1].query.weights.x^3"), ({"x*y": 1}, "history[1].query.weights.x*y")],
)
def test_bad_quadratic_key_is_a_problem_naming_it(
    client: TestClient, analyst: str, weights: dict[str, float], field: str
) -> None:
    history = [{"query": MEAN, "output": 1}, {"query": dict(SQUARE, weights=weights), "output": 0}]
    r = client.post("/v1/loss", headers=auth(analyst), json={"domain": DOMAIN, "history": history})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["field"] == field


def test_range_check_reports_the_quadratic_minimum(client: TestClient, analyst: str) -> None:
    query = {"mechanism": "linear", "weights": {"x^2": 1, "x": 1}, "range": [-0.2, 2], "epsilon": 1}
    history = [{"query": query, "output": 2}]
    r = client.post("/v1/loss", headers=auth(analyst), json={"domain": DOMAIN, "history": history})
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == "history[0].query.range"
    assert "[-0.25, 2]" in error["message"]

"""No number, however extreme, may break an object or a shared endpoint (issue #11, 1-2).

Regressions: a submit with ε = 1e-200 was accepted and its exact Σε outgrew ``VARCHAR(400)``,
so every later submit on the object was a 500 on PostgreSQL (5e-324, 1e-310 and 1e-300 failed
at once); a budget of 5e-324 made every ``/metrics`` scrape a 500 on PostgreSQL (``0.1 * budget``
underflows in double precision). Each test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.db.session import make_engine
from app.engine.limits import MAX_BUDGET, MIN_EPSILON
from tests.service import factories
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id

DOMAIN = {"attributes": [{"name": "disease", "type": "categorical", "values": ["a", "b", "c"]}]}
BOX = {"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]}


def grr(epsilon: object) -> dict[str, object]:
    return {"mechanism": "grr", "attribute": "disease", "epsilon": epsilon}


def register(client: TestClient, budget: object = 5.0, domain: object = DOMAIN) -> str:
    value = {"disease": "b"} if domain is DOMAIN else {"x": 0.5}
    return factories.register(client, domain=domain, value=value, budget=budget, prefix="extreme")


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


def assert_usable(client: TestClient, object_id: str, analyst: dict[str, str]) -> None:
    """A normal query on the object still gets a decision, never a 5xx."""
    r = client.post(f"/v1/objects/{object_id}/queries", json={"query": grr(0.5)}, headers=analyst)
    assert r.status_code in (201, 409), r.text
    r = client.get(f"/v1/objects/{object_id}/odometer", headers=analyst)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("epsilon", [1e-200, 5e-324, 1e-310, 1e-300, 1e-7])
def test_an_epsilon_below_the_floor_is_refused_and_the_object_stays_usable(
    client: TestClient, analyst: dict[str, str], epsilon: float
) -> None:
    object_id = register(client)
    for route in ("queries", "dry-run"):
        r = client.post(
            f"/v1/objects/{object_id}/{route}", json={"query": grr(epsilon)}, headers=analyst
        )
        assert r.status_code == 422, r.text
        problem = r.json()
        assert [e["field"] for e in problem["errors"]] == ["query.epsilon"]
        assert "at least 1e-06" in problem["errors"][0]["message"]
    assert_usable(client, object_id, analyst)
    assert client.get("/metrics").status_code == 200


def test_the_floor_itself_is_accepted_and_sums_exactly(
    client: TestClient, analyst: dict[str, str]
) -> None:
    object_id = register(client)
    for epsilon in (MIN_EPSILON, 0.1, MIN_EPSILON, 0.1 + MIN_EPSILON):
        r = client.post(
            f"/v1/objects/{object_id}/queries", json={"query": grr(epsilon)}, headers=analyst
        )
        assert r.status_code == 201, r.text
    odometer = client.get(f"/v1/objects/{object_id}/odometer", headers=analyst).json()
    assert odometer["basic_composition"] == float(
        Fraction("1e-6") * 2 + Fraction("0.1") + Fraction(repr(0.1 + MIN_EPSILON))
    )


@pytest.mark.parametrize("budget", [5e-324, 1e-300, 1e-7, MAX_BUDGET * 1.0001, 1e308])
def test_a_budget_outside_the_range_is_refused(client: TestClient, budget: float) -> None:
    body = {"id": unique_id(), "domain": DOMAIN, "value": {"disease": "a"}}
    r = client.post(
        "/v1/objects", json={**body, "budget": {"epsilon": budget}}, headers=auth(ADMIN_KEY)
    )
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["budget.epsilon"]


def test_the_calculator_refuses_a_candidate_or_budget_below_the_floor_but_replays_any_history(
    client: TestClient, analyst: dict[str, str]
) -> None:
    history = [{"query": grr(1e-200), "output": "a"}, {"query": grr(0.5), "output": "b"}]
    r = client.post(
        "/v1/loss", json={"domain": DOMAIN, "history": history, "budget": 1.0}, headers=analyst
    )
    assert r.status_code == 200, r.text  # a history is what happened: any ε > 0 replays
    r = client.post(
        "/v1/loss",
        json={"domain": DOMAIN, "history": history, "budget": 1.0, "candidate": grr(1e-9)},
        headers=analyst,
    )
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == ["candidate.epsilon"]
    r = client.post(
        "/v1/loss",
        json={"domain": DOMAIN, "history": [], "budget": 5e-324, "candidate": grr(0.1)},
        headers=analyst,
    )
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == ["budget"]


def test_a_stored_sum_of_any_length_stays_storable(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    """A history written before the floor (Σε with a 600-digit denominator) keeps working.

    Before the columns became ``TEXT`` the next submit's sum did not fit ``VARCHAR(400)`` on
    PostgreSQL: every submit on the object was a 500.
    """
    object_id = register(client)
    legacy = Fraction(1, 10**600)
    engine = make_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE objects SET basic_total = :t WHERE id = :id"),
            {"t": str(legacy), "id": object_id},
        )
    engine.dispose()
    r = client.post(f"/v1/objects/{object_id}/queries", json={"query": grr(0.5)}, headers=analyst)
    assert r.status_code == 201, r.text
    engine = make_engine(database_url)
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT basic_total FROM objects WHERE id = :id"), {"id": object_id}
        ).scalar_one()
    engine.dispose()
    assert Fraction(stored) == legacy + Fraction(1, 2)
    assert len(stored) > 600


def test_metrics_survive_any_stored_budget_and_loss(client: TestClient, database_url: str) -> None:
    """Rows a former version accepted (budget 5e-324) or any float must not break a scrape."""
    extremes = [(5e-324, 0.0), (5e-324, 1e-320), (1e-310, 1e308), (MAX_BUDGET, 5e-324)]
    for budget, loss in extremes:
        object_id = register(client)
        engine = make_engine(database_url)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE objects SET budget = :b, loss_upper = :l WHERE id = :id"),
                {"b": budget, "l": loss, "id": object_id},
            )
        engine.dispose()
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    near = [
        line
        for line in r.text.splitlines()
        if line.startswith("gatekeeper_objects_near_exhaustion ")
    ]
    # (5e-324, 1e-320) and (1e-310, 1e308) are over their budget: near (in fact past) exhaustion
    assert near
    assert float(near[0].split()[1]) >= 2


EXTREMES = st.sampled_from(
    [
        5e-324,
        1e-320,
        1e-310,
        1e-300,
        1e-200,
        1e-12,
        9.99999e-7,
        1e-6,
        -0.0,
        0.0,
        -1e-300,
        100.0,
        100.00000000000001,
        1e16,
        1e308,
        1.7976931348623157e308,
        2**63,
        10**400,
        "1e-200",
        True,
        None,
    ]
) | st.floats(allow_nan=False, allow_infinity=False)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(epsilon=EXTREMES, budget=EXTREMES)
def test_no_extreme_number_gives_a_5xx_or_breaks_the_object(
    client: TestClient, analyst: dict[str, str], epsilon: object, budget: object
) -> None:
    object_id = unique_id("prop")
    body = {"id": object_id, "domain": DOMAIN, "value": {"disease": "c"}}
    r = client.post(
        "/v1/objects", json={**body, "budget": {"epsilon": budget}}, headers=auth(ADMIN_KEY)
    )
    assert r.status_code in (201, 422), r.text
    if r.status_code == 422:
        assert [e["field"] for e in r.json()["errors"]] == ["budget.epsilon"]
        object_id = register(client)
    for route in ("dry-run", "queries"):
        r = client.post(
            f"/v1/objects/{object_id}/{route}", json={"query": grr(epsilon)}, headers=analyst
        )
        assert r.status_code in (200, 201, 409, 422), r.text
        if r.status_code == 422:
            assert [e["field"] for e in r.json()["errors"]] == ["query.epsilon"]
    calc = {"domain": DOMAIN, "history": [], "budget": budget, "candidate": grr(epsilon)}
    r = client.post("/v1/loss", content=json.dumps(calc), headers=analyst)
    assert r.status_code in (200, 422), r.text
    assert_usable(client, object_id, analyst)
    assert client.get("/metrics").status_code == 200
    if isinstance(epsilon, float) and math.isfinite(epsilon):
        assert client.get(f"/v1/objects/{object_id}", headers=analyst).status_code == 200

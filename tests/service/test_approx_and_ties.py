"""Issue #15 through the service: exact ties, the ``approx_bayesian`` filter (Algorithm 4).

SQLite and PostgreSQL (the ``client`` fixture), every decision through the same pipeline.
"""

from __future__ import annotations

import time
from fractions import Fraction
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db.session import make_engine
from app.engine.approx import OutputIndependentFilter
from app.services.verify import verify_all
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import register

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}


def _rr(eps: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": eps,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }


def _register(client: TestClient, budget: dict[str, Any], filter: str) -> Any:
    body = {"id": unique_id("approx"), "domain": BINARY, "value": {"b": 1}, "budget": budget}
    return client.post("/v1/objects", headers=auth(ADMIN_KEY), json={**body, "filter": filter})


@pytest.mark.parametrize(
    ("budget", "filter", "message"),
    [
        ({"epsilon": 1.0}, "approx_bayesian", "is required"),
        ({"epsilon": 1.0, "delta": 1.0}, "approx_bayesian", "less than 1"),
        ({"epsilon": 1.0, "delta": 0}, "approx_bayesian", "at least 1e-300"),
        ({"epsilon": 1.0, "delta": 1e-301}, "approx_bayesian", "at least 1e-300"),
        ({"epsilon": 1.0, "delta": "0.1"}, "approx_bayesian", "number"),
        ({"epsilon": 1.0, "delta": 0.25}, "bayesian", "only allowed"),
    ],
)
def test_registration_validates_budget_delta(
    client: TestClient, budget: dict[str, Any], filter: str, message: str
) -> None:
    r = _register(client, budget, filter)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    text = r.text
    assert "budget.delta" in text
    assert message in text
    assert "0.25" not in text  # never echoes the value


def test_ties_are_accepted_until_the_loss_is_exactly_the_budget(
    client: TestClient, database_url: str
) -> None:
    """Binary RR ε = 0.25 under a budget of 1.0 = 4ε, submitted until the first rejection.

    The loss moves by ±0.25, so the filter may only stop at a loss of exactly 1.0: at 0.75 the
    worst case is 1.0, a tie, which the exact rule accepts (the float margin stopped at 0.75).
    Each submit reloads the stored state, so the exact form survives persistence.
    """
    analyst = new_key(client, "analyst")
    oid = register(client, domain=BINARY, value={"b": 1}, budget=1.0)
    for _ in range(400):
        r = client.post(
            f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": _rr(0.25)}
        )
        if r.status_code == 409:
            break
        assert r.status_code == 201, r.text
    else:
        pytest.fail("no rejection in 400 queries")
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odometer["realized_loss"] == {"lower": 1.0, "upper": 1.0, "exact": True}
    assert odometer["remaining"] == 0.0
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems


def test_calculator_accepts_the_tie_and_reports_algorithm_4(client: TestClient) -> None:
    analyst = new_key(client, "analyst")
    history = [{"query": _rr(0.25), "output": out} for out in (1, 0, 1, 1, 1)]
    body = {"domain": BINARY, "history": history, "candidate": _rr(0.25), "budget": 1.0}
    r = client.post("/v1/loss", headers=auth(analyst), json=body)
    assert r.status_code == 200, r.text
    candidate = r.json()["candidate"]
    assert candidate["worst_case_upper"] == 1.0
    assert candidate["accepted"] == {"bayesian": True, "simplified": True, "basic": False}
    r = client.post("/v1/loss", headers=auth(analyst), json={**body, "delta": 1e-6})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["candidate"]["accepted"]["approx_bayesian"] is True
    f0 = OutputIndependentFilter.for_points(1.0, 1e-6, 2)
    assert answer["approx"]["phase"] == "bayesian"  # 5 queries of 0.25 are beyond F₀
    assert answer["approx"]["f0_account"] == float(5 * f0.charge(Fraction(1, 4)))
    assert answer["approx"]["f0_threshold"] == float(f0.threshold)
    r = client.post("/v1/loss", headers=auth(analyst), json={**body, "delta": 2})
    assert r.status_code == 422
    assert "delta" in r.text


def test_approx_bayesian_object_moves_from_f0_to_the_bayesian_phase(
    client: TestClient, database_url: str
) -> None:
    """Budget (1, 0.1), binary RR ε = 0.1: F₀ accepts 15 queries, then the Bayesian filter."""
    analyst = new_key(client, "analyst")
    r = _register(client, {"epsilon": 1.0, "delta": 0.1}, "approx_bayesian")
    assert r.status_code == 201, r.text
    view = r.json()
    assert view["budget"] == {"epsilon": 1.0, "delta": 0.1}
    assert view["filter"] == "approx_bayesian"
    assert view["odometer"]["phase"] == "output-independent"
    oid = view["id"]
    f0 = OutputIndependentFilter.for_points(1.0, 0.1, 2)
    f0_count = int(f0.threshold / f0.charge(Fraction(1, 10)))
    assert f0_count == 15
    for i in range(f0_count):
        dry = client.post(
            f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": _rr(0.1)}
        )
        assert dry.status_code == 200, dry.text
        assert dry.json()["phase"] == "output-independent"
        assert dry.json()["delta"] == 0.1
        r = client.post(
            f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": _rr(0.1)}
        )
        assert r.status_code == 201, r.text
        assert r.json()["odometer"]["phase"] == "output-independent", i
    dry = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": _rr(0.1)})
    loss = dry.json()["realized_loss"]["upper"]
    # F₀ is done; the Bayesian filter decides on the realized loss (at most 1.5 after 15 queries)
    assert dry.json()["decision"] == ("accept" if loss <= 0.9 else "reject")
    if loss <= 0.9:
        assert dry.json()["phase"] == "bayesian"
        r = client.post(
            f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": _rr(0.1)}
        )
        assert r.status_code == 201, r.text
        assert r.json()["odometer"]["phase"] == "bayesian"
        assert r.json()["odometer"]["delta"] == 0.1
    listed = client.get("/v1/odometers", headers=auth(analyst)).json()["items"]
    assert any(item["id"] == oid and "phase" in item for item in listed)
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems


def test_import_and_survey_of_approx_objects(client: TestClient, database_url: str) -> None:
    """Bulk registration carries budget.delta; a survey decides each member by Algorithm 4."""
    analyst = {"Authorization": f"Bearer {new_key(client, 'analyst')}"}
    study = unique_id("approx-study")
    objects = [
        {
            "id": f"{study}-{i}",
            "domain": BINARY,
            "value": {"b": i % 2},
            "budget": {"epsilon": 1.0, "delta": 0.1},
            "filter": "approx_bayesian",
            "labels": {"study": study},
        }
        for i in range(4)
    ]
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": objects})
    assert r.status_code == 200, r.text
    assert r.json() == {"created": 4, "existing": 0}
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": objects})
    assert r.json() == {"created": 0, "existing": 4}
    changed = [{**objects[0], "budget": {"epsilon": 1.0, "delta": 0.2}}]
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": changed})
    assert r.status_code == 409, r.text
    body = {"name": "rr", "query": _rr(0.1), "cohort": {"labels": {"study": study}}}
    for _ in range(2):
        created = client.post("/v1/surveys", headers=analyst, json=body)
        assert created.status_code == 202, created.text
        survey_id = created.json()["id"]
        for _ in range(1200):
            survey = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
            if survey["status"] not in ("queued", "running"):
                break
            time.sleep(0.05)
        assert survey["status"] == "done", survey
        assert survey["progress"]["accepted"] == 4
    for item in objects:
        odometer = client.get(f"/v1/objects/{item['id']}/odometer", headers=analyst).json()
        assert odometer["accepted"] == 2
        assert odometer["delta"] == 0.1
        assert odometer["phase"] == "output-independent"
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems


def _bit_query(j: int) -> dict[str, Any]:
    """``x in {v : bit j of v is 1}`` on ``0 .. 2047``, binary RR of ε₀ = 0.1."""
    members = [v for v in range(2048) if v >> j & 1]
    pred = {"attribute": "x", "op": "in", "value": members}
    return {"mechanism": "binary_rr", "epsilon": 0.1, "predicate": pred}


def test_bit_splits_on_2048_points_stay_within_the_budget(
    client: TestClient, database_url: str
) -> None:
    """Issue 22's reproduction through the service: budget (1, 0.05), the 11 bit queries.

    Whatever the outputs, ``k`` accepted bit queries leave a realized loss of exactly ``0.1 k``
    (the points agreeing with every output and with none). The pairwise F₀ accepted all 11 in
    its output-independent phase (15 queries of 0.1 fit it at any domain size): the odometer
    showed 1.1 > 1.0 with probability 1. Now F₀ (L = log(2048·2047/0.05)) takes 6, the
    Bayesian filter 4 more up to the tie 1.0, and the 11th is refused.
    """
    analyst = new_key(client, "analyst")
    domain = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 2047}]}
    body = {
        "id": unique_id("bits"),
        "domain": domain,
        "value": {"x": 1234},
        "budget": {"epsilon": 1.0, "delta": 0.05},
        "filter": "approx_bayesian",
    }
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 201, r.text
    oid = r.json()["id"]
    phases = []
    for j in range(11):
        r = client.post(
            f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": _bit_query(j)}
        )
        if j < 10:
            assert r.status_code == 201, r.text
            odometer = r.json()["odometer"]
        else:
            assert r.status_code == 409, r.text
            odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
        phases.append(odometer["phase"])
        assert odometer["realized_loss"]["upper"] <= 1.0, (j, odometer)
    assert phases == ["output-independent"] * 6 + ["bayesian"] * 5
    assert odometer["realized_loss"] == {"lower": 1.0, "upper": 1.0, "exact": True}
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems


def test_approx_bayesian_needs_a_finite_domain(client: TestClient) -> None:
    """F₀ bounds the loss over the d(d−1) ordered pairs of points: no finite d, no F₀."""
    real = {"attributes": [{"name": "r", "type": "real", "low": 0, "high": 1}]}
    body = {
        "id": unique_id("real"),
        "domain": real,
        "value": {"r": 0.5},
        "budget": {"epsilon": 1.0, "delta": 0.05},
        "filter": "approx_bayesian",
    }
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "filter" in r.text
    assert "finite domain" in r.text
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": [body]})
    assert r.status_code == 422, r.text
    assert "objects[0].filter" in r.text
    analyst = new_key(client, "analyst")
    loss = {"domain": real, "history": [], "budget": 1.0, "delta": 0.05}
    r = client.post("/v1/loss", headers=auth(analyst), json=loss)
    assert r.status_code == 422, r.text
    assert "delta" in r.text
    assert "finite domain" in r.text
    # the pure filters stay available on continuous domains
    body = {**body, "id": unique_id("real"), "budget": {"epsilon": 1.0}, "filter": "bayesian"}
    assert client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body).status_code == 201

"""A full walk-through of the REST API v1 (contract.md) on SQLite and PostgreSQL.

One finite and one continuous object go through register, metadata, dry-run, submit with an
Idempotency-Key (and its replays), submits until the Bayesian filter rejects, history, odometers,
retirement — with the object's value a sentinel that must never appear in any response body.
Also: the stateless loss calculator, the odometer summary, health, metrics and OpenAPI.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id

PROBLEM = "application/problem+json"

# --- the finite object -------------------------------------------------------------------------
#: The value's "code" is a number that appears nowhere else: not in the domain (only low and high
#: are listed), not in any query, never an output (no query outputs a code).
FINITE_SENTINEL = "987654321007"
FINITE_DOMAIN = {
    "attributes": [
        {"name": "x", "type": "integer", "low": 0, "high": 3},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
        {"name": "code", "type": "integer", "low": 987654321000, "high": 987654321009},
    ]
}
FINITE_VALUE = {"x": 2, "disease": "flu", "code": int(FINITE_SENTINEL)}
FINITE_POINTS = 4 * 3 * 10
GRR_X = {"mechanism": "grr", "attribute": "x", "epsilon": 0.4}
BINARY_CODE = {
    "mechanism": "binary_rr",
    "epsilon": 0.1,
    "predicate": {"attribute": "code", "op": "<=", "value": 987654321003},
}
UNARY_DISEASE = {
    "mechanism": "unary_encoding",
    "attribute": "disease",
    "epsilon": 0.5,
    "variant": "optimized",
}
MATRIX = {
    "mechanism": "matrix",
    "outputs": ["a", "b"],
    "probabilities": [[0.6, 0.4] if i % 2 else [0.4, 0.6] for i in range(FINITE_POINTS)],
}

# --- the continuous object ---------------------------------------------------------------------
CONT_SENTINEL = "73137731377"
CONT_DOMAIN = {
    "attributes": [
        {"name": "x1", "type": "real", "low": -1, "high": 1},
        {"name": "x2", "type": "real", "low": -1, "high": 1},
    ]
}
CONT_VALUE = {"x1": float("0." + CONT_SENTINEL), "x2": -0.25}
#: Tight ε ≈ 0.4509 (the logistic curve over x1 ∈ [-1, 1] with weight 3 does not reach 0 or 1).
LOGISTIC_X1 = {"mechanism": "logistic", "weights": {"x1": 3.0}, "intercept": 0.0, "epsilon": 0.5}
LOGISTIC_X1_TIGHT = 0.4508606839800709
#: ε = 0.3 on x2 only: x1 and x2 are separate, so the realized losses add up exactly.
LINEAR_X2 = {
    "mechanism": "linear",
    "weights": {"x2": 0.5},
    "intercept": 0.0,
    "range": [-0.5, 0.5],
    "epsilon": 0.3,
}
LINEAR_BOTH = {
    "mechanism": "linear",
    "weights": {"x1": 0.25, "x2": 0.25},
    "intercept": 0.1,
    "range": [-0.5, 0.5],
    "truncate": True,
    "epsilon": 0.2,
}

ODOMETER_KEYS = {
    "budget",
    "realized_loss",
    "remaining",
    "basic_composition",
    "accepted",
    "rejected",
    "updated_at",
}
TOL = 1e-6


class Recorder:
    """A client wrapper that keeps every response body, to scan them for the sentinels."""

    def __init__(self, client: TestClient | httpx.Client) -> None:
        self.client = client
        self.bodies: list[str] = []

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.client.request(method, url, **kwargs)
        self.bodies.append(response.text)
        for name, value in response.headers.items():
            self.bodies.append(f"{name}: {value}")
        return response

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def assert_never_saw(self, sentinel: str) -> None:
        assert self.bodies
        leaks = [b for b in self.bodies if sentinel in b]
        assert not leaks, f"the value's sentinel leaked in: {leaks[:3]}"


def assert_problem(response: httpx.Response, status: int, type_: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys(), body
    assert body["status"] == status
    if type_ is not None:
        assert body["type"] == type_, body
    return body


def assert_bounds(bounds: dict[str, float], budget: float | None = None) -> None:
    assert set(bounds) == {"lower", "upper", "exact"}, bounds
    assert isinstance(bounds["exact"], bool), bounds
    assert 0.0 - TOL <= bounds["lower"] <= bounds["upper"] + TOL, bounds
    if budget is not None:
        assert bounds["upper"] <= budget, bounds


def assert_odometer(odo: dict[str, Any], budget: float) -> None:
    assert odo.keys() >= ODOMETER_KEYS, odo
    assert odo["budget"] == budget
    assert_bounds(odo["realized_loss"], budget)
    assert odo["remaining"] == pytest.approx(max(0.0, budget - odo["realized_loss"]["upper"]))
    assert odo["basic_composition"] >= odo["realized_loss"]["upper"] - TOL
    assert isinstance(odo["accepted"], int)
    assert isinstance(odo["rejected"], int)
    assert isinstance(odo["updated_at"], str)


def assert_decision(body: dict[str, Any], outputs: int | None = None) -> None:
    assert body["decision"] in ("accept", "reject"), body
    assert isinstance(body["reason"], str)
    assert body["reason"]
    assert_bounds(body["realized_loss"])
    assert isinstance(body["worst_case_after"], float)
    assert body["worst_case_after"] >= body["realized_loss"]["upper"] - TOL
    assert isinstance(body["per_output"], list)
    assert body["per_output"]
    for item in body["per_output"]:
        assert {"output", "upper"} <= item.keys(), item
        assert item["upper"] <= body["worst_case_after"] + TOL
    assert max(o["upper"] for o in body["per_output"]) == pytest.approx(body["worst_case_after"])
    if outputs is not None:
        assert len(body["per_output"]) == outputs


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> str:
    return new_key(client, "analyst")


@pytest.fixture
def rec(client: TestClient) -> Recorder:
    return Recorder(client)


def _submit(
    rec: Recorder, oid: str, key: str, query: dict[str, Any], idem: str | None = None
) -> httpx.Response:
    headers = auth(key)
    if idem is not None:
        headers["Idempotency-Key"] = idem
    return rec.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": query})


def _check_histories(rec: Recorder, oid: str, key: str, budget: float, accepted: int) -> None:
    """History, odometer and odometer history agree, one point per accepted query."""
    odo = rec.get(f"/v1/objects/{oid}/odometer", headers=auth(key))
    assert odo.status_code == 200, odo.text
    odometer = odo.json()
    assert_odometer(odometer, budget)
    assert odometer["accepted"] == accepted

    hist = rec.get(f"/v1/objects/{oid}/queries", headers=auth(ADMIN_KEY))
    assert hist.status_code == 200, hist.text
    items = hist.json()["items"]
    assert [i["seq"] for i in items] == list(range(1, accepted + 1))
    assert hist.json()["next_after"] is None

    points = rec.get(f"/v1/objects/{oid}/odometer/history", headers=auth(key))
    assert points.status_code == 200, points.text
    body = points.json()
    assert body["object_id"] == oid
    assert body["budget"] == budget
    assert len(body["points"]) == accepted
    basic = 0.0
    previous_at = datetime.min.replace(tzinfo=UTC)
    for n, (point, item) in enumerate(zip(body["points"], items, strict=True), start=1):
        assert point["accepted"] == n
        assert_bounds(point["realized_loss"], budget)
        assert point["realized_loss"] == item["realized_loss_after"]
        basic += point["epsilon"]
        assert point["basic_composition"] == pytest.approx(basic)
        assert point["basic_composition"] == pytest.approx(item["basic_composition_after"])
        # the realized loss never exceeds what basic composition would have charged
        assert point["realized_loss"]["upper"] <= point["basic_composition"] + TOL
        at = datetime.fromisoformat(point["at"])
        assert at >= previous_at
        previous_at = at
    if accepted:
        assert body["points"][-1]["realized_loss"] == odometer["realized_loss"]
        assert body["points"][-1]["basic_composition"] == pytest.approx(
            odometer["basic_composition"]
        )
    # paging through the points one at a time gives the same points
    after, paged = 0, []
    while True:
        page = rec.get(
            f"/v1/objects/{oid}/odometer/history",
            params={"limit": 1, "after": after},
            headers=auth(key),
        ).json()
        paged += page["points"]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert paged == body["points"]


def test_walkthrough_finite_object(client: TestClient, analyst: str, rec: Recorder) -> None:
    oid = unique_id("finite")
    budget = 1.0
    register = {
        "id": oid,
        "domain": FINITE_DOMAIN,
        "value": FINITE_VALUE,
        "budget": {"epsilon": budget},
        "filter": "bayesian",
    }
    r = rec.post("/v1/objects", headers=auth(ADMIN_KEY), json=register)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["id"] == oid
    assert "value" not in created

    # metadata: never the value
    meta = rec.get(f"/v1/objects/{oid}", headers=auth(analyst))
    assert meta.status_code == 200, meta.text
    m = meta.json()
    assert "value" not in m
    assert m["id"] == oid
    assert m["domain"] == FINITE_DOMAIN
    assert m["budget"] == {"epsilon": budget}
    assert m["filter"] == "bayesian"
    assert m["finite"] is True
    assert m["status"] == "active"
    assert m["retired_at"] is None
    assert_odometer(m["odometer"], budget)
    assert m["odometer"]["accepted"] == 0
    assert m["odometer"]["realized_loss"] == {"lower": 0.0, "upper": 0.0, "exact": True}

    # dry-runs of every finite mechanism: all accepted, nothing recorded
    for query, outputs in [
        (GRR_X, 4),
        (BINARY_CODE, 2),
        (UNARY_DISEASE, None),
        (MATRIX, 2),
    ]:
        d = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": query})
        assert d.status_code == 200, d.text
        decision = d.json()
        assert_decision(decision, outputs)
        assert decision["decision"] == "accept", decision
        assert decision["realized_loss"] == {"lower": 0.0, "upper": 0.0, "exact": True}
    # a dry-run whose query alone is too much for the budget is a normal 200 "reject"
    too_much = {**GRR_X, "epsilon": 1.5}
    d = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": too_much})
    assert d.status_code == 200, d.text
    assert_decision(d.json(), 4)
    assert d.json()["decision"] == "reject"
    assert d.json()["worst_case_after"] > budget
    assert rec.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()["accepted"] == 0

    # submit with an Idempotency-Key
    first = _submit(rec, oid, analyst, BINARY_CODE, idem="walk-1")
    assert first.status_code == 201, first.text
    s = first.json()
    assert {"query_id", "output", "odometer"} <= s.keys()
    assert s["output"] in (0, 1)
    assert "Idempotent-Replayed" not in first.headers
    assert_odometer(s["odometer"], budget)
    assert s["odometer"]["accepted"] == 1
    assert s["odometer"]["realized_loss"]["upper"] == pytest.approx(0.1, abs=1e-9)
    assert s["odometer"]["basic_composition"] == pytest.approx(0.1)

    # retry with the same key and body: the same stored answer, never a new sample
    for _ in range(3):
        again = _submit(rec, oid, analyst, BINARY_CODE, idem="walk-1")
        assert again.status_code == 201, again.text
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert again.json()["query_id"] == s["query_id"]
        assert again.json()["output"] == s["output"]
        assert again.json() == s
    # the same body with its keys in another order is the same request
    reordered = dict(reversed(list(BINARY_CODE.items())))
    again = _submit(rec, oid, analyst, reordered, idem="walk-1")
    assert again.status_code == 201, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["query_id"] == s["query_id"]

    # the same key with another body is refused
    other = _submit(rec, oid, analyst, {**BINARY_CODE, "epsilon": 0.2}, idem="walk-1")
    assert_problem(other, 422, "idempotency-key-reused")
    odo = rec.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odo["accepted"] == 1
    assert odo["basic_composition"] == pytest.approx(0.1)

    # submit GRR queries until the Bayesian filter rejects; the loss never exceeds the budget
    accepted, rejection = 1, None
    for n in range(60):
        dry = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": GRR_X})
        assert dry.status_code == 200, dry.text
        assert_decision(dry.json(), 4)
        r = _submit(rec, oid, analyst, GRR_X, idem=f"grr-{n}")
        if r.status_code == 409:
            rejection = r
            assert dry.json()["decision"] == "reject", dry.json()
            break
        assert r.status_code == 201, r.text
        assert dry.json()["decision"] == "accept", dry.json()
        accepted += 1
        out = r.json()
        assert out["output"] in (0, 1, 2, 3)
        assert_odometer(out["odometer"], budget)
        assert out["odometer"]["accepted"] == accepted
        assert out["odometer"]["realized_loss"]["upper"] <= budget
        # the loss after the submit is one of the bounds the dry-run announced
        per = {o["output"]: o for o in dry.json()["per_output"]}
        assert out["odometer"]["realized_loss"]["upper"] <= per[out["output"]]["upper"] + TOL
    assert rejection is not None, "the filter never rejected"
    problem = assert_problem(rejection, 409, "budget-exhausted")
    assert_bounds(problem["realized_loss"], budget)
    assert problem["worst_case_after"] > budget
    assert accepted >= 2

    # a rejection is counted but changes no loss
    odo = rec.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odo["accepted"] == accepted
    assert odo["rejected"] >= 1
    assert odo["realized_loss"] == problem["realized_loss"]
    # the Bayesian filter accepted more than basic composition would have (Σε > budget is
    # possible; never the realized loss)
    assert odo["basic_composition"] == pytest.approx(0.1 + 0.4 * (accepted - 1))

    _check_histories(rec, oid, analyst, budget, accepted)
    # the analyst's own history has every query (all were its own)
    mine = rec.get(f"/v1/objects/{oid}/queries", headers=auth(analyst)).json()["items"]
    assert len(mine) == accepted
    assert mine[0]["query"]["mechanism"] == "binary_rr"
    assert mine[0]["output"] == s["output"]
    assert mine[0]["query_id"] == s["query_id"]

    # retire: no more queries, history still readable
    gone = rec.delete(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY))
    assert gone.status_code == 200, gone.text
    assert gone.json()["status"] == "retired"
    assert gone.json()["retired_at"] is not None
    after = _submit(rec, oid, analyst, {**GRR_X, "epsilon": 0.01}, idem="after-retire")
    assert_problem(after, 409, "object-retired")
    dry = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": GRR_X})
    assert_problem(dry, 409, "object-retired")
    meta = rec.get(f"/v1/objects/{oid}", headers=auth(analyst))
    assert meta.status_code == 200
    assert meta.json()["status"] == "retired"
    _check_histories(rec, oid, analyst, budget, accepted)
    # retiring twice is harmless
    assert rec.delete(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).status_code == 200

    rec.assert_never_saw(FINITE_SENTINEL)


def test_walkthrough_continuous_object(client: TestClient, analyst: str, rec: Recorder) -> None:
    oid = unique_id("cont")
    budget = 1.0
    r = rec.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={"id": oid, "domain": CONT_DOMAIN, "value": CONT_VALUE, "budget": {"epsilon": 1}},
    )
    assert r.status_code == 201, r.text
    meta = rec.get(f"/v1/objects/{oid}", headers=auth(analyst))
    assert meta.status_code == 200
    m = meta.json()
    assert "value" not in m
    assert m["finite"] is False
    assert m["filter"] == "bayesian"
    assert m["budget"] == {"epsilon": budget}
    assert_odometer(m["odometer"], budget)

    # dry-runs of linear (plain and truncated, several attributes) and logistic queries
    for query in (LOGISTIC_X1, LINEAR_X2, LINEAR_BOTH):
        d = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": query})
        assert d.status_code == 200, d.text
        assert_decision(d.json(), 2)
        assert d.json()["decision"] == "accept"
    d = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": LOGISTIC_X1})
    assert d.json()["epsilon"] == pytest.approx(LOGISTIC_X1_TIGHT, rel=1e-9)
    assert {o["output"] for o in d.json()["per_output"]} == {0, 1}

    # logistic on x1, submitted with a key, replayed
    s = _submit(rec, oid, analyst, LOGISTIC_X1, idem="c-1")
    assert s.status_code == 201, s.text
    first = s.json()
    assert first["output"] in (0, 1)
    assert_odometer(first["odometer"], budget)
    # one monotone query on one attribute: the realized loss is its tight ε
    loss = first["odometer"]["realized_loss"]
    assert loss["lower"] == pytest.approx(LOGISTIC_X1_TIGHT, abs=1e-4)
    assert loss["upper"] == pytest.approx(LOGISTIC_X1_TIGHT, abs=1e-4)
    replay = _submit(rec, oid, analyst, LOGISTIC_X1, idem="c-1")
    assert replay.status_code == 201
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json() == first
    assert_problem(_submit(rec, oid, analyst, LINEAR_X2, idem="c-1"), 422, "idempotency-key-reused")

    # linear on x2 (range [-0.5, 0.5] reached exactly): the losses of x1 and x2 add up
    s = _submit(rec, oid, analyst, LINEAR_X2, idem="c-2")
    assert s.status_code == 201, s.text
    assert s.json()["output"] in (-0.5, 0.5)
    loss = s.json()["odometer"]["realized_loss"]
    assert loss["upper"] == pytest.approx(LOGISTIC_X1_TIGHT + 0.3, abs=1e-4)
    assert loss["upper"] <= budget

    # another ε=0.3 query on x2 would reach 1.05 whatever x2's outputs: rejected
    d = rec.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": LINEAR_X2})
    assert d.status_code == 200
    assert_decision(d.json(), 2)
    assert d.json()["decision"] == "reject"
    assert d.json()["worst_case_after"] == pytest.approx(LOGISTIC_X1_TIGHT + 0.6, abs=1e-3)
    rejected = _submit(rec, oid, analyst, LINEAR_X2, idem="c-3")
    problem = assert_problem(rejected, 409, "budget-exhausted")
    assert_bounds(problem["realized_loss"], budget)
    assert problem["worst_case_after"] > budget
    # a rejected key holds its answer (issue #11): replayed as is, and not reusable for
    # another body; a smaller query needs its own key
    replayed = _submit(rec, oid, analyst, LINEAR_X2, idem="c-3")
    assert assert_problem(replayed, 409, "budget-exhausted") == problem
    assert replayed.headers.get("Idempotent-Replayed") == "true"
    small = {**LINEAR_X2, "epsilon": 0.05}
    assert_problem(_submit(rec, oid, analyst, small, idem="c-3"), 422, "idempotency-key-reused")
    s = _submit(rec, oid, analyst, small, idem="c-3b")
    assert s.status_code == 201, s.text
    assert "Idempotent-Replayed" not in s.headers
    assert s.json()["odometer"]["realized_loss"]["upper"] <= budget

    odo = rec.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odo["accepted"] == 3
    assert odo["rejected"] == 1
    _check_histories(rec, oid, analyst, budget, 3)
    hist = rec.get(f"/v1/objects/{oid}/queries", headers=auth(analyst)).json()["items"]
    assert [h["query"]["mechanism"] for h in hist] == ["logistic", "linear", "linear"]
    assert hist[0]["output"] == first["output"]

    gone = rec.delete(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY))
    assert gone.status_code == 200
    assert_problem(_submit(rec, oid, analyst, small, idem="c-4"), 409, "object-retired")
    _check_histories(rec, oid, analyst, budget, 3)

    rec.assert_never_saw(CONT_SENTINEL)


def test_register_returns_201_and_duplicate_is_409(client: TestClient) -> None:
    oid = unique_id()
    body = {"id": oid, "domain": FINITE_DOMAIN, "value": FINITE_VALUE, "budget": {"epsilon": 2}}
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 201, r.text
    assert r.json()["filter"] == "bayesian"  # the default
    dup = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert_problem(dup, 409, "already-exists")
    assert FINITE_SENTINEL not in dup.text


def test_unknown_object_is_404(client: TestClient, analyst: str) -> None:
    oid = unique_id("missing")
    q = {"query": GRR_X}
    for method, url, kwargs in [
        ("GET", f"/v1/objects/{oid}", {}),
        ("POST", f"/v1/objects/{oid}/dry-run", {"json": q}),
        ("POST", f"/v1/objects/{oid}/queries", {"json": q}),
        ("GET", f"/v1/objects/{oid}/queries", {}),
        ("GET", f"/v1/objects/{oid}/odometer", {}),
        ("GET", f"/v1/objects/{oid}/odometer/history", {}),
        ("DELETE", f"/v1/objects/{oid}", {}),
    ]:
        r = client.request(method, url, headers=auth(ADMIN_KEY), **kwargs)
        assert_problem(r, 404, "not-found")


@pytest.mark.parametrize("kind", ["bayesian", "simplified", "basic"])
def test_every_filter_keeps_the_loss_within_the_budget(
    client: TestClient, analyst: str, kind: str
) -> None:
    oid = unique_id(kind)
    budget = 1.0
    r = client.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={
            "id": oid,
            "domain": FINITE_DOMAIN,
            "value": FINITE_VALUE,
            "budget": {"epsilon": budget},
            "filter": kind,
        },
    )
    assert r.status_code == 201, r.text
    accepted = 0
    for n in range(60):
        s = client.post(
            f"/v1/objects/{oid}/queries",
            headers={**auth(analyst), "Idempotency-Key": f"k{n}"},
            json={"query": {**GRR_X, "epsilon": 0.3}},
        )
        if s.status_code == 409:
            assert_problem(s, 409, "budget-exhausted")
            break
        assert s.status_code == 201, s.text
        accepted += 1
        odo = s.json()["odometer"]
        assert odo["realized_loss"]["upper"] <= budget
        if kind == "basic":
            assert odo["basic_composition"] <= budget + 1e-12
    else:
        pytest.fail("never rejected")
    if kind == "basic":
        assert accepted == 3
    else:
        assert accepted >= 3


def test_odometers_paging_and_filters(client: TestClient, analyst: str) -> None:
    prefix = unique_id("page")
    budgets = [0.25, 0.5, 1.5, 2.5, 3.5]
    ids = [f"{prefix}-{n}" for n in range(len(budgets))]
    for oid, budget in zip(ids, budgets, strict=True):
        r = client.post(
            "/v1/objects",
            headers=auth(ADMIN_KEY),
            json={
                "id": oid,
                "domain": FINITE_DOMAIN,
                "value": FINITE_VALUE,
                "budget": {"epsilon": budget},
            },
        )
        assert r.status_code == 201, r.text
    # spend some of the last one's budget
    s = client.post(f"/v1/objects/{ids[-1]}/queries", headers=auth(analyst), json={"query": GRR_X})
    assert s.status_code == 201, s.text
    viewer = new_key(client, "viewer")

    def all_pages(**params: Any) -> tuple[list[dict[str, Any]], int]:
        items: list[dict[str, Any]] = []
        offset, total = 0, None
        while True:
            r = client.get(
                "/v1/odometers",
                params={"limit": 2, "offset": offset, **params},
                headers=auth(viewer),
            )
            assert r.status_code == 200, r.text
            page = r.json()
            assert page["limit"] == 2
            assert page["offset"] == offset
            assert len(page["items"]) <= 2
            total = page["total"] if total is None else total
            assert page["total"] == total
            items += page["items"]
            if len(page["items"]) < 2:
                break
            offset += 2
        assert len(items) == total
        return items, total

    items, total = all_pages()
    seen = [i["id"] for i in items]
    assert len(seen) == len(set(seen)), "an object appears on two pages"
    assert seen == sorted(seen)
    for oid in ids:
        assert oid in seen
    for item in items:
        assert ODOMETER_KEYS | {"id", "filter", "status"} <= item.keys()
        assert "value" not in item
        assert_odometer({k: item[k] for k in ODOMETER_KEYS}, item["budget"])
    mine = {i["id"]: i for i in items if i["id"] in ids}
    assert mine[ids[-1]]["accepted"] == 1
    assert mine[ids[-1]]["remaining"] == pytest.approx(3.5 - 0.4, abs=1e-9)

    low, _ = all_pages(remaining_lt=1.0)
    assert all(i["remaining"] < 1.0 for i in low)
    assert {ids[0], ids[1]} <= {i["id"] for i in low}
    assert not {ids[2], ids[3], ids[4]} & {i["id"] for i in low}

    high, _ = all_pages(remaining_gt=3.0)
    assert all(i["remaining"] > 3.0 for i in high)
    assert ids[-1] in {i["id"] for i in high}  # 3.1 left
    between, _ = all_pages(remaining_gt=1.0, remaining_lt=3.0)
    assert {ids[2], ids[3]} <= {i["id"] for i in between}
    assert not {ids[0], ids[1], ids[4]} & {i["id"] for i in between}

    # retired objects are left out unless asked for
    assert client.delete(f"/v1/objects/{ids[0]}", headers=auth(ADMIN_KEY)).status_code == 200
    active, _ = all_pages(remaining_lt=1.0)
    assert ids[0] not in {i["id"] for i in active}
    with_retired, _ = all_pages(remaining_lt=1.0, include_retired="true")
    retired = [i for i in with_retired if i["id"] == ids[0]]
    assert len(retired) == 1
    assert retired[0]["status"] == "retired"

    # an offset past the end is an empty page
    r = client.get("/v1/odometers", params={"offset": total + 10}, headers=auth(viewer))
    assert r.status_code == 200
    assert r.json()["items"] == []


def test_loss_calculator_shape(client: TestClient, analyst: str) -> None:
    history = [
        {"query": BINARY_CODE, "output": 1},
        {"query": GRR_X, "output": 3},
        {"query": GRR_X, "output": 3},
    ]
    request = {
        "domain": FINITE_DOMAIN,
        "history": history,
        "budget": 4.0,
        "candidate": GRR_X,
        "options": {"tolerance": 1e-4},
    }
    r = client.post("/v1/loss", headers=auth(analyst), json=request)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert_bounds(answer["realized_loss"])
    assert answer["realized_loss"]["upper"] - answer["realized_loss"]["lower"] <= 1e-4
    assert answer["status"] == "ok"
    # two identical GRR outputs plus the predicate: 0.8 + 0.1
    assert answer["realized_loss"]["upper"] == pytest.approx(0.9, abs=1e-6)
    assert answer["basic_composition"] == pytest.approx(0.9)
    cand = answer["candidate"]
    assert len(cand["per_output"]) == 4
    for item in cand["per_output"]:
        assert {"output", "upper"} <= item.keys()
    assert {o["output"] for o in cand["per_output"]} == {0, 1, 2, 3}
    assert cand["worst_case_upper"] == pytest.approx(max(o["upper"] for o in cand["per_output"]))
    assert cand["worst_case_upper"] == pytest.approx(1.3, abs=1e-6)
    assert set(cand["accepted"]) == {"bayesian", "simplified", "basic"}
    assert cand["accepted"] == {"bayesian": True, "simplified": True, "basic": True}

    # without a candidate: no "candidate" key; with a tight budget the filters disagree
    r = client.post(
        "/v1/loss", headers=auth(analyst), json={"domain": FINITE_DOMAIN, "history": history}
    )
    assert r.status_code == 200, r.text
    assert "candidate" not in r.json()
    # outputs 3 then 2 partly cancel: loss 0.5 while basic composition has charged 0.9
    cancelling = [history[0], history[1], {"query": GRR_X, "output": 2}]
    r = client.post(
        "/v1/loss",
        headers=auth(analyst),
        json={**request, "history": cancelling, "budget": 1.0},
    )
    assert r.status_code == 200, r.text
    assert r.json()["realized_loss"]["upper"] == pytest.approx(0.5, abs=1e-6)
    assert r.json()["candidate"]["worst_case_upper"] == pytest.approx(0.9, abs=1e-6)
    assert r.json()["candidate"]["accepted"] == {
        "bayesian": True,
        "simplified": True,
        "basic": False,
    }
    # a candidate needs a budget
    no_budget = {k: v for k, v in request.items() if k != "budget"}
    r = client.post("/v1/loss", headers=auth(analyst), json=no_budget)
    body = assert_problem(r, 422)
    assert body["errors"][0]["field"] == "budget"

    # continuous: a real-attribute history
    r = client.post(
        "/v1/loss",
        headers=auth(analyst),
        json={
            "domain": CONT_DOMAIN,
            "history": [{"query": LOGISTIC_X1, "output": 1}, {"query": LINEAR_X2, "output": -0.5}],
            "budget": 1.0,
            "candidate": LINEAR_X2,
        },
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["realized_loss"]["upper"] == pytest.approx(LOGISTIC_X1_TIGHT + 0.3, abs=1e-4)
    assert answer["candidate"]["accepted"]["bayesian"] is False
    assert answer["candidate"]["worst_case_upper"] > 1.0


def test_health_ready_metrics(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["database"] == "ok"
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    # Prometheus text exposition format
    lines = [line for line in r.text.splitlines() if line and not line.startswith("#")]
    assert lines
    for line in lines:
        name, _, value = line.rpartition(" ")
        assert name
        float(value)
        assert not math.isnan(float(value)) or "nan" in value.lower()
    assert "# TYPE" in r.text


def test_readyz_checks_redis_when_configured(database_url: str, redis_url: str) -> None:
    with TestClient(create_app(make_settings(database_url, redis_url))) as with_redis:
        r = with_redis.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "ok", "database": "ok", "redis": "ok"}
    unreachable = "redis://127.0.0.1:1/0"
    with TestClient(create_app(make_settings(database_url, unreachable))) as without:
        r = without.get("/readyz")
        assert_problem(r, 503, "not-ready")
        assert r.json()["checks"] == {"database": "ok", "redis": "unavailable"}
        assert r.headers.get("retry-after")
        assert without.get("/healthz").status_code == 200


#: Every endpoint of contract.md "REST API (v1)": (method, path).
DESIGN_ENDPOINTS = [
    ("post", "/v1/objects"),
    ("get", "/v1/objects/{object_id}"),
    ("delete", "/v1/objects/{object_id}"),
    ("post", "/v1/objects/{object_id}/dry-run"),
    ("post", "/v1/objects/{object_id}/queries"),
    ("get", "/v1/objects/{object_id}/queries"),
    ("get", "/v1/objects/{object_id}/odometer"),
    ("get", "/v1/objects/{object_id}/odometer/history"),
    ("get", "/v1/odometers"),
    ("post", "/v1/loss"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
]


@pytest.fixture(scope="module")
def openapi(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


@pytest.mark.parametrize(("method", "path"), DESIGN_ENDPOINTS)
def test_openapi_lists_every_design_endpoint(
    openapi: dict[str, Any], method: str, path: str
) -> None:
    assert path in openapi["paths"], sorted(openapi["paths"])
    assert method in openapi["paths"][path]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/objects",
        "/v1/objects/{object_id}/dry-run",
        "/v1/objects/{object_id}/queries",
        "/v1/loss",
    ],
)
def test_openapi_has_request_examples(
    client: TestClient, analyst: str, openapi: dict[str, Any], path: str
) -> None:
    body = openapi["paths"][path]["post"]["requestBody"]
    examples = body["content"]["application/json"]["examples"]
    assert examples
    # the examples are real requests: each is accepted by the service
    for name, example in examples.items():
        value = example["value"]
        if path == "/v1/objects":
            value = {**value, "id": unique_id(name)}
            r = client.post(path, headers=auth(ADMIN_KEY), json=value)
            assert r.status_code == 201, (name, r.text)
        elif path == "/v1/loss":
            r = client.post(path, headers=auth(analyst), json=value)
            assert r.status_code == 200, (name, r.text)
        else:
            oid = unique_id("ex")
            reg = openapi["paths"]["/v1/objects"]["post"]["requestBody"]["content"][
                "application/json"
            ]["examples"]["finite"]["value"]
            r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json={**reg, "id": oid})
            assert r.status_code == 201, r.text
            url = path.replace("{object_id}", oid)
            r = client.post(url, headers=auth(analyst), json=value)
            assert r.status_code in (200, 201), (name, r.text)


def test_openapi_documents_problem_responses(openapi: dict[str, Any]) -> None:
    submit = openapi["paths"]["/v1/objects/{object_id}/queries"]["post"]
    assert "409" in submit["responses"]
    assert "401" in submit["responses"]
    assert any(p.get("name", "").lower() == "idempotency-key" for p in submit.get("parameters", []))

"""Issue 22 item 3 through ``POST /v1/loss``: adversarial continuous cases tight, limits explained.

One case of each shape of :mod:`tests.engine.continuous.adversarial` (ε ≈ 80 with kinks that
meet inside the box, a candidate at ε = 40, weights spanning 1e13 at ε >= 50, a 1e100-wide box)
within 0.01 of its engine-free reference under the default options, and a binding node limit
answered ``status: limit`` with its ``reason`` (valid against the response schema). Runs on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

from functools import cache

import pytest
from fastapi.testclient import TestClient

from app.services import schemas
from tests.engine.continuous.adversarial import all_cases, reference_loss
from tests.service.conftest import auth, new_key

CASES = {case.name: case for case in all_cases()}


@cache
def reference(name: str) -> float:
    return reference_loss(CASES[name], grid=401)


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> str:
    return new_key(client, "analyst")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eps-3-n4", "cand-3", "spread-5-n6", "huge-5-n6"])
def test_adversarial_case_through_the_service(client: TestClient, analyst: str, name: str) -> None:
    case = CASES[name]
    r = client.post("/v1/loss", headers=auth(analyst), json=case.request())
    assert r.status_code == 200, r.text
    answer = r.json()
    schemas.LossResult.model_validate(answer)
    if case.candidate:
        out = case.checked_output()
        row = next(o for o in answer["candidate"]["per_output"] if o["output"] == out)
        lower, upper = row["lower"], row["upper"]
    else:
        lower, upper = answer["realized_loss"]["lower"], answer["realized_loss"]["upper"]
    exact = reference(name)
    assert lower <= exact + 1e-6, (lower, upper, exact)
    assert upper >= exact - 1e-9, (lower, upper, exact)
    assert answer["status"] == "ok", answer
    assert upper - lower <= 0.01
    assert "reason" not in answer


@pytest.mark.slow
def test_a_binding_limit_is_answered_with_its_reason(client: TestClient, analyst: str) -> None:
    request = CASES["eps-2-n8"].request()
    request["options"] = {"max_nodes": 2}
    r = client.post("/v1/loss", headers=auth(analyst), json=request)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["status"] == "limit"
    assert "max_nodes" in answer["reason"]
    assert schemas.LossResult.model_validate(answer).reason == answer["reason"]

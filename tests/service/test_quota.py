"""Project quotas (issue 25): a second Bayesian filter on the project's own sub-history.

The check is independent and exact: ``binary_rr`` on a two-point domain has, for a history of
outputs ``y_i`` with ε = 1/10 as written, realized loss ``|#agree − #disagree| / 10`` exactly
(log P(x=1) − log P(x=0) = Σ ±ε). The Bayesian filter accepts a next query iff that loss after
**every** output stays ≤ the quota, i.e. iff ``(|S| + 1) / 10 <= q`` in rationals (ties accepted:
decimals as written). The test predicts each answer from the outputs the server returned and
compares, while an unscoped analyst's submits on the same object (which the project never saw)
must not count towards the project's quota.
"""

from __future__ import annotations

import secrets
from fractions import Fraction
from typing import Any

from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, unique_id

DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 1}]}
RR = {
    "mechanism": "binary_rr",
    "epsilon": 0.1,
    "predicate": {"attribute": "x", "op": "==", "value": 1},
}
TENTH = Fraction(1, 10)


def _project(client: TestClient, quota: float, team: str) -> tuple[str, str]:
    name = unique_id("quota")
    body = {"name": name, "scope": {"labels": {"team": team}}, "quota": {"epsilon": quota}}
    assert client.post("/v1/projects", headers=auth(ADMIN_KEY), json=body).status_code == 201
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "analyst", "project": name})
    assert r.status_code == 201, r.text
    return name, str(r.json()["key"])


def _object(client: TestClient, budget: float, team: str) -> str:
    oid = unique_id("quota")
    body = {
        "id": oid,
        "domain": DOMAIN,
        "value": {"x": 1},
        "budget": {"epsilon": budget},
        "labels": {"team": team},
    }
    assert client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body).status_code == 201
    return oid


def _submit(client: TestClient, oid: str, key: str) -> Any:
    return client.post(f"/v1/objects/{oid}/queries", headers=auth(key), json={"query": RR})


def test_accepted_count_is_the_exact_bayesian_filter_on_the_projects_sub_history(
    client: TestClient,
) -> None:
    team = secrets.token_hex(4)
    quota = Fraction(3, 10)  # written 0.3: three steps of 0.1 reach it exactly (a tie: accepted)
    project, key = _project(client, 0.3, team)
    oid = _object(client, 1000, team)
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "analyst"})
    unscoped = r.json()["key"]
    walk = 0  # Σ ±1 over the project's outputs: its sub-history's loss is |walk| / 10
    accepted = refused = 0
    for step in range(400):
        if step % 3 == 2:  # the unscoped analyst's queries are not the project's
            assert _submit(client, oid, unscoped).status_code == 201
            continue
        expect_accept = (abs(walk) + 1) * TENTH <= quota
        r = _submit(client, oid, key)
        if expect_accept:
            assert r.status_code == 201, (step, walk, r.text)
            walk += 1 if r.json()["output"] == 1 else -1
            accepted += 1
        else:
            assert r.status_code == 409, (step, walk, r.text)
            problem = r.json()
            assert problem["type"] == "quota-exhausted"
            assert problem["realized_loss"]["upper"] == float(abs(walk) * TENTH)
            assert problem["realized_loss"]["exact"] is True
            refused += 1
            if refused == 3:
                break
    assert refused == 3, "the walk never reached the quota in 400 steps"
    assert abs(walk) == 3
    # the dry-run names the quota's refusal, the object's own filter accepting
    r = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(key), json={"query": RR})
    dry = r.json()
    assert dry["decision"] == "reject"
    assert dry["refusal"] == "quota-exhausted"
    assert dry["quota"]["project"] == project
    assert dry["quota"]["decision"] == "reject"
    assert dry["quota"]["realized_loss"]["upper"] == 0.3
    # its top level is the refusing filter's, as the 409's is: the sub-history against the quota
    assert dry["budget"] == 0.3
    assert dry["realized_loss"] == dry["quota"]["realized_loss"]
    assert dry["worst_case_after"] == dry["quota"]["worst_case_after"]
    # the unscoped analyst is still accepted (only the object's own filter applies)
    assert _submit(client, oid, unscoped).status_code == 201
    # admins' odometer lists the project's sub-history
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY)).json()
    (entry,) = odometer["projects"]
    assert entry["project"] == project
    assert entry["quota"] == 0.3
    assert entry["accepted"] == accepted
    assert entry["realized_loss"]["upper"] == 0.3
    assert entry["realized_loss"]["exact"] is True
    # a project key's own odometer has no projects
    assert "projects" not in client.get(f"/v1/objects/{oid}/odometer", headers=auth(key)).json()


def test_projects_have_separate_sub_histories_and_the_objects_refusal_comes_first(
    client: TestClient,
) -> None:
    team = secrets.token_hex(4)
    _, first = _project(client, 0.1, team)
    _, second = _project(client, 0.1, team)
    oid = _object(client, 0.2, team)  # the object's own budget: two steps of 0.1
    assert _submit(client, oid, first).status_code == 201
    r = _submit(client, oid, first)
    assert r.status_code == 409
    assert r.json()["type"] == "quota-exhausted"  # the object's filter (0.1 + 0.1) accepts
    assert _submit(client, oid, second).status_code == 201  # its own sub-history is empty
    # now the object's filter refuses whatever the outputs (0.2 + 0.1 > 0.2 when they agree)
    for key in (first, second):
        r = _submit(client, oid, key)
        dry = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(key), json={"query": RR})
        odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY)).json()
        loss = Fraction(odometer["realized_loss"]["upper"]).limit_denominator(1000)
        if loss + TENTH > Fraction(2, 10):
            assert r.status_code == 409
            assert r.json()["type"] == "budget-exhausted"  # both refuse: the object's is reported
            assert dry.json()["refusal"] == "budget-exhausted"


def test_a_rejected_quota_replays_its_answer_and_counts_once(client: TestClient) -> None:
    team = secrets.token_hex(4)
    _, key = _project(client, 0.1, team)
    oid = _object(client, 10, team)
    assert _submit(client, oid, key).status_code == 201
    headers = {**auth(key), "Idempotency-Key": unique_id("k")}
    first = client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": RR})
    again = client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": RR})
    assert first.status_code == again.status_code == 409
    assert again.json()["type"] == "quota-exhausted"
    assert again.headers.get("idempotent-replayed") == "true"
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY)).json()
    assert odometer["rejected"] == 1


def test_verify_recomputes_each_projects_sub_history(client: TestClient) -> None:
    """``gatekeeper verify`` recomputes project_states from the stored history; a change fails."""
    from sqlalchemy import text

    from app.services.verify import verify_all

    team = secrets.token_hex(4)
    _, key = _project(client, 5, team)
    oid = _object(client, 100, team)
    for _ in range(4):
        assert _submit(client, oid, key).status_code == 201
    engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
    report = verify_all(engine)
    assert report.ok, report.problems
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE project_states SET loss_upper = loss_upper + 1 WHERE object_id = :o"),
            {"o": oid},
        )
    report = verify_all(engine)
    assert any(oid in p and "realized loss differs" in p for p in report.problems)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE project_states SET loss_upper = loss_upper - 1 WHERE object_id = :o"),
            {"o": oid},
        )
    assert verify_all(engine).ok


def test_concurrent_projects_on_one_object_stay_serialised(client: TestClient) -> None:
    """Two projects submitting at once: every accepted query in exactly one place, verified."""
    from concurrent.futures import ThreadPoolExecutor

    from app.services.verify import verify_all

    team = secrets.token_hex(4)
    keys = [_project(client, 0.5, team)[1] for _ in range(2)]
    oid = _object(client, 1000, team)

    def burst(key: str) -> list[int]:
        return [_submit(client, oid, key).status_code for _ in range(12)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(burst, keys + keys))
    statuses = [s for result in results for s in result]
    assert set(statuses) <= {201, 409}, statuses
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY)).json()
    assert odometer["accepted"] == statuses.count(201)
    assert sum(p["accepted"] for p in odometer["projects"]) == statuses.count(201)
    for entry in odometer["projects"]:  # each within its quota, exactly
        assert entry["realized_loss"]["upper"] <= 0.5
    engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
    report = verify_all(engine)
    assert report.ok, report.problems

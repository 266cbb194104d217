"""A project's survey passes its quota (issue 25 item 3): ``quota-exhausted`` refusals counted.

The check is independent and exact, as in ``test_quota``: ``binary_rr`` with ε = 1/10 (as
written) on a two-point domain gives a sub-history with outputs ``y_i`` the realized loss
``|#agree − #disagree| / 10`` exactly, and the project's Bayesian filter accepts one more
query iff ``(|walk| + 1) / 10 <= q`` in rationals (ties accepted). Before the survey, each
object gets a different sub-history from the project's single submits (some reach the quota);
an unscoped analyst's submits on the same objects do not count. The survey's dry-run, its
counts and its answers must follow the prediction member by member, and a single submit after
it must see the survey's charges (they are in the stored sub-history, ``project_states``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.services.verify import verify_all
from tests.service.conftest import ADMIN_KEY, auth, make_settings, unique_id
from tests.service.test_quota import RR, TENTH, _object, _project, _submit
from tests.service.test_surveys import all_responses, wait_done

QUOTA = Fraction(3, 10)  # written 0.3


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """Surveys in chunks of 4 members, so a cohort spans several chunks."""
    with TestClient(create_app(make_settings(database_url, survey_chunk_size=4))) as test_client:
        yield test_client


def _step(output: Any) -> int:
    return 1 if output == 1 else -1


def _within(walk: int) -> bool:
    return (abs(walk) + 1) * TENTH <= QUOTA


def test_a_project_survey_counts_quota_refusals_and_charges_the_sub_history(
    client: TestClient, database_url: str
) -> None:
    team = secrets.token_hex(4)
    project, key = _project(client, 0.3, team)
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "analyst"})
    unscoped = r.json()["key"]
    ids = [_object(client, 1000, team) for _ in range(14)]
    walks = dict.fromkeys(ids, 0)
    # objects 0..5: the project submits until its quota refuses (|walk| = 3); 6..11: i % 3
    # submits; 12, 13: none. The unscoped analyst asks every other object (not the project's).
    for n, oid in enumerate(ids):
        if n % 2:
            assert _submit(client, oid, unscoped).status_code == 201
        planned = 200 if n < 6 else (n % 3 if n < 12 else 0)
        for _ in range(planned):
            r = _submit(client, oid, key)
            if not _within(walks[oid]):
                assert r.status_code == 409, r.text
                assert r.json()["type"] == "quota-exhausted"
                break
            assert r.status_code == 201, r.text
            walks[oid] += _step(r.json()["output"])
    expect = {oid: _within(walk) for oid, walk in walks.items()}
    accepted = sum(expect.values())
    refused = len(ids) - accepted
    assert refused >= 6  # objects 0..5 reached the quota

    body = {"name": "quota", "query": RR, "cohort": {"labels": {"team": team}}}
    dry = client.post("/v1/surveys/dry-run", headers=auth(key), json=body)
    assert dry.status_code == 200, dry.text
    assert dry.json()["members"] == len(ids)
    assert dry.json()["would_accept"] == accepted
    assert dry.json()["would_refuse"]["quota-exhausted"] == refused
    assert dry.json()["would_refuse"]["budget-exhausted"] == 0

    r = client.post("/v1/surveys", headers=auth(key), json=body)
    assert r.status_code == 202, r.text
    survey = wait_done(client, auth(key), r.json()["id"])
    assert survey["status"] == "done"
    assert survey["progress"]["accepted"] == accepted
    assert survey["progress"]["refused"]["quota-exhausted"] == refused
    assert survey["progress"]["refused"]["budget-exhausted"] == 0
    answers = {item["object_id"]: item for item in all_responses(client, auth(key), survey["id"])}
    for oid in ids:
        item = answers[oid]
        if expect[oid]:
            assert item["decision"] == "accepted", (oid, item)
            walks[oid] += _step(item["output"])
        else:
            assert item["decision"] == "refused", (oid, item)
            assert item["reason"] == "quota-exhausted", (oid, item)

    # admins' odometers show the survey's charges in the project's sub-history, exactly
    for oid in ids:
        odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY)).json()
        # every object has seen the project: a submit before the survey, or the survey's answer
        (entry,) = [e for e in odometer["projects"] if e["project"] == project]
        assert entry["realized_loss"]["upper"] == float(abs(walks[oid]) * TENTH), oid
        assert entry["realized_loss"]["exact"] is True
    # a single submit after the survey sees its charges
    for oid in ids:
        r = _submit(client, oid, key)
        if _within(walks[oid]):
            assert r.status_code == 201, (oid, walks[oid], r.text)
            walks[oid] += _step(r.json()["output"])
        else:
            assert r.status_code == 409, (oid, walks[oid], r.text)
            assert r.json()["type"] == "quota-exhausted"
            assert r.json()["realized_loss"]["upper"] == float(abs(walks[oid]) * TENTH)
    assert verify_all(client.app.state.runtime.engine).ok  # type: ignore[attr-defined]


def test_an_unscoped_survey_is_not_held_by_any_quota(client: TestClient) -> None:
    team = secrets.token_hex(4)
    _, key = _project(client, 0.1, team)
    ids = [_object(client, 1000, team) for _ in range(3)]
    for oid in ids:  # each object's project sub-history is at its quota
        assert _submit(client, oid, key).status_code == 201
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "analyst"})
    unscoped = auth(r.json()["key"])
    body = {"name": unique_id("free"), "query": RR, "cohort": {"ids": ids}}
    r = client.post("/v1/surveys", headers=unscoped, json=body)
    assert r.status_code == 202, r.text
    survey = wait_done(client, unscoped, r.json()["id"])
    assert survey["progress"]["accepted"] == 3
    assert survey["progress"]["refused"]["quota-exhausted"] == 0
    # the project's own survey of the same objects is refused by its quota on every member
    r = client.post("/v1/surveys", headers=auth(key), json=body)
    survey = wait_done(client, auth(key), r.json()["id"])
    assert survey["progress"]["accepted"] == 0
    assert survey["progress"]["refused"]["quota-exhausted"] == 3

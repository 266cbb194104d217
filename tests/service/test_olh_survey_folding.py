"""A survey after an ``olh`` survey (issue 26): histories read per chunk, folded states grouped.

After an ``olh`` answer each member's history is its own (``objects.state_pending``), so a later
survey used to decide each member alone, reading its history with four statements. Now a
chunk reads all its pending members' histories at once
(:func:`app.services.history.object_histories`, checked here against :func:`object_history`)
and members whose folded states are equal share one decision. Over a 3-value attribute an
``olh`` answer's subset is one of 8, so 60 members fold to at most 8 states: the later survey
has at most 8 decision groups, and every member's columns are still its own history's (the
lazy state equals the eager fold, ``gatekeeper verify`` is clean, a dry-run decides as the
stateless calculator).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.db.session import make_engine
from app.services.history import HistoryMismatch, object_histories, object_history
from app.services.verify import verify_all
from app.store import reading
from app.store.objects import load_state
from tests.service import test_olh_survey_states as olh_states
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id

DOMAIN = {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": 2}]}
MEMBERS = 60


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """Surveys in chunks of 7 members (groups split across chunks)."""
    with TestClient(create_app(make_settings(database_url, survey_chunk_size=7))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


@pytest.fixture(autouse=True)
def _three_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The states module's checks (eager fold, calculator) over this file's domain."""
    monkeypatch.setattr(olh_states, "DOMAIN", DOMAIN)


def _histories_agree(database_url: str, ids: list[str]) -> None:
    engine = make_engine(database_url)
    try:
        with reading(engine) as conn:
            accepted = {}
            for oid in ids:
                row = load_state(conn, object_id=oid)
                assert row is not None
                accepted[oid] = len(object_history(conn, oid))
            batch = object_histories(conn, accepted)
            assert set(batch) == set(ids)
            for oid in ids:
                assert batch[oid] == object_history(conn, oid), oid
            # a count the stored entries do not match is refused, as object_history does
            wrong = {ids[0]: accepted[ids[0]] + 1}
            with pytest.raises(HistoryMismatch):
                object_histories(conn, wrong)
    finally:
        engine.dispose()


def test_a_survey_after_olh_groups_equal_folded_states(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    study = unique_id("olhf")
    budget = 6.0
    ids = [f"{study}-{i:03d}" for i in range(MEMBERS)]
    body = {
        "objects": [
            {"id": oid, "domain": DOMAIN, "value": {"v": i % 3}, "budget": {"epsilon": budget},
             "labels": {"study": study}}
            for i, oid in enumerate(ids)
        ]
    }  # fmt: skip
    assert client.post("/v1/imports", headers=auth(ADMIN_KEY), json=body).status_code == 200
    olh = {"mechanism": "olh", "attribute": "v", "epsilon": 1.0}
    olh_states._survey(client, analyst, study, olh)
    # two members get a single submit: their arrays are stored, nothing pending
    grr = {"mechanism": "grr", "attribute": "v", "epsilon": 0.5}
    for oid in ids[:2]:
        r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": grr})
        assert r.status_code == 201, r.text
    rows, _ = olh_states._rows(database_url, ids)
    assert [rows[oid][1] for oid in ids[:3]] == [0, 0, 1]
    _histories_agree(database_url, ids)
    # the next survey: the 58 pending members fold to at most 8 states (one olh subset of
    # 3 values each), the 2 others share the stored arrays their histories name
    later = olh_states._survey(client, analyst, study, grr)
    assert later["progress"]["accepted"] == MEMBERS
    assert later["groups"] <= 8 + 2
    rows, _ = olh_states._rows(database_url, ids)
    assert [rows[oid][1] for oid in ids[:3]] == [0, 0, 2]
    olh_states._lazy_equals_eager(database_url, ids)
    _histories_agree(database_url, ids)
    # and once more: two pending entries each, still grouped, still exact
    again = olh_states._survey(client, analyst, study, olh)
    assert again["progress"]["accepted"] == MEMBERS
    olh_states._lazy_equals_eager(database_url, ids)
    for oid in ids[:3] + ids[-2:]:
        olh_states._same_as_the_calculator(client, analyst, oid, olh, budget)
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems

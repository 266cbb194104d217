"""A survey after an ``olh`` survey decides a chunk's members together, as each alone would.

After an ``olh`` survey every member's history is its own, so a later survey decides each one
on its own folded state. A chunk now folds and decides them together
(:func:`app.engine.likelihood.fold_many`, :func:`app.engine.pipeline.evaluate_many`) and
computes the losses after the answers at once. Checked here, for ``grr``, ``olh`` and
``binary_rr`` after ``olh``, on members of every filter and budgets at and around the exact
ties (ε = 1 twice against 1.25, 1.5, 2.0 and 2.5; Algorithm 4 with δ): before the second
survey each member's snapshot is read as a single submit reads it
(:func:`~app.services.snapshots.snapshot_of`); after it, the per-member road
(:func:`~app.engine.pipeline.evaluate`, :func:`~app.engine.pipeline.record`) on that snapshot
and the output the survey drew gives the survey's decision (an answer in the history, or a
refusal counted), the stored loss columns and the history entry's bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.db.session import make_engine
from app.engine.domain import parse_domain
from app.engine.limits import DEFAULT_LIMITS
from app.engine.mechanisms import parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record
from app.services.snapshots import snapshot_of, stored_history
from app.services.verify import verify_all
from app.store import reading
from app.store.objects import load_state
from tests.service import test_olh_survey_states as olh_states
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id

DOMAIN = {
    "attributes": [
        {"name": "v", "type": "integer", "low": 0, "high": 4},
        {"name": "s", "type": "categorical", "values": ["a", "b"]},
    ]
}
MEMBERS = 48
BUDGETS = [1.25, 1.5, 2.0, 2.5]
FILTERS = ["bayesian", "simplified", "basic", "approx_bayesian"]
LATER = {
    "grr": {"mechanism": "grr", "attribute": "v", "epsilon": 1.0},
    "olh": {"mechanism": "olh", "attribute": "v", "epsilon": 1.0},
    "binary_rr": {
        "mechanism": "binary_rr",
        "predicate": {"attribute": "v", "op": ">=", "value": 2},
        "epsilon": 1.0,
    },
}


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """Surveys in chunks of 11 members (several chunks of mixed filters and budgets)."""
    with TestClient(create_app(make_settings(database_url, survey_chunk_size=11))) as test_client:
        yield test_client


@pytest.fixture(autouse=True)
def _this_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The states module's eager-fold check over this file's domain."""
    monkeypatch.setattr(olh_states, "DOMAIN", DOMAIN)


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


def _objects(study: str) -> list[dict[str, Any]]:
    objects = []
    for i in range(MEMBERS):
        kind = FILTERS[i % len(FILTERS)]
        budget: dict[str, Any] = {"epsilon": BUDGETS[(i // len(FILTERS)) % len(BUDGETS)]}
        if kind == "approx_bayesian":
            budget["delta"] = 0.05 if i % 8 == 3 else 1e-6
        objects.append(
            {
                "id": f"{study}-{i:03d}",
                "domain": DOMAIN,
                "value": {"v": i % 5, "s": "ab"[i % 2]},
                "budget": budget,
                "filter": kind,
                "labels": {"study": study},
            }
        )
    return objects


def _snapshots(database_url: str, ids: list[str]) -> dict[str, ObjectSnapshot]:
    """Each member's snapshot as a single submit reads it (stored array + pending entries)."""
    domain = parse_domain(DOMAIN)
    engine = make_engine(database_url)
    try:
        with reading(engine) as conn:
            found = {}
            for oid in ids:
                row = load_state(conn, object_id=oid)
                assert row is not None
                found[oid] = snapshot_of(conn, row, domain, DEFAULT_LIMITS)
            return found
    finally:
        engine.dispose()


@pytest.mark.parametrize("later", sorted(LATER))
def test_a_survey_after_olh_decides_each_member_as_alone(
    client: TestClient, analyst: dict[str, str], database_url: str, later: str
) -> None:
    study = unique_id(f"olhb-{later}")
    objects = _objects(study)
    ids = [o["id"] for o in objects]
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": objects})
    assert r.status_code == 200, r.text
    first = olh_states._survey(client, analyst, study, LATER["olh"])
    assert first["progress"]["accepted"] == MEMBERS
    before = _snapshots(database_url, ids)
    query = LATER[later]
    survey = olh_states._survey(client, analyst, study, query)
    domain = parse_domain(DOMAIN)
    mech = parse_query(query, domain)
    engine = make_engine(database_url)
    accepted = refused = 0
    try:
        with reading(engine) as conn:
            for oid in ids:
                snapshot = before[oid]
                want = evaluate(snapshot, mech)
                entries = stored_history(conn, oid, domain)
                row = load_state(conn, object_id=oid)
                assert row is not None
                if not want.accepted:
                    refused += 1
                    assert len(entries) == 1, oid
                    continue
                accepted += 1
                assert len(entries) == 2, oid
                drawn = entries[-1].output
                after = record(snapshot, mech, drawn, want).loss()
                assert (row.loss_lower, row.loss_upper) == (after.lower, after.upper), oid
                assert after.value is not None  # exact: ties decided as written
    finally:
        engine.dispose()
    assert survey["progress"]["accepted"] == accepted
    assert survey["progress"]["refused"]["budget-exhausted"] == refused
    assert accepted
    assert refused
    olh_states._lazy_equals_eager(database_url, ids)
    report = verify_all(make_engine(database_url))
    assert report.ok, report.problems

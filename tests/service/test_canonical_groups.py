"""Issue 27 item 3: survey members grouped by the content of their likelihood state.

Members whose histories hold the same randomized-response outputs in another order share one
stored array (named by its content) and one decision. The diverging seven-survey sequence is
run twice on two identical populations, drawing the same outputs: once on the canonical path,
once on the path before it (groups and arrays by history: ``decision_key`` the identity,
``content_key`` none). Every member's decisions and answers, every survey's counts, tally and
estimate, and every final odometer must be equal; the canonical run must decide fewer groups and
store fewer arrays; ``gatekeeper verify`` must be clean after both.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.bootstrap import create_app
from app.db.session import make_engine
from app.engine.limits import DEFAULT_LIMITS, EngineLimits
from app.engine.mechanisms.base import Output
from app.engine.mechanisms.randomized_response import GeneralizedRR
from app.services import snapshots, survey_groups, survey_runs, surveys
from app.store.surveys import GroupKey
from app.worker.pool import BoundWorker, WorkerSettings
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.factories import driven_survey
from tests.service.test_surveys import all_responses, verify_clean, wait_done

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 3},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "region", "type": "categorical", "values": ["a", "b", "c", "d", "e"]},
    ]
}
SEQUENCE = ["region", "age", "sex", "region", "age", "sex", "region"]
MEMBERS = 160
#: Basic composition accepts the first four answers of ε = 0.5; from the fifth the Bayesian
#: filter decides on each history's content, and refuses some members.
BUDGET = 2.25


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """One survey thread of this process (chunks in order: both runs draw their outputs in the
    same order, from the sampling this module patches — a survey child process would not see
    the patch)."""
    settings = make_settings(
        database_url, survey_chunk_size=16, survey_threads=1, survey_processes=0
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _population(client: TestClient, study: str) -> list[str]:
    rng = random.Random(27)  # the same values in both studies
    ids = [f"{study}-{i:04d}" for i in range(MEMBERS)]
    objects = [
        {
            "id": oid,
            "domain": DOMAIN,
            "value": {
                "age": rng.randrange(4),
                "sex": rng.randrange(2),
                "region": "abcde"[min(int(rng.expovariate(0.8)), 4)],
            },
            "budget": {"epsilon": BUDGET},
            "filter": "bayesian",
            "labels": {"study": study},
        }
        for oid in ids
    ]
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": objects})
    assert r.status_code == 200, r.text
    return ids


def _run(
    client: TestClient,
    analyst: dict[str, str],
    study: str,
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
) -> dict[str, Any]:
    """The seven surveys on ``study``, outputs drawn from a stream seeded the same for each run."""
    stream = random.Random(2027)

    def sample(self: GeneralizedRR, value: Any) -> Output:
        self.attribute.index_of(value[self.attribute.name], self.attribute.name)
        return stream.randrange(self.k)

    monkeypatch.setattr(GeneralizedRR, "sample", sample)
    # a chunk draws its members at once (sample_many): from the same stream, in order
    monkeypatch.setattr(
        GeneralizedRR, "sample_many", lambda self, values: [sample(self, v) for v in values]
    )
    ids = _population(client, study)
    surveys, states = [], []
    for attribute in SEQUENCE:
        query = {"mechanism": "grr", "attribute": attribute, "epsilon": 0.5}
        body = {"name": attribute, "query": query, "cohort": {"labels": {"study": study}}}
        dry = client.post("/v1/surveys/dry-run", headers=analyst, json=body)
        assert dry.status_code == 200, dry.text
        r = client.post("/v1/surveys", headers=analyst, json=body)
        assert r.status_code == 202, r.text
        view = wait_done(client, analyst, r.json()["id"])
        assert view["status"] == "done", view
        # the dry-run decides the same groups, as the run does
        assert dry.json()["would_accept"] == view["progress"]["accepted"]
        assert dry.json()["groups"] == view["groups"]
        responses = {
            item["object_id"]: {k: v for k, v in item.items() if k != "object_id"}
            for item in all_responses(client, analyst, view["id"])
        }
        surveys.append((view, responses))
        states.append(view["groups"])
    odometers = {}
    for oid in ids:
        r = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY))
        assert r.status_code == 200, r.text
        odometers[oid.split("-")[-1]] = {
            k: v for k, v in r.json().items() if k not in ("object_id", "updated_at")
        }
    return {
        "surveys": surveys,
        "odometers": odometers,
        "groups": states,
        "columns": _columns(database_url, study),
    }


def _columns(database_url: str, study: str) -> dict[str, tuple[Any, ...]]:
    """Each object's stored accounting columns and its array's row (by the object's number)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT o.id, o.state_hash, o.state_pending, o.loss_lower, o.loss_upper, "
                    "o.basic_total, o.f0_account, s.state, s.err FROM objects o "
                    "LEFT JOIN likelihood_states s ON s.hash = o.state_hash "
                    "WHERE o.id LIKE :prefix"
                ),
                {"prefix": f"{study}-%"},
            ).all()
    finally:
        engine.dispose()
    return {row[0].split("-")[-1]: tuple(row[1:]) for row in rows}


def _comparable(view: dict[str, Any]) -> dict[str, Any]:
    """A survey's view without what names it or times it (and without its group count)."""
    drop = {"id", "created_at", "started_at", "finished_at", "updated_at", "name", "cohort"}
    drop |= {"groups", "links", "duration_seconds"}
    return {k: v for k, v in view.items() if k not in drop}


def _by_number(responses: dict[str, Any]) -> dict[str, Any]:
    return {oid.split("-")[-1]: item for oid, item in responses.items()}


def test_canonical_groups_decide_as_the_ordered_ones(
    client: TestClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    analyst = auth(new_key(client, "analyst"))
    named: list[int] = []  # (group, output) pairs named by content before any array is built
    fast = survey_runs._exact_advance

    def counted(*args: Any) -> Any:
        found = fast(*args)
        named.append(found is not None)
        return found

    with monkeypatch.context() as counting:
        counting.setattr(survey_runs, "_exact_advance", counted)
        canonical = _run(client, analyst, unique_id("canon"), monkeypatch, database_url)
    # not vacuous: every (group, output) pair of the sequence took the named path (all are
    # exact histories)
    assert named
    assert all(named), len(named)
    # the per-pair path (h/canon): every (group, output) recorded and its array serialised,
    # no content named before its array is built
    with monkeypatch.context() as per_pair:
        per_pair.setattr(survey_runs, "_exact_advance", lambda *args: None)
        recorded = _run(client, analyst, unique_id("pair"), monkeypatch, database_url)
    for (view, answers), (pair_view, pair_answers) in zip(
        canonical["surveys"], recorded["surveys"], strict=True
    ):
        assert view["groups"] == pair_view["groups"]
        assert _comparable(view) == _comparable(pair_view)
        assert _by_number(answers) == _by_number(pair_answers)
    assert canonical["odometers"] == recorded["odometers"]
    # every object's columns and state key; the arrays themselves are the ones the per-pair
    # path stores, bit for bit (this population's first member of each content is the same)
    assert canonical["columns"].keys() == recorded["columns"].keys()
    for number, columns in canonical["columns"].items():
        assert columns[:6] == recorded["columns"][number][:6], number
        assert columns[6] is not None, number
        assert columns[6] == recorded["columns"][number][6], number
    with monkeypatch.context() as old:
        old.setattr(survey_runs, "decision_key", lambda key, parsed: key)
        old.setattr(surveys, "decision_key", lambda key, parsed: key)
        old.setattr(snapshots, "content_key", lambda domain_text, state: None)
        ordered = _run(client, analyst, unique_id("order"), monkeypatch, database_url)
    for (view, answers), (old_view, old_answers) in zip(
        canonical["surveys"], ordered["surveys"], strict=True
    ):
        assert _comparable(view) == _comparable(old_view)
        assert _by_number(answers) == _by_number(old_answers)
    assert canonical["odometers"] == ordered["odometers"]
    # not vacuous: the filter refused some members and accepted others on diverged histories
    last = canonical["surveys"][-1][0]["progress"]
    assert 0 < last["accepted"] < MEMBERS, last
    # fewer decisions: histories in another order with the same outputs are one group
    assert canonical["groups"][:4] == ordered["groups"][:4]
    assert sum(canonical["groups"]) < sum(ordered["groups"]), (canonical, ordered)
    verify_clean(database_url)


def test_the_decision_key_ignores_only_a_finite_history_hash() -> None:
    parsed = survey_groups.ParsedQuery(
        limits=EngineLimits(),
        query={"mechanism": "grr", "attribute": "sex", "epsilon": 0.5},
    )
    finite = json.dumps(DOMAIN)
    continuous = json.dumps({"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]})
    base = GroupKey(
        finite, 2.0, "bayesian", "1/2", "h1", "s1", 0, 0.5, 0.5, None, "0", None, None, 0.0, 0.0
    )
    assert survey_groups.decision_key(base, parsed) == base._replace(history_hash=None)
    pending = base._replace(state_pending=1)
    assert survey_groups.decision_key(pending, parsed) == pending
    other = base._replace(domain=continuous, state_hash=None)
    assert survey_groups.decision_key(other, parsed) == other


def test_a_state_stored_and_forgotten_meanwhile_is_not_written_without_its_array(
    client: TestClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed chunk's states keep only their keys in the run's cache (not their bytes).

    If the run forgets them meanwhile (another thread's chunk lost a race: a state may have
    been deleted), a chunk holding a cached answer that names one must not store it without
    its array: it fails (``StateGone``), forgets, and is decided again with the array built.
    """
    monkeypatch.setattr(GeneralizedRR, "sample", lambda self, value: 1)  # every answer "b"
    monkeypatch.setattr(GeneralizedRR, "sample_many", lambda self, values: [1] * len(values))
    study = unique_id("gone")
    _population(client, study)
    engine = make_engine(database_url)
    worker = BoundWorker(WorkerSettings(processes=0))
    body = {
        "name": "gone",
        "query": {"mechanism": "grr", "attribute": "region", "epsilon": 0.5},
        "cohort": {"labels": {"study": study}},
    }
    try:
        survey_id, request = driven_survey(
            engine, body, max_members=MEMBERS, chunk_size=40, owner="test"
        )
        cache = survey_runs.new_run_cache(request.query, DEFAULT_LIMITS)
        run = {"engine": engine, "worker": worker, "survey_id": survey_id, "limits": DEFAULT_LIMITS}
        assert survey_runs.run_chunk(chunk=0, cache=cache, **run).accepted == 40
        (key,) = cache.stored  # one state: every member answered "b" on an empty history
        assert cache.contents[key].state == b""  # stored: its bytes dropped
        cache.stored.clear()  # as a concurrent chunk's forget, seen half-way
        with pytest.raises(snapshots.StateGone):
            survey_runs.run_chunk(chunk=1, cache=cache, **run)
        assert not cache.contents  # forgotten: built again
        assert not cache.advances
        for chunk in range(1, MEMBERS // 40):
            assert survey_runs.run_chunk(chunk=chunk, cache=cache, **run).accepted == 40
    finally:
        worker.close()
        engine.dispose()
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT length(state), (SELECT count(*) FROM objects o WHERE "
                    "o.state_hash = s.hash) FROM likelihood_states s WHERE hash = :key"
                ),
                {"key": key},
            ).all()
    finally:
        engine.dispose()
    assert len(rows) == 1
    assert rows[0][0] > 0
    assert rows[0][1] == MEMBERS
    verify_clean(database_url)

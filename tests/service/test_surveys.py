"""Population surveys through the API (issue #13), on SQLite and PostgreSQL.

Labels and bulk import; a survey decides every member once, through the same filter as single
submits, grouped by public state; responses, estimates, refusals by reason, dry-run, cancel;
``gatekeeper verify`` stays clean; bad input answers 422 naming the field.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.bootstrap import create_app
from app.db.models import LikelihoodStateRecord, ProtectedObject
from app.db.session import make_engine
from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.services.history import object_history
from app.services.verify import verify_all
from app.store.states import count_unnamed
from app.worker.pool import BoundWorker, WorkerSettings
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.factories import driven_survey, run_cli

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 9},
        {"name": "flu", "type": "categorical", "values": ["no", "yes", "unsure"]},
    ]
}
GRR = {"mechanism": "grr", "attribute": "flu", "epsilon": 1.0}
MAX_MEMBERS = 500


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """An app whose surveys run in small chunks (several chunks per survey) and cap cohorts."""
    settings = make_settings(database_url, survey_chunk_size=7, survey_max_members=MAX_MEMBERS)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


def registration(
    oid: str, study: str, value: dict[str, Any], budget: float = 5.0
) -> dict[str, Any]:
    return {
        "id": oid,
        "domain": DOMAIN,
        "value": value,
        "budget": {"epsilon": budget},
        "labels": {"study": study, "site": "berlin"},
    }


def import_study(
    client: TestClient | httpx.Client, study: str, n: int, budget: float = 5.0
) -> list[str]:
    ids = [f"{study}-{i:04d}" for i in range(n)]
    body = {
        "objects": [
            registration(oid, study, {"age": i % 10, "flu": ["no", "yes", "unsure"][i % 3]}, budget)
            for i, oid in enumerate(ids)
        ]
    }
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"created": n, "existing": 0}
    return ids


def wait_done(
    client: TestClient | httpx.Client, headers: dict[str, str], survey_id: int
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = client.get(f"/v1/surveys/{survey_id}", headers=headers)
        assert r.status_code == 200, r.text
        if r.json()["status"] not in ("queued", "running"):
            return dict(r.json())
        time.sleep(0.05)
    raise AssertionError(f"survey {survey_id} did not finish: {r.json()}")


def all_responses(client: TestClient, headers: dict[str, str], survey_id: int) -> list[Any]:
    items: list[Any] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 10}
        if after is not None:
            params["after"] = after
        r = client.get(f"/v1/surveys/{survey_id}/responses", headers=headers, params=params)
        assert r.status_code == 200, r.text
        items.extend(r.json()["items"])
        after = r.json()["next_after"]
        if after is None:
            return items


def verify_clean(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        report = verify_all(engine)
    finally:
        engine.dispose()
    assert report.ok, report.problems


# ------------------------------------------------------------------------------ labels, import
def test_labels_are_shown_and_filter_odometers(client: TestClient) -> None:
    study = unique_id("lab")
    import_study(client, study, 3)
    r = client.get(f"/v1/objects/{study}-0001", headers=auth(ADMIN_KEY))
    assert r.json()["labels"] == {"study": study, "site": "berlin"}
    r = client.get("/v1/odometers", headers=auth(ADMIN_KEY), params={"label": f"study:{study}"})
    assert r.status_code == 200, r.text
    assert [i["id"] for i in r.json()["items"]] == [f"{study}-{i:04d}" for i in range(3)]
    assert r.json()["total"] == 3
    both = {"label": [f"study:{study}", "site:paris"]}
    assert client.get("/v1/odometers", headers=auth(ADMIN_KEY), params=both).json()["total"] == 0
    twice = {"label": [f"study:{study}", "study:other"]}  # all must hold: nothing can
    assert client.get("/v1/odometers", headers=auth(ADMIN_KEY), params=twice).json()["total"] == 0
    bad = client.get("/v1/odometers", headers=auth(ADMIN_KEY), params={"label": "nocolon"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "label"


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"bad name": "x"}, "labels"),
        ({"study": 3}, "labels.study"),
        ({f"k{i}": "v" for i in range(21)}, "labels"),
        ({"study": ""}, "labels.study"),
    ],
)
def test_bad_labels_are_refused_naming_the_field(
    client: TestClient, labels: dict[str, Any], field: str
) -> None:
    body = registration(unique_id("bad"), "s", {"age": 1, "flu": "no"})
    body["labels"] = labels
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == field


def test_import_is_all_or_nothing_and_idempotent(client: TestClient) -> None:
    study = unique_id("imp")
    good = [registration(f"{study}-{i}", study, {"age": i, "flu": "no"}) for i in range(4)]
    bad = [*good, {**good[0], "id": f"{study}-x", "value": {"age": 99, "flu": "no"}}]
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": bad})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "objects[4].value.age"
    none = client.get("/v1/odometers", headers=auth(ADMIN_KEY), params={"label": f"study:{study}"})
    assert none.json()["total"] == 0  # nothing stored

    key = {"Idempotency-Key": unique_id("k"), **auth(ADMIN_KEY)}
    r = client.post("/v1/imports", headers=key, json={"objects": good[:2]})
    assert r.json() == {"created": 2, "existing": 0}
    again = client.post("/v1/imports", headers=key, json={"objects": good[:2]})
    assert again.json() == {"created": 2, "existing": 0}
    assert again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/imports", headers=key, json={"objects": good})
    assert other.status_code == 422  # the key with another body

    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": good})
    assert r.json() == {"created": 2, "existing": 2}  # resumable: registered ones are existing

    changed = [{**good[0], "budget": {"epsilon": 9.0}}]
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": changed})
    assert r.status_code == 409, r.text
    assert "objects[0]" in r.json()["detail"]

    twice = client.post(
        "/v1/imports", headers=auth(ADMIN_KEY), json={"objects": [good[0], good[0]]}
    )
    assert twice.status_code == 422
    assert twice.json()["errors"][0]["field"] == "objects[1].id"


def test_import_takes_ndjson_and_refuses_too_many(client: TestClient) -> None:
    study = unique_id("nd")
    lines = [
        json.dumps(registration(f"{study}-{i}", study, {"age": 1, "flu": "yes"})) for i in range(3)
    ]
    body = "\n".join(lines) + "\n\n"
    headers = {"Content-Type": "application/x-ndjson", **auth(ADMIN_KEY)}
    r = client.post("/v1/imports", headers=headers, content=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"created": 3, "existing": 0}
    broken = client.post("/v1/imports", headers=headers, content=lines[0] + "\n{not json\n")
    assert broken.status_code == 400
    assert "objects[1]" in broken.json()["detail"]
    many = {"objects": [{"id": "x"}] * 10_001}
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json=many)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "objects"


def test_import_is_admin_only(client: TestClient, analyst: dict[str, str]) -> None:
    r = client.post("/v1/imports", headers=analyst, json={"objects": []})
    assert r.status_code == 403


# ------------------------------------------------------------------------------ surveys
def test_a_survey_queries_each_member_once_and_estimates(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    study = unique_id("sv")
    ids = import_study(client, study, 45)
    body = {"name": "flu", "query": GRR, "cohort": {"labels": {"study": study}}}
    dry = client.post("/v1/surveys/dry-run", headers=analyst, json=body)
    assert dry.status_code == 200, dry.text
    assert dry.json() == {
        "members": 45,
        "would_accept": 45,
        "would_refuse": {
            "budget-exhausted": 0,
            "invalid-for-domain": 0,
            "retired": 0,
            "lifetime-exhausted": 0,
            "quota-exhausted": 0,
        },
        "groups": 1,
        "would_reuse": 0,
    }
    r = client.post("/v1/surveys", headers=analyst, json=body)
    assert r.status_code == 202, r.text
    assert r.headers["Location"] == f"/v1/surveys/{r.json()['id']}"
    survey = wait_done(client, analyst, r.json()["id"])
    assert survey["status"] == "done"
    assert survey["progress"] == {
        "total": 45,
        "decided": 45,
        "accepted": 45,
        "reused": 0,
        "refused": {
            "budget-exhausted": 0,
            "invalid-for-domain": 0,
            "retired": 0,
            "lifetime-exhausted": 0,
            "quota-exhausted": 0,
        },
    }
    assert survey["groups"] == 1  # fresh objects: one public state, decided once
    estimate = survey["estimate"]
    assert estimate["kind"] == "histogram"
    assert estimate["n"] == 45
    assert set(estimate["values"]) == {"no", "yes", "unsure"}
    assert sum(survey["outputs"].values()) == 45

    responses = all_responses(client, analyst, survey["id"])
    assert [item["object_id"] for item in responses] == ids
    assert {item["decision"] for item in responses} == {"accepted"}
    # each member has exactly one history row, with the response's output
    for item in responses[:5]:
        history = client.get(f"/v1/objects/{item['object_id']}/queries", headers=analyst).json()
        assert [h["output"] for h in history["items"]] == [item["output"]]
    viewer = auth(new_key(client, "viewer"))
    hidden = client.get(f"/v1/surveys/{survey['id']}/responses", headers=viewer).json()
    assert "output" not in hidden["items"][0]  # outputs: the survey's analyst and admins
    verify_clean(database_url)

    # a second survey: members now differ by their first output, so a few groups
    second = client.post("/v1/surveys", headers=analyst, json=body).json()
    second = wait_done(client, analyst, second["id"])
    assert second["progress"]["accepted"] == 45
    assert 1 < second["groups"] <= 3
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = sum(len(object_history(conn, oid)) for oid in ids)
            named = (
                conn.execute(select(ProtectedObject.state_hash).where(ProtectedObject.id.in_(ids)))
                .scalars()
                .all()
            )
            stored = (
                conn.execute(
                    select(LikelihoodStateRecord.hash).where(LikelihoodStateRecord.hash.in_(named))
                )
                .scalars()
                .all()
            )
            unnamed = count_unnamed(conn)
    finally:
        engine.dispose()
    assert rows == 90
    assert len(named) == 45
    assert 1 <= len(set(stored)) == len(set(named)) <= 9  # 45 objects share at most 9 arrays
    assert unnamed == 0  # the first survey's arrays: deleted at the second's end
    verify_clean(database_url)


def test_a_failed_collection_of_states_does_not_stop_a_survey_finishing(
    client: TestClient, analyst: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collection at a survey's end may fail: its garbage waits, the survey is done."""

    def fail(engine: object) -> int:
        raise RuntimeError("the collection failed")

    monkeypatch.setattr(survey_runs, "collect_states", fail)
    study = unique_id("cf")
    import_study(client, study, 6)
    body = {"name": "flu", "query": GRR, "cohort": {"labels": {"study": study}}}
    survey = client.post("/v1/surveys", headers=analyst, json=body).json()
    done = wait_done(client, analyst, survey["id"])
    assert done["status"] == "done"
    assert done["progress"]["accepted"] == 6


def test_refusals_by_reason_and_the_same_decision_as_a_submit(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    study = unique_id("rf")
    ids = import_study(client, study, 9, budget=1.5)
    other = {  # a domain without the survey's attribute: the query is invalid there
        "id": f"{study}-other",
        "domain": {"attributes": [{"name": "age", "type": "integer", "low": 0, "high": 9}]},
        "value": {"age": 3},
        "budget": {"epsilon": 5.0},
        "labels": {"study": study},
    }
    assert client.post("/v1/objects", headers=auth(ADMIN_KEY), json=other).status_code == 201
    assert client.delete(f"/v1/objects/{ids[0]}", headers=auth(ADMIN_KEY)).status_code == 200
    body = {"name": "flu", "query": GRR, "cohort": {"labels": {"study": study}}}
    first = wait_done(
        client, analyst, client.post("/v1/surveys", headers=analyst, json=body).json()["id"]
    )
    assert first["progress"]["accepted"] == 8
    assert first["progress"]["refused"] == {
        "budget-exhausted": 0,
        "invalid-for-domain": 1,
        "retired": 1,
        "lifetime-exhausted": 0,
        "quota-exhausted": 0,
    }
    # after one grr of ε=1 a second exceeds the budget 1.5 for some outputs: the dry-run, the
    # survey and a single submit's dry-run agree member by member
    dry = client.post("/v1/surveys/dry-run", headers=analyst, json=body).json()
    singles = {
        oid: client.post(f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": GRR}).json()[
            "decision"
        ]
        for oid in ids[1:]
    }
    second = wait_done(
        client, analyst, client.post("/v1/surveys", headers=analyst, json=body).json()["id"]
    )
    responses = {r["object_id"]: r for r in all_responses(client, analyst, second["id"])}
    for oid, decision in singles.items():
        expected = "accepted" if decision == "accept" else "refused"
        assert responses[oid]["decision"] == expected, oid
    assert dry["would_accept"] == second["progress"]["accepted"]
    assert dry["would_refuse"] == second["progress"]["refused"]
    refused = [oid for oid, r in responses.items() if r["reason"] == "budget-exhausted"]
    for oid in refused:  # a refusal is counted on the object's odometer
        assert client.get(f"/v1/objects/{oid}/odometer", headers=analyst).json()["rejected"] == 1
    verify_clean(database_url)


def test_bad_cohorts_answer_422_naming_the_problem(
    client: TestClient, analyst: dict[str, str]
) -> None:
    nothing = {"name": "x", "query": GRR, "cohort": {"labels": {"study": unique_id("none")}}}
    r = client.post("/v1/surveys", headers=analyst, json=nothing)
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "invalid-cohort"
    assert client.post("/v1/surveys/dry-run", headers=analyst, json=nothing).status_code == 422

    study = unique_id("bc")
    ids = import_study(client, study, 2)
    unknown = {"name": "x", "query": GRR, "cohort": {"ids": [ids[0], "nobody-1", "nobody-2"]}}
    r = client.post("/v1/surveys", headers=analyst, json=unknown)
    assert r.status_code == 422, r.text
    assert r.json()["unknown_ids"] == ["nobody-1", "nobody-2"]

    big = {
        "name": "x",
        "query": GRR,
        "cohort": {"ids": [f"id-{i}" for i in range(MAX_MEMBERS + 1)]},
    }
    r = client.post("/v1/surveys", headers=analyst, json=big)
    assert r.status_code == 422, r.text
    assert "SURVEY_MAX_MEMBERS" in r.json()["detail"]

    for body, field in [
        ({"name": "x", "query": GRR}, "cohort"),
        ({"name": "", "query": GRR, "cohort": {"ids": ids}}, "name"),
        ({"name": "x", "query": GRR, "cohort": {"ids": ids, "labels": {"a": "b"}}}, "cohort"),
        ({"name": "x", "query": GRR, "cohort": {"ids": [ids[0], ids[0]]}}, "cohort.ids[1]"),
        ({"name": "x", "query": {"epsilon": 1}, "cohort": {"ids": ids}}, "query.mechanism"),
        # invalid for every member's domain: no member could answer it
        (
            {"name": "x", "query": {**GRR, "attribute": "nope"}, "cohort": {"ids": ids}},
            "query.attribute",
        ),
        (
            {
                "name": "x",
                "query": {"mechanism": "logistic", "weights": {}, "intercept": 0},
                "cohort": {"ids": ids},
            },
            "query.epsilon",
        ),
    ]:
        r = client.post("/v1/surveys", headers=analyst, json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["errors"][0]["field"] == field, (body, r.text)


def test_idempotency_key_creates_one_survey(client: TestClient, analyst: dict[str, str]) -> None:
    study = unique_id("idk")
    import_study(client, study, 3)
    body = {"name": "once", "query": GRR, "cohort": {"labels": {"study": study}}}
    headers = {"Idempotency-Key": unique_id("key"), **analyst}
    first = client.post("/v1/surveys", headers=headers, json=body)
    again = client.post("/v1/surveys", headers=headers, json=body)
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    wait_done(client, analyst, first.json()["id"])


def test_cancel_stops_before_undecided_members(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    """Created and cancelled between two chunks (driven here, not by the app's runner)."""
    study = unique_id("cx")
    import_study(client, study, 20)
    engine = make_engine(database_url)
    worker = BoundWorker(WorkerSettings(processes=0))
    body = {"name": "cancel me", "query": GRR, "cohort": {"labels": {"study": study}}}
    try:
        survey_id, _ = driven_survey(
            engine, body, max_members=MAX_MEMBERS, chunk_size=6, owner="test"
        )
        first = survey_runs.run_chunk(
            engine=engine, worker=worker, survey_id=survey_id, chunk=0, limits=DEFAULT_LIMITS
        )
        assert first.decided == 6
        r = client.delete(f"/v1/surveys/{survey_id}", headers=auth(ADMIN_KEY))
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "cancelled"
        status = survey_runs.run_survey(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            owner="test",
            limits=DEFAULT_LIMITS,
            lease_seconds=5,
        )
        assert status == "cancelled"
    finally:
        worker.close()
        engine.dispose()
    final = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
    assert final["progress"]["decided"] == 6
    responses = all_responses(client, auth(ADMIN_KEY), survey_id)
    # the undecided members will never be asked: "cancelled", not "pending" forever
    decisions = [r["decision"] for r in responses]
    assert decisions.count("cancelled") == 14
    assert "pending" not in decisions
    # an analyst who did not create it may not cancel it
    assert client.delete(f"/v1/surveys/{survey_id}", headers=analyst).status_code == 403
    verify_clean(database_url)


def test_surveys_are_listed_newest_first_and_audited(
    client: TestClient, analyst: dict[str, str]
) -> None:
    study = unique_id("ls")
    import_study(client, study, 2)
    body = {"name": "list", "query": GRR, "cohort": {"labels": {"study": study}}}
    made = [client.post("/v1/surveys", headers=analyst, json=body).json()["id"] for _ in range(3)]
    for survey_id in made:
        wait_done(client, analyst, survey_id)
    page = client.get("/v1/surveys", headers=analyst, params={"limit": 2}).json()
    assert [s["id"] for s in page["items"]] == [made[2], made[1]]
    rest = client.get("/v1/surveys", headers=analyst, params={"before": page["next_before"]}).json()
    assert rest["items"][0]["id"] == made[0]
    events = client.get("/v1/audit", headers=auth(ADMIN_KEY), params={"limit": 1000}).json()
    kinds = [e["kind"] for e in events["events"]]
    assert "survey.created" in kinds
    assert "survey.finished" in kinds
    assert "objects.imported" in kinds
    assert client.get("/v1/surveys/999999", headers=analyst).status_code == 404


def test_gatekeeper_import_streams_a_file_and_resumes(tmp_path: Path, database_url: str) -> None:
    """The command imports in batches; run again after an interruption it skips what is there."""
    study = unique_id("cli")
    lines = [
        json.dumps(registration(f"{study}-{i:03d}", study, {"age": i % 10, "flu": "no"}))
        for i in range(25)
    ]
    part = tmp_path / "part.ndjson"
    part.write_text("\n".join(lines[:12]) + "\n")
    whole = tmp_path / "whole.ndjson"
    whole.write_text("\n".join(lines) + "\n")
    first = run_cli("import", str(part), "--batch-size", "5", database_url=database_url)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"created": 12, "existing": 0}
    again = run_cli("import", str(whole), "--batch-size", "5", database_url=database_url)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"created": 13, "existing": 12}
    assert "import" in again.stderr  # the progress bar (stderr)

    bad = tmp_path / "bad.ndjson"
    broken = json.loads(lines[0])
    broken["id"] = f"{study}-bad"
    broken["budget"] = {"epsilon": -1}
    bad.write_text(lines[1] + "\n\n" + json.dumps(broken) + "\n")
    failed = run_cli("import", str(bad), database_url=database_url)
    assert failed.returncode == 2
    assert "line 3, field budget.epsilon" in failed.stderr
    garbage = tmp_path / "garbage.ndjson"
    garbage.write_text("{not json\n")
    failed = run_cli("import", str(garbage), database_url=database_url)
    assert failed.returncode == 2
    assert "line 1: not valid JSON" in failed.stderr
    # the first bad line is reported, whichever way the lines after it are bad (the malformed
    # line 4 used to be reported before the invalid line 2 of the same batch)
    both = tmp_path / "both.ndjson"
    both.write_text("\n".join([lines[1], json.dumps(broken), lines[2], "{not json"]) + "\n")
    failed = run_cli("import", str(both), "--jobs", "0", database_url=database_url)
    assert failed.returncode == 2
    assert "line 2, field budget.epsilon" in failed.stderr
    assert "line 4" not in failed.stderr


@pytest.mark.parametrize("jobs", ["0", "2"])
def test_gatekeeper_import_stores_every_batch_before_a_bad_line(
    tmp_path: Path, database_url: str, client: TestClient, jobs: str
) -> None:
    """With worker processes parsing ahead or without, the batches before a bad line are stored
    and the ones after it are not."""
    study = unique_id(f"cli{jobs}")
    lines = [
        json.dumps(registration(f"{study}-{i:03d}", study, {"age": i % 10, "flu": "no"}))
        for i in range(20)
    ]
    lines[12] = "[1, 2"  # line 13, in the third batch of five
    path = tmp_path / "mixed.ndjson"
    path.write_text("\n".join(lines) + "\n")
    failed = run_cli(
        "import",
        str(path),
        "--batch-size",
        "5",
        "--jobs",
        jobs,
        "--jobs-min-lines",
        "0",  # the workers start for these 20 lines
        database_url=database_url,
    )
    assert failed.returncode == 2
    assert "line 13: not valid JSON" in failed.stderr
    page = client.get(
        "/v1/odometers", params={"label": f"study:{study}", "limit": 100}, headers=auth(ADMIN_KEY)
    ).json()
    assert len(page["items"]) == 10


def test_metrics_count_members_groups_and_states(
    client: TestClient, analyst: dict[str, str]
) -> None:
    def sample(text: str, name: str) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    before = client.get("/metrics").text
    study = unique_id("mx")
    import_study(client, study, 12)
    body = {"name": "metrics", "query": GRR, "cohort": {"labels": {"study": study}}}
    wait_done(client, analyst, client.post("/v1/surveys", headers=analyst, json=body).json()["id"])
    after = client.get("/metrics").text
    accepted = 'gatekeeper_survey_members_total{outcome="accepted"}'
    assert sample(after, accepted) - sample(before, accepted) == 12
    assert sample(after, "gatekeeper_survey_groups_total") > sample(
        before, "gatekeeper_survey_groups_total"
    )
    assert sample(after, "gatekeeper_likelihood_states ") >= 3  # one per output at least
    assert sample(after, 'gatekeeper_surveys{status="done"}') >= 1


@pytest.mark.parametrize("mechanism", ["olh", "hadamard"])
def test_a_frequency_oracle_survey_estimates_what_the_client_decodes(
    client: TestClient, analyst: dict[str, str], database_url: str, mechanism: str
) -> None:
    """``olh``/``hadamard`` surveys: every member answers once with its own output, the tally
    is the per-value support counts, and the estimate equals what the client library decodes
    from the responses; ``gatekeeper verify`` replays the histories."""
    from ldp_gatekeeper_client.oracles import estimate_frequencies, support_counts

    study = unique_id("fo")
    ids = import_study(client, study, 30)
    query = {"mechanism": mechanism, "attribute": "flu", "epsilon": 1.0}
    body = {"name": "oracle", "query": query, "cohort": {"labels": {"study": study}}}
    r = client.post("/v1/surveys", headers=analyst, json=body)
    assert r.status_code == 202, r.text
    survey = wait_done(client, analyst, r.json()["id"])
    assert survey["status"] == "done"
    assert survey["progress"]["accepted"] == 30
    estimate = survey["estimate"]
    assert estimate["kind"] == "histogram"
    assert estimate["n"] == 30
    assert set(estimate["values"]) == {"no", "yes", "unsure"}
    responses = all_responses(client, analyst, survey["id"])
    assert [item["object_id"] for item in responses] == ids
    canonical = survey["query"]
    counts = support_counts(canonical, [item["output"] for item in responses], 3)
    # the raw tally is the support count per value, as the client decodes it
    assert survey["outputs"] == {
        json.dumps(v): c for v, c in zip(["no", "yes", "unsure"], counts, strict=True)
    }
    decoded = estimate_frequencies(canonical, counts, 30)
    for value, found in zip(["no", "yes", "unsure"], decoded, strict=True):
        assert estimate["values"][value] == pytest.approx(found.value, abs=1e-12)
        assert estimate["stderr"][value] == pytest.approx(found.stderr, abs=1e-12)
    verify_clean(database_url)

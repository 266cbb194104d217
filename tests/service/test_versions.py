"""Data versions and lifetime budgets through the API (issue 24), on SQLite and PostgreSQL.

A new version closes the current one (its history kept, readable with ``?version=``) and opens
a fresh per-version filter; the lifetime budget bounds the sum of the versions' realized losses,
with exact ties at ε_L; bulk versions are all or nothing and idempotent; bad input names the
field and never echoes a value; ``gatekeeper verify`` replays every version and the sums.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.db.session import make_engine
from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.services.verify import verify_all
from app.worker.pool import BoundWorker, WorkerSettings
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.factories import driven_survey, run_cli

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
BOX = {"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]}
ADMIN = auth(ADMIN_KEY)


def rr(epsilon: float) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": epsilon,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


def register(
    client: TestClient,
    *,
    budget: float,
    lifetime: float | None = None,
    domain: dict[str, Any] = BINARY,
    value: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    oid = unique_id("ver")
    body: dict[str, Any] = {
        "id": oid,
        "domain": domain,
        "value": value if value is not None else {"b": 1},
        "budget": {"epsilon": budget},
    }
    if lifetime is not None:
        body["lifetime"] = {"epsilon": lifetime}
    if labels is not None:
        body["labels"] = labels
    r = client.post("/v1/objects", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return oid


def submit(client: TestClient, headers: dict[str, str], oid: str, query: Any) -> Any:
    return client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": query})


def new_version(client: TestClient, oid: str, value: Any) -> Any:
    return client.post(f"/v1/objects/{oid}/versions", headers=ADMIN, json={"value": value})


def check_verify(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        report = verify_all(engine)
    finally:
        engine.dispose()
    assert report.ok, report.problems[:5]


def test_a_new_version_closes_the_old_one_and_keeps_its_history(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    oid = register(client, budget=1.0)
    assert client.get(f"/v1/objects/{oid}", headers=ADMIN).json()["version"] == 1
    for _ in range(3):
        assert submit(client, analyst, oid, rr(0.2)).status_code == 201
    before = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    assert before["accepted"] == 3
    assert before["version"] == 1
    assert "lifetime" not in before

    r = new_version(client, oid, {"b": 0})
    assert r.status_code == 201, r.text
    assert r.json() == {"object_id": oid, "version": 2}

    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    assert odometer["version"] == 2
    assert odometer["accepted"] == 0
    assert odometer["rejected"] == 0
    assert odometer["realized_loss"] == {"lower": 0.0, "upper": 0.0, "exact": True}
    assert odometer["basic_composition"] == 0.0
    assert odometer["remaining"] == 1.0

    current = client.get(f"/v1/objects/{oid}/queries", headers=ADMIN).json()
    assert current["items"] == []
    old = client.get(f"/v1/objects/{oid}/queries?version=1", headers=ADMIN).json()
    assert [item["seq"] for item in old["items"]] == [1, 2, 3]
    assert {item["version"] for item in old["items"]} == {1}
    history = client.get(f"/v1/objects/{oid}/odometer/history?version=1", headers=ADMIN).json()
    assert history["version"] == 1
    assert [p["accepted"] for p in history["points"]] == [1, 2, 3]
    assert client.get(f"/v1/objects/{oid}/queries?version=3", headers=ADMIN).status_code == 404

    # the fresh filter answers from the new value; seq numbers go on across versions
    r = submit(client, analyst, oid, rr(0.5))
    assert r.status_code == 201, r.text
    assert r.json()["seq"] == 4
    assert r.json()["version"] == 2
    assert r.json()["odometer"]["accepted"] == 1
    now = client.get(f"/v1/objects/{oid}/queries", headers=ADMIN).json()["items"]
    assert [(i["seq"], i["version"]) for i in now] == [(4, 2)]
    chart = client.get(f"/v1/objects/{oid}/odometer/history", headers=ADMIN).json()
    assert [p["accepted"] for p in chart["points"]] == [1]
    check_verify(database_url)


def test_the_odometer_history_says_when_each_version_began(
    client: TestClient, analyst: dict[str, str]
) -> None:
    oid = register(client, budget=1.0)
    registered = client.get(f"/v1/objects/{oid}", headers=ADMIN).json()["created_at"]
    assert submit(client, analyst, oid, rr(0.2)).status_code == 201
    assert new_version(client, oid, {"b": 0}).status_code == 201
    assert submit(client, analyst, oid, rr(0.2)).status_code == 201
    assert new_version(client, oid, {"b": 1}).status_code == 201

    def page(version: int | None) -> dict[str, Any]:
        query = "" if version is None else f"?version={version}"
        r = client.get(f"/v1/objects/{oid}/odometer/history{query}", headers=ADMIN)
        assert r.status_code == 200, r.text
        return dict(r.json())

    first, second, third = page(1), page(2), page(None)
    assert third["version"] == 3
    assert third["points"] == []
    # version 1 began at registration; each later one when it was created: after the last
    # query of the version before it and before the first query of its own
    assert first["created_at"] == registered
    when = datetime.fromisoformat
    assert when(first["points"][-1]["at"]) <= when(second["created_at"])
    assert when(second["created_at"]) <= when(second["points"][0]["at"])
    assert when(second["points"][-1]["at"]) <= when(third["created_at"])
    assert page(3)["created_at"] == third["created_at"]


def test_lifetime_ties_are_accepted_and_the_sum_refuses_past_it(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    """ε_g = ε_L = 0.3: version 1 spends exactly 0.1 (one binary_rr output); on version 2 a
    query of ε = 0.2 brings the life to 0.1 + 0.2 = 0.3 exactly (0.30000000000000004 in
    doubles): accepted; then ε = 0.1 fits the version (0.3) but not the life (0.4)."""
    oid = register(client, budget=0.3, lifetime=0.3)
    view = client.get(f"/v1/objects/{oid}", headers=ADMIN).json()
    assert view["lifetime"] == {"epsilon": 0.3}
    assert submit(client, analyst, oid, rr(0.1)).status_code == 201
    assert new_version(client, oid, {"b": 0}).status_code == 201
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    assert odometer["lifetime"]["realized_loss"] == {"lower": 0.1, "upper": 0.1, "exact": True}
    assert odometer["lifetime"]["versions"] == 2

    dry = client.post(f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": rr(0.2)}).json()
    assert dry["decision"] == "accept", dry
    r = submit(client, analyst, oid, rr(0.2))
    assert r.status_code == 201, r.text
    lifetime = r.json()["odometer"]["lifetime"]
    assert lifetime == {
        "budget": 0.3,
        "realized_loss": {"lower": 0.3, "upper": 0.3, "exact": True},
        "versions": 2,
        "remaining": 0.0,
    }

    dry = client.post(f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": rr(0.1)}).json()
    assert dry["decision"] == "reject"
    assert dry["refusal"] == "lifetime-exhausted"
    r = submit(client, analyst, oid, rr(0.1))
    assert r.status_code == 409
    assert r.json()["type"].endswith("lifetime-exhausted")
    # the version's own filter refuses first: budget-exhausted, not lifetime-exhausted
    r = submit(client, analyst, oid, rr(0.3))
    assert r.status_code == 409
    assert r.json()["type"].endswith("budget-exhausted")
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    assert odometer["rejected"] == 2
    check_verify(database_url)


def test_a_new_version_of_a_spent_lifetime_is_stored_but_answers_nothing(
    client: TestClient, analyst: dict[str, str]
) -> None:
    oid = register(client, budget=0.5, lifetime=0.5)
    assert submit(client, analyst, oid, rr(0.5)).status_code == 201
    assert new_version(client, oid, {"b": 0}).status_code == 201
    r = submit(client, analyst, oid, rr(0.1))
    assert r.status_code == 409
    assert r.json()["type"].endswith("lifetime-exhausted")
    assert new_version(client, oid, {"b": 1}).json()["version"] == 3


def test_continuous_lifetime_bounds_add(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    linear = {
        "mechanism": "linear",
        "weights": {"x": 1},
        "intercept": 0,
        "range": [0, 1],
        "epsilon": 0.4,
    }
    oid = register(client, budget=1.0, lifetime=1.0, domain=BOX, value={"x": 0.25})
    # one output of a linear query of ε = 0.4 always costs 0.4 (y = x spans [0, 1])
    assert submit(client, analyst, oid, linear).status_code == 201
    closed = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()["realized_loss"]
    assert closed["upper"] == pytest.approx(0.4, abs=1e-3)
    assert new_version(client, oid, {"x": 0.75}).status_code == 201
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    assert odometer["lifetime"]["realized_loss"]["upper"] >= closed["upper"]
    assert odometer["lifetime"]["realized_loss"]["lower"] <= closed["lower"]
    # 0.4 + 0.4 fits ε_L = 1; the next query's worst output brings the version to 0.8 (within
    # ε_g = 1) and the life to 1.2: lifetime-exhausted
    assert submit(client, analyst, oid, linear).status_code == 201
    last = submit(client, analyst, oid, linear)
    assert last.status_code == 409
    assert last.json()["type"].endswith("lifetime-exhausted")
    lifetime = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()["lifetime"]
    assert lifetime["realized_loss"]["upper"] == pytest.approx(0.8, abs=1e-3)
    check_verify(database_url)


def test_bad_single_versions(client: TestClient, analyst: dict[str, str]) -> None:
    secret = 987654321
    assert new_version(client, "no-such-object", {"b": 0}).status_code == 404
    assert new_version(client, "bad%00id", {"b": 0}).status_code == 404
    oid = register(client, budget=1.0)
    r = new_version(client, oid, {"b": secret})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"].startswith("value")
    assert str(secret) not in r.text
    r = client.post(f"/v1/objects/{oid}/versions", headers=ADMIN, json={"value": {}, "x": 1})
    assert r.status_code == 422
    r = client.post(f"/v1/objects/{oid}/versions", headers=analyst, json={"value": {"b": 0}})
    assert r.status_code == 403
    assert client.delete(f"/v1/objects/{oid}", headers=ADMIN).status_code == 200
    r = new_version(client, oid, {"b": 0})
    assert r.status_code == 409
    assert r.json()["type"].endswith("object-retired")
    # a lifetime below the per-version budget
    body = {
        "id": unique_id("ver"),
        "domain": BINARY,
        "value": {"b": 1},
        "budget": {"epsilon": 1.0},
        "lifetime": {"epsilon": 0.5},
    }
    r = client.post("/v1/objects", headers=ADMIN, json=body)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "lifetime.epsilon"


def test_bulk_versions_all_or_nothing_and_idempotent(client: TestClient, database_url: str) -> None:
    ids = [register(client, budget=1.0) for _ in range(3)]
    body = {"versions": [{"id": oid, "value": {"b": i % 2}} for i, oid in enumerate(ids)]}
    key = {**ADMIN, "Idempotency-Key": unique_id("bulk")}
    r = client.post("/v1/versions", headers=key, json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"created": 3, "versions": [{"id": oid, "version": 2} for oid in ids]}
    again = client.post("/v1/versions", headers=key, json=body)
    assert again.status_code == 200
    assert again.json() == r.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert client.get(f"/v1/objects/{ids[0]}", headers=ADMIN).json()["version"] == 2
    changed = {"versions": [{"id": ids[0], "value": {"b": 1}}]}
    assert client.post("/v1/versions", headers=key, json=changed).status_code == 422

    # one bad value: 422 naming it, nothing stored
    bad = {
        "versions": [
            {"id": ids[0], "value": {"b": 1}},
            {"id": ids[1], "value": {"b": 7777}},
        ]
    }
    r = client.post("/v1/versions", headers=ADMIN, json=bad)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "versions[1].value.b"
    assert "7777" not in r.text
    assert client.get(f"/v1/objects/{ids[0]}", headers=ADMIN).json()["version"] == 2
    unknown = {"versions": [{"id": ids[0], "value": {"b": 1}}, {"id": "nobody", "value": {}}]}
    r = client.post("/v1/versions", headers=ADMIN, json=unknown)
    assert r.status_code == 404
    assert "versions[1]" in r.json()["detail"]
    repeated = {"versions": [{"id": ids[0], "value": {"b": 1}}] * 2}
    r = client.post("/v1/versions", headers=ADMIN, json=repeated)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "versions[1].id"
    assert client.get(f"/v1/objects/{ids[0]}", headers=ADMIN).json()["version"] == 2
    # without a key each request makes new versions
    plain = {"versions": [{"id": ids[2], "value": {"b": 1}}]}
    assert client.post("/v1/versions", headers=ADMIN, json=plain).json()["versions"][0] == {
        "id": ids[2],
        "version": 3,
    }
    assert client.post("/v1/versions", headers=ADMIN, json=plain).json()["versions"][0] == {
        "id": ids[2],
        "version": 4,
    }
    check_verify(database_url)


def test_versions_are_audited_and_counted(client: TestClient) -> None:
    oid = register(client, budget=1.0)
    before = _counter(client)
    assert new_version(client, oid, {"b": 0}).status_code == 201
    assert _counter(client) == before + 1
    events = client.get("/v1/audit", headers=ADMIN, params={"object_id": oid}).json()
    kinds = [e["kind"] for e in events["events"]]
    assert "object.version_created" in kinds


def _counter(client: TestClient) -> float:
    text = client.get("/metrics", headers=ADMIN).text
    for line in text.splitlines():
        if line.startswith("gatekeeper_versions_created_total "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture(scope="module")
def postgres_client(postgres_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(postgres_url))) as test_client:
        yield test_client


def test_concurrent_versions_and_submits_are_serialised(
    postgres_client: TestClient, postgres_url: str
) -> None:
    """Threads submitting and creating versions on one object (PostgreSQL): every accepted
    query lands in exactly one version, the versions' ranges are contiguous and every version's
    state replays (``gatekeeper verify``)."""
    client = postgres_client
    headers = auth(new_key(client, "analyst"))
    oid = register(client, budget=50.0, lifetime=10_000.0)
    codes: list[int] = []
    guard = threading.Lock()

    def submitter() -> None:
        for _ in range(10):
            r = submit(client, headers, oid, rr(0.3))
            with guard:
                codes.append(r.status_code)

    def versioner() -> None:
        for i in range(5):
            r = new_version(client, oid, {"b": i % 2})
            with guard:
                codes.append(r.status_code)

    threads = [threading.Thread(target=submitter) for _ in range(3)]
    threads.append(threading.Thread(target=versioner))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {201}, codes
    view = client.get(f"/v1/objects/{oid}", headers=ADMIN).json()
    assert view["version"] == 6
    total = 0
    for version in range(1, 7):
        items = client.get(
            f"/v1/objects/{oid}/queries",
            headers=ADMIN,
            params={"version": version, "limit": 1000},
        ).json()["items"]
        assert all(item["version"] == version for item in items)
        total += len(items)
    assert total == 30
    check_verify(postgres_url)


def test_a_survey_asks_each_member_s_current_version(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    """A survey created before a bulk version is decided after it: each member answers from its
    current version (the one the survey finds when its chunk is decided), once per survey.

    Members: ``spent`` took 0.2 of its lifetime 0.3 on version 1 (its version 2 has 0.1 left,
    the survey's ε = 0.2 is refused ``lifetime-exhausted``), ``fresh`` has room. The dry-run
    counts the lifetime refusal separately; responses carry the version answered.
    """
    study = unique_id("study")
    labels = {"study": study}
    spent = register(client, budget=0.3, lifetime=0.3, labels=labels)
    fresh = register(client, budget=0.3, lifetime=0.6, labels=labels)
    assert submit(client, analyst, spent, rr(0.2)).status_code == 201
    survey_body = {"name": "after a version", "query": rr(0.2), "cohort": {"labels": labels}}
    engine = make_engine(database_url)
    worker = BoundWorker(WorkerSettings(processes=0))
    try:
        survey_id, _ = driven_survey(
            engine, survey_body, max_members=100, chunk_size=10, owner="test"
        )
        bulk = {"versions": [{"id": spent, "value": {"b": 0}}, {"id": fresh, "value": {"b": 0}}]}
        assert client.post("/v1/versions", headers=ADMIN, json=bulk).status_code == 200
        dry = client.post("/v1/surveys/dry-run", headers=analyst, json=survey_body).json()
        assert dry["would_accept"] == 1
        assert dry["would_refuse"]["lifetime-exhausted"] == 1
        assert dry["would_refuse"]["budget-exhausted"] == 0
        status = survey_runs.run_survey(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            owner="test",
            limits=DEFAULT_LIMITS,
            lease_seconds=5,
        )
        assert status == "done"
        # at most once per member: running it again asks nobody twice
        survey_runs.run_survey(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            owner="test",
            limits=DEFAULT_LIMITS,
            lease_seconds=5,
        )
    finally:
        worker.close()
        engine.dispose()
    done = client.get(f"/v1/surveys/{survey_id}", headers=ADMIN).json()
    assert done["progress"]["accepted"] == 1
    assert done["progress"]["refused"]["lifetime-exhausted"] == 1
    items = client.get(f"/v1/surveys/{survey_id}/responses", headers=ADMIN).json()["items"]
    by_id = {item["object_id"]: item for item in items}
    assert by_id[fresh]["decision"] == "accepted"
    assert by_id[fresh]["version"] == 2
    assert by_id[spent]["decision"] == "refused"
    assert by_id[spent]["reason"] == "lifetime-exhausted"
    answered = client.get(f"/v1/objects/{fresh}/queries", headers=ADMIN).json()["items"]
    assert [(i["version"], i["survey_id"]) for i in answered] == [(2, survey_id)]
    assert client.get(f"/v1/objects/{fresh}/queries?version=1", headers=ADMIN).json()["items"] == []
    assert client.get(f"/v1/objects/{spent}/odometer", headers=ADMIN).json()["rejected"] == 1
    check_verify(database_url)


def test_cli_imports_versions_resumably(
    client: TestClient, database_url: str, tmp_path: Path
) -> None:
    """``gatekeeper import --versions FILE``: batches of new values; the same file again makes
    no second version (each batch is replayed by its Idempotency-Key); a bad line is named."""
    ids = [register(client, budget=1.0) for _ in range(5)]
    path = tmp_path / "versions.ndjson"
    path.write_text("".join(f'{{"id": "{oid}", "value": {{"b": 0}}}}\n' for oid in ids))
    done = run_cli(
        "import", "--versions", str(path), "--batch-size", "2", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"created": 5, "already": 0}
    again = run_cli(
        "import", "--versions", str(path), "--batch-size", "2", database_url=database_url
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"created": 0, "already": 5}
    assert {client.get(f"/v1/objects/{oid}", headers=ADMIN).json()["version"] for oid in ids} == {2}
    bad = tmp_path / "bad.ndjson"
    lines = [
        f'{{"id": "{ids[0]}", "value": {{"b": 1}}}}',
        f'{{"id": "{ids[1]}", "value": {{"b": 31337}}}}',
    ]
    bad.write_text("\n".join(lines) + "\n")
    failed = run_cli("import", "--versions", str(bad), database_url=database_url)
    assert failed.returncode == 2
    assert "line 2, field value.b" in failed.stderr
    assert "31337" not in failed.stderr
    assert client.get(f"/v1/objects/{ids[0]}", headers=ADMIN).json()["version"] == 2

"""Reuse of identical answers (issue 24 item 3), on SQLite and PostgreSQL.

``"reuse": true`` returns the earliest stored answer of the identical query (canonical JSON)
from the object's current data version — status 200, ``"reused": true`` — and changes nothing:
the object's row and odometer stay byte for byte, no history row, no audit event. Never across
versions; the dry-run says ``would_reuse``; surveys count reused members in ``accepted`` and
``reused``; a project key reuses only its own answers (its quota's sub-history stays exact).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.bootstrap import create_app
from app.db.session import make_engine
from app.services.reuse import canonical_query, query_hash
from app.services.verify import verify_all
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.test_surveys import wait_done

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
ADMIN = auth(ADMIN_KEY)


def rr(epsilon: float = 0.3) -> dict[str, Any]:
    return {
        "mechanism": "binary_rr",
        "epsilon": epsilon,
        "predicate": {"attribute": "b", "op": "==", "value": 1},
    }


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> dict[str, str]:
    return auth(new_key(client, "analyst"))


def register(
    client: TestClient, *, budget: float = 5.0, labels: dict[str, str] | None = None
) -> str:
    oid = unique_id("reuse")
    body: dict[str, Any] = {
        "id": oid,
        "domain": BINARY,
        "value": {"b": 1},
        "budget": {"epsilon": budget},
    }
    if labels is not None:
        body["labels"] = labels
    r = client.post("/v1/objects", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return oid


def submit(client: TestClient, headers: dict[str, str], oid: str, query: Any, **extra: Any) -> Any:
    return client.post(
        f"/v1/objects/{oid}/queries", headers=headers, json={"query": query, **extra}
    )


def object_row(database_url: str, oid: str) -> tuple[Any, ...]:
    """The object's stored row, every column, as the database holds it."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT * FROM objects WHERE id = :id"), {"id": oid}).one()
            counts = tuple(
                conn.execute(
                    text(f"SELECT count(*) FROM {table} WHERE object_id = :id"),  # noqa: S608
                    {"id": oid},
                ).scalar_one()
                for table in ("queries", "audit_events", "rejections", "project_states")
            )
    finally:
        engine.dispose()
    return (*tuple(row), *counts)


def verify(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        report = verify_all(engine)
    finally:
        engine.dispose()
    assert report.ok, report.problems[:5]


def test_canonical_json_is_sorted_and_keeps_numbers_as_the_reader_gives_them() -> None:
    a = {"epsilon": 0.1, "mechanism": "grr", "attribute": "b"}
    b = {"attribute": "b", "mechanism": "grr", "epsilon": 0.10}
    assert canonical_query(a) == '{"attribute":"b","epsilon":0.1,"mechanism":"grr"}'
    assert query_hash(a) == query_hash(b)
    # 1 and 1.0 differ for the engine (an integer attribute refuses 1.0): not identical
    assert query_hash({"value": 1}) != query_hash({"value": 1.0})


@pytest.mark.parametrize(
    "query",
    [
        {"mechanism": "grr", "attribute": "b", "epsilon": 0.5},
        {"z": [1, 1.0, -0.0, 1e300, 10**30, True, None], "a": {"y": "é\u2028\ud800", "b": []}},
        {"epsilon": float("nan"), "x": float("inf"), "y": -float("inf")},
        [{"b": 1, "a": 2}, "text", 3],
    ],
)
def test_canonical_json_is_json_dumps_sorted_and_compact(
    query: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same text as ``json.dumps(sort_keys, compact, allow_nan)``, from one prebuilt encoder."""
    expected = json.dumps(query, sort_keys=True, separators=(",", ":"), allow_nan=True)
    made = []
    real_init = json.JSONEncoder.__init__

    def counted(self: json.JSONEncoder, *args: Any, **kwargs: Any) -> None:
        made.append(kwargs)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONEncoder, "__init__", counted)
    assert canonical_query(query) == expected
    assert made == []  # no encoder built per call
    with pytest.raises(TypeError):  # keys that cannot be sorted: refused as json.dumps does
        canonical_query({1: "a", "b": 2})


def test_reuse_hit_returns_the_stored_output_and_changes_nothing(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    oid = register(client)
    first = submit(client, analyst, oid, rr())
    assert first.status_code == 201, first.text
    assert first.json()["reused"] is False
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).content
    history = client.get(f"/v1/objects/{oid}/queries", headers=ADMIN).content
    row = object_row(database_url, oid)
    # the same query, keys in another order and ε written as 0.30
    written = {"predicate": {"value": 1, "op": "==", "attribute": "b"}, "epsilon": 0.30}
    for _ in range(3):
        again = submit(client, analyst, oid, {**written, "mechanism": "binary_rr"}, reuse=True)
        assert again.status_code == 200, again.text
        body = again.json()
        assert body["reused"] is True
        assert body["output"] == first.json()["output"]
        assert body["seq"] == 1
        assert body["query_id"] == first.json()["query_id"]
        assert body["version"] == 1
        assert body["odometer"] == first.json()["odometer"]
    assert client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).content == odometer
    assert client.get(f"/v1/objects/{oid}/queries", headers=ADMIN).content == history
    assert object_row(database_url, oid) == row
    verify(database_url)


def test_reuse_miss_decides_as_usual(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    oid = register(client)
    # nothing stored yet: a fresh answer (201), which a later reuse then finds
    r = submit(client, analyst, oid, rr(), reuse=True)
    assert r.status_code == 201, r.text
    assert r.json()["reused"] is False
    # another query (another ε) is not identical
    other = submit(client, analyst, oid, rr(0.2), reuse=True)
    assert other.status_code == 201
    assert other.json()["seq"] == 2
    # without reuse, the identical query is charged again
    plain = submit(client, analyst, oid, rr())
    assert plain.status_code == 201
    assert plain.json()["seq"] == 3
    # reuse returns the earliest identical answer
    hit = submit(client, analyst, oid, rr(), reuse=True)
    assert (hit.status_code, hit.json()["seq"]) == (200, 1)
    assert hit.json()["output"] == r.json()["output"]
    verify(database_url)


def test_never_across_versions(client: TestClient, analyst: dict[str, str]) -> None:
    oid = register(client)
    assert submit(client, analyst, oid, rr()).status_code == 201
    r = client.post(f"/v1/objects/{oid}/versions", headers=ADMIN, json={"value": {"b": 0}})
    assert r.status_code == 201
    dry = client.post(
        f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": rr(), "reuse": True}
    ).json()
    assert dry["would_reuse"] is False
    fresh = submit(client, analyst, oid, rr(), reuse=True)
    assert fresh.status_code == 201, fresh.text
    assert fresh.json()["version"] == 2
    assert fresh.json()["seq"] == 2
    again = submit(client, analyst, oid, rr(), reuse=True)
    assert (again.status_code, again.json()["seq"], again.json()["version"]) == (200, 2, 2)


def test_dry_run_says_whether_the_query_would_be_reused(
    client: TestClient, analyst: dict[str, str]
) -> None:
    oid = register(client)

    def dry(**extra: Any) -> Any:
        r = client.post(
            f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": rr(), **extra}
        )
        assert r.status_code == 200, r.text
        return r.json()

    assert dry(reuse=True)["would_reuse"] is False
    assert submit(client, analyst, oid, rr()).status_code == 201
    assert dry(reuse=True)["would_reuse"] is True
    assert dry()["would_reuse"] is False  # a submit without reuse would not reuse
    assert dry(reuse=True)["decision"] == "accept"  # the decision is for a fresh answer


def test_only_the_callers_own_answers_are_reused(client: TestClient, database_url: str) -> None:
    """An analyst reuses only what its key asked; an unscoped admin any answer."""
    oid = register(client)
    first, second = auth(new_key(client, "analyst")), auth(new_key(client, "analyst"))
    asked = submit(client, first, oid, rr())
    assert asked.status_code == 201
    other = submit(client, second, oid, rr(), reuse=True)
    assert other.status_code == 201  # not the first analyst's output: a fresh answer
    assert other.json()["seq"] == 2
    admin = submit(client, ADMIN, oid, rr(), reuse=True)
    assert (admin.status_code, admin.json()["seq"]) == (200, 1)


def test_project_keys_reuse_only_their_own_sub_history(client: TestClient) -> None:
    """The project's quota filter counts its own sub-history: a reuse stays inside it."""
    team = unique_id("team")
    name = unique_id("proj")
    body = {"name": name, "scope": {"labels": {"team": team}}, "quota": {"epsilon": 0.3}}
    assert client.post("/v1/projects", headers=ADMIN, json=body).status_code == 201
    r = client.post("/v1/keys", headers=ADMIN, json={"role": "analyst", "project": name})
    key = auth(r.json()["key"])
    oid = register(client, labels={"team": team})
    outsider = auth(new_key(client, "analyst"))
    assert submit(client, outsider, oid, rr()).status_code == 201
    # the outsider's answer is not in the project's sub-history: charged to its quota
    own = submit(client, key, oid, rr(), reuse=True)
    assert own.status_code == 201, own.text
    # now the quota (0.3) is spent: only a reuse of its own answer is possible
    assert submit(client, key, oid, rr()).status_code == 409
    hit = submit(client, key, oid, rr(), reuse=True)
    assert (hit.status_code, hit.json()["seq"]) == (200, 2)
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    (entry,) = odometer["projects"]
    assert entry["realized_loss"]["upper"] == pytest.approx(0.3)


def test_idempotency_key_replays_first_and_a_reuse_binds_no_key(
    client: TestClient, analyst: dict[str, str]
) -> None:
    oid = register(client)
    keyed = {**analyst, "Idempotency-Key": unique_id("k")}
    first = submit(client, keyed, oid, rr(), reuse=True)
    assert first.status_code == 201  # nothing to reuse: sampled, stored under the key
    replay = submit(client, keyed, oid, rr(), reuse=True)
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["query_id"] == first.json()["query_id"]
    # a new key on a reusable query: the stored answer, the key stays unused
    other = {**analyst, "Idempotency-Key": unique_id("k")}
    hit = submit(client, other, oid, rr(), reuse=True)
    assert (hit.status_code, hit.json()["reused"]) == (200, True)
    assert "Idempotent-Replayed" not in hit.headers
    # the reused answer stored nothing under that key: a retry is reused again
    assert submit(client, other, oid, rr(), reuse=True).status_code == 200


@pytest.mark.parametrize("bad", ["yes", 1, None, [True], {"x": True}])
def test_reuse_must_be_a_boolean(client: TestClient, analyst: dict[str, str], bad: Any) -> None:
    oid = register(client)
    for path, body in (
        (f"/v1/objects/{oid}/queries", {"query": rr(), "reuse": bad}),
        (f"/v1/objects/{oid}/dry-run", {"query": rr(), "reuse": bad}),
        ("/v1/surveys", {"name": "s", "query": rr(), "cohort": {"ids": [oid]}, "reuse": bad}),
        (
            "/v1/surveys/dry-run",
            {"name": "s", "query": rr(), "cohort": {"ids": [oid]}, "reuse": bad},
        ),
    ):
        r = client.post(path, headers=analyst, json=body)
        assert r.status_code == 422, (path, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        fields = [e["field"] for e in r.json()["errors"]]
        assert fields == ["reuse"], (path, r.json())
        assert repr(bad) not in r.json()["detail"] or bad is None


def test_a_reusing_survey_counts_and_answers_its_reused_members(
    client: TestClient, analyst: dict[str, str], database_url: str
) -> None:
    study = unique_id("study")
    labels = {"study": study}
    ids = sorted(register(client, labels=labels) for _ in range(6))
    # two members answered by single submits, then a first survey answers every member
    singles = {oid: submit(client, analyst, oid, rr()).json()["output"] for oid in ids[:2]}
    survey = {"name": "first", "query": rr(), "cohort": {"labels": labels}}
    r = client.post("/v1/surveys", headers=analyst, json={**survey, "reuse": True})
    assert r.status_code == 202, r.text
    first = wait_done(client, analyst, r.json()["id"])
    assert first["reuse"] is True
    assert first["progress"]["accepted"] == 6
    assert first["progress"]["reused"] == 2
    # a new version of one member: its earlier answers are not reused
    assert (
        client.post(f"/v1/objects/{ids[5]}/versions", headers=ADMIN, json={"value": {"b": 0}})
    ).status_code == 201
    rows = {oid: object_row(database_url, oid) for oid in ids}
    dry = client.post("/v1/surveys/dry-run", headers=analyst, json={**survey, "reuse": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["would_reuse"] == 5
    assert dry.json()["would_accept"] == 6
    r = client.post(
        "/v1/surveys", headers=analyst, json={**survey, "name": "second", "reuse": True}
    )
    second = wait_done(client, analyst, r.json()["id"])
    assert second["progress"]["accepted"] == 6
    assert second["progress"]["reused"] == 5
    assert second["progress"]["decided"] == 6
    items = client.get(f"/v1/surveys/{second['id']}/responses", headers=analyst).json()["items"]
    first_items = client.get(f"/v1/surveys/{first['id']}/responses", headers=analyst).json()[
        "items"
    ]
    earlier = {i["object_id"]: i["output"] for i in first_items} | singles
    for item in items:
        assert item["decision"] == "accepted"
        if item["object_id"] != ids[5]:
            assert item["output"] == earlier[item["object_id"]]
            assert item["version"] == 1
        else:
            assert item["version"] == 2
    for oid in ids[:5]:
        assert object_row(database_url, oid) == rows[oid]  # nothing charged or recorded
    assert object_row(database_url, ids[5]) != rows[ids[5]]
    # the estimate counts the reused members' answers
    assert second["estimate"]["n"] == 6
    # a history holds each answer once
    history = client.get(f"/v1/objects/{ids[0]}/queries", headers=ADMIN).json()["items"]
    assert [i["seq"] for i in history] == [1]
    verify(database_url)


@pytest.fixture(scope="module")
def postgres_client(postgres_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(postgres_url))) as test_client:
        yield test_client


def test_a_reuse_racing_new_versions_never_returns_an_older_versions_answer(
    postgres_client: TestClient, postgres_url: str
) -> None:
    """Threads reusing while versions are created (PostgreSQL): every reused answer is the
    first answer of the version it names, and versions' answers are never mixed."""
    client = postgres_client
    headers = auth(new_key(client, "analyst"))
    oid = register(client, budget=100.0)
    results: list[Any] = []
    guard = threading.Lock()
    stop = threading.Event()

    def reuser() -> None:
        while not stop.is_set():
            r = submit(client, headers, oid, rr(), reuse=True)
            with guard:
                results.append((r.status_code, r.json()))

    def versioner() -> None:
        for i in range(6):
            r = client.post(
                f"/v1/objects/{oid}/versions", headers=ADMIN, json={"value": {"b": i % 2}}
            )
            assert r.status_code == 201
        stop.set()

    threads = [threading.Thread(target=reuser) for _ in range(3)]
    threads.append(threading.Thread(target=versioner))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first_of: dict[int, Any] = {}
    for version in range(1, 8):
        items = client.get(
            f"/v1/objects/{oid}/queries", headers=ADMIN, params={"version": version}
        ).json()["items"]
        assert len(items) <= 1, items  # one charged answer per version at most
        if items:
            first_of[version] = items[0]
    assert {code for code, _ in results} <= {200, 201}
    for code, body in results:
        stored = first_of[body["version"]]
        assert (body["seq"], body["output"]) == (stored["seq"], stored["output"])
        assert body["reused"] is (code == 200)
    verify(postgres_url)


def _reused_metric(client: TestClient, source: str) -> float:
    text = client.get("/metrics", headers=ADMIN).text
    for line in text.splitlines():
        if line.startswith(f'gatekeeper_reused_answers_total{{source="{source}"}} '):
            return float(line.split()[1])
    return 0.0


def test_reused_answers_are_counted_in_metrics_and_audit_nothing(
    client: TestClient, analyst: dict[str, str]
) -> None:
    study = unique_id("study")
    oid = register(client, labels={"study": study})
    assert submit(client, analyst, oid, rr()).status_code == 201
    events = client.get("/v1/audit", headers=ADMIN, params={"object_id": oid}).json()["events"]
    before = _reused_metric(client, "submit")
    assert submit(client, analyst, oid, rr(), reuse=True).status_code == 200
    assert _reused_metric(client, "submit") == before + 1
    # no audit event for a reuse: nothing was decided or released anew
    assert (
        client.get("/v1/audit", headers=ADMIN, params={"object_id": oid}).json()["events"] == events
    )
    before = _reused_metric(client, "survey")
    body = {"name": "m", "query": rr(), "cohort": {"labels": {"study": study}}, "reuse": True}
    r = client.post("/v1/surveys", headers=analyst, json=body)
    assert wait_done(client, analyst, r.json()["id"])["progress"]["reused"] == 1
    assert _reused_metric(client, "survey") == before + 1


@pytest.fixture(scope="module")
def small_chunks(database_url: str) -> Iterator[TestClient]:
    """A client whose surveys cut their members in chunks of 4 (several chunks per test)."""
    settings = make_settings(database_url, survey_chunk_size=4)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _earliest(client: TestClient, oid: str, headers: dict[str, str], epsilon: float) -> Any:
    """The earliest ``rr(epsilon)`` entry of the object's current version among those the
    caller can read (an analyst: its own key's), from the history the API shows — the oracle."""
    r = client.get(f"/v1/objects/{oid}/queries", headers=headers, params={"limit": 100})
    assert r.status_code == 200, r.text
    same = [i for i in r.json()["items"] if i["query"]["epsilon"] == epsilon]
    return min(same, key=lambda i: i["seq"], default=None)


def test_reuse_in_chunks_cut_differently_mixes_hits_and_misses(
    small_chunks: TestClient, database_url: str
) -> None:
    """Chunks of 4 where the earlier survey cut its (other) cohort differently: per member, the
    earliest answer its key asked in its current version, whether from a single submit or a
    survey, and a fresh answer for the rest — retired members refused, new versions missed."""
    client = small_chunks
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("mixed")
    ids = sorted(register(client, labels={"study": study}) for _ in range(13))
    assert submit(client, analyst, ids[0], rr()).status_code == 201  # single submits first
    assert submit(client, analyst, ids[3], rr()).status_code == 201
    # another query's answer: a survey answer of another member matched to this one by mistake
    # would fall in its range
    assert submit(client, analyst, ids[4], rr(0.5)).status_code == 201
    odd = {"name": "odd", "query": rr(), "cohort": {"ids": ids[1::2]}}  # chunks [1,3,5,7] [9,11]
    r = client.post("/v1/surveys", headers=analyst, json=odd)
    assert r.status_code == 202, r.text
    first = wait_done(client, analyst, r.json()["id"])
    assert first["progress"]["accepted"] == 6
    assert submit(client, analyst, ids[1], rr()).status_code == 201  # after the survey's answer
    new = client.post(f"/v1/objects/{ids[5]}/versions", headers=ADMIN, json={"value": {"b": 0}})
    assert new.status_code == 201  # its survey answer is of a closed version now
    assert client.delete(f"/v1/objects/{ids[9]}", headers=ADMIN).status_code == 200  # retired
    expected = {oid: _earliest(client, oid, analyst, 0.3) for oid in ids}
    assert expected[ids[4]] is None
    assert expected[ids[0]] is not None
    assert expected[ids[5]] is None
    assert expected[ids[1]]["survey_id"] == first["id"]  # not the later single submit's
    assert expected[ids[3]]["survey_id"] is None  # the single submit, before the survey's
    rows = {oid: object_row(database_url, oid) for oid in ids}
    body = {"name": "all", "query": rr(), "cohort": {"labels": {"study": study}}, "reuse": True}
    dry = client.post("/v1/surveys/dry-run", headers=analyst, json=body)
    hits = [oid for oid in ids if expected[oid] is not None and oid != ids[9]]
    assert dry.json()["would_reuse"] == len(hits) == 5  # 0, 1, 3 (its single submit), 7, 11
    r = client.post("/v1/surveys", headers=analyst, json=body)  # chunks [0..3] [4..7] ...
    second = wait_done(client, analyst, r.json()["id"])
    progress = second["progress"]
    assert (progress["reused"], progress["accepted"], progress["decided"]) == (5, 12, 13)
    assert {k: n for k, n in progress["refused"].items() if n} == {"retired": 1}
    items = {
        i["object_id"]: i
        for i in client.get(
            f"/v1/surveys/{second['id']}/responses", headers=analyst, params={"limit": 100}
        ).json()["items"]
    }
    for oid in ids:
        item = items[oid]
        if oid == ids[9]:
            assert (item["decision"], item["reason"]) == ("refused", "retired")
        elif oid in hits:
            assert item["output"] == expected[oid]["output"], oid
            assert object_row(database_url, oid) == rows[oid]  # nothing charged or recorded
        else:  # no earlier answer of this version: decided and answered afresh
            assert item["decision"] == "accepted"
            assert object_row(database_url, oid) != rows[oid]
    verify(database_url)


def test_a_survey_reuses_only_its_own_keys_survey_answers(small_chunks: TestClient) -> None:
    """An analyst's reusing survey takes no answer another analyst's survey drew; the
    unscoped admin's takes them all."""
    client = small_chunks
    first, second = auth(new_key(client, "analyst")), auth(new_key(client, "analyst"))
    study = unique_id("scoped")
    for _ in range(6):
        register(client, labels={"study": study})
    body = {"name": "s", "query": rr(), "cohort": {"labels": {"study": study}}}
    r = client.post("/v1/surveys", headers=first, json=body)
    assert wait_done(client, first, r.json()["id"])["progress"]["accepted"] == 6
    r = client.post("/v1/surveys", headers=second, json={**body, "reuse": True})
    other = wait_done(client, second, r.json()["id"])["progress"]
    assert (other["reused"], other["accepted"]) == (0, 6)  # fresh answers, charged
    r = client.post("/v1/surveys", headers=ADMIN, json={**body, "reuse": True})
    admin = wait_done(client, ADMIN, r.json()["id"])["progress"]
    assert (admin["reused"], admin["accepted"]) == (6, 6)

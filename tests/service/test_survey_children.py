"""A survey's chunks decided in child processes (``SURVEY_PROCESSES``), on SQLite and PostgreSQL.

The same survey through the app with the chunks in threads (``SURVEY_PROCESSES=0``) and in two
child processes: every member decided once, the totals, tallies, history rows, audit and
collected states alike; the children start with the first survey and are gone when the app
stops. A child killed mid-survey: the pool is rebuilt and the survey finishes with each member
queried exactly once. A cancel mid-run stops it; a lease taken over stops it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app, survey_children
from app.db.session import make_engine
from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.services.history import object_history
from app.store import reading, transaction
from app.store import surveys as survey_store
from app.store.states import count_unnamed
from app.worker.children import ChildPool
from app.worker.jobs import InProcessJobs
from app.worker.pool import BoundWorker, WorkerSettings
from tests.processes import alive
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.factories import driven_survey
from tests.service.test_survey_faults import survey_rows_per_member
from tests.service.test_surveys import GRR, all_responses, import_study, verify_clean, wait_done

MAX_MEMBERS = 2000


def children_of(client: TestClient) -> ChildPool[Any]:
    jobs = client.app.state.runtime.surveys  # type: ignore[attr-defined]
    assert isinstance(jobs, InProcessJobs)
    assert jobs.children is not None
    return jobs.children


@pytest.fixture
def app_with(database_url: str) -> Iterator[Any]:
    """``app_with(processes, chunk_size)``: a client whose surveys run in that many children."""
    clients: list[TestClient] = []

    def start(processes: int, chunk_size: int = 7) -> TestClient:
        settings = make_settings(
            database_url,
            survey_chunk_size=chunk_size,
            survey_max_members=MAX_MEMBERS,
            survey_processes=processes,
        )
        client = TestClient(create_app(settings))
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def two_surveys(client: TestClient, database_url: str) -> dict[str, Any]:
    """Two surveys of the same 50 fresh members; what the roads must agree on."""
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("ch")
    ids = import_study(client, study, 50)
    body = {"name": "flu", "query": GRR, "cohort": {"labels": {"study": study}}}
    views = [
        wait_done(
            client, analyst, client.post("/v1/surveys", headers=analyst, json=body).json()["id"]
        )
        for _ in range(2)
    ]
    decisions = []
    for view in views:
        responses = all_responses(client, analyst, view["id"])
        assert [item["object_id"] for item in responses] == ids
        decisions.append(sorted({item["decision"] for item in responses}))
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = [len(object_history(conn, oid)) for oid in ids]
            unnamed = count_unnamed(conn)
    finally:
        engine.dispose()
    events = client.get("/v1/audit", headers=auth(ADMIN_KEY), params={"limit": 1000}).json()
    finished = {
        e["detail"].get("survey_id") for e in events["events"] if e["kind"] == "survey.finished"
    }
    return {
        "status": [view["status"] for view in views],
        "progress": [view["progress"] for view in views],
        "outputs": [sum(view["outputs"].values()) for view in views],
        "estimated": [view["estimate"]["n"] for view in views],
        "decisions": decisions,
        "history rows per member": sorted(set(rows)),
        "unnamed states": unnamed,
        "audited": [view["id"] in finished for view in views],
        "groups": [view["groups"] for view in views],
    }


def test_children_decide_every_member_once_as_threads_do(app_with: Any, database_url: str) -> None:
    threads = two_surveys(app_with(0), database_url)
    client = app_with(2)
    pool = children_of(client)
    assert pool.pids() == []  # started with the first survey, not with the app
    children = two_surveys(client, database_url)
    pids = pool.pids()
    assert len(pids) == 2
    assert all(alive(pid) for pid in pids)
    assert os.getpid() not in pids
    assert children == threads
    assert threads["status"] == ["done", "done"]
    assert threads["progress"][1]["accepted"] == 50
    assert threads["history rows per member"] == [2]
    assert threads["audited"] == [True, True]
    # each child counts the groups new to it; a group two children met is counted once
    assert threads["groups"][0] == 1
    assert 1 < threads["groups"][1] <= 3
    verify_clean(database_url)
    client.__exit__(None, None, None)  # the app stops: its children exit, none left behind
    assert not any(alive(pid) for pid in pids)
    client.__enter__()  # for the fixture's own exit


def test_a_child_killed_mid_survey_is_replaced_and_each_member_queried_once(
    app_with: Any, database_url: str
) -> None:
    client = app_with(2, chunk_size=3)
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("kc")
    import_study(client, study, 600)
    body = {"name": "killed", "query": GRR, "cohort": {"labels": {"study": study}}}
    survey_id = client.post("/v1/surveys", headers=analyst, json=body).json()["id"]
    pool = children_of(client)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
        if view["progress"]["decided"] >= 6 and len(pool.pids()) == 2:
            break
        time.sleep(0.005)
    killed = pool.pids()[0]
    os.kill(killed, signal.SIGKILL)
    at_kill = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()["progress"]
    assert at_kill["decided"] < 600, "the kill must land mid-survey"
    done = wait_done(client, analyst, survey_id)
    assert done["status"] == "done"
    assert done["progress"]["decided"] == done["progress"]["accepted"] == 600
    assert sum(done["outputs"].values()) == 600
    assert killed not in pool.pids()  # a new pool
    assert len(pool.pids()) == 2
    per_member = survey_rows_per_member(database_url, survey_id)
    assert len(per_member) == 600
    assert set(per_member.values()) == {1}
    verify_clean(database_url)


def test_cancel_mid_run_stops_the_children(app_with: Any, database_url: str) -> None:
    client = app_with(2, chunk_size=2)
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("cc")
    import_study(client, study, 800)
    body = {"name": "cancelled", "query": GRR, "cohort": {"labels": {"study": study}}}
    survey_id = client.post("/v1/surveys", headers=analyst, json=body).json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()["progress"]["decided"]:
            break
        time.sleep(0.005)
    r = client.delete(f"/v1/surveys/{survey_id}", headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    time.sleep(1.0)  # chunks in flight at the cancel roll back; nothing more is dispatched
    final = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
    assert final["status"] == "cancelled"
    assert 0 < final["progress"]["decided"] < 800
    time.sleep(0.5)
    again = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
    assert again["progress"] == final["progress"]
    decisions = [r["decision"] for r in all_responses(client, auth(ADMIN_KEY), survey_id)]
    assert decisions.count("cancelled") == 800 - final["progress"]["decided"]
    assert "pending" not in decisions
    verify_clean(database_url)


def test_a_lease_taken_over_stops_the_run(app_with: Any, database_url: str) -> None:
    """Driven here (not by the app's runner): another owner takes the lease mid-run."""
    client = app_with(0)  # its own runner decides no chunk of this survey: it is claimed
    study = unique_id("lc")
    import_study(client, study, 900)
    settings = make_settings(database_url, survey_processes=2)
    pool = survey_children(settings)
    assert pool is not None
    engine = make_engine(database_url)
    worker = BoundWorker(WorkerSettings(processes=0))
    body = {"name": "taken", "query": GRR, "cohort": {"labels": {"study": study}}}
    try:
        survey_id, _ = driven_survey(
            engine, body, max_members=MAX_MEMBERS, chunk_size=2, owner="me"
        )
        outcome: list[str] = []
        runner = threading.Thread(
            target=lambda: outcome.append(
                survey_runs.run_survey(
                    engine=engine,
                    worker=worker,
                    survey_id=survey_id,
                    owner="me",
                    limits=DEFAULT_LIMITS,
                    lease_seconds=60,
                    children=pool,
                )
            )
        )
        runner.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with reading(engine) as conn:
                if survey_store.get_survey(conn, survey_id).decided:  # type: ignore[union-attr]
                    break
            time.sleep(0.005)
        later = datetime.now(UTC) + timedelta(hours=1)  # as if the lease had expired
        with transaction(engine) as conn:
            assert survey_store.claim(
                conn, survey_id=survey_id, owner="thief", now=later, lease_until=later
            )
        runner.join(60)
        assert outcome == ["not-claimed"]
        with reading(engine) as conn:
            survey = survey_store.get_survey(conn, survey_id)
        assert survey is not None
        assert survey.status in ("running", "queued")
        assert 0 < survey.decided < 900
    finally:
        pool.close()
        worker.close()
        engine.dispose()
    assert pool.pids() == []

"""Surveys under faults: a server SIGKILLed mid-survey, single submits racing a survey.

Each member must be queried at most once per survey whatever happens, the survey must resume
where it stopped, and ``gatekeeper verify`` must find every stored state following from its
history (on SQLite and PostgreSQL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.bootstrap import create_app
from app.db.session import make_engine
from app.services.history import stored_entries
from app.store.chunks import CHUNKS, ChunkCache, decode
from tests.service.conftest import auth, make_settings, new_key, start_server, unique_id
from tests.service.test_surveys import GRR, import_study, verify_clean, wait_done


def survey_rows_per_member(database_url: str, survey_id: int) -> dict[str, int]:
    """Per member, how many entries of its object's stored history answer the survey."""
    engine = make_engine(database_url)
    counts: dict[str, int] = {}
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(CHUNKS).where(CHUNKS.c.survey_id == survey_id)).all()
            cache = ChunkCache()
            for row in rows:
                for oid in decode(row).members:
                    entries = stored_entries(conn, oid, chunks=cache)
                    times = sum(1 for e in entries if e.survey_id == survey_id)
                    if times:
                        counts[oid] = times
    finally:
        engine.dispose()
    return counts


def kill_tree(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the server and its worker processes: nothing gets to clean up."""
    subprocess.run(["pkill", "-9", "-P", str(process.pid)], check=False)  # noqa: S603, S607
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_sigkill_mid_survey_resumes_and_queries_each_member_once(
    tmp_path: Path, database_url: str
) -> None:
    env = {"SURVEY_CHUNK_SIZE": "4", "SURVEY_LEASE_SECONDS": "2", "BOUND_PROCESSES": "0"}
    server = start_server(tmp_path, database_url=database_url, redis_url=None, workers=1, **env)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            analyst = auth(new_key(http, "analyst"))
            study = unique_id("kill")
            ids = import_study(http, study, 400)
            body = {"name": "killed", "query": GRR, "cohort": {"labels": {"study": study}}}
            survey_id = http.post("/v1/surveys", headers=analyst, json=body).json()["id"]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                decided = http.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
                if decided["progress"]["decided"] >= 8:
                    break
                time.sleep(0.01)
    finally:
        kill_tree(server.process)
        server.stop()
    at_kill = decided["progress"]["decided"]
    assert 0 < at_kill < 400, "the kill must land mid-survey"
    restarted = start_server(tmp_path, database_url=database_url, redis_url=None, workers=1, **env)
    try:
        with httpx.Client(base_url=restarted.url, timeout=30) as http:
            final = wait_done(http, analyst, survey_id)
    finally:
        restarted.stop()
    assert final["status"] == "done"
    assert final["progress"]["decided"] == 400
    assert final["progress"]["accepted"] == 400
    rows = survey_rows_per_member(database_url, survey_id)
    assert set(rows) == set(ids)
    assert set(rows.values()) == {1}  # at most once, and every member once
    verify_clean(database_url)


def test_single_submits_during_a_survey_stay_serialised(database_url: str) -> None:
    settings = make_settings(database_url, survey_chunk_size=3)
    with TestClient(create_app(settings)) as client:
        analyst = auth(new_key(client, "analyst"))
        study = unique_id("race")
        ids = import_study(client, study, 60, budget=50.0)
        stop = threading.Event()
        submitted: list[int] = []

        def hammer(offset: int) -> None:
            i = offset
            while not stop.is_set():
                oid = ids[i % len(ids)]
                r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": GRR})
                assert r.status_code in (201, 409, 503), r.text
                submitted.append(r.status_code)
                i += 7

        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(3)]
        for thread in threads:
            thread.start()
        try:
            body = {"name": "race", "query": GRR, "cohort": {"labels": {"study": study}}}
            survey_id = client.post("/v1/surveys", headers=analyst, json=body).json()["id"]
            final = wait_done(client, analyst, survey_id)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert submitted.count(201) > 0
    assert final["progress"]["accepted"] == 60
    rows = survey_rows_per_member(database_url, survey_id)
    assert set(rows.values()) == {1}
    assert len(rows) == 60
    verify_clean(database_url)  # sequence numbers 1..n, states and hashes follow the history

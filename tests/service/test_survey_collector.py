"""A survey run keeps what it holds out of the cyclic collector's passes (issue 27 item 3, h/vec).

After each committed chunk, :func:`~app.services.survey_runs.run_survey` moves every tracked
object to the collector's permanent generation (``gc.freeze``), and back when the run ends,
however it ends (``gc.unfreeze``): the later chunks' full passes no longer traverse the run's
cache and the process's own objects (docs/benchmarks.md, "h/vec": ~35% of a diverged seventh
survey's CPU in process).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db.session import make_engine
from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.services import surveys as survey_service
from app.store import Database
from app.worker.pool import BoundWorker, WorkerSettings
from tests.service.conftest import unique_id
from tests.service.test_surveys import GRR, MAX_MEMBERS, import_study, verify_clean

MEMBERS = 24
CHUNK = 6


@pytest.fixture
def engine(database_url: str) -> Iterator[Database]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def _survey(client: TestClient, engine: Database) -> int:
    study = unique_id("gc")
    import_study(client, study, MEMBERS)
    request = survey_service.parse_request(
        {"name": "collector", "query": GRR, "cohort": {"labels": {"study": study}}},
        max_members=MAX_MEMBERS,
    )
    view, _ = survey_service.create_survey(
        engine=engine,
        request=request,
        fingerprint="f",
        idempotency_key=None,
        analyst_key_id=None,
        max_members=MAX_MEMBERS,
        limits=DEFAULT_LIMITS,
        chunk_size=CHUNK,
    )
    return view.id


def _run(engine: Database, survey_id: int) -> str:
    worker = BoundWorker(WorkerSettings(processes=0))
    try:
        return survey_runs.run_survey(
            engine=engine,
            worker=worker,
            survey_id=survey_id,
            owner="test",
            limits=DEFAULT_LIMITS,
            lease_seconds=30,
            threads=1,
        )
    finally:
        worker.close()


def _counting(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[int]:
    """Each chunk's frozen object count when it starts (``fail_at``: that chunk raises)."""
    seen: list[int] = []
    real = survey_runs.run_chunk

    def counted(**kwargs: Any) -> survey_runs.ChunkOutcome:
        seen.append(gc.get_freeze_count())
        if fail_at is not None and len(seen) == fail_at:
            raise RuntimeError("a chunk failing after two committed ones")
        return real(**kwargs)

    monkeypatch.setattr(survey_runs, "run_chunk", counted)
    return seen


def test_a_run_freezes_after_each_committed_chunk_and_unfreezes_at_its_end(
    client: TestClient, engine: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    survey_id = _survey(client, engine)
    gc.unfreeze()
    seen = _counting(monkeypatch)
    assert _run(engine, survey_id) == "done"
    assert len(seen) == MEMBERS // CHUNK
    assert seen[0] == 0  # nothing frozen before the first chunk committed
    assert all(count > 0 for count in seen[1:]), seen  # frozen after each committed one
    assert gc.get_freeze_count() == 0  # all collectable again once the run ended
    verify_clean(database_url)


def test_a_failed_run_unfreezes_too(
    client: TestClient, engine: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    survey_id = _survey(client, engine)
    gc.unfreeze()
    seen = _counting(monkeypatch, fail_at=3)
    assert _run(engine, survey_id) == "failed"
    assert len(seen) == 3
    assert seen[1] > 0
    assert gc.get_freeze_count() == 0

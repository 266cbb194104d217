"""``bench/server_road.py``'s ``batched`` rung: its committer sends the real accepted write, keeps
each object's compare-and-set, and never batches two writes of one object.

The group-commit figures mean something only while each batched write is the service's own
(the statement ``record_accepted`` sends, one per submit) and a batch keeps the submit's
semantics: a lost race loses that write alone, the others commit. On a real PostgreSQL and Redis
(the service tests' fixtures).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import (  # noqa: F401 - fixtures
    _postgres_template,
    postgres_url,
    redis_url,
)

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import async_probe as ap  # noqa: E402
import server_road as sr  # noqa: E402
import service_load as sl  # noqa: E402


@pytest.fixture(scope="module")
def made(
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[str], int]:
    """Three objects with accepted submits behind them (the real app's), and an analyst key."""
    from app.db.session import make_engine
    from app.services.auth import ensure_bootstrap_admin

    key_file = tmp_path_factory.mktemp("key") / "encryption.key"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GATEKEEPER_ENCRYPTION_KEY_FILE", str(key_file))
        engine = make_engine(postgres_url)
        ensure_bootstrap_admin(engine=engine, secret=sl.ADMIN_KEY)
        engine.dispose()
        captured = [ap.capture(postgres_url, redis_url, submits=2) for _ in range(3)]
    return [c.object_id for c in captured], captured[0].key_id


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Any]:  # noqa: F811 - the fixture
    from app.db.session import make_engine

    made = make_engine(postgres_url, pool_size=4, max_overflow=0)
    yield made
    made.dispose()


def _load(engine: Any, object_id: str) -> Any:
    from app.store import objects as object_store
    from app.store.base import submitting

    with submitting(engine) as conn:
        found = object_store.load_for_submit(conn, object_id=object_id, key=None)
    assert found is not None
    return found[0]


def _inputs(row: Any, key_id: int) -> dict[str, Any]:
    return ap.accept_inputs(row, uuid.uuid4().hex, key_id, row.state)


class _Held:
    """The committer's connection, made only once ``release`` is called: the writes handed
    over before that are all waiting when the committer takes its first batch."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.gate = engine, threading.Event()

    def release(self) -> None:
        self.gate.set()

    def __call__(self) -> Any:
        assert self.gate.wait(30)
        return self.engine.raw_connection()


def _handed(committer: sr.Committer, writes: list[tuple[str, dict[str, Any]]], held: _Held) -> Any:
    """``writes`` handed over by as many request threads, then the committer let go."""
    pool = ThreadPoolExecutor(len(writes))
    futures = []
    for object_id, inputs in writes:  # in this order into the queue
        futures.append(pool.submit(committer.write, object_id, inputs))
        deadline = time.monotonic() + 10
        while committer._queue.qsize() < len(futures):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    held.release()
    results = [f.result(timeout=30) for f in futures]
    pool.shutdown()
    return results


def _queries(engine: Any, ids: list[int]) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM queries WHERE id = ANY(:i)"), {"i": ids}
            ).scalar_one()
        )


def test_a_batch_of_three_objects_commits_each_write(
    made: tuple[list[str], int], engine: Any, tmp_path: Path
) -> None:
    objects, key_id = made
    rows = [_load(engine, o) for o in objects]
    held = _Held(engine)
    committer = sr.Committer(held, tmp_path / "w.json")
    try:
        ids = _handed(committer, [(r.id, _inputs(r, key_id)) for r in rows], held)
    finally:
        committer.close()
    assert all(isinstance(i, int) for i in ids)
    assert len(set(ids)) == 3
    assert _queries(engine, ids) == 3
    for before, object_id in zip(rows, objects, strict=True):
        after = _load(engine, object_id)
        assert after.version == before.version + 1
        assert after.accepted == before.accepted + 1
    assert dict(committer.sizes) == {3: 1}  # one batch: one transaction for the three
    assert committer.alone == 0
    saved = sr.batch_stats(tmp_path)
    assert dict(saved["sizes"]) == {3: 1}
    summary = sr.size_summary({"sizes": Counter(), "alone": 0}, saved)
    assert summary == {
        "batches": 1.0,
        "writes": 3.0,
        "mean": 3.0,
        "median_write": 3.0,
        "max": 3.0,
        "alone": 0.0,
    }


def test_a_lost_race_in_a_batch_loses_that_write_alone(
    made: tuple[list[str], int],
    engine: Any,
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
) -> None:
    objects, key_id = made
    rows = [_load(engine, o) for o in objects]
    stale = _inputs(rows[1], key_id)
    # another writer advances the second object after its row was read
    road = ap.SyncRoad.make(postgres_url, redis_url, key_id)
    try:
        road.submit(objects[1], uuid.uuid4().hex)
    finally:
        road.threads.shutdown()
        road.engine.dispose()
    held = _Held(engine)
    committer = sr.Committer(held)
    try:
        writes = [(rows[0].id, _inputs(rows[0], key_id)), (rows[1].id, stale)]
        writes.append((rows[2].id, _inputs(rows[2], key_id)))
        ids = _handed(committer, writes, held)
    finally:
        committer.close()
    assert ids[1] is None  # the compare-and-set missed: the caller reads again
    assert isinstance(ids[0], int)
    assert isinstance(ids[2], int)
    assert _queries(engine, [ids[0], ids[2]]) == 2
    assert _load(engine, objects[0]).version == rows[0].version + 1
    assert _load(engine, objects[1]).version == rows[1].version + 1  # the other writer's only
    assert _load(engine, objects[2]).version == rows[2].version + 1
    assert dict(committer.sizes) == {3: 1}
    assert committer.alone == 3  # the batch failed whole; each write ran again alone


def test_two_writes_of_one_object_are_never_one_batch(
    made: tuple[list[str], int], engine: Any
) -> None:
    objects, key_id = made
    first, other = _load(engine, objects[0]), _load(engine, objects[2])
    # the second write of the first object at the version the first one makes
    after = dataclasses.replace(first, version=first.version + 1, accepted=first.accepted + 1)
    later = _inputs(after, key_id)
    held = _Held(engine)
    committer = sr.Committer(held)
    try:
        writes = [(first.id, _inputs(first, key_id)), (first.id, later)]
        writes.append((other.id, _inputs(other, key_id)))
        ids = _handed(committer, writes, held)
    finally:
        committer.close()
    assert all(isinstance(i, int) for i in ids)
    assert dict(committer.sizes) == {2: 1, 1: 1}  # {first, other}, then the second write
    assert committer.alone == 0
    assert _load(engine, objects[0]).version == first.version + 2
    assert _load(engine, objects[2]).version == other.version + 1


def test_the_loops_writes_release_their_locks_after_the_commit_then_answer(
    made: tuple[list[str], int], engine: Any
) -> None:
    """``write_async`` (the batched rung's): the committer commits, calls each write's release,
    then settles its future on the loop; no thread waits meanwhile."""
    import asyncio

    objects, key_id = made
    rows = [_load(engine, o) for o in objects[:2]]
    held = _Held(engine)
    committer = sr.Committer(held)
    released: list[tuple[str, int]] = []
    answered: list[str] = []

    def release(object_id: str) -> Any:
        def done() -> None:  # committed already (another connection sees it), not answered yet
            released.append((object_id, _load(engine, object_id).version))
            assert object_id not in answered

        return done

    async def run() -> list[int | None]:
        async def one(row: Any) -> int | None:
            statement = sr.accept_statement(_inputs(row, key_id))
            query_id = await committer.write_async(row.id, statement, release(row.id))
            answered.append(row.id)
            return query_id

        tasks = [asyncio.create_task(one(r)) for r in rows]
        while committer._queue.qsize() < 2:
            await asyncio.sleep(0.01)
        held.release()
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    try:
        ids = asyncio.run(run())
    finally:
        committer.close()
    assert all(isinstance(i, int) for i in ids)
    assert sorted(released) == sorted((r.id, r.version + 1) for r in rows)
    assert sorted(answered) == sorted(r.id for r in rows)
    assert dict(committer.sizes) == {2: 1}


def test_the_batched_write_is_the_one_record_accepted_sends(
    made: tuple[list[str], int], engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``accept_statement`` builds what ``record_accepted`` sends: the same text, the same
    parameters (a change to the real write must fail here, not leave the rung timing an old
    one)."""
    import psycopg

    from app.store import submits as submit_store
    from app.store.base import submitting

    objects, key_id = made
    row = _load(engine, objects[1])
    inputs = _inputs(row, key_id)
    sent: list[tuple[Any, Any]] = []
    original = psycopg.Cursor.execute

    def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent.append((query, params))
        return original(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    with submitting(engine) as conn:
        query_id = submit_store.record_accepted(conn, commit=True, **inputs)
    monkeypatch.undo()
    assert query_id is not None
    (real,) = [(q, p) for q, p in sent if isinstance(q, str) and "cas AS" in q]
    text, params = sr.accept_statement(inputs)
    assert text == real[0]
    assert params == real[1]

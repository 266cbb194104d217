"""A thread's kept connection for :func:`app.store.submitting` blocks, on PostgreSQL.

A request thread keeps one pooled connection across its submits (no check-out, reset and
check-in per submit): these tests hold it to the pool's guarantees — a broken connection is
never used again, ``Engine.dispose()`` closes what is kept (also while a block runs), a forked
child never uses its parent's, the pool's size bounds what is kept, a thread that ended gives
its connection back, the pool's ``connect`` event and ``pool_recycle`` still apply (counted
from the connection's making, as the pool counts), and the service's submit survives its kept
connection's backend being killed. And to the pool's ways with a disconnect (every thread's
kept connection goes, not only the one that met it, whether a statement or the ``COMMIT`` met
it), to races with ``Engine.dispose()`` (nothing left to the garbage collector), to blocks
within blocks (each its own connection), to bounds only ``make_engine`` sets and to the rest of
the pool staying free for other users (a thread's idle kept connection goes back before it
checks out another).
"""

from __future__ import annotations

import gc
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import QueuePool

from app.bootstrap import create_app
from app.db.session import make_engine
from app.store import Unavailable, base, begin_writes, reading, submitting, transaction
from tests.service import factories
from tests.service.conftest import auth, make_settings, new_key
from tests.service.factories import grr_query, integer_domain


@pytest.fixture
def url(postgres_url: str) -> str:
    return postgres_url


def _pid(engine: Engine) -> int:
    """The backend pid of the calling thread's submitting block."""
    with submitting(engine) as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _checked_out(engine: Engine) -> int:
    """How many of the engine's pooled connections are out of its pool (kept ones too)."""
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    return int(pool.checkedout())


def _backends(url: str) -> set[int]:
    """The pids of the other connections to ``url``'s database."""
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return {int(row[0]) for row in rows}


def _lingering(url: str, pids: set[int], seconds: float = 10.0) -> set[int]:
    """Those of ``pids`` still connected after up to ``seconds``.

    A backend ends on its own after its client closed the connection (the client does not wait
    for it), so a closed connection's pid can show in ``pg_stat_activity`` for a moment; one
    left open stays there and is returned.
    """
    deadline = time.monotonic() + seconds
    while (left := pids & _backends(url)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _kill(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url, pool_size=2, max_overflow=2)  # two kept at most
    yield engine
    engine.dispose()


def test_a_thread_keeps_its_connection_across_blocks(engine: Engine) -> None:
    first = _pid(engine)
    assert _pid(engine) == first
    assert _checked_out(engine) == 1  # kept, not back in the pool
    with submitting(engine) as conn:  # in autocommit: each read is its own transaction
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        assert raw.autocommit is True


def test_a_broken_kept_connection_is_dropped_and_the_next_block_succeeds(
    engine: Engine, url: str
) -> None:
    first = _pid(engine)
    _kill(url, first)
    with pytest.raises(Unavailable), submitting(engine) as conn:
        conn.exec_driver_sql("SELECT 1")
    second = _pid(engine)  # a new connection, never the broken one
    assert second != first
    assert _pid(engine) == second
    assert _checked_out(engine) == 1  # the broken one is not counted any more


def test_dispose_closes_the_kept_connections(engine: Engine, url: str) -> None:
    pids: list[int] = []
    worker = threading.Thread(target=lambda: pids.append(_pid(engine)))
    worker.start()
    worker.join()
    pids.append(_pid(engine))
    assert len(set(pids)) == 2
    assert set(pids) <= _backends(url)
    engine.dispose()
    assert not _lingering(url, set(pids))
    assert _pid(engine) not in pids  # and the next block gets a new one


def test_dispose_closes_a_kept_connection_in_use_when_its_block_ends(
    engine: Engine, url: str
) -> None:
    inside, leave = threading.Event(), threading.Event()
    pids: list[int] = []

    def block() -> None:
        with submitting(engine) as conn:
            pids.append(int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()))
            inside.set()
            assert leave.wait(10)
            conn.exec_driver_sql("SELECT 1")  # still usable inside its block

    worker = threading.Thread(target=block)
    worker.start()
    assert inside.wait(10)
    engine.dispose()
    assert pids[0] in _backends(url)
    leave.set()
    worker.join()
    assert not _lingering(url, {pids[0]})


def test_the_pool_bounds_what_is_kept(engine: Engine) -> None:
    """Three threads in blocks at once on a pool of 2 + 2: two keep theirs, one gives it back."""
    inside = threading.Barrier(3, timeout=10)
    errors: list[BaseException] = []

    def block() -> None:
        try:
            with submitting(engine) as conn:
                conn.exec_driver_sql("SELECT 1")
                inside.wait()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=block) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert _checked_out(engine) == 2


def test_a_thread_that_ended_gives_its_connection_back(url: str) -> None:
    engine = make_engine(url, pool_size=1, max_overflow=1)  # one kept at most
    checked_in: list[bool] = []  # each connection's autocommit as it goes back to the pool
    event.listen(engine, "checkin", lambda raw, _record: checked_in.append(raw.autocommit))
    try:
        pids: list[int] = []
        worker = threading.Thread(target=lambda: pids.append(_pid(engine)))
        worker.start()
        worker.join()
        assert _checked_out(engine) == 1
        assert checked_in == []
        # the next thread finds no room to keep one more: the ended thread's goes back to the
        # pool, out of autocommit, and is the one this thread then keeps
        assert _pid(engine) == pids[0]
        assert checked_in == [False]
        assert _checked_out(engine) == 1
    finally:
        engine.dispose()


def test_a_kept_connection_had_the_pools_connect_event_and_is_recycled(url: str) -> None:
    engine = make_engine(url, pool_size=2, max_overflow=2, pool_recycle=0.05)

    @event.listens_for(engine, "connect")
    def _timeout(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = '4321ms'")
        dbapi_connection.commit()

    try:
        with submitting(engine) as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar_one() == "4321ms"
            first = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        threading.Event().wait(0.1)
        assert _pid(engine) != first  # kept past pool_recycle: the pool made a new one
        assert _checked_out(engine) == 1
    finally:
        engine.dispose()


def _forked(
    body: Callable[[], int], *, seconds: float, in_parent: Callable[[], object] = lambda: None
) -> tuple[int, int]:
    """``body()`` in a forked child: what it returned (0 if nothing) and the child's exit code.

    ``in_parent`` runs in the parent right after the fork; a child that has said nothing after
    ``seconds`` is killed, so a hung child fails its test instead of hanging the run.
    """
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        status = 1
        try:
            os.close(read)
            os.write(write, str(body()).encode())
            status = 0
        finally:
            os._exit(status)
    in_parent()
    os.close(write)
    with os.fdopen(read) as pipe:
        if not select.select([pipe], [], [], seconds)[0]:
            os.kill(child, signal.SIGKILL)
        said = int(pipe.read() or 0)
    _, status = os.waitpid(child, 0)
    return said, os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_fork_child_never_uses_its_parents_kept_connection(engine: Engine) -> None:
    parent = _pid(engine)

    def child() -> int:  # its own connection, the parent's left untouched
        pid = _pid(engine)
        engine.dispose(close=False)  # SQLAlchemy's recipe in a child: nothing closed
        return pid

    in_child, exit_code = _forked(child, seconds=30)
    assert exit_code == 0
    assert in_child not in (0, parent)
    assert _pid(engine) == parent  # the parent's connection still works, still kept


def test_a_submit_survives_its_kept_connections_backend_being_killed(url: str) -> None:
    with TestClient(create_app(make_settings(url))) as client:
        oid = factories.register(
            client, domain=integer_domain(4), value={"x": 1}, budget=100.0, prefix="conn"
        )
        key = new_key(client, "analyst")

        def submit() -> Any:
            return client.post(
                f"/v1/objects/{oid}/queries", headers=auth(key), json={"query": grr_query(0.1)}
            )

        for _ in range(2):
            assert submit().status_code == 201
        for pid in _backends(url):  # every connection the app has, the kept ones too
            _kill(url, pid)
        response = submit()
        assert response.status_code == 201, response.text


@contextmanager
def _another_thread(engine: Engine) -> Iterator[list[object]]:
    """Another thread keeps a connection of ``engine`` (its backend's pid: ``results[0]``).

    When the block ends, that thread runs one more block: its backend's pid, or what it raised,
    is ``results[1]``.
    """
    kept, go = threading.Event(), threading.Event()
    results: list[object] = []

    def other() -> None:
        try:
            results.append(_pid(engine))
            kept.set()
            assert go.wait(10)
            results.append(_pid(engine))
        except BaseException as exc:
            results.append(exc)

    worker = threading.Thread(target=other)
    worker.start()
    try:
        assert kept.wait(10), results
        yield results
    finally:
        go.set()
        worker.join()


def test_a_disconnect_drops_every_kept_connection_as_the_pool_does(
    engine: Engine, url: str
) -> None:
    """A restarted server: only the first block that meets a dead connection fails.

    The pool answers a disconnect by recycling every connection it had made before it (without
    a ping at check-out, that is what spares the next check-outs); a kept connection is never
    checked out again, so the keeper must drop the other threads' too, or each of them fails
    once more.
    """
    with _another_thread(engine) as results:
        mine = _pid(engine)
        for pid in (mine, results[0]):  # both servers' backends gone, as in a restart
            assert isinstance(pid, int)
            _kill(url, pid)
        with pytest.raises(Unavailable), submitting(engine) as conn:
            conn.exec_driver_sql("SELECT 1")
    assert len(results) == 2, results
    assert isinstance(results[1], int), results  # the other thread's next block succeeded
    assert results[1] != results[0]
    assert _pid(engine) not in (mine, results[0])


def test_an_engine_make_engine_did_not_pool_keeps_none(url: str) -> None:
    """The bounds of what is kept are the ones the composition root gave ``make_engine``."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        _pid(engine)
        assert _checked_out(engine) == 0  # the block's own check-out, given back
    finally:
        engine.dispose()


def test_a_kept_connection_given_up_as_it_expires_is_closed_not_left_to_the_gc(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispose (or a disconnect) in another thread just as a thread's kept one expires.

    The connection must be closed, never dropped from the keeper unreleased: the garbage
    collector would give it back to the pool in autocommit, where a ``transaction()`` block
    would then commit each of its statements on its own.
    """
    engine = make_engine(url, pool_size=2, max_overflow=2, pool_recycle=1000)
    autocommit: list[object] = []  # each connection's autocommit as it goes back to the pool
    event.listen(
        engine, "checkin", lambda raw, _record: autocommit.append(getattr(raw, "autocommit", None))
    )
    try:
        first = _pid(engine)
        keeper = engine.__dict__["_gatekeeper_kept"]
        real = time.monotonic

        def late() -> float:  # once: another thread gives every kept one up, and time passes
            monkeypatch.setattr(time, "monotonic", real)
            keeper.dispose(None)
            return real() + 2000

        monkeypatch.setattr(time, "monotonic", late)
        second = _pid(engine)
        monkeypatch.setattr(time, "monotonic", real)
        gc.collect()
        assert second != first
        assert not _lingering(url, {first})  # closed by the keeper, not left to the GC
        assert True not in autocommit  # nothing went back to the pool in autocommit
    finally:
        engine.dispose()


def test_a_block_inside_a_block_of_the_same_thread_has_a_connection_of_its_own(
    engine: Engine,
) -> None:
    """As before the kept connection: the inner block's COMMIT is never the outer block's."""
    with submitting(engine) as outer:
        outer_pid = int(outer.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        with submitting(engine) as inner:
            inner_pid = int(inner.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        assert outer.exec_driver_sql("SELECT 1").scalar_one() == 1  # still the outer's
    assert inner_pid != outer_pid
    assert _pid(engine) == outer_pid  # the thread still keeps the outer block's
    assert _checked_out(engine) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_fork_child_keeps_connections_whatever_its_parent_was_doing(url: str) -> None:
    """A fork while another thread makes an engine's keeper: the child's lock is its own."""

    def child() -> int:  # the child's copy of the lock stays held: its maker is not there
        engine = make_engine(url, pool_size=2, max_overflow=2)
        pid = _pid(engine)
        engine.dispose()
        return pid

    base._MAKING.acquire()  # as if another thread of the parent were making a keeper
    in_child, exit_code = _forked(child, seconds=15, in_parent=base._MAKING.release)
    assert in_child != 0
    assert exit_code == 0


def test_a_kept_connection_is_recycled_at_the_age_the_pool_would_recycle_it(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pool_recycle`` counts from when a connection was made, not from when it was kept.

    A connection made 600 s before a thread keeps it must go at 1000 s of age (600 + 400 s
    later), as the pool would recycle it, not 1000 s after it was kept (≈ 2 × pool_recycle).
    """
    engine = make_engine(url, pool_size=2, max_overflow=2, pool_recycle=1000)
    offset = [0.0]
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + offset[0])
    try:
        with engine.connect() as conn:  # made now, back in the pool at the block's end
            first = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        offset[0] += 600
        assert _pid(engine) == first  # kept now (the pool's clock saw it young)
        assert _pid(engine) == first
        offset[0] += 300  # 900 s old
        assert _pid(engine) == first
        offset[0] += 150  # 1050 s old, kept 450 s
        second = _pid(engine)
        assert second != first
        assert _checked_out(engine) == 1
        assert not _lingering(url, {first})  # the pool recycled it: closed
    finally:
        engine.dispose()


@pytest.mark.parametrize("road", ["statement", "commit"])
def test_a_disconnect_at_commit_drops_what_a_disconnect_in_a_statement_drops(
    engine: Engine, url: str, road: str
) -> None:
    """A restarted server met by a statement or by the block's ``COMMIT``: the same after it.

    The ``COMMIT`` goes to psycopg straight, outside SQLAlchemy's error handling; a disconnect
    there must still drop the other threads' kept connections and have the pool recycle the
    connections it holds, as a disconnect inside a statement does.
    """
    with _another_thread(engine) as results:
        mine = _pid(engine)
        with engine.connect() as conn:  # a third connection, idle in the pool
            pooled = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        theirs = results[0]
        assert isinstance(theirs, int), results
        dead = {mine, pooled, theirs}
        assert len(dead) == 3

        def block() -> None:
            with submitting(engine) as conn:
                begin_writes(conn)
                conn.exec_driver_sql("SELECT 1")
                for pid in dead:  # every backend gone, as in a restart
                    _kill(url, pid)
                if road == "statement":
                    conn.exec_driver_sql("SELECT 1")

        with pytest.raises(Unavailable):
            block()
    assert len(results) == 2, results
    assert isinstance(results[1], int), results  # the other thread's next block succeeded
    with engine.connect() as conn:  # the pool's idle one was recycled, not handed out dead
        assert int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()) not in dead
    assert _pid(engine) not in dead


def test_a_thread_gives_its_idle_kept_connection_back_before_it_checks_out_another(
    engine: Engine,
) -> None:
    """Request threads never hold two connections while their other reads run (issue 27).

    Two threads keep theirs (half of a 2 + 2 pool) and are then each inside a ``reading()``
    block at once: holding the kept one idle as well would take the whole pool, and the
    process's other users (a survey's threads, housekeeping) would wait up to ``pool_timeout``.
    """
    inside = threading.Barrier(3, timeout=10)
    leave = threading.Event()
    errors: list[BaseException] = []

    def request() -> None:
        try:
            _pid(engine)  # a submit: the connection kept
            with reading(engine) as conn:  # another request's read
                conn.exec_driver_sql("SELECT 1")
                inside.wait()
                assert leave.wait(10)
            _pid(engine)  # the next submit keeps one again
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=request) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        inside.wait()
        assert _checked_out(engine) == 2  # one each, not their kept ones besides
        with transaction(engine) as conn:  # a survey's check-out: room in the pool
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        leave.set()
        for worker in workers:
            worker.join()
    assert errors == []
    assert _checked_out(engine) == 2  # both kept again


def test_a_read_inside_a_block_leaves_the_blocks_kept_connection_alone(engine: Engine) -> None:
    with submitting(engine) as conn:
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        with reading(engine) as other:
            assert int(other.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()) != pid
            assert _checked_out(engine) == 2
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() == pid
    assert _pid(engine) == pid  # still kept
    assert _checked_out(engine) == 1

"""The per-object Redis lock against a real Redis: exclusion, expiry, token-checked release."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.services.errors import Busy
from app.services.locks import ObjectLocks
from tests.service.test_faults import PrivateRedis


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, socket_timeout=2.0)
    yield c
    c.close()


def test_a_second_replica_waits_then_gets_busy_then_the_lock(client: redis.Redis) -> None:
    oid = "lock-" + secrets.token_hex(4)
    a, b = ObjectLocks(client, timeout=10, wait=5), ObjectLocks(client, timeout=10, wait=0.2)
    with a.hold(oid):
        assert client.get(f"gatekeeper:lock:{oid}") is not None
        start = time.monotonic()
        with pytest.raises(Busy), b.hold(oid):
            pass
        assert time.monotonic() - start >= 0.2
        assert b.waits == 1
    assert client.get(f"gatekeeper:lock:{oid}") is None  # released
    with b.hold(oid):
        pass


def test_a_waiting_replica_gets_the_lock_when_it_is_released(client: redis.Redis) -> None:
    oid = "lock-" + secrets.token_hex(4)
    a, b = ObjectLocks(client, timeout=10, wait=5), ObjectLocks(client, timeout=10, wait=5)
    order: list[str] = []
    held = threading.Event()

    def first() -> None:
        with a.hold(oid):
            held.set()
            time.sleep(0.2)
            order.append("a done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    with b.hold(oid):
        order.append("b in")
    thread.join()
    assert order == ["a done", "b in"]


def test_a_lock_that_expired_while_held_is_reported_at_release(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    oid = "lock-" + secrets.token_hex(4)
    locks = ObjectLocks(client, timeout=0.2, wait=1)
    with caplog.at_level(logging.WARNING, logger="app.services.locks"), locks.hold(oid):
        time.sleep(0.3)
        assert client.get(f"gatekeeper:lock:{oid}") is None  # expired by itself
    assert "expired or was lost" in caplog.text


def test_an_expired_holder_leaves_the_new_holders_lock_alone(client: redis.Redis) -> None:
    oid = "lock-" + secrets.token_hex(4)
    key = f"gatekeeper:lock:{oid}"
    a, b = ObjectLocks(client, timeout=0.2, wait=1), ObjectLocks(client, timeout=10, wait=1)
    b_holds, a_done = threading.Event(), threading.Event()

    def second() -> None:
        with b.hold(oid):
            b_holds.set()
            a_done.wait(5)
            assert client.get(key) is not None  # a's release did not delete b's lock

    with a.hold(oid):
        time.sleep(0.3)
        thread = threading.Thread(target=second)
        thread.start()
        assert b_holds.wait(5)
    a_done.set()
    thread.join()
    assert client.get(key) is None


@pytest.mark.slow
def test_an_unreachable_redis_leaves_the_database_in_charge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    locks = ObjectLocks(dead, timeout=1, wait=1)
    ran = False
    with caplog.at_level(logging.WARNING, logger="app.services.locks"), locks.hold("any"):
        ran = True
    assert ran
    assert "relying on the database alone" in caplog.text


def test_a_release_redis_did_not_answer_is_retried_until_it_lands(tmp_path: Path) -> None:
    """Redis frozen at release time: the release is queued, and once Redis answers again one
    background thread deletes the lock (long before it would expire by itself)."""
    server = PrivateRedis(tmp_path)
    try:
        frozen_client = redis.Redis.from_url(server.url, socket_timeout=0.3)
        locks = ObjectLocks(frozen_client, timeout=30, wait=1)
        observer = redis.Redis.from_url(server.url, socket_timeout=2.0)
        assert observer.keys("*") == []
        with locks.hold("frozen-at-release"):
            (name,) = observer.keys("*")
            server.pause()
        # the release timed out and was queued for the one retry thread: the lock is still there
        assert locks._pending
        retrier = locks._retrier
        assert retrier is not None
        server.resume()
        deadline = time.monotonic() + 5.0
        while observer.exists(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not observer.exists(name), "the queued release never deleted the lock"
        retrier.join(timeout=5.0)
        assert not retrier.is_alive()  # the retry thread stops once the queue is empty
        assert locks._retrier is None
        assert not locks._pending
    finally:
        server.resume()
        server.kill()


def test_a_release_script_redis_does_not_have_is_loaded_and_run(client: redis.Redis) -> None:
    """The release is an ``EVALSHA`` sent by hand: after a restarted or flushed Redis (here: a
    script it never saw) it loads the script and releases the lock, rather than leaving it to
    expire while the object stays busy for every other replica."""
    from app.services import locks as lock_module

    oid = "lock-" + secrets.token_hex(4)
    locks = ObjectLocks(client, timeout=30, wait=0.2)
    unseen = lock_module._RELEASE + f"-- {secrets.token_hex(8)}\n"
    locks._release = client.register_script(unseen)
    assert client.script_exists(locks._release.sha) == [False]
    with locks.hold(oid):
        assert client.get(f"gatekeeper:lock:{oid}") is not None
    assert client.get(f"gatekeeper:lock:{oid}") is None
    assert client.script_exists(locks._release.sha) == [True]
    with ObjectLocks(client, timeout=30, wait=0.2).hold(oid):  # not busy: it was released
        pass


def test_a_command_after_a_timed_out_one_reads_its_own_reply(tmp_path: Path) -> None:
    """A command that timed out (Redis frozen) may still be answered later: the lock drops its
    connection, so the next command on the pool reads its own reply, never the late one (a
    ``SET NX`` taking a late ``EVALSHA`` reply would believe it holds a lock it does not)."""
    server = PrivateRedis(tmp_path)
    try:
        frozen = redis.Redis.from_url(server.url, socket_timeout=0.3)
        frozen.set("gatekeeper:a", "A")
        frozen.set("gatekeeper:b", "B")
        locks = ObjectLocks(frozen, timeout=30, wait=0.2)
        server.pause()
        with pytest.raises(redis.exceptions.TimeoutError):
            locks._command("GET", "gatekeeper:a")
        server.resume()
        assert locks._command("GET", "gatekeeper:b") == b"B"
        assert locks._command("GET", "gatekeeper:a") == b"A"
        frozen.close()
    finally:
        server.kill()


def test_the_lock_commands_use_the_threads_own_connection(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's commands never check a connection out of the client's pool: each thread has
    its own, one per thread however many locks it takes (the pool's check-out and check-in cost
    about half a command's client-side CPU: docs/benchmarks.md, "h/submit4")."""
    pool = client.connection_pool
    checked_out: list[object] = []
    real_get = pool.get_connection

    def counting(*args: object, **kwargs: object) -> object:
        checked_out.append(args)
        return real_get(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counting)
    locks = ObjectLocks(client, timeout=10, wait=0.2)
    ids: set[int] = set()

    def hold_three() -> None:
        for _ in range(3):
            oid = "lock-" + secrets.token_hex(4)
            with locks.hold(oid):
                assert client.get(f"gatekeeper:lock:{oid}") is not None
            ids.add(id(locks._own.connection))

    hold_three()
    other = threading.Thread(target=hold_three)
    other.start()
    other.join()
    # the test's own GETs went through the pool; the locks' SETs and releases did not
    assert len(checked_out) == 6
    assert len(ids) == 2  # one connection per thread


def test_a_thread_connection_the_server_closed_is_reopened(client: redis.Redis) -> None:
    """A thread's connection that Redis closed while it was idle (a restart, an idle timeout) is
    reopened before the next command, as the pool's check-out would: the next lock is taken in
    Redis, with no warning and no fall-back to the database alone."""
    locks = ObjectLocks(client, timeout=10, wait=0.2)
    oid = "lock-" + secrets.token_hex(4)
    with locks.hold(oid):
        pass
    connection = locks._own.connection
    connection.send_command("CLIENT", "ID")
    own_id = connection.read_response()
    assert client.client_kill_filter(_id=own_id) == 1
    time.sleep(0.05)
    with locks.hold(oid):
        assert client.get(f"gatekeeper:lock:{oid}") is not None
    assert locks._redis_down_until == 0.0  # no Redis failure was seen
    assert client.get(f"gatekeeper:lock:{oid}") is None


def test_a_reply_nobody_read_is_never_taken_for_the_next_commands(client: redis.Redis) -> None:
    """A thread's connection with a reply waiting (a command sent and never read) is replaced
    before the next command, as the pool's check-out replaces one: each command reads its own
    reply."""
    client.set("gatekeeper:lock-test-b", "B")
    locks = ObjectLocks(client, timeout=10, wait=0.2)
    assert locks._command("GET", "gatekeeper:lock-test-b") == b"B"
    connection = locks._own.connection
    connection.send_command("ECHO", "stale")  # its reply is never read
    time.sleep(0.05)
    assert locks._command("GET", "gatekeeper:lock-test-b") == b"B"
    client.delete("gatekeeper:lock-test-b")


def test_an_idle_connection_in_step_is_checked_without_the_pools_can_read(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before a command on a connection already open is one ``poll`` (the pool's
    ``can_read`` is three system calls): ``can_read`` runs only for a new connection."""
    locks = ObjectLocks(client, timeout=10, wait=0.2)
    locks._command("PING")
    connection = locks._own.connection
    calls = []
    real = connection.can_read

    def counting(*args: object, **kwargs: object) -> bool:
        calls.append(args)
        return bool(real(*args, **kwargs))

    monkeypatch.setattr(connection, "can_read", counting)
    for _ in range(3):
        with locks.hold("lock-" + secrets.token_hex(4)):
            pass
    assert calls == []

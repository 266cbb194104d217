"""Per-object locks: in-process always, plus a Redis lock across replicas when configured.

The locks only keep two workers from computing the same object's decision at once (saving
work and retries). Correctness comes from the database: an accepted query is written in the
same transaction as a compare-and-set on the object's version. So a Redis lock that expires,
is lost, or cannot be reached at all never causes a double spend; an unreachable Redis is
logged and the request goes on with the in-process lock alone.

The Redis lock is a plain ``SET key token NX PX timeout`` and a compare-and-delete script, the
same protocol as ``redis.lock.Lock`` with less client-side work per request: one round trip to
acquire, one to release, each sent by hand (the client's ``execute_command`` — its retry
wrapper, option filtering and response callbacks — cost as much CPU again as the two commands
themselves: docs/benchmarks.md, "h/submitdb") on the calling thread's own connection, made by
the client's pool but never checked in or out of it (the pool's lock, its observability hooks and
its release event cost about half the CPU of a command's own client-side work:
docs/benchmarks.md, "h/submit4"); before each command the connection is checked as the pool's
check-out checks it (reconnected if the server closed it or it has unread data). A command that
fails is not retried by the client: the failure takes the path below at once.

A release that Redis does not answer (down, or frozen past the client's socket timeout) is
retried in the background (one thread per process, working through a queue) until it succeeds
or the lock has expired by itself: otherwise the stale lock would hold every other worker off
the object for the whole lock timeout after Redis came back (measured: 30 s,
``tests/service/test_faults.py::test_redis_outage_during_load[frozen]``).
After any Redis failure the locks skip Redis for :data:`REDIS_BACKOFF` seconds (the database
alone decides, as always correctly): requests queued on one object's in-process lock would
otherwise each wait out the client's socket timeout in turn (measured: 3 s with a 1 s timeout).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app import metrics
from app.services.errors import Busy

log = logging.getLogger(__name__)

_LOCK_ACQUIRED = metrics.LOCK_WAIT.labels("acquired")
_LOCK_BUSY = metrics.LOCK_WAIT.labels("busy")

#: Seconds the locks leave Redis alone after it failed to answer.
REDIS_BACKOFF = 1.0

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class _Local:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def get(self, key: str) -> Any:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = threading.Lock()
                self._locks[key] = lock
            return lock


class ObjectLocks:
    """``with locks.hold(object_id): ...`` serialises work on one object.

    Parameters
    ----------
    redis:
        A ``redis.Redis`` client, or None for in-process locks only.
    timeout:
        Seconds after which a Redis lock expires by itself (a crashed holder cannot block).
    wait:
        Seconds to wait for a lock before answering :class:`Busy`.
    """

    def __init__(self, redis: Any | None = None, timeout: float = 30.0, wait: float = 30.0) -> None:
        self.redis = redis
        self.timeout = timeout
        self.wait = wait
        self._local = _Local()
        self.waits = 0
        #: ``time.monotonic()`` before which Redis is not asked (after a failure).
        self._redis_down_until = 0.0
        # deletes the key only if it still holds our token (run as EVALSHA, loaded on first use)
        self._release = redis.register_script(_RELEASE) if redis is not None else None
        #: releases Redis did not answer: (key, token) -> when the lock expires by itself
        self._pending: dict[tuple[str, str], float] = {}
        self._pending_guard = threading.Lock()
        self._retrier: threading.Thread | None = None
        #: each thread's own connection for the lock's commands (:meth:`_connection`)
        self._own = threading.local()

    @contextmanager
    def hold(self, object_id: str) -> Iterator[None]:
        """Hold the in-process lock and, if configured, the Redis lock of ``object_id``.

        The wait for both is observed in ``gatekeeper_lock_wait_seconds`` (result ``acquired``
        or ``busy``).
        """
        start = time.perf_counter()
        local = self._local.get(object_id)
        if not local.acquire(timeout=self.wait):
            _LOCK_BUSY.observe(time.perf_counter() - start)
            raise Busy("the object is busy; retry later", retry_after=1)
        entered = False
        try:
            with self._redis_lock(object_id):
                entered = True
                _LOCK_ACQUIRED.observe(time.perf_counter() - start)
                yield
        except Busy:
            if not entered:  # the Redis lock was not acquired (a Busy of the body is its own)
                _LOCK_BUSY.observe(time.perf_counter() - start)
            raise
        finally:
            local.release()

    @contextmanager
    def _redis_lock(self, object_id: str) -> Iterator[None]:
        if self.redis is None or self._release is None or self._redis_skipped():
            yield
            return
        from redis.exceptions import RedisError

        name = f"gatekeeper:lock:{object_id}"
        token = os.urandom(16).hex()
        try:
            acquired = self._acquire(name, token)
        except RedisError as exc:
            self._redis_down_until = time.monotonic() + REDIS_BACKOFF
            # Redis may have executed the SET and frozen before replying: a lock with our token
            # would then hold the object for the whole timeout (measured: 26.5 s); delete it
            # (only if it holds our token) as soon as Redis answers again
            self._release_later(name, token, quiet=True)
            log.warning(
                "redis lock unavailable (%s); relying on the database alone", type(exc).__name__
            )
            yield
            return
        if not acquired:
            self.waits += 1
            raise Busy("the object is busy on another replica; retry later", retry_after=1)
        try:
            yield
        finally:
            try:
                released = self._release_now(name, token)
            except RedisError:
                self._redis_down_until = time.monotonic() + REDIS_BACKOFF
                self._release_later(name, token)
            else:
                if not released:
                    log.warning("redis lock of an object expired or was lost before release")

    def _command(self, *args: Any) -> Any:
        """One command on the calling thread's own connection: its reply (a Redis error raised).

        A connection that failed mid-command is disconnected (its reply may still come: the next
        command must not read it, and reconnects).
        """
        from redis.exceptions import ResponseError

        connection = self._connection()
        try:
            connection.send_command(*args)
            return connection.read_response()
        except ResponseError:  # an error reply: the connection is in step
            raise
        except BaseException:
            connection.disconnect()
            raise

    def _connection(self) -> Any:
        """The calling thread's connection, checked as the pool checks one it hands out.

        Made by the client's pool (its settings, credentials and TLS) on the thread's first
        command and kept by the thread. Before each command, as ``ConnectionPool.get_connection``
        does: connected if it is not, and reconnected if its socket has data to read — a reply
        nobody read, or the end of file of a connection the server closed while it was idle (a
        Redis restart) — raising if even a fresh connection has. The check is one ``poll`` of
        the socket with no wait (the pool's ``can_read`` makes three system calls, each
        releasing the GIL: the socket made non-blocking, a ``recv``, the timeout restored); only
        a socket with something to read takes the pool's own steps.
        """
        own = self._own
        connection = getattr(own, "connection", None)
        if connection is None:
            assert self.redis is not None  # noqa: S101 - only called with a client
            connection = own.connection = self.redis.connection_pool.make_connection()
        sock = getattr(connection, "_sock", None)
        if sock is not None and sock is getattr(own, "polled", None) and not own.poller.poll(0):
            return connection  # open, and nothing to read: in step
        self._check(connection)
        sock = getattr(connection, "_sock", None)
        if sock is not None and sock is not getattr(own, "polled", None):
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            own.poller, own.polled = poller, sock
        return connection

    @staticmethod
    def _check(connection: Any) -> None:
        """``ConnectionPool.get_connection``'s check of a connection it hands out."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        try:
            connection.connect()
            try:
                if connection.can_read():
                    raise RedisConnectionError("Connection has data")
            except (RedisConnectionError, RedisTimeoutError, OSError):
                connection.disconnect()
                connection.connect()
                if connection.can_read():
                    raise RedisConnectionError("Connection not ready") from None
        except BaseException:
            connection.disconnect()
            raise

    def _release_now(self, name: str, token: str) -> bool:
        """Run the release script (``EVALSHA``; loaded first if Redis does not have it)."""
        from redis.exceptions import NoScriptError

        assert self._release is not None  # noqa: S101 - set with the client
        try:
            return bool(self._command("EVALSHA", self._release.sha, 1, name, token))
        except NoScriptError:  # a restarted or flushed Redis: the script object loads it
            return bool(self._release(keys=[name], args=[token]))

    def _redis_skipped(self) -> bool:
        """Whether Redis failed less than :data:`REDIS_BACKOFF` seconds ago."""
        return time.monotonic() < self._redis_down_until

    def _release_later(self, name: str, token: str, *, quiet: bool = False) -> None:
        """Queue a failed release for the retry thread (started if it is not running)."""
        if not quiet:
            log.warning("redis did not answer the release of an object's lock; retrying it")
        with self._pending_guard:
            # retrying past the lock's expiry is pointless: it is gone by itself by then
            self._pending[(name, token)] = time.monotonic() + self.timeout
            if self._retrier is None:
                self._retrier = threading.Thread(
                    target=self._retry_releases, name="lock-release", daemon=True
                )
                self._retrier.start()

    def _retry_releases(self) -> None:
        """Retry the queued releases every 0.2 s; stop when none is left.

        A release leaves the queue when it succeeds or when its lock has expired by itself.
        """
        from redis.exceptions import RedisError

        while True:
            time.sleep(0.2)
            with self._pending_guard:
                now = time.monotonic()
                due = [item for item, expires in self._pending.items() if expires > now]
                self._pending = {item: self._pending[item] for item in due}
                if not due:
                    self._retrier = None
                    return
            for name, token in due:
                try:
                    assert self._release is not None  # noqa: S101 - set with the client
                    self._release(keys=[name], args=[token])
                except RedisError:
                    break  # still down: wait and try them all again
                with self._pending_guard:
                    self._pending.pop((name, token), None)

    def _acquire(self, name: str, token: str) -> bool:
        """``SET name token NX PX timeout``, retried with backoff (2 ms doubling to 50 ms)."""
        assert self.redis is not None  # noqa: S101 - only called with a client
        deadline = time.monotonic() + self.wait
        delay = 0.002
        timeout = max(1, int(self.timeout * 1000))
        while not self._command("SET", name, token, "NX", "PX", timeout):
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(0.05, 2 * delay)
        return True

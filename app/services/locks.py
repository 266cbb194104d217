"""Per-object locks: in-process always, plus a Redis lock across replicas when configured.

The locks only keep two workers from computing the same object's decision at once (saving
work and retries). Correctness comes from the database: an accepted query is written in the
same transaction as a compare-and-set on the object's version. So a Redis lock that expires,
is lost, or cannot be reached at all never causes a double spend; an unreachable Redis is
logged and the request goes on with the in-process lock alone.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.services.errors import Busy

log = logging.getLogger(__name__)


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

    @contextmanager
    def hold(self, object_id: str) -> Iterator[None]:
        """Hold the in-process lock and, if configured, the Redis lock of ``object_id``."""
        local = self._local.get(object_id)
        if not local.acquire(timeout=self.wait):
            raise Busy("the object is busy; retry later", retry_after=1)
        try:
            with self._redis_lock(object_id):
                yield
        finally:
            local.release()

    @contextmanager
    def _redis_lock(self, object_id: str) -> Iterator[None]:
        if self.redis is None:
            yield
            return
        from redis.exceptions import LockError, RedisError

        lock = self.redis.lock(
            f"gatekeeper:lock:{object_id}", timeout=self.timeout, blocking_timeout=self.wait
        )
        try:
            acquired = lock.acquire()
        except RedisError as exc:
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
                lock.release()
            except (LockError, RedisError):
                log.warning("redis lock of an object expired or was lost before release")

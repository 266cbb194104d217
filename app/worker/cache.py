"""Result caches for bound computations."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any, Protocol

log = logging.getLogger(__name__)


class ResultCache(Protocol):
    """What the worker needs of a cache: JSON-able answers by key."""

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached answer, or None."""

    def set(self, key: str, value: dict[str, Any]) -> None:
        """Store an answer."""


class LRUCache:
    """A thread-safe in-process least-recently-used cache with hit/miss counters."""

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached answer (marking it recently used), or None."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def set(self, key: str, value: dict[str, Any]) -> None:
        """Store an answer, evicting the least recently used beyond ``max_entries``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


class RedisCache:
    """Answers cached in Redis under ``gatekeeper:bounds:<key>`` with a TTL, shared by replicas.

    Redis errors are logged and treated as misses: the cache can only save work.
    """

    def __init__(self, client: Any, ttl_seconds: int = 7 * 24 * 3600) -> None:
        self.client = client
        self.ttl = ttl_seconds
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached answer, or None (also on Redis errors)."""
        from redis.exceptions import RedisError

        try:
            raw = self.client.get(f"gatekeeper:bounds:{key}")
        except RedisError as exc:
            log.warning("redis cache unavailable (%s)", type(exc).__name__)
            raw = None
        if raw is None:
            self.misses += 1
            return None
        self.hits += 1
        value: dict[str, Any] = json.loads(raw)
        return value

    def set(self, key: str, value: dict[str, Any]) -> None:
        """Store an answer (errors are logged and ignored)."""
        from redis.exceptions import RedisError

        try:
            self.client.set(f"gatekeeper:bounds:{key}", json.dumps(value), ex=self.ttl)
        except RedisError as exc:
            log.warning("redis cache unavailable (%s)", type(exc).__name__)

"""Result caches for bound computations."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol


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

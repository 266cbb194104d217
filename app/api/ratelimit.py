"""Per-API-key rate limits: a pure ASGI middleware answering ``429`` problem+json.

Each request that carries ``Authorization: Bearer <key>`` is counted against that key, identified
by a hash of the key (so no database lookup happens before the limit, and guessing keys is
throttled like using them). The limit is ``RATE_LIMIT_PER_SECOND`` requests a second on average
with bursts of ``RATE_LIMIT_BURST``; ``0`` (the default) turns limiting off.

With Redis (``REDIS_URL``) the count is shared by every worker and replica: a window of
``burst / per_second`` seconds admits ``burst`` requests (``INCR`` + ``EXPIRE`` on one key per
window). Without Redis, or while Redis cannot be reached, each process keeps a token bucket per
key (so ``N`` workers admit up to ``N`` times the rate). A throttled request gets ``Retry-After``
(seconds, rounded up) and is never passed on.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from typing import Any

from starlette.responses import Response
from starlette.types import Scope

from app.api import problems

log = logging.getLogger("gatekeeper")

#: Keys whose buckets a process remembers (least recently used ones are forgotten).
MAX_TRACKED_KEYS = 10_000


class TokenBuckets:
    """In-process token buckets, one per key."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._guard = threading.Lock()

    def take(self, key: str) -> float:
        """Take one token: ``0`` if allowed, else the seconds until one is available."""
        now = time.monotonic()
        with self._guard:
            tokens, last = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.per_second)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.per_second
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > MAX_TRACKED_KEYS:
                self._buckets.popitem(last=False)
        return wait


class RateLimiter:
    """Shared windows in Redis when available, token buckets otherwise (module docstring)."""

    def __init__(self, per_second: float, burst: int, redis: Any | None) -> None:
        self.per_second = per_second
        self.burst = burst if burst > 0 else max(1, math.ceil(2 * per_second))
        self.window = self.burst / per_second
        self.redis = redis
        self.local = TokenBuckets(per_second, self.burst)
        self._warned = False

    def take(self, key: str) -> float:
        """``0`` if the request may go on, else the seconds to wait."""
        if self.redis is None:
            return self.local.take(key)
        from redis.exceptions import RedisError

        now = time.time()
        window = math.floor(now / self.window)
        name = f"gatekeeper:rate:{key}:{window}"
        try:
            pipe = self.redis.pipeline()
            pipe.incr(name)
            pipe.expire(name, math.ceil(self.window) + 1)
            count = int(pipe.execute()[0])
        except RedisError as exc:
            if not self._warned:
                log.warning("rate limits fall back to this process (%s)", type(exc).__name__)
                self._warned = True
            return self.local.take(key)
        if count <= self.burst:
            return 0.0
        return (window + 1) * self.window - now


def key_id(authorization: bytes) -> str | None:
    """A stable, non-reversible id of the bearer key in an Authorization header."""
    if authorization[:7].lower() != b"bearer ":
        return None
    secret = authorization[7:].strip()
    return hashlib.sha256(secret).hexdigest()[:32] if secret else None


class RateLimits:
    """The limit of a process's requests: ``429`` for a key over it (None: go on).

    :class:`app.api.middleware.RequestContext` asks it before anything else runs (pure ASGI:
    no body buffering); the limiter is made at the first request, when the runtime (its Redis)
    exists.
    """

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self._limiter: RateLimiter | None = None

    def _get_limiter(self, scope: Scope) -> RateLimiter:
        if self._limiter is None:
            runtime = getattr(scope["app"].state, "runtime", None)
            redis = getattr(runtime, "redis", None)
            self._limiter = RateLimiter(self.per_second, self.burst, redis)
        return self._limiter

    def refuse(self, scope: Scope, authorization: bytes | None) -> Response | None:
        """The ``429`` answer to a request over its key's limit, else None."""
        key = key_id(authorization) if authorization else None
        wait = self._get_limiter(scope).take(key) if key else 0.0
        if wait <= 0.0:
            return None
        return problems.problem(
            429,
            "rate-limited",
            "Too many requests",
            f"this API key is limited to {self.per_second:g} requests a second "
            f"(bursts of {self._get_limiter(scope).burst}); retry later",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )

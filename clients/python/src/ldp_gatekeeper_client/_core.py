"""What the sync and async clients share: calls, pagers and the retry policy.

An operation of the API is described once, as a :class:`Call` (method, path, body bytes,
``Idempotency-Key``, how to parse the answer, whether a retry is safe); :mod:`._sync` and
:mod:`._async` only send it. The body is serialized once per logical call and the key generated
once, so every retry of it sends the same bytes with the same key.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from ldp_gatekeeper_client._version import __version__
from ldp_gatekeeper_client.errors import ApiError, RateLimited, ServerBusy

log = logging.getLogger("ldp_gatekeeper_client")

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

USER_AGENT = f"ldp-gatekeeper-client/{__version__}"
JSON = "application/json"
NDJSON = "application/x-ndjson"

#: Failures after which the request certainly did not reach the application.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Failures of this side (a URL without http/https, a request httpx cannot send): no retry helps.
_OURS = (httpx.UnsupportedProtocol, httpx.LocalProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before sending a failed request again.

    A request is retried after a connection error, a timeout, ``429`` or a ``5xx`` answer — if
    retrying it is safe: reads, dry-runs, the calculator and every call that carries an
    ``Idempotency-Key`` (submits, imports, survey creation). Other writes (registering an
    object, creating or revoking a key) are retried only when the request certainly did not
    reach the application: the connection could not be opened, or the rate limiter (which
    answers before the application) said ``429``.

    The wait before retry ``n`` (0-based) is exponential, ``backoff × 2ⁿ`` capped at
    ``max_backoff``, with "equal jitter" (a uniformly random half of it added to the other
    half), so that clients failing together do not come back together. A ``Retry-After`` header
    (seconds or an HTTP date) is honoured: the wait is never shorter than it, plus up to 20%
    jitter. A ``Retry-After`` longer than ``max_retry_after`` is not waited for: the error is
    raised at once (:class:`~ldp_gatekeeper_client.errors.RateLimited` or
    :class:`~ldp_gatekeeper_client.errors.ServerBusy`, with ``retry_after``).
    """

    max_retries: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    statuses: frozenset[int] = frozenset({429, 500, 502, 503, 504})
    #: the jitter's source of randomness (not a secret: ``random`` is fine)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def backoff_delay(self, retry: int) -> float:
        """The jittered exponential wait before retry number ``retry`` (0-based)."""
        ceiling = min(self.max_backoff, self.backoff * (2.0**retry))
        return ceiling / 2.0 + self.rng.uniform(0.0, ceiling / 2.0)

    def delay(self, retry: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry ``retry``, or None when it must not be waited for."""
        if retry >= self.max_retries:
            return None
        backoff = self.backoff_delay(retry)
        if retry_after is None:
            return backoff
        if retry_after > self.max_retry_after:
            return None
        return max(backoff, retry_after * (1.0 + 0.2 * self.rng.random()))


#: The default policy.
DEFAULT_RETRY = RetryPolicy()
#: No retries at all.
NO_RETRY = RetryPolicy(max_retries=0)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One logical request: sent once, and again with the same bytes and key on a retry."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: list[tuple[str, str]] = field(default_factory=list)
    content: bytes | None = None
    content_type: str = JSON
    idempotency_key: str | None = None
    #: a retry cannot change the outcome (reads, dry-runs, calls with an Idempotency-Key)
    safe: bool = True

    def request(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The HTTP request of one attempt (identical for every attempt)."""
        headers = {}
        if self.content is not None:
            headers["Content-Type"] = self.content_type
        if self.idempotency_key is not None:
            headers["Idempotency-Key"] = self.idempotency_key
        return client.build_request(
            self.method,
            self.path,
            params=tuple(self.params),
            content=self.content,
            headers=headers,
        )


def retry_wait(
    policy: RetryPolicy,
    call: Call[Any],
    retry: int,
    *,
    error: ApiError | None = None,
    failure: httpx.TransportError | None = None,
) -> float | None:
    """Seconds to wait before retrying ``call`` after ``error`` or ``failure``; None: don't."""
    if error is not None:
        if error.status not in policy.statuses or not (call.safe or error.status == 429):
            return None
        retry_after = error.retry_after if isinstance(error, RateLimited | ServerBusy) else None
        wait = policy.delay(retry, retry_after)
        reason = f"{error.status} {error.type}"
    else:
        if isinstance(failure, _OURS) or not (call.safe or isinstance(failure, _NOT_SENT)):
            return None
        wait = policy.delay(retry, None)
        reason = type(failure).__name__
    if wait is not None:
        log.info(
            "%s %s: %s; retry %d of %d in %.2f s",
            call.method,
            call.path,
            reason,
            retry + 1,
            policy.max_retries,
            wait,
        )
    return wait


def new_idempotency_key() -> str:
    """A fresh Idempotency-Key (a random UUID)."""
    return str(uuid.uuid4())


def dump(body: BaseModel | Mapping[str, Any]) -> Any:
    """The JSON value of a request body: a model (``None`` fields left out) or a mapping."""
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(body)


def encode(value: Any) -> bytes:
    """Compact JSON bytes; NaN and infinities are refused here (they are not JSON)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def parser(model: type[M]) -> Callable[[httpx.Response], M]:
    """Parse an answer into ``model``, noting ``Idempotent-Replayed`` where it applies."""

    def parse(response: httpx.Response) -> M:
        parsed = model.model_validate_json(response.content)
        if hasattr(parsed, "_replayed"):
            parsed._replayed = response.headers.get("idempotent-replayed") == "true"
        return parsed

    return parse


@dataclass(frozen=True)
class Pager(Generic[T]):
    """A paged list: ``page(cursor)`` is the call of one page, ``split`` its items and next cursor.

    The first page is asked with ``first``; iteration stops when ``split`` gives no cursor.
    """

    first: Any
    page: Callable[[Any], Call[Any]]
    split: Callable[[Any], tuple[list[T], Any]]

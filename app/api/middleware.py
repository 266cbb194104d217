"""The one pure ASGI middleware: request id, access log, latency metrics, rate and body limits.

One plain ASGI callable rather than ``@app.middleware("http")``: Starlette's
``BaseHTTPMiddleware`` runs every request through an extra task group and memory streams per
layer, a measurable share of the CPU of a submit (docs/benchmarks.md, service load). And one
rather than three (request context, rate limit, body limit): one pass over the headers, one
layer of calls (docs/benchmarks.md, "h/http").
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs, metrics
from app.api import problems
from app.api.ratelimit import RateLimits

access = logging.getLogger("gatekeeper.access")


class RequestContext:
    """The only layer before FastAPI's: every response gets ``X-Request-ID`` and one access line.

    The request id is the client's ``X-Request-ID`` when it is 1-64 printable characters, else a
    new random 128-bit hex id; it is set in :data:`app.logs.request_id` for every log line of
    the request. Then, in this order, a request may be answered here without reaching the
    routes (with its request id and access line too):

    - ``429`` when its bearer key is over ``RATE_LIMIT_PER_SECOND`` (:mod:`app.api.ratelimit`;
      ``per_second = 0``: no limit);
    - ``400`` for a non-numeric ``Content-Length`` and ``413`` above ``max_bytes`` (a chunked
      body without ``Content-Length`` is limited while it is read: :func:`app.api.deps.json_body`).
    """

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, per_second: float = 0.0, burst: int = 0
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.limits = RateLimits(per_second, burst) if per_second > 0 else None
        #: The latency histogram's child per (method, path, status): ``labels()`` once each.
        self._observers: dict[tuple[str, str, int], Callable[[float], None]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = length = authorization = None
        for key, value in scope["headers"]:  # one pass; the first of each, the last Authorization
            if key == b"x-request-id":
                if incoming is None:
                    incoming = value.decode("latin-1")
            elif key == b"content-length":
                if length is None:
                    length = value.decode("latin-1")
            elif key == b"authorization":
                authorization = value
        valid = incoming is not None and 0 < len(incoming) <= 64 and incoming.isprintable()
        rid = incoming if valid and incoming is not None else os.urandom(16).hex()
        raw_rid = rid.encode("latin-1")
        token = logs.request_id.set(rid)
        start = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers: list[Any] = list(message.get("headers", ()))
                headers.append((b"x-request-id", raw_rid))
                message = {**message, "headers": headers}
            await send(message)

        metrics.IN_PROGRESS.inc()
        try:
            refusal = self.limits.refuse(scope, authorization) if self.limits else None
            if refusal is None:
                refusal = self._too_large(length)
            if refusal is None:
                await self.app(scope, receive, send_with_id)
            else:
                await refusal(scope, receive, send_with_id)
        finally:
            metrics.IN_PROGRESS.dec()
            duration = time.perf_counter() - start
            path = _route_path(scope)
            method = scope.get("method", "")
            if access.isEnabledFor(logging.INFO):
                # access.info's record, made without looking up the caller's frame (it is
                # always this line); handled as access.info handles it
                access.handle(
                    access.makeRecord(
                        access.name,
                        logging.INFO,
                        __file__,
                        sys._getframe().f_lineno,
                        "request",
                        (),
                        None,
                        "__call__",
                        {
                            "method": method,
                            "path": path,
                            "status": status,
                            "duration_ms": round(1000 * duration, 2),
                        },
                    )
                )
            observe = self._observers.get((method, path, status))
            if observe is None:
                observe = metrics.REQUESTS.labels(method, path, str(status)).observe
                if len(self._observers) < 10_000:  # paths are templates; bounded anyway
                    self._observers[(method, path, status)] = observe
            observe(duration)
            logs.request_id.reset(token)

    def _too_large(self, length: str | None) -> Response | None:
        """The ``400`` or ``413`` answer to a ``Content-Length``, or None."""
        if length is None:
            return None
        if not length.isdigit():
            return problems.problem(
                400, "bad-request", "Bad request", "the Content-Length header is not a number"
            )
        if int(length) > self.max_bytes:
            return problems.problem(
                413,
                "payload-too-large",
                "Payload too large",
                f"request bodies are limited to {self.max_bytes} bytes",
            )
        return None


def _route_path(scope: Scope) -> str:
    """The route template that served the request; ``unmatched`` when no route did.

    FastAPI's API routes put themselves in ``scope["route"]``; plain Starlette routes
    (``/openapi.json``, ``/docs``, ``/redoc``) only leave their ``endpoint``, which was logged and
    counted as ``unmatched``.
    """
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", "unmatched"))
    endpoint = scope.get("endpoint")
    app = scope.get("app")
    if endpoint is not None and app is not None:
        for candidate in getattr(getattr(app, "router", None), "routes", ()):
            if getattr(candidate, "endpoint", None) is endpoint:
                return str(getattr(candidate, "path", "unmatched"))
    return "unmatched"

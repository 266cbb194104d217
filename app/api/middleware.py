"""Pure ASGI middleware: request id + access log + latency metrics, and the body-size limit.

Plain ASGI callables rather than ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware``
runs every request through an extra task group and memory streams per layer, a measurable share
of the CPU of a submit (docs/benchmarks.md, service load).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs, metrics
from app.api import problems

access = logging.getLogger("gatekeeper.access")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


class RequestContext:
    """Outermost layer: every response (413s too) gets ``X-Request-ID`` and one access line.

    The request id is the client's ``X-Request-ID`` when it is 1-64 printable characters, else a
    new random 128-bit hex id; it is set in :data:`app.logs.request_id` for every log line of
    the request.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, b"x-request-id") or ""
        valid = 0 < len(incoming) <= 64 and incoming.isprintable()
        rid = incoming if valid else os.urandom(16).hex()
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
            await self.app(scope, receive, send_with_id)
        finally:
            metrics.IN_PROGRESS.dec()
            duration = time.perf_counter() - start
            path = _route_path(scope)
            method = scope.get("method", "")
            access.info(
                "request",
                extra={
                    "method": method,
                    "path": path,
                    "status": status,
                    "duration_ms": round(1000 * duration, 2),
                },
            )
            metrics.REQUESTS.labels(method, path, str(status)).observe(duration)
            logs.request_id.reset(token)


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


class BodyLimit:
    """Answer 400 for a non-numeric ``Content-Length`` and 413 above ``max_bytes``.

    A chunked body without ``Content-Length`` is limited while it is read
    (:func:`app.api.deps.json_body`).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] == "http":
            length = _header(scope, b"content-length")
            if length is not None and not length.isdigit():
                response = problems.problem(
                    400, "bad-request", "Bad request", "the Content-Length header is not a number"
                )
                await response(scope, receive, send)
                return
            if length is not None and int(length) > self.max_bytes:
                response = problems.problem(
                    413,
                    "payload-too-large",
                    "Payload too large",
                    f"request bodies are limited to {self.max_bytes} bytes",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

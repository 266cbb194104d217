"""One JSON error shape: RFC 9457 ``application/problem+json``.

``{"type", "title", "status", "detail", "errors": [{"field", "message"}], ...}`` — validation
errors name the field and never echo the submitted value.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SATimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from app.engine.errors import InvalidInput, Unsupported
from app.services.bodies import our_words
from app.services.errors import ServiceError

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"


def problem(
    status: int,
    type_: str,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """A problem+json response."""
    body = {"type": type_, "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    if len(loc) == 2 and loc[0] == "header":  # as the client wrote it: Idempotency-Key
        return "-".join(word.capitalize() for word in str(loc[1]).split("-"))
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "body"


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)  # noqa: S101 - registered for this type
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return problem(400, "invalid-json", "Invalid JSON", "the request body is not valid JSON")
    items = [
        {"field": _field(tuple(e.get("loc", ()))), "message": our_words(dict(e))} for e in errors
    ]
    detail = f"{items[0]['field']}: {items[0]['message']}" if items else "invalid request"
    return problem(422, "validation-error", "Invalid input", detail, errors=items)


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidInput)  # noqa: S101 - registered for this type
    items = [{"field": e.field or "body", "message": e.message} for e in exc.errors]
    detail = f"{items[0]['field']}: {items[0]['message']}"
    return problem(422, "validation-error", "Invalid input", detail, errors=items)


async def _unsupported(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Unsupported)  # noqa: S101 - registered for this type
    return problem(
        422,
        "unsupported",
        "Not supported",
        f"{exc.field}: {exc.message}",
        errors=[{"field": exc.field, "message": exc.message}],
    )


async def _service(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)  # noqa: S101 - registered for this type
    headers = {}
    extra = dict(exc.extra)
    if "retry_after" in extra:
        headers["Retry-After"] = str(extra.pop("retry_after"))
    if extra.pop("replayed", False):
        headers["Idempotent-Replayed"] = "true"
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return problem(exc.status, exc.type, exc.title, exc.detail, headers=headers or None, **extra)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path.

    Starlette's 405 names only the methods of the *first* route matching the path, so
    ``PATCH /v1/objects/x`` said ``Allow: GET, HEAD`` though ``DELETE`` is served there too.
    """
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)  # PARTIAL: the path matches, the method not
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)  # noqa: S101 - registered for this type
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    titles = {
        404: "Not found",
        405: "Method not allowed",
        413: "Payload too large",
        415: "Unsupported media type",
    }
    slug = {
        404: "not-found",
        405: "method-not-allowed",
        413: "payload-too-large",
        415: "unsupported-media-type",
    }
    return problem(
        exc.status_code,
        slug.get(exc.status_code, "http-error"),
        titles.get(exc.status_code, "HTTP error"),
        str(exc.detail),
        headers=headers or None,
    )


async def _database(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", type(getattr(exc, "orig", exc)).__name__)
    return problem(
        503,
        "database-unavailable",
        "Service unavailable",
        "the database is unavailable; retry later",
        headers={"Retry-After": "2"},
    )


async def _client_gone(_: Request, exc: Exception) -> JSONResponse:
    # nobody will read this answer; 499 (as nginx logs it) keeps it out of the 5xx counts
    log.info("the client closed the connection before its request body was read")
    return problem(499, "client-closed-request", "Client closed request", "the client disconnected")


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error: %s", type(exc).__name__)
    return problem(500, "internal-error", "Internal error", "an unexpected error occurred")


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(InvalidInput, _invalid)
    app.add_exception_handler(Unsupported, _unsupported)
    app.add_exception_handler(ServiceError, _service)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OperationalError, _database)
    app.add_exception_handler(SATimeoutError, _database)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)

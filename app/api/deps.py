"""``Annotated`` dependencies of the routers, all in one place."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.engine.errors import InvalidInput
from app.engine.limits import EngineLimits
from app.services.auth import Role, authenticate
from app.services.errors import BadJson, Forbidden, PayloadTooLarge, Unauthorized
from app.services.locks import ObjectLocks
from app.settings import Settings
from app.worker.pool import BoundWorker


@dataclass
class Runtime:
    """Everything the routers need, built once per process by :func:`app.api.main.create_app`."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    worker: BoundWorker
    locks: ObjectLocks
    limits: EngineLimits
    redis: Any | None


@dataclass(frozen=True)
class Caller:
    """The authenticated key."""

    key_id: int
    role: Role


def get_runtime(request: Request) -> Runtime:
    """The process's :class:`Runtime`."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_caller(
    runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    """Authenticate ``Authorization: Bearer <key>``."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    secret = authorization[7:].strip()
    with runtime.sessions() as session:
        row = authenticate(session=session, secret=secret)
        if row is None:
            raise Unauthorized("the API key is not valid")
        return Caller(row.id, Role(row.role))


CallerDep = Annotated[Caller, Depends(get_caller)]


async def json_body(request: Request) -> Any:
    """The request body parsed as JSON, whatever its Content-Type (400 if it is not JSON).

    The size limit is enforced while reading, so a chunked body without ``Content-Length``
    cannot get around it (413).
    """
    limit = get_runtime(request).settings.max_body_bytes
    size = 0
    parts: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request bodies are limited to {limit} bytes")
        parts.append(chunk)
    raw = b"".join(parts)
    if not raw:
        raise InvalidInput("body", "is required (a JSON document)")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise BadJson("the request body is not valid JSON") from None


JsonBody = Annotated[Any, Depends(json_body)]


def body_doc(examples: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON request body with examples."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}, "examples": examples}},
        }
    }


def require(*roles: Role) -> Callable[[Caller], Caller]:
    """A dependency that admits only callers with one of ``roles``."""

    def check(caller: CallerDep) -> Caller:
        if caller.role not in roles:
            allowed = ", ".join(r.value for r in roles)
            raise Forbidden(f"this operation needs one of the roles: {allowed}")
        return caller

    return check


AdminDep = Annotated[Caller, Depends(require(Role.ADMIN))]
AnalystDep = Annotated[Caller, Depends(require(Role.ADMIN, Role.ANALYST))]
ViewerDep = Annotated[Caller, Depends(require(Role.ADMIN, Role.ANALYST, Role.VIEWER))]

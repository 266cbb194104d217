"""``Annotated`` dependencies of the routers, all in one place.

A JSON request body, one pattern for every route (docs/architecture.md, "Where to add an
endpoint")::

    async def create(runtime: RuntimeDep, caller: AdminDep,
                     body: Annotated[schemas.XRequest, typed_body(schemas.XRequest)]) -> ...

with ``openapi_extra=body_doc(schemas.XRequest, examples.X)`` in the decorator and the model
in ``schemas.REQUESTS``. :func:`typed_body` reads the bytes within ``MAX_BODY_BYTES``, refuses
what is not JSON text (a key twice, a lone surrogate: 400 ``invalid-json``), then validates the
model (:func:`app.services.bodies.validated`: 422 naming each field, in our words, never the
value). The route hands the model to its use case; what depends on an object's domain (its
value, a query) the engine parses from :meth:`written <app.services.schemas._Body.written>`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from app.engine.errors import InvalidInput
from app.engine.jsonfields import NotText, RepeatedKey, loads_strict
from app.engine.limits import EngineLimits
from app.services.auth import (
    KeyCache,
    RevocationListener,
    announce_revoked,
    authenticate,
    hash_key,
)
from app.services.bodies import validated
from app.services.errors import BadJson, Forbidden, PayloadTooLarge, Unauthorized
from app.services.locks import ObjectLocks
from app.services.schemas import Role
from app.services.scope import Scope
from app.settings import Settings
from app.store import Database
from app.worker.jobs import SurveyJobs
from app.worker.periodic import Periodic
from app.worker.pool import BoundWorker

if TYPE_CHECKING:
    from celery import Celery

    from app.worker.celery_app import CelerySettings


@dataclass
class Runtime:
    """Everything the routers need, built once per process by :func:`app.api.main.create_app`."""

    settings: Settings
    engine: Database
    worker: BoundWorker
    locks: ObjectLocks
    limits: EngineLimits
    redis: Any | None
    keys: KeyCache
    #: Blocking work of requests runs in this pool's threads, as many as DB_POOL_SIZE.
    threads: ThreadPoolExecutor
    #: Where surveys run (in this process by default).
    surveys: SurveyJobs
    #: The Celery app and its settings when ``BROKER_URL`` is set (None: all work in process).
    celery: tuple[Celery, CelerySettings] | None = None
    #: The periodic collection of unnamed likelihood states (None: ``STATES_COLLECT_SECONDS=0``).
    housekeeping: Periodic | None = None
    #: Forgets the keys other processes revoke, as they announce them (None: no Redis or no
    #: key cache).
    revocations: RevocationListener | None = None


P = ParamSpec("P")
T = TypeVar("T")


async def in_thread(
    runtime: Runtime, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """Run blocking ``func`` in a worker thread, at most ``DB_POOL_SIZE`` at a time.

    Bounding the threads to the connection pool keeps the pool from opening and closing overflow
    connections under load (each new PostgreSQL connection is a backend process) and keeps the
    threads that contend for the GIL few; requests beyond it wait in the pool's queue.

    The pool is the runtime's own ``ThreadPoolExecutor`` (its queue a C ``SimpleQueue``), not
    anyio's worker threads: anyio's hand-off (a ``queue.Queue`` whose ``put`` wakes the thread
    through a Python ``Condition``, a capacity limiter and a cancel scope per call) was 11.5% of
    a single submit's Python CPU (docs/benchmarks.md, "The single submit"). The call runs in a
    copy of the request's context (its request id for the logs), as anyio's did. Cancelling the
    request does not stop a call that has started: it runs to its end, as before; a call that
    has not started yet never does.

    What ``loop.run_in_executor`` does, with one future fewer to chain: the thread sets the
    awaited asyncio future itself (``call_soon_threadsafe``), where ``run_in_executor`` wraps
    the executor's future in an asyncio one and copies its state across through two chained
    callbacks (``asyncio.wrap_future``): the event loop thread's CPU per call 26-27 → 16-22 µs
    in ``bench/submit_parts.py`` (docs/benchmarks.md, "h/submit4"). Cancelling the awaited
    future cancels the executor's, as the chain did.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
    work = runtime.threads.submit(_settle, loop, future, call)
    future.add_done_callback(functools.partial(_cancel_unstarted, work))
    return await future


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], call: Any) -> None:
    """Run ``call`` (in a worker thread) and settle ``future`` with its outcome, on its loop."""
    outcome: Callable[[asyncio.Future[Any], Any], None]
    value: Any
    try:
        result = call()
    except BaseException as exc:  # handed to the awaiting coroutine, as the executor's was
        outcome, value = _set_exception, exc
    else:
        outcome, value = _set_result, result
    if not loop.is_closed():  # closed: nobody awaits the outcome any more (asyncio's check)
        loop.call_soon_threadsafe(outcome, future, value)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # cancelled meanwhile: the outcome is dropped
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _cancel_unstarted(work: concurrent.futures.Future[None], future: asyncio.Future[Any]) -> None:
    """A cancelled await cancels the call if it has not started (a started one runs on)."""
    if future.cancelled():
        work.cancel()


@dataclass(frozen=True)
class Caller:
    """The authenticated key, and its project's scope (None: unscoped)."""

    key_id: int
    role: Role
    scope: Scope | None = None


# Dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in the
# thread pool, a hand-off per dependency per request.


async def get_runtime(request: Request) -> Runtime:
    """The process's :class:`Runtime`."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def _lookup(runtime: Runtime, secret: str) -> Caller | None:
    found = authenticate(engine=runtime.engine, secret=secret)
    return None if found is None else Caller(found[0].id, Role(found[0].role), found[1])


#: Declares the bearer scheme in the OpenAPI document; a missing or non-bearer header gives
#: ``None`` here and a problem+json 401 below (not FastAPI's plain 403).
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`")


async def get_caller(
    runtime: RuntimeDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """Authenticate ``Authorization: Bearer <key>`` (cached: :class:`KeyCache`)."""
    secret = credentials.credentials.strip() if credentials is not None else ""
    if not secret:
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    digest = hash_key(secret)
    cached = runtime.keys.lookup(digest)
    if cached is not None:
        return Caller(*cached)
    generation = runtime.keys.generation  # a revocation announced meanwhile: not cached
    caller = await in_thread(runtime, _lookup, runtime, secret)
    if caller is None:
        raise Unauthorized("the API key is not valid")
    runtime.keys.put(digest, caller.key_id, caller.role, caller.scope, generation=generation)
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]


async def forget_keys(runtime: Runtime, key_ids: list[int]) -> None:
    """After revoking ``key_ids``: forget them here and announce them to the other processes.

    With Redis every other process's :class:`app.services.auth.RevocationListener` forgets them
    on the announcement; without, their cached entries expire within ``AUTH_CACHE_SECONDS``.
    """
    for key_id in key_ids:
        runtime.keys.forget(key_id)
    if runtime.redis is not None and key_ids:
        await in_thread(runtime, announce_revoked, runtime.redis, key_ids)


async def raw_body(request: Request) -> bytes:
    """The request body's bytes, read within ``MAX_BODY_BYTES`` (413 past it).

    The size limit is enforced while reading, so a chunked body without ``Content-Length``
    cannot get around it.
    """
    runtime: Runtime = request.app.state.runtime
    limit = runtime.settings.max_body_bytes
    size = 0
    parts: list[bytes] = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request bodies are limited to {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


RawBody = Annotated[bytes, Depends(raw_body)]


async def json_body(raw: RawBody) -> Any:
    """The request body parsed as JSON, whatever its Content-Type (400 if it is not JSON)."""
    if not raw:
        raise InvalidInput("body", "is required (a JSON document)")
    return parse_json(raw)


def parse_json(raw: bytes) -> Any:
    r"""Parse a request body; 400 ``invalid-json``: not JSON, a key twice, a lone surrogate.

    A lone UTF-16 surrogate escape (``"\ud800"``) is no text, and no database can store it.

    ``json.loads`` keeps the last of two equal keys, so ``{"epsilon": 0.1, "epsilon": 50}`` was
    evaluated with ε = 50 while the client may have meant the first: a duplicate is ambiguous
    and refused, naming its path (never a value) — :func:`app.engine.jsonfields.loads_strict`.
    """
    try:
        return loads_strict(raw)
    except RepeatedKey as exc:
        raise BadJson(
            f"the key {exc.field} is given more than once",
            errors=[{"field": exc.field, "message": "is given more than once"}],
        ) from None
    except NotText as exc:
        raise BadJson(
            f"{exc.field} holds a lone UTF-16 surrogate escape, which is not Unicode text",
            errors=[{"field": exc.field, "message": "holds a lone UTF-16 surrogate escape"}],
        ) from None
    except (ValueError, RecursionError):
        raise BadJson("the request body is not valid JSON") from None


JsonBody = Annotated[Any, Depends(json_body)]

ModelT = TypeVar("ModelT", bound=BaseModel)


def typed_body(model: type[ModelT]) -> Any:
    """The dependency that gives a route its body as ``model`` (see the module's docstring)."""

    async def read(body: JsonBody) -> ModelT:
        return validated(model, body)

    read.__name__ = f"{model.__name__}_body"
    return Depends(read)


def require(*roles: Role) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency that admits only callers with one of ``roles``."""

    async def check(caller: CallerDep) -> Caller:
        if caller.role not in roles:
            allowed = ", ".join(r.value for r in roles)
            raise Forbidden(f"this operation needs one of the roles: {allowed}")
        return caller

    return check


AdminDep = Annotated[Caller, Depends(require(Role.ADMIN))]
AnalystDep = Annotated[Caller, Depends(require(Role.ADMIN, Role.ANALYST))]
ViewerDep = Annotated[Caller, Depends(require(Role.ADMIN, Role.ANALYST, Role.VIEWER))]

"""The single submit without the router in front: ``POST /v1/objects/{object_id}/queries``.

A pure ASGI layer between :class:`app.api.middleware.RequestContext` (request id, access line,
metrics, rate and size limits: unchanged, in front of every request) and the application's own
stack (Starlette's ``ExceptionMiddleware``, FastAPI's ``AsyncExitStackMiddleware``, the router
and its per-inclusion contexts, the route). For a submit it goes straight to the route's
:meth:`app.api.direct.DirectRoute.serve` — the **same** plan, dependency callables, endpoint
(:func:`app.api.routes.objects.submit`), serialisation and answer as the route's own
``handle`` — with the application's exception handlers around it as ``ExceptionMiddleware``
applies them. What is left out is the road to the route: the router's matching of every route
of the application (FastAPI 0.165: two passes through its per-inclusion contexts), the exit
stack nothing on this route uses, a second ``Request``.

Which route serves a path is the router's answer, not a second copy of its rules: the first
submit to a path is routed by the application's router with a probe (:data:`app.api.direct.PROBE`,
nothing served), and what routing put in the scope (route, endpoint, path parameters, FastAPI's
own keys) is kept per path and put in every later submit's scope. A path the router does not
give to the submit route (another route, none: a 404) takes the whole stack, as does every
request that is not a ``POST`` to ``/v1/objects/…/queries``, and every request the route itself
would hand to FastAPI's solver (:meth:`~app.api.direct.DirectRoute.serve` answers False
before reading anything: a parameter error, dependency overrides).
"""

from __future__ import annotations

from typing import Any, ClassVar

from starlette._exception_handler import wrap_app_handling_exceptions
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.direct import PROBE, DirectRoute

_PREFIX = "/v1/objects/"
_SUFFIX = "/queries"
#: Paths whose routing is kept (object ids); past it the kept routings are dropped and made again.
_PATHS = 10_000
_UNROUTED = object()


class LeanSubmit:
    """The submit's short road (module docstring); every other request passes through."""

    #: Off: every request takes the whole stack (the equivalence tests compare both roads).
    enabled: ClassVar[bool] = True

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        #: path -> (the route, its served context, the scope entries routing sets), or None
        self._routes: dict[str, tuple[DirectRoute, Any, dict[str, Any]] | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI scope: a submit directly, anything else through the whole stack."""
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not path.endswith(_SUFFIX)
            or not path.startswith(_PREFIX)
            or scope.get("root_path")
            or not self.enabled
            or not isinstance(self.app, ExceptionMiddleware)
        ):
            await self.app(scope, receive, send)
            return
        found = self._routes.get(path, _UNROUTED)
        if found is _UNROUTED:
            found = await self._route(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        assert isinstance(found, tuple)  # noqa: S101 - for mypy: a kept routing
        target, route, entries = found
        for key, value in entries.items():  # what the router puts in the scope, fresh dicts
            scope[key] = dict(value) if isinstance(value, dict) else value
        # as ExceptionMiddleware does: the application's handlers answer what the route raises
        exceptions = self.app
        scope["starlette.exception_handlers"] = (
            exceptions._exception_handlers,
            exceptions._status_handlers,
        )
        request = Request(scope, receive, send)
        declined = False  # by the route, before reading or sending anything

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            nonlocal declined
            declined = not await target.serve(route, request, scope, receive, send)

        await wrap_app_handling_exceptions(serve, request)(scope, receive, send)
        if declined:  # FastAPI's handler serves it
            await self.app(scope, receive, send)

    async def _route(self, scope: Scope) -> tuple[DirectRoute, Any, dict[str, Any]] | None:
        """Ask the application's router which route serves ``scope``'s path (nothing served)."""
        router = getattr(scope.get("app"), "router", None)
        found: tuple[DirectRoute, Any, dict[str, Any]] | None = None
        if router is not None:
            probe: dict[str, Any] = {
                "type": "http",
                "method": "POST",
                "path": scope["path"],
                "raw_path": scope.get("raw_path"),
                "root_path": "",
                "query_string": b"",
                "headers": [],
                "app": scope["app"],
                PROBE: None,
            }
            before = dict(probe)
            try:
                await router(probe, _nothing_received, _nothing_sent)
            except Exception:  # no route (the router's 404): the whole stack answers it
                probe[PROBE] = None
            landed = probe.pop(PROBE)
            if isinstance(landed, tuple) and isinstance(landed[0], DirectRoute):
                entries = {
                    key: value
                    for key, value in probe.items()
                    if key not in before or before[key] is not value
                }
                found = (landed[0], landed[1], entries)
        if len(self._routes) >= _PATHS:
            self._routes.clear()
        self._routes[scope["path"]] = found
        return found


async def _nothing_received() -> Message:  # pragma: no cover - the probe reads no body
    return {"type": "http.request", "body": b"", "more_body": False}


async def _nothing_sent(message: Message) -> None:
    """A probe that no route took is answered by the router's default (a 404): dropped."""

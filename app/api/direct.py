"""A route class that solves a plain route's dependencies without FastAPI's general solver.

FastAPI's ``solve_dependencies`` is general: per request and per dependency it looks up
overrides, builds cache keys with security scopes, classifies the callable (generator, coroutine,
thread), validates every kind of parameter and opens two ``AsyncExitStack`` s around the
handler. For a single submit that was 8% of the server's Python CPU (``solve_dependencies``
inclusive) plus 4% in the exit stacks, more than its access log, metrics and JSON parsing
together (docs/benchmarks.md, "h/http").

:class:`DirectRoute` serves a request with the **same** dependency callables, in the same order,
with the same per-request cache, then answers with FastAPI's own ``serialize_response`` — but
through a plan made once per route: a tree of ``async`` callables. It takes this road only
where the result is the same by construction, and hands the request, untouched, to FastAPI's
handler otherwise:

- a route (and all its dependencies) whose dependencies are ``async def`` functions or
  ``async`` callables (the bearer scheme) taking only the request (``Request`` or
  ``HTTPConnection``) and other such dependencies
  — no generators (nothing to close), no parameters of their own, no security scopes;
- the route's own parameters are path, header, query or cookie parameters (validated with
  FastAPI's ``request_params_to_args`` *before* any dependency runs: any error, and FastAPI's
  handler solves the request and answers its 422 — in its order, dependencies first), the
  ``Response`` and the ``Request``; no body parameter (our bodies are dependencies:
  :func:`app.api.deps.typed_body`);
- a response model and the default response class (FastAPI's JSON fast path);
- no dependency overrides on the application (tests use them).

An exception of a dependency or of the route propagates as it does from FastAPI's handler: the
application's exception handlers (:mod:`app.api.problems`) answer it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import request_params_to_args
from fastapi.routing import APIRoute, serialize_response
from fastapi.utils import is_body_allowed_for_status_code
from starlette.types import Receive, Scope, Send

try:  # the steps of request_params_to_args, to take once per route (_params)
    from fastapi._compat import field_annotation_is_sequence
    from fastapi.dependencies.utils import (
        _get_param_aliases,
        _get_param_model,
        _is_json_field,
        _validate_value_with_model_field,
    )
    from pydantic_core import PydanticUndefined
    from starlette.datastructures import Headers, ImmutableMultiDict

    _PLANNED_PARAMS = True
except ImportError:  # pragma: no cover - another FastAPI: request_params_to_args on every request
    _PLANNED_PARAMS = False

try:  # which inclusion of the route serves the request (FastAPI >= 0.16x keeps it in the scope)
    from fastapi.routing import _get_scope_effective_route_context as _effective_context
except ImportError:  # pragma: no cover - another FastAPI: every request takes FastAPI's road

    def _effective_context(scope: Scope) -> Any | None:
        return False


#: The scope key by which :mod:`app.api.lean` asks the router which route serves a request: the
#: route found puts ``(itself, the served context)`` there and serves nothing.
PROBE = "gatekeeper.lean.probe"


@dataclass(frozen=True)
class _Step:
    """One dependency: its callable, the parameter it fills, its own dependencies."""

    call: Callable[..., Any]
    name: str | None
    #: The parameters given the request (a ``Request`` or ``HTTPConnection`` parameter).
    request_params: tuple[str, ...]
    subs: tuple[_Step, ...]


@dataclass(frozen=True)
class _Plan:
    """A route's endpoint and dependencies, and how it answers (from its served context)."""

    endpoint: _Step
    dependant: Dependant
    response_param: str | None
    route: Any  # the APIRoute or FastAPI's per-inclusion context of it
    #: The path, query, header and cookie parameters' reading plans (:func:`_params`).
    params: tuple[_Params, _Params, _Params, _Params]


#: One parameter as request_params_to_args reads it: the field, its (validation alias, request
#: key) pairs, whether it is read as a list (not JSON, a sequence) from a multi-dict, whether an
#: empty value counts as missing (a sequence), and where it is (``path``, ``header``...).
_Param = tuple[Any, list[tuple[str, str]], bool, bool, str]
#: A group of parameters: their reading plans, or None to ask request_params_to_args.
_Params = tuple[_Param, ...] | None


def _params(fields: Any) -> _Params:
    """What FastAPI's ``request_params_to_args`` works out of ``fields`` on every request.

    It asks each field, per request, whether it is a parameter model, its aliases and whether
    its annotation is a sequence (a submit's two parameters: 16 → 4 µs in
    ``bench/submit_parts.py``); these depend on the
    field alone, so they are taken once here. None (request_params_to_args then) when a field
    is a parameter model or this FastAPI lacks the steps.
    """
    if not _PLANNED_PARAMS:
        return None
    planned: list[_Param] = []
    for field in fields:
        if _get_param_model(field) is not None:
            return None
        sequence = field_annotation_is_sequence(field.field_info.annotation)
        planned.append(
            (
                field,
                _get_param_aliases(field),
                (not _is_json_field(field)) and sequence,
                sequence,
                field.field_info.in_.value,
            )
        )
    return tuple(planned)


def _read_params(planned: tuple[_Param, ...], received: Any) -> tuple[dict[str, Any], list[Any]]:
    """``request_params_to_args(fields, received)`` with its per-field steps taken already.

    The same steps in the same order (FastAPI 0.165): the first alias present (else the first),
    the value (a list from a multi-dict for a sequence), missing if None or an empty sequence,
    then FastAPI's own validation with the same location. ``received`` is never form data here
    (path parameters, query parameters, headers or cookies).
    """
    values: dict[str, Any] = {}
    errors: list[Any] = []
    for field, aliases, as_list, sequence, where in planned:
        _, alias = next((pair for pair in aliases if pair[1] in received), aliases[0])
        value: Any
        if as_list and isinstance(received, (ImmutableMultiDict, Headers)):
            value = received.getlist(alias)
        else:
            value = received.get(alias, None)
        if value is None or (sequence and len(value) == 0):
            value = PydanticUndefined
        found, wrong = _validate_value_with_model_field(
            field=field, value=value, values=values, loc=(where, alias)
        )
        if wrong:
            errors.extend(wrong)
        else:
            values[field.name] = found
    return values, errors


def _async(call: Any) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
        getattr(call, "__call__", None)  # noqa: B004 - an instance with async __call__
    )


def _step(dependant: Dependant, *, endpoint: bool = False) -> _Step | None:
    """The plan of ``dependant``, or None when it needs FastAPI's solver (module docstring)."""
    if dependant.call is None or not _async(dependant.call) or not dependant.use_cache:
        return None
    if dependant.body_params or dependant.concurrency is not None:
        return None
    if (
        dependant.websocket_param_name
        or dependant.background_tasks_param_name
        or dependant.security_scopes_param_name
        or dependant.own_oauth_scopes
        or dependant.parent_oauth_scopes
    ):
        return None
    if not endpoint and (
        dependant.path_params
        or dependant.query_params
        or dependant.header_params
        or dependant.cookie_params
        or dependant.response_param_name
    ):
        return None
    subs = []
    for sub in dependant.dependencies:
        step = _step(sub)
        if step is None:
            return None
        subs.append(step)
    given = (dependant.request_param_name, dependant.http_connection_param_name)
    return _Step(dependant.call, dependant.name, tuple(n for n in given if n), tuple(subs))


async def _solve(step: _Step, request: Request, cache: dict[Any, Any]) -> dict[str, Any]:
    """The keyword arguments of ``step``: its dependencies' values, each solved once."""
    values: dict[str, Any] = {}
    for name in step.request_params:
        values[name] = request
    for sub in step.subs:
        if sub.call in cache:
            value = cache[sub.call]
        else:
            value = await sub.call(**await _solve(sub, request, cache))
            cache[sub.call] = value
        if sub.name is not None:
            values[sub.name] = value
    return values


class DirectRoute(APIRoute):
    """An :class:`~fastapi.routing.APIRoute` served without FastAPI's solver where it can be.

    The OpenAPI document, the matching and every answer are the APIRoute's own; only the road
    to them is shorter (module docstring).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Plans by the id of the served context (None: that context takes FastAPI's road).
        self._plans: dict[int, _Plan | None] = {}

    def _plan(self, route: Any) -> _Plan | None:
        key = id(route)
        if key in self._plans:
            plan = self._plans[key]
            return plan if plan is None or plan.route is route else self._make(route)
        return self._make(route)

    def _make(self, route: Any) -> _Plan | None:
        dependant = getattr(route, "dependant", None)
        plan: _Plan | None = None
        if (
            dependant is not None
            and route.response_field is not None
            and isinstance(route.response_class, DefaultPlaceholder)
            and getattr(route, "body_field", None) is None
        ):
            endpoint = _step(dependant, endpoint=True)
            if endpoint is not None:
                params = (
                    _params(dependant.path_params),
                    _params(dependant.query_params),
                    _params(dependant.header_params),
                    _params(dependant.cookie_params),
                )
                plan = _Plan(endpoint, dependant, dependant.response_param_name, route, params)
        self._plans[id(route)] = plan
        return plan

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request directly when the plan allows, else as FastAPI does."""
        context = _effective_context(scope)
        if context is False:  # pragma: no cover - a FastAPI without per-inclusion contexts
            await super().handle(scope, receive, send)
            return
        route: Any = self if context is None else context
        if PROBE in scope:  # app.api.lean asks which route serves this path: nothing served
            scope[PROBE] = (self, route)
            return
        if not await self.serve(route, Request(scope, receive, send), scope, receive, send):
            await super().handle(scope, receive, send)

    async def serve(
        self, route: Any, request: Request, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        """Serve the request as :meth:`handle` would, ``route`` (this route or its context) given.

        False, with nothing read or sent, when FastAPI's handler must serve it (no plan, an
        override, another method, a parameter error).

        :mod:`app.api.lean` calls this for the submit without the router in front.
        """
        plan = self._plan(route)
        overrides = getattr(route.dependency_overrides_provider, "dependency_overrides", None)
        if plan is None or overrides or scope["method"] not in route.methods:
            return False
        dependant = plan.dependant
        values: dict[str, Any] = {}
        for params, planned, source in (
            (dependant.path_params, plan.params[0], lambda: request.path_params),
            (dependant.query_params, plan.params[1], lambda: request.query_params),
            (dependant.header_params, plan.params[2], lambda: request.headers),
            (dependant.cookie_params, plan.params[3], lambda: request.cookies),
        ):
            if params:
                found, errors = (
                    request_params_to_args(params, source())
                    if planned is None
                    else _read_params(planned, source())
                )
                if errors:  # FastAPI's handler answers them, after the dependencies (its order)
                    return False
                values.update(found)
        values.update(await _solve(plan.endpoint, request, {}))
        sub_response = Response()  # what the route may set: its status code and headers
        del sub_response.headers["content-length"]
        sub_response.status_code = None  # type: ignore[assignment]
        if plan.response_param is not None:
            values[plan.response_param] = sub_response
        raw = await plan.endpoint.call(**values)
        if isinstance(raw, Response):
            response = raw
        else:
            content = await serialize_response(
                field=route.response_field,
                response_content=raw,
                include=route.response_model_include,
                exclude=route.response_model_exclude,
                by_alias=route.response_model_by_alias,
                exclude_unset=route.response_model_exclude_unset,
                exclude_defaults=route.response_model_exclude_defaults,
                exclude_none=route.response_model_exclude_none,
                dump_json=True,
            )
            status = sub_response.status_code or route.status_code or 200
            response = Response(content=content, media_type="application/json", status_code=status)
            if not is_body_allowed_for_status_code(response.status_code):
                response.body = b""
            response.headers.raw.extend(sub_response.headers.raw)
        await response(scope, receive, send)
        return True

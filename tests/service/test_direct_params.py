"""DirectRoute reads a route's parameters as FastAPI's ``request_params_to_args`` does.

:func:`app.api.direct._read_params` takes the per-field steps once per route; for every route
served directly and every group of its parameters, its values and errors must be those of
``request_params_to_args`` on the same input: present, missing, empty, repeated, too long, of
the wrong type.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.dependencies.utils import request_params_to_args
from starlette.datastructures import Headers, QueryParams

from app.api import direct
from app.api.direct import DirectRoute
from app.api.routes import objects

ROUTES = [r for r in objects.router.routes if isinstance(r, DirectRoute)]

PATHS: list[dict[str, Any]] = [
    {"object_id": "obj-1"},
    {"object_id": ""},
    {"object_id": "x" * 300},
    {},
]
QUERIES = [
    QueryParams(""),
    QueryParams("limit=5&after=3"),
    QueryParams("limit=abc"),
    QueryParams("limit=0&after=-1"),
    QueryParams("limit=1&limit=2"),
    QueryParams("version="),
    QueryParams("version=2&limit=10001"),
]
HEADERS = [
    Headers(raw=[]),
    Headers(raw=[(b"idempotency-key", b"k-1")]),
    Headers(raw=[(b"idempotency-key", b"")]),
    Headers(raw=[(b"idempotency-key", b"k" * 256)]),
    Headers(raw=[(b"idempotency-key", b"a"), (b"idempotency-key", b"b")]),
    Headers(raw=[(b"idempotency_key", b"underscored")]),
]


def _groups(route: DirectRoute) -> list[tuple[str, Any, Any, list[Any]]]:
    plan = route._make(route)
    assert plan is not None, route.name
    dependant = plan.dependant
    return [
        ("path", dependant.path_params, plan.params[0], PATHS),
        ("query", dependant.query_params, plan.params[1], QUERIES),
        ("header", dependant.header_params, plan.params[2], HEADERS),
        ("cookie", dependant.cookie_params, plan.params[3], [{}, {"session": "x"}]),
    ]


def test_every_direct_route_plans_its_parameters() -> None:
    names = {r.name for r in ROUTES}
    assert {"submit", "history", "odometer_history", "dry_run"} <= names
    planned = [g for r in ROUTES if r.body_field is None for g in _groups(r) if g[1]]
    assert planned
    assert all(g[2] is not None for g in planned)


@pytest.mark.parametrize("route", [r for r in ROUTES if r.body_field is None], ids=lambda r: r.name)
def test_read_params_equals_request_params_to_args(route: DirectRoute) -> None:
    compared = 0
    for _where, fields, planned, inputs in _groups(route):
        if not fields:
            continue
        for received in inputs:
            expected = request_params_to_args(fields, received)
            assert direct._read_params(planned, received) == expected, (route.name, received)
            compared += 1
    assert compared > 0 or route.name == "register"  # the one without parameters

"""The objects' routes solved directly (app.api.direct) answer exactly as FastAPI's solver does.

Each request below is sent twice to one app: once by the direct road, once with a dependency
override registered (which sends every request through FastAPI's own handler); status, headers
(but the request id) and body bytes must be equal. Only requests whose answer does not depend
on a fresh sample are compared (a stored submit is replayed; a reused answer is stored).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi.testclient import TestClient

from tests.service import factories
from tests.service.conftest import ADMIN_KEY, auth, new_key
from tests.service.factories import grr_query, integer_domain

QUERY = grr_query(0.5)


def _never_used() -> None:  # pragma: no cover - a dependency override's key, never called
    raise AssertionError


@pytest.fixture
def solver_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts FastAPI's ``solve_dependencies`` calls at the top of a request."""
    calls: list[int] = []
    original = fastapi.routing.solve_dependencies

    async def counting(**kwargs: Any) -> Any:
        calls.append(1)
        return await original(**kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


def _register(client: TestClient) -> str:
    return factories.register(
        client, domain=integer_domain(3), value={"x": 1}, filter="bayesian", prefix="direct"
    )


def test_a_submit_does_not_run_fastapis_solver(client: TestClient, solver_calls: list[int]) -> None:
    oid = _register(client)
    analyst = new_key(client, "analyst")
    solver_calls.clear()
    headers = {**auth(analyst), "Idempotency-Key": "direct-solver"}
    response = client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": QUERY})
    assert response.status_code == 201, response.text
    assert solver_calls == []
    # the counter counts: a route of another router still takes FastAPI's road
    assert client.get("/v1/keys", headers=auth(ADMIN_KEY)).status_code == 200
    assert solver_calls != []


def _same(direct: httpx.Response, solved: httpx.Response) -> None:
    assert (direct.status_code, direct.content) == (solved.status_code, solved.content)
    strip = {"x-request-id"}
    assert [(k, v) for k, v in direct.headers.multi_items() if k not in strip] == [
        (k, v) for k, v in solved.headers.multi_items() if k not in strip
    ]


def test_both_roads_answer_alike(client: TestClient, fastapi_road_toggle: Any) -> None:
    oid = _register(client)
    analyst = new_key(client, "analyst")
    viewer = new_key(client, "viewer")
    queries = f"/v1/objects/{oid}/queries"
    first = client.post(
        queries, headers={**auth(analyst), "Idempotency-Key": "direct-1"}, json={"query": QUERY}
    )
    assert first.status_code == 201, first.text
    stored = client.post(queries, headers=auth(analyst), json={"query": QUERY, "reuse": True})
    assert stored.status_code == 200, stored.text
    cases: list[tuple[str, str, dict[str, str], Any]] = [
        # replays and reuses: a stored answer, equal both ways
        ("POST", queries, {**auth(analyst), "Idempotency-Key": "direct-1"}, {"query": QUERY}),
        ("POST", queries, auth(analyst), {"query": QUERY, "reuse": True}),
        # authentication and roles
        ("POST", queries, {}, {"query": QUERY}),
        ("POST", queries, {"Authorization": "Basic abc"}, {"query": QUERY}),
        ("POST", queries, auth("gk_not-a-key"), {"query": QUERY}),
        ("POST", queries, auth(viewer), {"query": QUERY}),
        # bodies
        ("POST", queries, auth(analyst), b"{not json"),
        ("POST", queries, auth(analyst), b'{"query": {}, "query": {}}'),
        ("POST", queries, auth(analyst), b""),
        ("POST", queries, auth(analyst), {"query": {**QUERY, "epsilon": -1}}),
        ("POST", queries, auth(analyst), {"quarry": QUERY}),
        # headers: blank, too long (FastAPI's 422 after the dependencies: its order)
        ("POST", queries, {**auth(analyst), "Idempotency-Key": " "}, {"query": QUERY}),
        ("POST", queries, {**auth(analyst), "Idempotency-Key": "k" * 256}, {"query": QUERY}),
        ("POST", queries, {"Idempotency-Key": "k" * 256}, {"query": QUERY}),
        # objects and other routes of the router
        ("POST", "/v1/objects/direct-nothing/queries", auth(analyst), {"query": QUERY}),
        ("GET", f"/v1/objects/{oid}", auth(analyst), None),
        ("GET", f"/v1/objects/{oid}/odometer", auth(viewer), None),
        ("GET", f"{queries}?limit=0", auth(analyst), None),
        ("GET", f"{queries}?limit=5", auth(analyst), None),
        ("PUT", queries, auth(analyst), {"query": QUERY}),
    ]
    for method, url, headers, body in cases:
        answers = []
        for road in (False, True):
            with fastapi_road_toggle(road):
                kwargs: dict[str, Any] = {"headers": headers}
                if isinstance(body, bytes):
                    kwargs["content"] = body
                elif body is not None:
                    kwargs["json"] = body
                answers.append(client.request(method, url, **kwargs))
        _same(*answers)


@pytest.fixture
def fastapi_road_toggle(client: TestClient) -> Any:
    """``with toggle(True):`` sends requests through FastAPI's handler (an override disables
    the direct road)."""

    @contextlib.contextmanager
    def toggle(on: bool) -> Iterator[None]:
        overrides = client.app.dependency_overrides  # type: ignore[attr-defined]
        if on:
            overrides[_never_used] = _never_used
        try:
            yield
        finally:
            overrides.clear()

    return toggle

"""The submit's short road (app.api.lean) answers exactly as the whole stack does.

Each request is sent by three roads of one app: the short road (``LeanSubmit``: no router in
front), the whole stack with the short road off (the router, then ``DirectRoute``), and
FastAPI's own solver (a dependency override); status, headers (but the request id) and body
bytes must be equal. An accepted submit draws a fresh sample, so two accepted submits are
compared by their shape, and each one's bytes with its replay by the other roads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.api import lean
from app.api.direct import PROBE, DirectRoute
from app.api.lean import LeanSubmit
from tests.service import factories
from tests.service.conftest import ADMIN_KEY, auth, new_key
from tests.service.factories import grr_query, integer_domain, kept_access_records

QUERY = grr_query(0.5)
ROADS = ("lean", "stack", "fastapi")


def _never_used() -> None:  # pragma: no cover - a dependency override's key, never called
    raise AssertionError


@pytest.fixture
def road(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``with road(name):`` sends the requests inside by the road ``name`` (ROADS)."""

    @contextlib.contextmanager
    def take(name: str) -> Iterator[None]:
        overrides = client.app.dependency_overrides  # type: ignore[attr-defined]
        monkeypatch.setattr(LeanSubmit, "enabled", name == "lean")
        if name == "fastapi":
            overrides[_never_used] = _never_used
        try:
            yield
        finally:
            overrides.clear()
            monkeypatch.setattr(LeanSubmit, "enabled", True)

    return take


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the router hands to a ``DirectRoute`` (the lean road's probes left out)."""
    paths: list[str] = []
    original = DirectRoute.handle

    async def counting(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if PROBE not in scope:
            paths.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(DirectRoute, "handle", counting)
    return paths


@pytest.fixture
def shortened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the short road took up (before the route may decline them)."""
    paths: list[str] = []
    original = lean.wrap_app_handling_exceptions

    def counting(app: Any, conn: Any) -> Any:
        paths.append(conn.scope["path"])
        return original(app, conn)

    monkeypatch.setattr(lean, "wrap_app_handling_exceptions", counting)
    return paths


def _send(client: TestClient, method: str, url: str, headers: dict[str, str], body: Any) -> Any:
    kwargs: dict[str, Any] = {"headers": headers, "follow_redirects": False}
    if isinstance(body, bytes):
        kwargs["content"] = body
    elif body is not None:
        kwargs["json"] = body
    return client.request(method, url, **kwargs)


def _headers(response: httpx.Response, drop: frozenset[str] = frozenset()) -> list[Any]:
    strip = {"x-request-id"} | drop
    return [(k, v) for k, v in response.headers.multi_items() if k not in strip]


def _same(answers: list[httpx.Response], case: Any) -> None:
    first = answers[0]
    for other in answers[1:]:
        assert (first.status_code, first.content) == (other.status_code, other.content), case
        assert _headers(first) == _headers(other), case


def test_a_submit_is_not_routed_by_the_router(client: TestClient, routed: list[str]) -> None:
    """After the first submit to a path (routed once by a probe) the router sees no submit;
    with the short road off it routes every one (so this fails without the short road)."""
    oid = factories.register(client, domain=integer_domain(3), value={"x": 1}, prefix="lean")
    analyst = new_key(client, "analyst")
    url = f"/v1/objects/{oid}/queries"
    routed.clear()
    for n in range(3):
        headers = {**auth(analyst), "Idempotency-Key": f"lean-route-{n}"}
        response = client.post(url, headers=headers, json={"query": QUERY})
        assert response.status_code == 201, response.text
    assert url not in routed
    # other requests still take the router
    assert client.get(f"/v1/objects/{oid}", headers=auth(analyst)).status_code == 200
    assert f"/v1/objects/{oid}" in routed


def test_all_roads_answer_alike(
    client: TestClient, road: Any, routed: list[str], shortened: list[str]
) -> None:
    oid = factories.register(
        client, domain=integer_domain(3), value={"x": 1}, filter="bayesian", prefix="lean"
    )
    small = factories.register(
        client, domain=integer_domain(3), value={"x": 2}, budget=0.1, prefix="lean-small"
    )
    analyst = new_key(client, "analyst")
    viewer = new_key(client, "viewer")
    queries = f"/v1/objects/{oid}/queries"
    first = client.post(
        queries, headers={**auth(analyst), "Idempotency-Key": "lean-1"}, json={"query": QUERY}
    )
    assert first.status_code == 201, first.text
    stored = client.post(queries, headers=auth(analyst), json={"query": QUERY, "reuse": True})
    assert stored.status_code == 200, stored.text
    rejected = f"/v1/objects/{small}/queries"
    refused = client.post(
        rejected, headers={**auth(analyst), "Idempotency-Key": "lean-409"}, json={"query": QUERY}
    )
    assert refused.status_code == 409, refused.text
    # (method, url, headers, body, whether the short road serves it)
    cases: list[tuple[str, str, dict[str, str], Any, bool]] = [
        # an idempotent replay, a key used with another body (422), a reuse
        ("POST", queries, {**auth(analyst), "Idempotency-Key": "lean-1"}, {"query": QUERY}, True),
        (
            "POST",
            queries,
            {**auth(analyst), "Idempotency-Key": "lean-1"},
            {"query": grr_query(1)},
            True,
        ),
        ("POST", queries, auth(analyst), {"query": QUERY, "reuse": True}, True),
        # rejections: fresh (409 budget-exhausted), and the stored one replayed
        ("POST", rejected, auth(analyst), {"query": QUERY}, True),
        (
            "POST",
            rejected,
            {**auth(analyst), "Idempotency-Key": "lean-409"},
            {"query": QUERY},
            True,
        ),
        # authentication and roles
        ("POST", queries, {}, {"query": QUERY}, True),
        ("POST", queries, {"Authorization": "Basic abc"}, {"query": QUERY}, True),
        ("POST", queries, {"Authorization": "Bearer "}, {"query": QUERY}, True),
        ("POST", queries, auth("gk_not-a-key"), {"query": QUERY}, True),
        ("POST", queries, auth(viewer), {"query": QUERY}, True),
        ("POST", queries, auth(ADMIN_KEY), {"query": QUERY, "reuse": True}, True),
        # bodies: not JSON, a key twice, empty, a bad value, an unknown field (422 naming it)
        ("POST", queries, auth(analyst), b"{not json", True),
        ("POST", queries, auth(analyst), b'{"query": {}, "query": {}}', True),
        ("POST", queries, auth(analyst), b"", True),
        ("POST", queries, auth(analyst), {"query": {**QUERY, "epsilon": -1}}, True),
        ("POST", queries, auth(analyst), {"quarry": QUERY}, True),
        ("POST", queries, auth(analyst), {"query": {**QUERY, "attribute": "nope"}}, True),
        # headers: blank, too long (FastAPI's 422 after the dependencies: its order)
        ("POST", queries, {**auth(analyst), "Idempotency-Key": " "}, {"query": QUERY}, True),
        ("POST", queries, {**auth(analyst), "Idempotency-Key": "k" * 256}, {"query": QUERY}, False),
        ("POST", queries, {"Idempotency-Key": "k" * 256}, {"query": QUERY}, False),
        # objects: unknown (404), paths the submit route does not serve
        ("POST", "/v1/objects/lean-nothing/queries", auth(analyst), {"query": QUERY}, True),
        ("POST", f"/v1/objects/{oid}/x/queries", auth(analyst), {"query": QUERY}, False),
        ("POST", f"{queries}/", auth(analyst), {"query": QUERY}, False),
        ("POST", "/v1/objects//queries", auth(analyst), {"query": QUERY}, False),
        ("GET", f"{queries}?limit=5", auth(analyst), None, False),
        ("PUT", queries, auth(analyst), {"query": QUERY}, False),
    ]
    for method, url, headers, body, short in cases:
        answers = []
        for name in ROADS:
            routed.clear()
            shortened.clear()
            with road(name):
                answers.append(_send(client, method, url, headers, body))
            # the short road served it (taken up, and not handed to the router after), or not
            took = shortened != [] and routed == []
            assert (name == "lean" and short) == took, (name, method, url)
        _same(answers, (method, url, headers, body))


def test_accepted_submits_alike(client: TestClient, road: Any) -> None:
    """Accepted by each road: the same status, headers and fields; each one's bytes are what
    every road replays (with ``Idempotent-Replayed: true``)."""
    oid = factories.register(
        client, domain=integer_domain(3), value={"x": 1}, filter="bayesian", prefix="lean"
    )
    analyst = new_key(client, "analyst")
    url = f"/v1/objects/{oid}/queries"
    accepted: dict[str, httpx.Response] = {}
    for name in ROADS:
        with road(name):
            headers = {**auth(analyst), "Idempotency-Key": f"lean-acc-{name}"}
            accepted[name] = client.post(url, headers=headers, json={"query": QUERY})
        assert accepted[name].status_code == 201, accepted[name].text
    shapes = {
        name: (
            _headers(response, frozenset({"content-length"})),
            sorted(response.json()),
            sorted(response.json()["odometer"]),
        )
        for name, response in accepted.items()
    }
    assert shapes["lean"] == shapes["stack"] == shapes["fastapi"]
    for name, response in accepted.items():
        for other in ROADS:
            with road(other):
                headers = {**auth(analyst), "Idempotency-Key": f"lean-acc-{name}"}
                replay = client.post(url, headers=headers, json={"query": QUERY})
            assert (replay.status_code, replay.content) == (201, response.content)
            assert replay.headers["idempotent-replayed"] == "true"
            assert _headers(replay, frozenset({"idempotent-replayed"})) == _headers(response)


def test_the_access_line_names_the_route(client: TestClient, road: Any) -> None:
    """The short road's access line and latency metric carry the route's template, as the
    router's does."""
    oid = factories.register(client, domain=integer_domain(3), value={"x": 1}, prefix="lean")
    analyst = new_key(client, "analyst")
    with kept_access_records() as handler:
        for name in ROADS:
            with road(name):
                for status, body in ((201, {"query": QUERY}), (422, {"quarry": QUERY})):
                    response = client.post(
                        f"/v1/objects/{oid}/queries", headers=auth(analyst), json=body
                    )
                    assert response.status_code == status, response.text
    lines = [
        (r.__dict__["method"], r.__dict__["path"], r.__dict__["status"]) for r in handler.records
    ]
    expected = [
        ("POST", "/v1/objects/{object_id}/queries", 201),
        ("POST", "/v1/objects/{object_id}/queries", 422),
    ]
    assert lines == expected * len(ROADS)

"""Authorization matrix over every route the app serves, enumerated from ``app.routes``.

Each ``(method, path)`` the application routes — API, health, metrics, dashboard and the
OpenAPI documents — must have a row here saying who may call it; a route added without a row
(or a row left for a removed route) fails :func:`test_every_route_has_a_row`. Then every row is
called with each credential: admin, analyst, viewer, no key, an invalid key and a revoked key.

Documented answers (contract.md "REST API (v1)", issue #4, the routers' docstrings):

* no key, an invalid key or a revoked key: 401 problem+json with ``WWW-Authenticate: Bearer``
  on every route that needs a key;
* admin: everything; analyst: read an object, dry-run, submit, its own queries, odometers, the
  calculator; viewer: odometers only (``/v1/objects/{id}`` metadata is analyst-level); the
  keys API, the projects API and the audit log are admin-only; ``/v1/whoami`` answers any
  valid key; a role that may not call a route gets 403 problem+json;
* public, whatever the ``Authorization`` header says (even an invalid or revoked key):
  ``/healthz``, ``/readyz``, ``/metrics``, ``/dashboard``, ``/dashboard/``,
  ``/dashboard/{name}`` (static files; data comes from the API with the user's key) and the
  OpenAPI documents ``/openapi.json``, ``/docs``, ``/docs/oauth2-redirect``, ``/redoc``.

``tests/service/test_auth.py`` holds the detailed checks (a refused call changes nothing,
malformed headers, analysts see only their own queries); this module proves completeness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.api.routes.dashboard import assets
from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import credentials
from tests.service.test_auth import (
    ADMINS,
    ALL_ROLES,
    ANALYSTS,
    CREDENTIALS,
    DOMAIN,
    INVALID,
    MISSING,
    PROBLEM,
    QUERY,
    REVOKED,
    VIEWER,
    register,
)

PUBLIC: frozenset[str] = frozenset()  # no key needed


Prepare = Callable[[TestClient], tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Row:
    """Who may call one route, how to call it, and the status of a permitted call."""

    allowed: frozenset[str]  # PUBLIC: no key needed
    success: int
    prepare: Prepare


def _fixed(url: str, **kwargs: Any) -> Prepare:
    return lambda client: (url, dict(kwargs))


def _object(suffix: str = "", **kwargs: Any) -> Prepare:
    return lambda client: (f"/v1/objects/{register(client)}{suffix}", dict(kwargs))


def _new_object(client: TestClient) -> tuple[str, dict[str, Any]]:
    body = {"id": unique_id("authz"), "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}}
    return "/v1/objects", {"json": body}


def _key_to_revoke(client: TestClient) -> tuple[str, dict[str, Any]]:
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": VIEWER})
    assert r.status_code == 201, r.text
    return f"/v1/keys/{r.json()['id']}", {}


def _dashboard_file(client: TestClient) -> tuple[str, dict[str, Any]]:
    name = sorted(n for n in assets() if n != "index.html")[0]
    return f"/dashboard/{name}", {}


def _import(client: TestClient) -> tuple[str, dict[str, Any]]:
    _, body = _new_object(client)
    return "/v1/imports", {"json": {"objects": [body["json"]]}}


def _versions(client: TestClient) -> tuple[str, dict[str, Any]]:
    return "/v1/versions", {"json": {"versions": [{"id": register(client), "value": {"x": 2}}]}}


def _survey_body(client: TestClient) -> dict[str, Any]:
    return {"name": "authz", "query": QUERY, "cohort": {"ids": [register(client)]}}


def _new_survey(client: TestClient) -> tuple[str, dict[str, Any]]:
    return "/v1/surveys", {"json": _survey_body(client)}


def _survey_dry_run(client: TestClient) -> tuple[str, dict[str, Any]]:
    return "/v1/surveys/dry-run", {"json": _survey_body(client)}


def _survey(suffix: str = "") -> Prepare:
    """A survey created by the bootstrap admin (so only admins may cancel it)."""

    def prepare(client: TestClient) -> tuple[str, dict[str, Any]]:
        r = client.post("/v1/surveys", headers=auth(ADMIN_KEY), json=_survey_body(client))
        assert r.status_code == 202, r.text
        return f"/v1/surveys/{r.json()['id']}{suffix}", {}

    return prepare


def _project_body() -> dict[str, Any]:
    return {
        "name": unique_id("authz"),
        "scope": {"labels": {"study": "authz"}},
        "quota": {"epsilon": 1},
    }


def _new_project(client: TestClient) -> tuple[str, dict[str, Any]]:
    return "/v1/projects", {"json": _project_body()}


def _project(json: Any = None) -> Prepare:
    """A project created by the bootstrap admin."""

    def prepare(client: TestClient) -> tuple[str, dict[str, Any]]:
        body = _project_body()
        r = client.post("/v1/projects", headers=auth(ADMIN_KEY), json=body)
        assert r.status_code == 201, r.text
        return f"/v1/projects/{body['name']}", {} if json is None else {"json": json}

    return prepare


LOSS_BODY = {
    "domain": DOMAIN,
    "history": [{"query": QUERY, "output": 1}],
    "budget": 1,
    "candidate": QUERY,
}

#: (method, path template) -> who may call it. Keep in step with the routers.
ROWS: dict[tuple[str, str], Row] = {
    ("POST", "/v1/objects"): Row(ADMINS, 201, _new_object),
    ("GET", "/v1/objects/{object_id}"): Row(ANALYSTS, 200, _object()),
    ("DELETE", "/v1/objects/{object_id}"): Row(ADMINS, 200, _object()),
    ("POST", "/v1/objects/{object_id}/dry-run"): Row(
        ANALYSTS, 200, _object("/dry-run", json={"query": QUERY})
    ),
    ("POST", "/v1/objects/{object_id}/queries"): Row(
        ANALYSTS, 201, _object("/queries", json={"query": QUERY})
    ),
    ("GET", "/v1/objects/{object_id}/queries"): Row(ANALYSTS, 200, _object("/queries")),
    ("POST", "/v1/objects/{object_id}/versions"): Row(
        ADMINS, 201, _object("/versions", json={"value": {"x": 2}})
    ),
    ("GET", "/v1/objects/{object_id}/odometer"): Row(ALL_ROLES, 200, _object("/odometer")),
    ("GET", "/v1/objects/{object_id}/odometer/history"): Row(
        ALL_ROLES, 200, _object("/odometer/history")
    ),
    ("GET", "/v1/odometers"): Row(ALL_ROLES, 200, _fixed("/v1/odometers")),
    ("GET", "/v1/odometers/totals"): Row(ALL_ROLES, 200, _fixed("/v1/odometers/totals")),
    ("POST", "/v1/imports"): Row(ADMINS, 200, _import),
    ("POST", "/v1/versions"): Row(ADMINS, 200, _versions),
    ("POST", "/v1/surveys"): Row(ANALYSTS, 202, _new_survey),
    ("POST", "/v1/surveys/dry-run"): Row(ANALYSTS, 200, _survey_dry_run),
    ("GET", "/v1/surveys"): Row(ALL_ROLES, 200, _fixed("/v1/surveys")),
    ("GET", "/v1/surveys/{survey_id}"): Row(ALL_ROLES, 200, _survey()),
    ("GET", "/v1/surveys/{survey_id}/responses"): Row(ALL_ROLES, 200, _survey("/responses")),
    # its analyst may cancel a survey too (tests/service/test_surveys.py); another may not
    ("DELETE", "/v1/surveys/{survey_id}"): Row(ADMINS, 200, _survey()),
    ("GET", "/v1/audit"): Row(ADMINS, 200, _fixed("/v1/audit")),
    ("GET", "/v1/audit/export"): Row(ADMINS, 200, _fixed("/v1/audit/export")),
    ("POST", "/v1/loss"): Row(ANALYSTS, 200, _fixed("/v1/loss", json=LOSS_BODY)),
    ("POST", "/v1/keys"): Row(ADMINS, 201, _fixed("/v1/keys", json={"role": VIEWER})),
    ("GET", "/v1/keys"): Row(ADMINS, 200, _fixed("/v1/keys")),
    ("DELETE", "/v1/keys/{key_id}"): Row(ADMINS, 200, _key_to_revoke),
    ("GET", "/v1/whoami"): Row(ALL_ROLES, 200, _fixed("/v1/whoami")),
    ("POST", "/v1/projects"): Row(ADMINS, 201, _new_project),
    ("GET", "/v1/projects"): Row(ADMINS, 200, _fixed("/v1/projects")),
    ("GET", "/v1/projects/{name}"): Row(ADMINS, 200, _project()),
    ("PATCH", "/v1/projects/{name}"): Row(ADMINS, 200, _project({"quota": {"epsilon": 2}})),
    ("DELETE", "/v1/projects/{name}"): Row(ADMINS, 204, _project()),
    ("GET", "/healthz"): Row(PUBLIC, 200, _fixed("/healthz")),
    ("GET", "/readyz"): Row(PUBLIC, 200, _fixed("/readyz")),
    ("GET", "/metrics"): Row(PUBLIC, 200, _fixed("/metrics")),
    ("GET", "/dashboard"): Row(PUBLIC, 308, _fixed("/dashboard", follow_redirects=False)),
    ("GET", "/dashboard/"): Row(PUBLIC, 200, _fixed("/dashboard/")),
    ("GET", "/dashboard/{name}"): Row(PUBLIC, 200, _dashboard_file),
    ("GET", "/openapi.json"): Row(PUBLIC, 200, _fixed("/openapi.json")),
    ("HEAD", "/openapi.json"): Row(PUBLIC, 200, _fixed("/openapi.json")),
    ("GET", "/docs"): Row(PUBLIC, 200, _fixed("/docs")),
    ("HEAD", "/docs"): Row(PUBLIC, 200, _fixed("/docs")),
    ("GET", "/docs/oauth2-redirect"): Row(PUBLIC, 200, _fixed("/docs/oauth2-redirect")),
    ("HEAD", "/docs/oauth2-redirect"): Row(PUBLIC, 200, _fixed("/docs/oauth2-redirect")),
    ("GET", "/redoc"): Row(PUBLIC, 200, _fixed("/redoc")),
    ("HEAD", "/redoc"): Row(PUBLIC, 200, _fixed("/redoc")),
}


def _routes_of(routes: list[Any]) -> Iterator[tuple[str, str]]:
    """Every ``(method, path)`` of ``routes``, descending into included routers."""
    for route in routes:
        if hasattr(route, "effective_route_contexts"):  # FastAPI >= 0.165: included routers
            yield from _routes_of(list(route.effective_route_contexts()))
        elif hasattr(route, "routes"):  # a mounted sub-application or router
            yield from _routes_of(list(route.routes))
        else:
            for method in sorted(route.methods or ()):
                # path_format: without convertors ("/v1/surveys/{survey_id:int}" is served as
                # documented, "/v1/surveys/{survey_id}")
                yield method, getattr(route, "path_format", route.path)


def served_routes(app: FastAPI) -> set[tuple[str, str]]:
    """The ``(method, path)`` pairs ``app`` serves."""
    return set(_routes_of(list(app.routes)))


def test_every_route_has_a_row(client: TestClient) -> None:
    """A new route without a row here fails (and so does a row for a route that is gone)."""
    app: FastAPI = client.app  # type: ignore[assignment]
    served = served_routes(app)
    # the enumeration itself works: it sees every operation of the OpenAPI schema
    documented = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    assert documented <= served, documented - served
    assert served - set(ROWS) == set(), "routes without a row in ROWS"
    assert set(ROWS) - served == set(), "rows for routes the app does not serve"


@pytest.fixture(scope="module")
def keys(client: TestClient) -> dict[str, str | None]:
    """A secret per credential kind (None: no Authorization header)."""
    return credentials(client)


def expected(row: Row, credential: str) -> int:
    """The documented status of calling ``row`` with ``credential``."""
    if row.allowed == PUBLIC:
        return row.success
    if credential in (MISSING, INVALID, REVOKED):
        return 401
    return row.success if credential in row.allowed else 403


def _problem(response: httpx.Response, status: int, type_: str) -> None:
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert body["status"] == status
    assert body["type"] == type_


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("route", sorted(ROWS), ids=[f"{m} {p}" for m, p in sorted(ROWS)])
def test_route_role_matrix(
    client: TestClient, keys: dict[str, str | None], route: tuple[str, str], credential: str
) -> None:
    """Each route answers each credential with the documented 401, 403 or success."""
    method, _ = route
    row = ROWS[route]
    url, kwargs = row.prepare(client)
    key = keys[credential]
    headers = auth(key) if key is not None else {}
    r = client.request(method, url, headers=headers, **kwargs)
    status = expected(row, credential)
    assert r.status_code == status, (r.status_code, r.text[:300])
    if status == 401:
        _problem(r, 401, "unauthorized")
        assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
    elif status == 403:
        _problem(r, 403, "forbidden")
    else:
        assert "www-authenticate" not in r.headers
    if route == ("GET", "/v1/whoami") and status == 200:
        assert r.json()["role"] == credential

"""The HTTP contract of every route, as contract.md and the OpenAPI document state it.

contract.md: "Errors are application/problem+json; validation errors name the field and never
echo the value". This module proves it for the HTTP layer itself, over every route the app
serves: unknown paths are 404, wrong methods 405 with an ``Allow`` header naming exactly the
methods served at that path, bodies over ``MAX_BODY_BYTES`` 413 (declared or chunked), malformed
JSON 400 ``invalid-json`` that never echoes the body, a body sent with a non-JSON Content-Type is
read as JSON (the README's ``curl -d`` walk-through relies on it) and is 400 when it is not JSON,
and every problem body has type, title, status and detail. It also proves the OpenAPI document
gives every JSON request body a schema and examples, and every operation its errors as
problem+json.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from starlette.routing import Route

from app.bootstrap import create_app
from tests.service.conftest import ADMIN_KEY, auth, make_settings, unique_id
from tests.service.factories import integer_domain

PROBLEM = "application/problem+json"
LIMIT = 2048
SENTINEL = "ECHO-SENTINEL-4f1"
DOMAIN = integer_domain(3)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """The app on SQLite or PostgreSQL with a small body limit (``LIMIT`` bytes)."""
    settings = make_settings(database_url, max_body_bytes=LIMIT)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def object_id(client: TestClient) -> str:
    """A registered object, so that object routes reach their body handling."""
    oid = unique_id("http")
    body = {"id": oid, "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 5.0}}
    r = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text
    return oid


def served_paths() -> dict[str, set[str]]:
    """Every path template the app serves and the methods served there (HEAD with GET)."""
    app = create_app(make_settings("sqlite://"))
    paths: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, APIRoute | Route) and route.methods:
            paths.setdefault(route.path, set()).update(route.methods)
    return paths


PATHS = served_paths()
BODY_ROUTES = ["/v1/objects", "/v1/objects/{id}/dry-run", "/v1/objects/{id}/queries", "/v1/loss"]
BODY_ROUTES.append("/v1/keys")


def concrete(template: str, oid: str) -> str:
    """A request path for ``template``: the object's id, a key id, a dashboard file."""
    return (
        template.replace("{object_id}", oid)
        .replace("{id}", oid)
        .replace("{key_id}", "999999")
        .replace("{name}", "app.js")
    )


def assert_problem(response: httpx.Response, status: int, type_: str | None = None) -> Any:
    """problem+json with type, title, status (= the HTTP status) and detail, all non-empty."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    for key in ("type", "title", "detail"):
        assert isinstance(body.get(key), str), body
        assert body[key], body
    assert body["status"] == status, body
    if type_ is not None:
        assert body["type"] == type_, body
    return body


@pytest.mark.parametrize(
    "path", ["/nope", "/v1", "/v1/objectsx", "/v1/objects/a/b/c", "/v1/keys/1/x", "/dashboardx"]
)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_path_is_404_problem(client: TestClient, path: str, method: str) -> None:
    """A path no route serves is 404 not-found problem+json, whatever the method."""
    r = client.request(method, path, headers=auth(ADMIN_KEY))
    assert_problem(r, 404, "not-found")


@pytest.mark.parametrize("template", sorted(PATHS))
def test_wrong_method_is_405_with_allow(client: TestClient, object_id: str, template: str) -> None:
    """Each method a path does not serve is 405 problem+json; ``Allow`` names every method
    served at the path (across all its routes), and nothing else."""
    allowed = PATHS[template]
    for method in METHODS:
        if method in allowed:
            continue
        r = client.request(method, concrete(template, object_id), headers=auth(ADMIN_KEY))
        assert_problem(r, 405, "method-not-allowed")
        named = {m.strip() for m in r.headers["allow"].split(",")}
        assert named == allowed, (template, method, named, allowed)


@pytest.mark.parametrize("template", BODY_ROUTES)
def test_body_over_the_limit_is_413(client: TestClient, object_id: str, template: str) -> None:
    """A body over ``MAX_BODY_BYTES`` is 413 payload-too-large, whether its Content-Length
    says so up front or it arrives chunked without one; it is never echoed."""
    raw = json.dumps({"pad": SENTINEL * (LIMIT // len(SENTINEL) + 1)}).encode()
    url = concrete(template, object_id)
    headers = {**auth(ADMIN_KEY), "Content-Type": "application/json"}
    r = client.post(url, content=raw, headers=headers)
    assert_problem(r, 413, "payload-too-large")
    assert SENTINEL not in r.text

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(raw), 256):
            yield raw[i : i + 256]

    r = client.post(url, content=chunks(), headers=headers)
    assert_problem(r, 413, "payload-too-large")
    assert SENTINEL not in r.text


@pytest.mark.parametrize("template", BODY_ROUTES)
@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "ECHO-SENTINEL-4f1"',
        b"ECHO-SENTINEL-4f1",
        b'{"a": ECHO-SENTINEL-4f1}',
        b"\xff\xfeECHO-SENTINEL-4f1",
        b'{"a": 1}}ECHO-SENTINEL-4f1',
    ],
    ids=["unterminated", "bare-word", "bad-token", "not-utf8", "trailing"],
)
def test_malformed_json_is_400_without_echo(
    client: TestClient, object_id: str, template: str, raw: bytes
) -> None:
    """Malformed JSON is 400 invalid-json; the detail says the body is not JSON and neither it
    nor any header repeats the body."""
    r = client.post(
        concrete(template, object_id),
        content=raw,
        headers={**auth(ADMIN_KEY), "Content-Type": "application/json"},
    )
    body = assert_problem(r, 400, "invalid-json")
    assert "JSON" in body["detail"]
    assert SENTINEL not in r.text
    assert all(SENTINEL not in v for v in r.headers.values())


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml", None]
)
def test_non_json_content_type(client: TestClient, content_type: str | None) -> None:
    """The body is read as JSON whatever the Content-Type (``curl -d`` in the README sends
    form-urlencoded): valid JSON is served, anything else is 400 invalid-json, not echoed."""
    headers = auth(ADMIN_KEY)
    if content_type is not None:
        headers["Content-Type"] = content_type
    ok = client.post("/v1/keys", content=b'{"role": "viewer"}', headers=headers)
    assert ok.status_code == 201, ok.text
    assert ok.headers["content-type"].startswith("application/json")
    bad = client.post("/v1/keys", content=b"role=viewer&x=" + SENTINEL.encode(), headers=headers)
    assert_problem(bad, 400, "invalid-json")
    assert SENTINEL not in bad.text


def test_empty_body_names_the_body(client: TestClient) -> None:
    """An empty body on a route that needs one is a 422 naming ``body``."""
    r = client.post("/v1/keys", headers={**auth(ADMIN_KEY), "Content-Type": "application/json"})
    body = assert_problem(r, 422, "validation-error")
    assert [e["field"] for e in body["errors"]] == ["body"]


def test_openapi_documents_bodies_and_errors(client: TestClient) -> None:
    """In ``/openapi.json`` every operation with a request body has a JSON schema and at least
    one example, every authenticated operation documents 401/403/422 and every operation's
    4xx/5xx responses are problem+json with the ``Problem`` schema."""
    document = client.get("/openapi.json").json()
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    assert document["components"]["schemas"]["Problem"]["required"] == [
        "type",
        "title",
        "status",
        "detail",
    ]
    operations = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            operations += 1
            where = f"{method.upper()} {path}"
            if "requestBody" in operation:
                media = operation["requestBody"]["content"]["application/json"]
                # a named schema (issue #11): resolve the reference, then the same checks
                ref = media["schema"]["$ref"]
                assert ref.startswith("#/components/schemas/"), where
                schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
                assert schema.get("type") == "object", where
                assert schema.get("properties"), where
                assert media.get("examples"), where
            if operation.get("security"):
                assert {"401", "403", "422"} <= operation["responses"].keys(), where
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert response["content"] == {PROBLEM: {"schema": problem_ref}}, (
                        where,
                        status,
                    )
    assert operations >= 16


def test_examples_are_accepted(client: TestClient) -> None:
    """Each documented request-body example is accepted as it stands (2xx; the dry-run and
    submit examples against an object whose domain they fit)."""
    document = client.get("/openapi.json").json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if "requestBody" not in operation:
                continue
            examples = operation["requestBody"]["content"]["application/json"]["examples"]
            for name, example in examples.items():
                body = example["value"]
                if path == "/v1/objects":
                    body = {**body, "id": unique_id(name)}
                url = path.replace("{object_id}", _object_for(client))
                url = url.replace("{name}", _project_for(client))
                r = client.request(method.upper(), url, json=body, headers=auth(ADMIN_KEY))
                assert r.status_code in (200, 201, 202), (method, path, name, r.text)


def _project_for(client: TestClient) -> str:
    """A fresh project, for the examples of operations on one project."""
    body = {"name": unique_id("ex"), "scope": {"labels": {"a": "b"}}, "quota": {"epsilon": 1}}
    r = client.post("/v1/projects", json=body, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text
    return str(body["name"])


def _object_for(client: TestClient) -> str:
    """A fresh object with the documented example domain, for a query example."""
    register = client.get("/openapi.json").json()["paths"]["/v1/objects"]["post"]
    finite = register["requestBody"]["content"]["application/json"]["examples"]["finite"]
    body = {**finite["value"], "id": unique_id("ex"), "budget": {"epsilon": 100.0}}
    r = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text
    return str(body["id"])


# --- the two operations schemathesis's fuzzer gives few cases (test_schemathesis.FEW_CASES) ---
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(object_id=st.text(min_size=1, max_size=200))
@pytest.mark.slow
def test_retire_any_id_is_a_problem_never_a_5xx(client: TestClient, object_id: str) -> None:
    """``DELETE /v1/objects/{object_id}`` with 1,000 arbitrary ids (any characters, quoted into
    the path): 404 or 422 problem+json (or 200 for the one registered id), never a 5xx."""
    response = client.delete(f"/v1/objects/{quote(object_id, safe='')}", headers=auth(ADMIN_KEY))
    if response.status_code == 200:
        return
    assert response.status_code in (404, 405, 422), (response.status_code, response.text)
    assert_problem(response, response.status_code)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.dictionaries(
        st.sampled_from(["role", "label", "extra"]),
        st.sampled_from(["admin", "analyst", "viewer", "root", ""]) | JSON_VALUES,
    )
)
@pytest.mark.slow
def test_create_key_any_body_is_201_or_a_problem(client: TestClient, body: dict[str, Any]) -> None:
    """``POST /v1/keys`` with 1,000 arbitrary bodies: 201 with a key for a valid role and
    label, otherwise 422 problem+json naming a field; never a 5xx, never the key echoed."""
    response = client.post("/v1/keys", json=body, headers=auth(ADMIN_KEY))
    if response.status_code == 201:
        assert body.get("role") in ("admin", "analyst", "viewer"), body
        assert set(body) <= {"role", "label"}, body
        return
    problem = assert_problem(response, 422)
    assert any(field in problem["detail"] for field in ("role", "label", "extra", "body")), problem


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_id=st.integers(min_value=-(2**70), max_value=2**70).map(str) | st.text(min_size=1))
@pytest.mark.slow
def test_revoke_any_key_id_is_a_problem_never_a_5xx(client: TestClient, key_id: str) -> None:
    """``DELETE /v1/keys/{key_id}`` with 1,000 arbitrary ids (integers of any size, any text):
    404 (no such key) or 422 naming ``key_id``, never a 5xx. Ids at or above 10**6 only, so
    the run never revokes a key the module's other tests use."""
    try:  # what the route reads: pydantic also takes "+1", " 1", "1.0" and "1_0" as numbers
        as_number = TypeAdapter(int).validate_python(key_id)
    except ValidationError:
        as_number = None
    if as_number is not None and 0 < as_number < 10**6:
        key_id = str(as_number + 10**6)  # " 1" once revoked the bootstrap admin key: flaky 401s
    response = client.delete(f"/v1/keys/{quote(key_id, safe='')}", headers=auth(ADMIN_KEY))
    assert response.status_code in (404, 405, 422), (response.status_code, response.text)
    problem = assert_problem(response, response.status_code)
    if response.status_code == 422:
        assert "key_id" in problem["detail"], problem


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(min_size=1, max_size=100))
@pytest.mark.slow
def test_delete_any_project_name_is_a_problem_never_a_5xx(client: TestClient, name: str) -> None:
    """``DELETE /v1/projects/{name}`` with 1,000 arbitrary names (no project has them: the
    module's projects are named ``<prefix>-<hex>``, the text here is drawn, never one of
    those): 404 problem+json (or 405 for a path that is no route), never a 5xx, nothing
    deleted."""
    response = client.delete(f"/v1/projects/{quote(name, safe='')}", headers=auth(ADMIN_KEY))
    assert response.status_code in (404, 405), (response.status_code, response.text)
    assert_problem(response, response.status_code)

"""The OpenAPI document is typed: what client generators and fuzzers need (issue #11, 8).

openapi-python-client skipped ``POST /v1/objects`` and ``POST /v1/loss`` (an array without
``items``), and 16 of 17 success responses were ``{"type": "object", "additionalProperties":
true}``, so a generated client got dicts named after the route. Every 2xx JSON response now has
a named schema, every array its items, and request bodies are as strict as the server's
structural checks (a union discriminated by ``mechanism``; ``low``/``high`` required for
``real``). Each response schema is checked against real answers here and by schemathesis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import OpenAPIV31SpecValidator
from pydantic import TypeAdapter, ValidationError

from app.engine.mechanisms import MECHANISMS
from app.services import schemas
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id


@pytest.fixture(scope="module")
def document(client: TestClient) -> dict[str, Any]:
    return dict(client.get("/openapi.json").json())


def test_the_document_passes_openapi_spec_validator(document: dict[str, Any]) -> None:
    """A third-party validator finds nothing.

    It refused 7 ``"default": null`` on non-null schemas that pydantic wrote for optional
    fields (absent is not null).
    """
    errors = [e.message for e in OpenAPIV31SpecValidator(document).iter_errors()]
    assert errors == []


def walk(node: Any, at: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield at, node
        for key, child in node.items():
            yield from walk(child, f"{at}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from walk(child, f"{at}/{i}")


def test_every_success_response_has_a_named_schema(document: dict[str, Any]) -> None:
    unnamed = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                content = response.get("content", {}).get("application/json")
                if code.startswith("2") and content is not None:
                    ref = content["schema"].get("$ref", "")
                    if not ref.startswith("#/components/schemas/"):
                        unnamed.append(f"{method.upper()} {path} {code}")
    assert unnamed == []


def test_every_array_has_items(document: dict[str, Any]) -> None:
    missing = [
        at for at, node in walk(document) if node.get("type") == "array" and "items" not in node
    ]
    assert missing == []


def test_every_request_body_has_a_named_schema(document: dict[str, Any]) -> None:
    for (method, path), model in schemas.REQUESTS.items():
        body = document["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{model.__name__}"}
        assert body["examples"], (method, path)


def test_queries_are_a_union_discriminated_by_mechanism(document: dict[str, Any]) -> None:
    components = document["components"]["schemas"]
    query = components["QueryRequest"]["properties"]["query"]
    assert query["discriminator"]["propertyName"] == "mechanism"
    # every mechanism the engine parses, and only those
    assert (
        set(query["discriminator"]["mapping"])
        == set(MECHANISMS)
        == {
            "grr",
            "binary_rr",
            "unary_encoding",
            "matrix",
            "linear",
            "logistic",
            "olh",
            "hadamard",
        }
    )
    assert set(components["GrrQuery"]["required"]) == {"mechanism", "attribute", "epsilon"}
    assert set(components["OlhQuery"]["required"]) == {"mechanism", "attribute", "epsilon"}
    assert components["OlhQuery"]["properties"]["g"]["minimum"] == 2
    assert set(components["LinearQuery"]["required"]) == {
        "mechanism",
        "weights",
        "range",
        "epsilon",
    }
    assert set(components["RealAttribute"]["required"]) == {"name", "type", "low", "high"}
    assert components["GrrQuery"]["additionalProperties"] is False


EXAMPLES_OK = [
    (
        "RegisterRequest",
        {
            "id": "p-1",
            "domain": {"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]},
            "value": {"x": 0.5},
            "budget": {"epsilon": 1},
        },
    ),
    (
        "QueryRequest",
        {
            "query": {
                "mechanism": "binary_rr",
                "epsilon": 0.5,
                "predicate": {"attribute": "x", "op": "in", "value": [1, 2]},
            }
        },
    ),
    (
        "LossRequest",
        {
            "domain": {"attributes": [{"name": "c", "type": "categorical", "values": ["a"]}]},
            "history": [],
            "options": {"tolerance": 1e-3},
        },
    ),
]
EXAMPLES_BAD = [
    (
        "RegisterRequest",
        {
            "id": "p-1",
            "domain": {"attributes": [{"name": "x", "type": "real"}]},
            "value": {"x": 0.5},
            "budget": {"epsilon": 1},
        },
    ),
    ("QueryRequest", {"query": {"mechanism": "grr", "epsilon": 0.5}}),
    ("QueryRequest", {"query": {"mechanism": "linear", "weights": {"x": 1}, "epsilon": 0.5}}),
    ("QueryRequest", {"query": {"mechanism": "grr", "attribute": "x", "epsilon": 1e-9}}),
    ("QueryRequest", {"query": {"mechanism": "teleport", "epsilon": 0.5}}),
]


@pytest.fixture(scope="module")
def target(client: TestClient) -> str:
    """An object whose domain the query examples fit (their dry-runs change nothing)."""
    oid = unique_id("examples")
    domain = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}
    body = {"id": oid, "domain": domain, "value": {"x": 1}, "budget": {"epsilon": 1}}
    r = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text
    return oid


def _send(client: TestClient, target: str, name: str, body: Any) -> Any:
    """POST an example to the route that takes its schema (a new id for each registration)."""
    if name == "RegisterRequest":
        return client.post(
            "/v1/objects", json={**body, "id": unique_id("example")}, headers=auth(ADMIN_KEY)
        )
    route = {"QueryRequest": f"/v1/objects/{target}/dry-run", "LossRequest": "/v1/loss"}[name]
    return client.post(route, json=body, headers=auth(ADMIN_KEY))


@pytest.mark.parametrize(("name", "body"), EXAMPLES_OK)
def test_the_request_schemas_accept_what_the_server_accepts(
    client: TestClient, target: str, name: str, body: Any
) -> None:
    model = next(m for m in schemas.REQUESTS.values() if m.__name__ == name)
    model.model_validate(body)
    r = _send(client, target, name, body)
    assert r.status_code in (200, 201), r.text


@pytest.mark.parametrize(("name", "body"), EXAMPLES_BAD)
def test_the_request_schemas_refuse_what_the_server_refuses(
    client: TestClient, target: str, name: str, body: Any
) -> None:
    model = next(m for m in schemas.REQUESTS.values() if m.__name__ == name)
    with pytest.raises(ValidationError):
        model.model_validate(body)
    r = _send(client, target, name, body)
    assert r.status_code == 422, r.text


def response_models(document: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The model of every 2xx JSON answer, as the document names it: (method, path) -> model.

    The document writes them from the routes' ``response_model`` (no longer patched in by
    path), so each named schema is a class of app.services.schemas.
    """
    found = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                content = response.get("content", {}).get("application/json")
                if code.startswith("2") and content is not None:
                    name = content["schema"]["$ref"].rsplit("/", 1)[-1]
                    found[(method, path)] = getattr(schemas, name)
    return found


def test_real_answers_match_their_response_schemas(
    client: TestClient, document: dict[str, Any]
) -> None:
    """Every 2xx answer of a short session validates against its route's model."""
    responses = response_models(document)
    admin, analyst = auth(ADMIN_KEY), auth(new_key(client, "analyst"))
    oid = unique_id("contract")
    domain = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 2}]}
    grr = {"mechanism": "grr", "attribute": "x", "epsilon": 0.5}
    calls: list[tuple[str, str, dict[str, str], Any]] = [
        (
            "post",
            "/v1/objects",
            admin,
            {"id": oid, "domain": domain, "value": {"x": 1}, "budget": {"epsilon": 2}},
        ),
        ("get", "/v1/objects/{object_id}", admin, None),
        ("post", "/v1/objects/{object_id}/dry-run", analyst, {"query": grr}),
        ("post", "/v1/objects/{object_id}/queries", analyst, {"query": grr}),
        ("get", "/v1/objects/{object_id}/queries", analyst, None),
        ("post", "/v1/objects/{object_id}/versions", admin, {"value": {"x": 1}}),
        ("get", "/v1/objects/{object_id}/odometer", analyst, None),
        ("get", "/v1/objects/{object_id}/odometer/history", analyst, None),
        ("get", "/v1/odometers", analyst, None),
        ("get", "/v1/odometers/totals", analyst, None),
        (
            "post",
            "/v1/loss",
            analyst,
            {"domain": domain, "history": [], "budget": 1, "candidate": grr},
        ),
        ("post", "/v1/keys", admin, {"role": "viewer", "label": "contract"}),
        ("get", "/v1/keys", admin, None),
        ("get", "/v1/audit", admin, None),
        ("get", "/v1/whoami", analyst, None),
        ("get", "/healthz", {}, None),
        ("get", "/readyz", {}, None),
        ("delete", "/v1/objects/{object_id}", admin, None),
    ]
    for method, route, headers, body in calls:
        r = client.request(method, route.format(object_id=oid), headers=headers, json=body)
        assert r.status_code in (200, 201), (route, r.text)
        model = responses[(method, route)]
        TypeAdapter(model).validate_python(r.json(), strict=False)
    created = client.post("/v1/keys", json={"role": "viewer"}, headers=admin).json()
    r = client.delete(f"/v1/keys/{created['id']}", headers=admin)
    responses[("delete", "/v1/keys/{key_id}")].model_validate(r.json())
    covered = {(m, p) for m, p, _, _ in calls} | {("delete", "/v1/keys/{key_id}")}
    study = unique_id("study")
    imported = {
        "id": unique_id("contract"),
        "domain": domain,
        "value": {"x": 2},
        "budget": {"epsilon": 2},
        "labels": {"study": study},
    }
    survey = {"name": "contract", "query": grr, "cohort": {"labels": {"study": study}}}
    survey_calls: list[tuple[str, str, dict[str, str], Any]] = [
        ("post", "/v1/imports", admin, {"objects": [imported]}),
        ("post", "/v1/versions", admin, {"versions": [{"id": imported["id"], "value": {"x": 1}}]}),
        ("post", "/v1/surveys/dry-run", analyst, survey),
        ("post", "/v1/surveys", analyst, survey),
        ("get", "/v1/surveys", analyst, None),
        ("get", "/v1/surveys/{survey_id}", analyst, None),
        ("get", "/v1/surveys/{survey_id}/responses", analyst, None),
        ("delete", "/v1/surveys/{survey_id}", analyst, None),
    ]
    survey_id = None
    for method, route, headers, body in survey_calls:
        url = route.format(survey_id=survey_id)
        r = client.request(method, url, headers=headers, json=body)
        assert r.status_code in (200, 202), (route, r.text)
        if route == "/v1/surveys" and method == "post":
            survey_id = r.json()["id"]
        TypeAdapter(responses[(method, route)]).validate_python(r.json(), strict=False)
    covered |= {(m, p) for m, p, _, _ in survey_calls}
    name = unique_id("project")
    project = {"name": name, "scope": {"labels": {"study": study}}, "quota": {"epsilon": 1}}
    project_calls: list[tuple[str, str, dict[str, str], Any]] = [
        ("post", "/v1/projects", admin, project),
        ("get", "/v1/projects", admin, None),
        ("get", "/v1/projects/{name}", admin, None),
        ("patch", "/v1/projects/{name}", admin, {"quota": {"epsilon": 2}}),
    ]
    for method, route, headers, body in project_calls:
        r = client.request(method, route.format(name=name), headers=headers, json=body)
        assert r.status_code in (200, 201), (route, r.text)
        TypeAdapter(responses[(method, route)]).validate_python(r.json(), strict=False)
    covered |= {(m, p) for m, p, _, _ in project_calls}
    assert covered == set(responses)


def test_links_lead_from_created_resources_to_the_operations_that_take_their_ids(
    document: dict[str, Any],
) -> None:
    operation_ids = {
        op["operationId"]: (path, op)
        for path, ops in document["paths"].items()
        for op in ops.values()
    }
    register = document["paths"]["/v1/objects"]["post"]["responses"]["201"]["links"]
    targets = {link["operationId"] for link in register.values()}
    object_scoped = {
        op["operationId"]
        for path, ops in document["paths"].items()
        if "{object_id}" in path
        for op in ops.values()
    }
    assert targets == object_scoped
    for link in register.values():
        path, _ = operation_ids[link["operationId"]]
        assert link["parameters"] == {"object_id": "$response.body#/id"}
        assert "{object_id}" in path
    keys = document["paths"]["/v1/keys"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in keys.values()} == {"drop_key"}
    surveys = document["paths"]["/v1/surveys"]["post"]["responses"]["202"]["links"]
    survey_scoped = {
        op["operationId"]
        for path, ops in document["paths"].items()
        if "{survey_id}" in path
        for op in ops.values()
    }
    assert {link["operationId"] for link in surveys.values()} == survey_scoped

"""What the OpenAPI document promises: typed answers, problem+json errors, bearer auth, bodies.

Every success answer is the ``response_model`` of its route (:func:`answers`), a model of
:mod:`app.services.schemas`: FastAPI validates the answer against it and names it in the
document. Every error the app can answer is documented per operation with the one ``Problem``
schema of :mod:`app.api.problems`, so a client generated from the document (and schemathesis,
tests/service/test_schemathesis.py) knows each status code and its body. Request bodies get
the JSON Schemas of the models that validate them (:func:`app.api.deps.typed_body`); what JSON
Schema cannot say (an attribute named by a query must exist in the object's domain, a value
must lie in its domain, a declared ε must be the mechanism's tight ε) is checked by the engine
and answered with 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.api.problems import PROBLEM
from app.services import schemas

#: One entry of a problem's ``errors``: the field and what is wrong, never the value.
FIELD_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "FieldError",
    "required": ["field", "message"],
    "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
}
#: RFC 9457 problem details, as every error of the app is rendered (app/api/problems.py).
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Problem",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "A short slug, e.g. budget-exhausted"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "Validation errors: the field and what is wrong, never the value",
            "items": {"$ref": "#/components/schemas/FieldError"},
        },
    },
    "additionalProperties": True,
}
_REF = {"$ref": "#/components/schemas/Problem"}
_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "string"}}
}

_DESCRIPTIONS = {
    400: "The request body is not JSON, or Content-Length is not a number",
    401: "Missing or invalid API key (WWW-Authenticate: Bearer)",
    403: "The key's role may not do this",
    404: "No such object or key",
    409: "Conflict",
    413: "The request body exceeds MAX_BODY_BYTES",
    422: "Invalid input, naming the field (never echoing the value)",
    429: "The API key is over its rate limit (Retry-After)",
    503: "The database is unavailable (Retry-After)",
}


def problems(*codes: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for FastAPI: each status in ``codes`` as problem+json.

    ``descriptions`` overrides the default description of a status (key ``s409`` for 409).
    """
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {
            "description": descriptions.get(f"s{code}", _DESCRIPTIONS[code]),
            "content": {PROBLEM: {"schema": _REF}},
        }
        if code in (429, 503):
            entry["headers"] = _RETRY_AFTER
        if code == 401:
            entry["headers"] = {
                "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}
            }
        out[code] = entry
    return out


#: Errors any authenticated operation can answer.
AUTHENTICATED = (401, 403, 422, 429, 503)
#: ... and any operation that reads a JSON body.
WITH_BODY = (*AUTHENTICATED, 400, 413)


def answers(model: type[BaseModel]) -> dict[str, Any]:
    """A route's decorator arguments for a success answer of type ``model``.

    ``response_model_exclude_unset``: a field the service left out (``delta`` of an object that
    is not ``approx_bayesian``, the optional ``exact``) stays absent on the wire, never ``null``.
    """
    return {"response_model": model, "response_model_exclude_unset": True}


def body_doc(model: type[BaseModel], examples: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` documenting a required JSON request body: its named schema, examples."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref(model.__name__), "examples": examples}},
        }
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def named_schemas() -> dict[str, Any]:
    """The JSON Schemas of the request bodies, as OpenAPI components (``$ref``-linked).

    The routes receive their bodies through :func:`app.api.deps.typed_body` (the raw JSON
    checks first, then the model), a dependency FastAPI does not document as a body:
    :func:`body_doc` refers to these schemas, the very models that validate.
    """
    models = set(schemas.REQUESTS.values())
    _, document = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    return dict(document.get("$defs", {}))


#: OpenAPI links: which operations take an id that a response gives (stateful fuzzers and client
#: generators follow them): (method, path, status) -> {link name: (operation id, parameter, id)}.
LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, str]]] = {
    ("post", "/v1/objects", "201"): {
        name: (operation, "object_id", "$response.body#/id")
        for name, operation in (
            ("GetObject", "get_object"),
            ("DryRun", "dry_run"),
            ("Submit", "submit"),
            ("History", "history"),
            ("Odometer", "odometer"),
            ("OdometerHistory", "odometer_history"),
            ("Retire", "retire"),
            ("NewVersion", "new_version"),
        )
    },
    ("post", "/v1/keys", "201"): {"RevokeKey": ("drop_key", "key_id", "$response.body#/id")},
    ("post", "/v1/projects", "201"): {
        name: (operation, "name", "$response.body#/name")
        for name, operation in (
            ("GetProject", "get_project"),
            ("ChangeProjectQuota", "change_project_quota"),
        )
    },
    ("post", "/v1/surveys", "202"): {
        name: (operation, "survey_id", "$response.body#/id")
        for name, operation in (
            ("GetSurvey", "get_survey"),
            ("SurveyResponses", "survey_responses"),
            ("CancelSurvey", "cancel_survey"),
        )
    },
}


def _link_responses(document: dict[str, Any]) -> None:
    for (method, route, status), links in LINKS.items():
        response = document["paths"][route][method]["responses"][status]
        response["links"] = {
            name: {"operationId": operation, "parameters": {parameter: expression}}
            for name, (operation, parameter, expression) in links.items()
        }


def _admits_null(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_admits_null(branch) for key in ("anyOf", "oneOf") for branch in schema.get(key, []))


def _drop_null_defaults(node: Any) -> None:
    """Remove ``"default": null`` from schemas that do not admit null.

    pydantic writes it for optional fields whose absence is the default (``field: X |
    SkipJsonSchema[None] = None``); absent is not null, and openapi-spec-validator rejects a
    default its own schema refuses.
    """
    if isinstance(node, dict):
        if "default" in node and node["default"] is None and not _admits_null(node):
            del node["default"]
        for child in node.values():
            _drop_null_defaults(child)
    elif isinstance(node, list):
        for child in node:
            _drop_null_defaults(child)


def install(app: FastAPI) -> None:
    """Generate the document once, with the ``Problem`` schema and the bearer scheme in it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            components = document.setdefault("components", {})
            named = components.setdefault("schemas", {})
            named.update(named_schemas())
            named["Problem"] = PROBLEM_SCHEMA
            named["FieldError"] = FIELD_ERROR_SCHEMA
            _link_responses(document)
            _drop_null_defaults(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

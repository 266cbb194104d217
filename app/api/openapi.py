"""What the OpenAPI document promises: problem+json errors, bearer auth and request bodies.

Every error the app can answer is documented per operation with the one ``Problem`` schema of
:mod:`app.api.problems`, so a client generated from the document (and schemathesis,
tests/service/test_schemathesis.py) knows each status code and its body. Request bodies get
JSON Schemas that say what the routes check structurally; what JSON Schema cannot say (an
attribute named by a query must exist in the object's domain, a value must lie in its domain, a
declared ε must be the mechanism's tight ε) is checked by the engine and answered with 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api.problems import PROBLEM
from app.services.objects import ID_PATTERN

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
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
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


def _json_schema_object(
    properties: dict[str, Any], required: list[str], **extra: Any
) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        **extra,
    }


#: The ids ``register_object`` accepts, anchored for JSON Schema and FastAPI's ``pattern=``.
OBJECT_ID_PATTERN = f"^{ID_PATTERN.pattern}$"
_EPSILON = {"type": "number", "exclusiveMinimum": 0}
_DOMAIN = _json_schema_object(
    {
        "attributes": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "type"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "type": {"enum": ["real", "integer", "categorical"]},
                    "low": {"type": "number"},
                    "high": {"type": "number"},
                    "values": {"type": "array", "minItems": 1},
                },
            },
        }
    },
    ["attributes"],
)
_QUERY = {
    "type": "object",
    "required": ["mechanism"],
    "properties": {
        "mechanism": {
            "enum": ["grr", "binary_rr", "unary_encoding", "matrix", "linear", "logistic"]
        },
        "epsilon": _EPSILON,
    },
    "description": "A query (mechanism) as in DESIGN.md; its fields depend on the mechanism",
}

REGISTER_BODY = _json_schema_object(
    {
        "id": {"type": "string", "pattern": OBJECT_ID_PATTERN},
        "domain": _DOMAIN,
        "value": {"type": "object", "description": "One point of the domain; never returned"},
        "budget": _json_schema_object({"epsilon": _EPSILON}, ["epsilon"]),
        "filter": {"enum": ["bayesian", "simplified", "basic"]},
    },
    ["id", "domain", "value", "budget"],
)
QUERY_BODY = _json_schema_object({"query": _QUERY}, ["query"])
LOSS_BODY = _json_schema_object(
    {
        "domain": _DOMAIN,
        "history": {
            "type": "array",
            "items": _json_schema_object({"query": _QUERY, "output": {}}, ["query", "output"]),
        },
        "budget": _EPSILON,
        "candidate": _QUERY,
        "options": {"type": "object"},
    },
    ["domain", "history"],
)
KEY_BODY = _json_schema_object(
    {
        "role": {"enum": ["admin", "analyst", "viewer"]},
        "label": {"type": "string", "minLength": 1, "maxLength": 200},
    },
    ["role"],
)


def body_doc(schema: dict[str, Any], examples: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` documenting a required JSON request body with a schema and examples."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema, "examples": examples}},
        }
    }


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
            components.setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

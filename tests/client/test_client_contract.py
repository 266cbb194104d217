"""The client follows the API: its models, operations and version match the app's OpenAPI document.

The models of ``clients/python`` are written by hand (its README says why); these tests are
what keeps them from drifting: a schema, a property, a required field, a field's type or
constraint, a request enum or an operation added to the app fails here until the client has
it, and the client's version must be the document's ``info.version``. The package must also
build into a wheel that ships its type information.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, get_args

import ldp_gatekeeper_client
import pytest
from ldp_gatekeeper_client import AsyncClient, Client, models
from pydantic import BaseModel

from app.bootstrap import create_app
from app.settings import Settings
from tests.service.conftest import ROOT

#: Every operation of the document -> the client method that calls it.
OPERATIONS = {
    "register": "objects.register",
    "get_object": "objects.get",
    "retire": "objects.retire",
    "dry_run": "objects.dry_run",
    "submit": "objects.submit",
    "history": "objects.history",
    "odometer": "objects.odometer",
    "odometer_history": "objects.odometer_history",
    "import_objects": "objects.import_objects",
    "new_version": "objects.new_version",
    "import_versions": "versions.create",
    "odometers": "odometers.all",
    "odometer_totals": "odometers.totals",
    "create_survey": "surveys.create",
    "survey_dry_run": "surveys.dry_run",
    "list_surveys": "surveys.all",
    "get_survey": "surveys.get",
    "cancel_survey": "surveys.cancel",
    "survey_responses": "surveys.responses",
    "audit_log": "audit.events",
    "audit_export": "audit.export",
    "loss": "loss",
    "new_key": "keys.create",
    "list_api_keys": "keys.all",
    "drop_key": "keys.revoke",
    "whoami": "whoami",
    "create_project": "projects.create",
    "list_projects": "projects.all",
    "get_project": "projects.get",
    "change_project_quota": "projects.set_quota",
    "delete_project": "projects.delete",
    "healthz": "health",
    "readyz": "ready",
}
#: Operations that are not part of the JSON API (Prometheus text).
NOT_JSON = {"metrics"}
#: Discriminators the client's request models default (``GrrQuery(attribute=..., epsilon=...)``)
DEFAULTED = {"type", "mechanism"}


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("openapi")
    return dict(create_app(Settings(database_url=f"sqlite:///{where}/unused.db")).openapi())


def schemas(document: dict[str, Any]) -> dict[str, Any]:
    return dict(document["components"]["schemas"])


def test_the_client_version_is_the_api_version(document: dict[str, Any]) -> None:
    assert ldp_gatekeeper_client.__version__ == document["info"]["version"]
    assert importlib.metadata.version("ldp-gatekeeper-client") == document["info"]["version"]


def test_every_schema_of_the_document_has_a_model_with_its_properties(
    document: dict[str, Any],
) -> None:
    for name, schema in schemas(document).items():
        assert hasattr(models, name), f"the client has no model {name}"
        if "enum" in schema:
            assert set(get_args(getattr(models, name))) == set(schema["enum"]), name
            continue
        model = getattr(models, name)
        assert issubclass(model, BaseModel), name
        ours = model.model_json_schema(by_alias=True)
        assert set(ours.get("properties", {})) == set(schema.get("properties", {})), name
        required, theirs = set(ours.get("required", [])), set(schema.get("required", []))
        request = schema.get("additionalProperties") is False
        if request:  # requests refuse unknown fields, responses keep them
            assert model.model_config.get("extra") == "forbid", name
            assert required <= theirs, name
            assert theirs - required <= DEFAULTED, name
        else:
            assert model.model_config.get("extra") == "allow", name
            assert required == theirs, name


#: JSON Schema keywords that limit a value (compared as the fields' constraints).
LIMITS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "format",
)
NULL = ("null",)


def shape(schema: Any, limits: set[tuple[str, str, Any]], at: str = "") -> Any:
    """A field's type, comparable across the two documents; its constraints go to ``limits``.

    ``$ref`` names a component (the server's ``#/components/schemas/X`` and the client's
    ``#/$defs/X`` alike); a union is the set of its branches; a fixed-length tuple is an array
    of its one item type with equal ``minItems`` and ``maxItems``.
    """
    if not isinstance(schema, dict):
        return ("?", repr(schema))
    if "prefixItems" in schema:
        items = schema["prefixItems"]
        assert all(item == items[0] for item in items), at
        count = len(items)
        schema = {"type": "array", "items": items[0], "minItems": count, "maxItems": count}
    limits.update((at, key, schema[key]) for key in LIMITS if key in schema)
    if "$ref" in schema:
        return ("ref", schema["$ref"].rsplit("/", 1)[-1])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = frozenset(shape(b, limits, at) for b in schema[key])
            return next(iter(branches)) if len(branches) == 1 else ("union", branches)
    if "const" in schema:
        return ("enum", frozenset([schema["const"]]))
    if "enum" in schema:
        return ("enum", frozenset(schema["enum"]))
    kind = schema.get("type")
    if kind == "array":
        return ("array", shape(schema.get("items", {}), limits, f"{at}[]"))
    if kind == "object" and "patternProperties" in schema:
        ((pattern, value),) = schema["patternProperties"].items()
        limits.add((f"{at}{{}}", "key pattern", pattern))
        return ("map", shape(value, limits, f"{at}{{}}"))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return ("map", shape(schema["additionalProperties"], limits, f"{at}{{}}"))
    return ("any",) if kind is None else (kind,)


def field_shape(schema: Any, *, optional: bool) -> tuple[Any, set[tuple[str, str, Any]]]:
    """:func:`shape` of a property; an optional one may be ``None`` in the client (absent)."""
    limits: set[tuple[str, str, Any]] = set()
    found = shape(schema, limits)
    if optional and found[0] == "union" and NULL in found[1]:
        rest = found[1] - {NULL}
        found = next(iter(rest)) if len(rest) == 1 else ("union", rest)
    return found, limits


def test_every_field_has_the_documents_type_and_limits(document: dict[str, Any]) -> None:
    """Field by field: the client's type is the document's, and so are its constraints.

    A response model states the document's constraints exactly. A request model leaves ranges
    and patterns to the server (which answers 422 naming the field, never refusing in the
    client what the server would take): the client may state none beyond the document's.
    """
    differences = []
    for name, schema in schemas(document).items():
        if "properties" not in schema:
            continue
        ours = getattr(models, name).model_json_schema(by_alias=True)["properties"]
        request = schema.get("additionalProperties") is False
        for field, prop in schema["properties"].items():
            optional = field not in schema.get("required", [])
            theirs, their_limits = field_shape(prop, optional=optional)
            mine, my_limits = field_shape(ours[field], optional=optional)
            if mine != theirs:
                differences.append(f"{name}.{field}: {mine} is not {theirs}")
            if my_limits != their_limits and not (request and my_limits <= their_limits):
                differences.append(f"{name}.{field}: limits {my_limits} are not {their_limits}")
    assert differences == []


def enum_of(schema: dict[str, Any]) -> set[Any] | None:
    if "const" in schema:
        return {schema["const"]}
    if "enum" in schema:
        return set(schema["enum"])
    return None


def test_request_enums_are_the_documents(document: dict[str, Any]) -> None:
    checked = 0
    for name, schema in schemas(document).items():
        if schema.get("additionalProperties") is not False:
            continue
        ours = getattr(models, name).model_json_schema(by_alias=True)["properties"]
        for field, prop in schema.get("properties", {}).items():
            expected = enum_of(prop)
            if expected is not None:
                assert enum_of(ours[field]) == expected, f"{name}.{field}"
                checked += 1
    assert checked >= 10, "the queries' mechanisms, attribute types, ops, filters, roles"


def test_every_operation_of_the_document_has_a_client_method(document: dict[str, Any]) -> None:
    ids = {
        operation["operationId"]
        for path in document["paths"].values()
        for operation in path.values()
    }
    assert ids - NOT_JSON == set(OPERATIONS), "an operation is missing from OPERATIONS"
    for kind in (Client, AsyncClient):
        client = kind("http://unused.test")
        for dotted in OPERATIONS.values():
            target: Any = client
            for part in dotted.split("."):
                target = getattr(target, part)
            assert callable(target), f"{kind.__name__}.{dotted}"


@pytest.mark.slow
def test_the_package_builds_into_a_typed_wheel(tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: S603 - pip of this venv on our own package
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT / "clients" / "python"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    version = ldp_gatekeeper_client.__version__
    (wheel,) = tmp_path.glob(f"ldp_gatekeeper_client-{version}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"ldp_gatekeeper_client-{version}.dist-info/METADATA").decode()
    assert "ldp_gatekeeper_client/py.typed" in names
    assert "ldp_gatekeeper_client/models.py" in names
    for requirement in ("httpx", "pydantic", "tqdm"):
        assert f"Requires-Dist: {requirement}" in metadata
    assert "Provides-Extra: pandas" in metadata
    assert "Quick start" in metadata  # the README is the long description

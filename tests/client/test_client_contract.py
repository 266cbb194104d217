"""The client follows the API: its models, operations and version match the app's OpenAPI document.

The models of ``clients/python`` are written by hand (its README says why); these tests are
what keeps them from drifting: a schema, a property, a required field, a request enum or an
operation added to the app fails here until the client has it, and the client's version must
be the document's ``info.version``. The package must also build into a wheel that ships its
type information.
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
    "odometers": "odometers.all",
    "create_survey": "surveys.create",
    "survey_dry_run": "surveys.dry_run",
    "list_surveys": "surveys.all",
    "get_survey": "surveys.get",
    "cancel_survey": "surveys.cancel",
    "survey_responses": "surveys.responses",
    "audit_log": "audit.events",
    "loss": "loss",
    "new_key": "keys.create",
    "list_api_keys": "keys.all",
    "drop_key": "keys.revoke",
    "whoami": "whoami",
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

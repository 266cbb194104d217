"""Projects (issue 25): the admin API, keys created in a project, and bad input.

A project has a unique name, a label scope (at least one label, fixed) and an ε quota (at most
the largest budget an object may have); keys are created in it by name and inherit both. Bad
input is a 422 problem+json naming the field, and stores nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.db.migrate import alembic_config, upgrade
from app.db.models import Base
from app.db.session import make_engine
from app.engine.limits import MAX_BUDGET
from tests.service.conftest import ADMIN_KEY, auth, make_settings, unique_id
from tests.service.factories import run_cli

PROBLEM = "application/problem+json"
ADMIN = auth(ADMIN_KEY)


def project_body(name: str | None = None, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name or unique_id("p"),
        "scope": {"labels": {"study": "flu-2026"}},
        "quota": {"epsilon": 1.5},
    }
    body.update(changes)
    return body


def field_error(response: httpx.Response, field: str, status: int = 422) -> dict[str, Any]:
    """A problem+json naming ``field``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert field in [e["field"] for e in body.get("errors", [])], body
    return dict(body)


def _counts(client: TestClient) -> tuple[int, int]:
    projects = client.get("/v1/projects", params={"limit": 1000}, headers=ADMIN).json()
    keys = client.get("/v1/keys", params={"limit": 1000}, headers=ADMIN).json()
    return len(projects["items"]), len(keys["items"])


def test_a_project_is_created_read_listed_and_its_quota_changed(client: TestClient) -> None:
    body = project_body()
    r = client.post("/v1/projects", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    view = r.json()
    assert view["name"] == body["name"]
    assert view["scope"] == {"labels": {"study": "flu-2026"}}
    assert view["quota"] == {"epsilon": 1.5}
    assert client.get(f"/v1/projects/{body['name']}", headers=ADMIN).json() == view
    listed = client.get("/v1/projects", params={"limit": 1000}, headers=ADMIN).json()
    assert view in listed["items"]
    r = client.patch(
        f"/v1/projects/{body['name']}", headers=ADMIN, json={"quota": {"epsilon": 2.5}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["quota"] == {"epsilon": 2.5}
    assert r.json()["scope"] == view["scope"]
    kinds = [
        e["kind"]
        for e in client.get("/v1/audit", params={"limit": 1000}, headers=ADMIN).json()["events"]
    ]
    assert "project.created" in kinds
    assert "project.quota_changed" in kinds


def test_project_names_are_unique_and_paged(client: TestClient) -> None:
    body = project_body()
    assert client.post("/v1/projects", headers=ADMIN, json=body).status_code == 201
    r = client.post("/v1/projects", headers=ADMIN, json={**body, "quota": {"epsilon": 3}})
    assert r.status_code == 409, r.text
    assert r.json()["type"] == "already-exists"
    assert client.get(f"/v1/projects/{body['name']}", headers=ADMIN).json()["quota"] == {
        "epsilon": 1.5
    }
    # a second project of its own: the module's database may hold no other (its tests can run
    # in any order, or in another test process with its own database)
    other = project_body()
    assert client.post("/v1/projects", headers=ADMIN, json=other).status_code == 201
    first = client.get("/v1/projects", params={"limit": 1}, headers=ADMIN).json()
    assert len(first["items"]) == 1
    assert first["next_after"] is not None
    second = client.get(
        "/v1/projects", params={"limit": 1, "after": first["next_after"]}, headers=ADMIN
    ).json()
    assert second["items"][0]["name"] != first["items"][0]["name"]
    # one page at a time, every project once, in creation order, to a page that ends the list
    names: list[str] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 1} if after is None else {"limit": 1, "after": after}
        page = client.get("/v1/projects", params=params, headers=ADMIN).json()
        names += [item["name"] for item in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert len(names) == len(set(names))
    assert names.index(body["name"]) < names.index(other["name"])


def test_unknown_projects_are_not_found(client: TestClient) -> None:
    for method, json in (("GET", None), ("PATCH", {"quota": {"epsilon": 1}})):
        r = client.request(method, "/v1/projects/no-such-project", headers=ADMIN, json=json)
        assert r.status_code == 404, r.text
        assert r.json()["type"] == "not-found"


def test_a_key_in_a_project_names_it_and_whoami_says_so(client: TestClient) -> None:
    body = project_body()
    client.post("/v1/projects", headers=ADMIN, json=body)
    for role in ("analyst", "viewer"):
        r = client.post(
            "/v1/keys", headers=ADMIN, json={"role": role, "project": body["name"], "label": "x"}
        )
        assert r.status_code == 201, r.text
        created = r.json()
        assert created["project"] == body["name"]
        me = client.get("/v1/whoami", headers=auth(created["key"])).json()
        assert me == {"key_id": created["id"], "role": role, "project": body["name"]}
        listed = client.get("/v1/keys", params={"limit": 1000}, headers=ADMIN).json()["items"]
        (info,) = [k for k in listed if k["id"] == created["id"]]
        assert info["project"] == body["name"]
    assert client.get("/v1/whoami", headers=ADMIN).json()["project"] is None


BAD_PROJECTS: list[tuple[str, Any, str]] = [
    ("no labels", project_body(scope={"labels": {}}), "scope.labels"),
    ("no scope", {"name": "x1", "quota": {"epsilon": 1}}, "scope"),
    ("scope not an object", project_body(scope=["study"]), "scope"),
    ("scope ids", project_body(scope={"labels": {"a": "b"}, "ids": ["x"]}), "scope.ids"),
    ("label value", project_body(scope={"labels": {"study": 3}}), "scope.labels.study"),
    ("label name", project_body(scope={"labels": {"-bad": "x"}}), "scope.labels"),
    ("quota above every budget", project_body(quota={"epsilon": MAX_BUDGET * 2}), "quota.epsilon"),
    ("quota zero", project_body(quota={"epsilon": 0}), "quota.epsilon"),
    ("quota negative", project_body(quota={"epsilon": -1}), "quota.epsilon"),
    ("quota text", project_body(quota={"epsilon": "1"}), "quota.epsilon"),
    ("quota delta", project_body(quota={"epsilon": 1, "delta": 0.1}), "quota.delta"),
    ("name", project_body(name="has space"), "name"),
    ("name too long", project_body(name="x" * 65), "name"),
    ("name number", {**project_body(), "name": 7}, "name"),
    ("extra field", {**project_body(), "owner": "me"}, "owner"),
]


@pytest.mark.parametrize(
    ("body", "field"), [(b, f) for _, b, f in BAD_PROJECTS], ids=[i for i, _, _ in BAD_PROJECTS]
)
def test_bad_projects_are_refused_naming_the_field(
    client: TestClient, body: Any, field: str
) -> None:
    before = _counts(client)
    field_error(client.post("/v1/projects", headers=ADMIN, json=body), field)
    assert _counts(client) == before


BAD_PATCHES: list[tuple[str, Any, str]] = [
    ("scope is fixed", {"quota": {"epsilon": 1}, "scope": {"labels": {"a": "b"}}}, "scope"),
    ("no quota", {}, "quota"),
    ("quota above every budget", {"quota": {"epsilon": MAX_BUDGET + 1}}, "quota.epsilon"),
    ("quota null", {"quota": None}, "quota"),
]


def test_a_quota_above_every_budget_means_above_the_largest_budget_an_object_may_have(
    client: TestClient,
) -> None:
    """Issue 25 bad input: "above every budget" is above ``MAX_BUDGET`` (10,000), the largest
    ``budget.epsilon`` any object may be registered with — a fixed bound, not the budgets of the
    objects registered now (which change). Exactly that bound is a quota; the next decimal
    above it is refused naming ``quota.epsilon``, never echoing the value, storing nothing."""
    at = project_body(quota={"epsilon": MAX_BUDGET})
    r = client.post("/v1/projects", headers=ADMIN, json=at)
    assert r.status_code == 201, r.text
    assert r.json()["quota"] == {"epsilon": MAX_BUDGET}
    above = 10000.000001
    assert above > MAX_BUDGET
    before = _counts(client)
    r = client.post("/v1/projects", headers=ADMIN, json=project_body(quota={"epsilon": above}))
    error = field_error(r, "quota.epsilon")
    assert "10000.000001" not in r.text
    assert error["errors"][0]["message"]
    assert _counts(client) == before
    r = client.patch(
        f"/v1/projects/{at['name']}", headers=ADMIN, json={"quota": {"epsilon": above}}
    )
    field_error(r, "quota.epsilon")
    assert "10000.000001" not in r.text
    assert client.get(f"/v1/projects/{at['name']}", headers=ADMIN).json()["quota"] == {
        "epsilon": MAX_BUDGET
    }


@pytest.mark.parametrize(
    ("body", "field"), [(b, f) for _, b, f in BAD_PATCHES], ids=[i for i, _, _ in BAD_PATCHES]
)
def test_bad_quota_changes_are_refused_naming_the_field(
    client: TestClient, body: Any, field: str
) -> None:
    project = project_body()
    client.post("/v1/projects", headers=ADMIN, json=project)
    r = client.patch(f"/v1/projects/{project['name']}", headers=ADMIN, json=body)
    field_error(r, field)
    assert client.get(f"/v1/projects/{project['name']}", headers=ADMIN).json()["quota"] == {
        "epsilon": 1.5
    }


def test_bad_project_keys_are_refused_naming_the_field(client: TestClient) -> None:
    project = project_body()
    client.post("/v1/projects", headers=ADMIN, json=project)
    cases = [
        ({"role": "analyst", "project": "no-such-project"}, "project"),
        ({"role": "analyst", "project": None}, "project"),
        ({"role": "analyst", "project": 5}, "project"),
        ({"role": "analyst", "project": "bad name"}, "project"),
        ({"role": "admin", "project": project["name"]}, "role"),
    ]
    for body, field in cases:
        before = _counts(client)
        field_error(client.post("/v1/keys", headers=ADMIN, json=body), field)
        assert _counts(client) == before


def test_0010_downgrades_and_upgrades_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cycle.db'}"
    upgrade(url)
    command.downgrade(alembic_config(url), "0008")
    upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": False})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def _database_with_a_project(tmp_path: Path) -> tuple[str, str]:
    """A migrated SQLite database for the command line, with a project: its URL and name."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(url)
    name = unique_id("cli")
    with TestClient(create_app(make_settings(url))) as client:
        r = client.post("/v1/projects", headers=ADMIN, json=project_body(name))
        assert r.status_code == 201, r.text
    return url, name


def test_gatekeeper_keys_create_in_a_project(tmp_path: Path) -> None:
    """``gatekeeper keys create --project NAME``: a key of that project; an unknown one: exit 2."""
    url, name = _database_with_a_project(tmp_path)
    done = run_cli("keys", "create", "--role", "viewer", "--project", name, database_url=url)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    with TestClient(create_app(make_settings(url))) as client:
        me = client.get("/v1/whoami", headers=auth(secret)).json()
        assert me["project"] == name
        assert me["role"] == "viewer"
    unknown = run_cli("keys", "create", "--role", "viewer", "--project", "nope", database_url=url)
    assert unknown.returncode == 2
    assert "project: names no project" in unknown.stderr
    assert unknown.stdout == ""


def _object_in(client: TestClient, labels: dict[str, str]) -> str:
    oid = unique_id("del")
    body = {
        "id": oid,
        "domain": {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 1}]},
        "value": {"x": 1},
        "budget": {"epsilon": 10},
        "labels": labels,
    }
    assert client.post("/v1/objects", headers=ADMIN, json=body).status_code == 201
    return oid


def test_a_deleted_project_revokes_its_keys_and_keeps_its_name_and_loss(
    client: TestClient,
) -> None:
    """DELETE /v1/projects/{name}: 204; its keys 401 like any revoked key; name and loss kept."""
    study = unique_id("st")
    body = project_body(scope={"labels": {"study": study}})
    name = body["name"]
    assert client.post("/v1/projects", headers=ADMIN, json=body).status_code == 201
    keys = {}
    for role in ("analyst", "viewer"):
        r = client.post("/v1/keys", headers=ADMIN, json={"role": role, "project": name})
        keys[role] = r.json()
    analyst = auth(keys["analyst"]["key"])
    oid = _object_in(client, {"study": study})
    query = {
        "mechanism": "binary_rr",
        "epsilon": 0.5,
        "predicate": {"attribute": "x", "op": "==", "value": 1},
    }
    r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": query})
    assert r.status_code == 201, r.text
    assert client.get("/v1/whoami", headers=analyst).status_code == 200  # cached: forgotten below

    r = client.delete(f"/v1/projects/{name}", headers=ADMIN)
    assert r.status_code == 204, r.text
    assert r.content == b""
    for role in ("analyst", "viewer"):
        headers = auth(keys[role]["key"])
        for url in ("/v1/whoami", f"/v1/objects/{oid}"):
            r = client.get(url, headers=headers)
            assert r.status_code == 401, (role, url, r.text)
    listed = {k["id"]: k for k in client.get("/v1/keys", headers=ADMIN).json()["items"]}
    for role in ("analyst", "viewer"):
        assert listed[keys[role]["id"]]["revoked_at"] is not None
        assert listed[keys[role]["id"]]["project"] == name
    # gone from the projects API: not found, not listed, not patched, not deleted twice
    assert client.get(f"/v1/projects/{name}", headers=ADMIN).status_code == 404
    projects = client.get("/v1/projects", params={"limit": 1000}, headers=ADMIN).json()
    assert name not in [p["name"] for p in projects["items"]]
    r = client.patch(f"/v1/projects/{name}", headers=ADMIN, json={"quota": {"epsilon": 2}})
    assert r.status_code == 404
    r = client.delete(f"/v1/projects/{name}", headers=ADMIN)
    assert r.status_code == 404
    assert r.json()["type"] == "not-found"
    # its name stays taken; no new key in it
    assert client.post("/v1/projects", headers=ADMIN, json=body).status_code == 409
    r = client.post("/v1/keys", headers=ADMIN, json={"role": "analyst", "project": name})
    error = field_error(r, "project")
    assert error["errors"][0]["message"] == "names a deleted project (its keys are revoked)"
    # admins' odometers keep the project's sub-history loss
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=ADMIN).json()
    (entry,) = odometer["projects"]
    assert entry["project"] == name
    assert entry["accepted"] == 1
    assert entry["realized_loss"]["upper"] == 0.5
    events = client.get(
        "/v1/audit", params={"limit": 1000, "kind": "project.deleted"}, headers=ADMIN
    ).json()["events"]
    deleted = [e for e in events if e["detail"]["project"] == name]
    assert len(deleted) == 1
    assert sorted(deleted[0]["detail"]["revoked_keys"]) == sorted(keys[role]["id"] for role in keys)


def test_unknown_projects_are_not_deleted(client: TestClient) -> None:
    for name in ("no-such-project", "bad%20name"):
        r = client.delete(f"/v1/projects/{name}", headers=ADMIN)
        assert r.status_code == 404, r.text
        assert r.json()["type"] == "not-found"


def test_gatekeeper_projects_delete(tmp_path: Path) -> None:
    """``gatekeeper projects delete NAME``: its keys revoked (exit 0); unknown or again: exit 1."""
    url, name = _database_with_a_project(tmp_path)
    with TestClient(create_app(make_settings(url))) as client:
        r = client.post("/v1/keys", headers=ADMIN, json={"role": "viewer", "project": name})
        secret = r.json()["key"]
    done = run_cli("projects", "delete", name, database_url=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"project {name} deleted; 1 key(s) revoked"
    with TestClient(create_app(make_settings(url))) as client:
        assert client.get("/v1/whoami", headers=auth(secret)).status_code == 401
    again = run_cli("projects", "delete", name, database_url=url)
    assert again.returncode == 1
    assert f"no project named {name!r}" in again.stderr

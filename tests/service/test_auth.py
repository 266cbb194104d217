"""Authentication and roles: every endpoint × {admin, analyst, viewer, missing, invalid, revoked}.

Roles (contract.md "REST API (v1)"): admin may do everything; analyst may read an object, dry-run,
submit, read its *own* queries, read odometers and use the calculator; viewer may read odometers
only; the keys API is admin-only; health and metrics need no key. Without a valid key the answer
is 401 problem+json with ``WWW-Authenticate: Bearer``; a role that may not is 403.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.bootstrap import create_app
from app.db.migrate import upgrade
from app.db.session import make_engine
from app.settings import Settings
from tests.service import factories
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import (
    ADMIN,
    ANALYST,
    CREDENTIALS,
    INVALID,
    MISSING,
    REVOKED,
    VIEWER,
    credentials,
    grr_query,
    integer_domain,
)

PROBLEM = "application/problem+json"
DOMAIN = integer_domain(3)
QUERY = grr_query(0.01)


def register(client: TestClient, oid: str | None = None, budget: float = 10_000.0) -> str:
    """An object of this module's domain (shared with the authorization matrix)."""
    return factories.register(
        client, domain=DOMAIN, value={"x": 1}, budget=budget, oid=oid, prefix="auth"
    )


def key_id_of(client: TestClient, role: str) -> tuple[int, str]:
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": role})
    assert r.status_code == 201, r.text
    return int(r.json()["id"]), str(r.json()["key"])


@dataclass
class Call:
    """One endpoint: how to call it (fresh state each time) and who may."""

    name: str
    method: str
    allowed: frozenset[str] | None  # None: no key needed
    success: int
    prepare: Callable[[TestClient], tuple[str, dict[str, Any]]]
    #: (client, url) -> True when the call had an effect (for calls that must not have one)
    effect: Callable[[TestClient, str], bool] | None = None


ALL_ROLES = frozenset({ADMIN, ANALYST, VIEWER})
ANALYSTS = frozenset({ADMIN, ANALYST})
ADMINS = frozenset({ADMIN})


def _register_call(client: TestClient) -> tuple[str, dict[str, Any]]:
    oid = unique_id("reg")
    body = {"id": oid, "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}}
    return "/v1/objects", {"json": body, "_oid": oid}


def _registered(client: TestClient, oid: str) -> bool:
    return client.get(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).status_code == 200


def _object_url(suffix: str) -> Callable[[TestClient], tuple[str, dict[str, Any]]]:
    def prepare(client: TestClient) -> tuple[str, dict[str, Any]]:
        oid = register(client)
        kwargs: dict[str, Any] = {"_oid": oid}
        if suffix in ("/dry-run", "/queries-post"):
            kwargs["json"] = {"query": QUERY}
        return f"/v1/objects/{oid}{suffix.replace('-post', '')}", kwargs

    return prepare


def _retired(client: TestClient, oid: str) -> bool:
    r = client.get(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY))
    return bool(r.json()["status"] == "retired")


def _spent(client: TestClient, oid: str) -> bool:
    r = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY))
    return bool(r.json()["accepted"] != 0)


def _loss_call(client: TestClient) -> tuple[str, dict[str, Any]]:
    body = {"domain": DOMAIN, "history": [{"query": QUERY, "output": 1}], "budget": 1}
    return "/v1/loss", {"json": {**body, "candidate": QUERY}}


def _new_key_call(client: TestClient) -> tuple[str, dict[str, Any]]:
    return "/v1/keys", {"json": {"role": VIEWER, "label": "made-by-test"}}


def _drop_key_call(client: TestClient) -> tuple[str, dict[str, Any]]:
    key_id, secret = key_id_of(client, VIEWER)
    return f"/v1/keys/{key_id}", {"_secret": secret}


def _key_revoked(client: TestClient, secret: str) -> bool:
    return client.get("/v1/odometers", headers=auth(secret)).status_code == 401


def _plain(url: str) -> Callable[[TestClient], tuple[str, dict[str, Any]]]:
    return lambda client: (url, {})


CALLS = [
    Call("register", "POST", ADMINS, 201, _register_call, _registered),
    Call("get-object", "GET", ANALYSTS, 200, _object_url("")),
    Call("retire", "DELETE", ADMINS, 200, _object_url(""), _retired),
    Call("dry-run", "POST", ANALYSTS, 200, _object_url("/dry-run")),
    Call("submit", "POST", ANALYSTS, 201, _object_url("/queries-post"), _spent),
    Call("history", "GET", ANALYSTS, 200, _object_url("/queries")),
    Call("odometer", "GET", ALL_ROLES, 200, _object_url("/odometer")),
    Call("odometer-history", "GET", ALL_ROLES, 200, _object_url("/odometer/history")),
    Call("odometers", "GET", ALL_ROLES, 200, _plain("/v1/odometers")),
    Call("loss", "POST", ANALYSTS, 200, _loss_call),
    Call("create-key", "POST", ADMINS, 201, _new_key_call),
    Call("revoke-key", "DELETE", ADMINS, 200, _drop_key_call),
    Call("healthz", "GET", None, 200, _plain("/healthz")),
    Call("readyz", "GET", None, 200, _plain("/readyz")),
    Call("metrics", "GET", None, 200, _plain("/metrics")),
]


@pytest.fixture(scope="module")
def keys(client: TestClient) -> dict[str, str | None]:
    """A secret per credential kind (None: no Authorization header)."""
    return credentials(client)


def assert_problem(response: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys()
    assert body["status"] == status
    assert body["type"] == type_
    return dict(body)


def assert_unauthorized(response: httpx.Response) -> None:
    assert_problem(response, 401, "unauthorized")
    assert response.headers.get("www-authenticate", "").lower().startswith("bearer")


def expected_status(call: Call, credential: str) -> int:
    if call.allowed is None:
        return call.success
    if credential in (MISSING, INVALID, REVOKED):
        return 401
    return call.success if credential in call.allowed else 403


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("call", CALLS, ids=[c.name for c in CALLS])
def test_endpoint_role_matrix(
    client: TestClient, keys: dict[str, str | None], call: Call, credential: str
) -> None:
    url, kwargs = call.prepare(client)
    oid = kwargs.pop("_oid", None)
    secret = kwargs.pop("_secret", None)
    key = keys[credential]
    headers = auth(key) if key is not None else {}
    r = client.request(call.method, url, headers=headers, **kwargs)
    expected = expected_status(call, credential)
    if expected == 401:
        assert_unauthorized(r)
    elif expected == 403:
        assert_problem(r, 403, "forbidden")
    else:
        assert r.status_code == expected, (r.status_code, r.text)
    # a refused call changes nothing; an allowed one does what it says
    if call.effect is not None:
        target = oid if oid is not None else secret
        assert target is not None
        assert call.effect(client, target) is (expected == call.success)
    elif call.name == "revoke-key":
        assert secret is not None
        assert _key_revoked(client, secret) is (expected == call.success)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Bearer  ",
        "Basic " + "YWRtaW46YWRtaW4=",
        "Token KEY",
        "KEY",
        "Bearer KEY extra",
        "Bearer KEYx",
        "Bearer xKEY",
        "Bearer " + "k" * 5000,
        "Bearer gk_\u00e9",
    ],
    ids=range(12),
)
@pytest.mark.parametrize(
    ("method", "url"),
    [("GET", "/v1/odometers"), ("POST", "/v1/objects"), ("POST", "/v1/keys")],
)
def test_malformed_authorization_headers_are_401(
    client: TestClient, header: str, method: str, url: str
) -> None:
    value = header.replace("KEY", ADMIN_KEY)
    r = client.request(
        method,
        url,
        headers={"Authorization": value.encode("utf-8")},
        json={"role": VIEWER},
    )
    assert_unauthorized(r)
    assert ADMIN_KEY not in r.text


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(client: TestClient, scheme: str) -> None:
    r = client.get("/v1/odometers", headers={"Authorization": f"{scheme} {ADMIN_KEY}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "where",
    [
        {"params": {"api_key": ADMIN_KEY}},
        {"params": {"access_token": ADMIN_KEY}},
        {"headers": {"X-API-Key": ADMIN_KEY}},
        {"cookie": f"Bearer {ADMIN_KEY}"},
    ],
    ids=["query-api_key", "query-access_token", "x-api-key", "cookie"],
)
def test_keys_only_in_the_authorization_header(client: TestClient, where: dict[str, Any]) -> None:
    where = dict(where)
    cookie = where.pop("cookie", None)
    client.cookies.clear()
    if cookie is not None:
        client.cookies.set("Authorization", cookie)
    try:
        r = client.get("/v1/odometers", **where)
    finally:
        client.cookies.clear()
    assert_unauthorized(r)


def test_auth_comes_before_validation_and_existence(
    client: TestClient, keys: dict[str, str | None]
) -> None:
    """A caller without the right gets 401/403, never a 400/404/422 that would tell more."""
    missing = unique_id("missing")
    bad = b'{"not json'
    for credential, status in ((MISSING, 401), (INVALID, 401), (VIEWER, 403)):
        key = keys[credential]
        headers = {"Content-Type": "application/json", **(auth(key) if key else {})}
        for method, url in [
            ("POST", "/v1/objects"),
            ("POST", f"/v1/objects/{missing}/dry-run"),
            ("POST", f"/v1/objects/{missing}/queries"),
            ("GET", f"/v1/objects/{missing}"),
            ("DELETE", f"/v1/objects/{missing}"),
            ("POST", "/v1/loss"),
            ("POST", "/v1/keys"),
            ("DELETE", "/v1/keys/999999"),
        ]:
            r = client.request(method, url, headers=headers, content=bad)
            assert r.status_code == status, (credential, method, url, r.text)
    # an analyst may not touch keys even with a malformed body, nor retire an unknown object
    headers = {"Content-Type": "application/json", **auth(str(keys[ANALYST]))}
    assert client.post("/v1/keys", headers=headers, content=bad).status_code == 403
    assert client.delete(f"/v1/objects/{missing}", headers=headers).status_code == 403
    # a viewer sees odometers of unknown objects as 404 (it may read odometers)
    r = client.get(f"/v1/objects/{missing}/odometer", headers=auth(str(keys[VIEWER])))
    assert_problem(r, 404, "not-found")


def test_an_analyst_sees_only_its_own_queries(client: TestClient) -> None:
    oid = register(client)
    alice, bob = new_key(client, ANALYST), new_key(client, ANALYST)
    mine: dict[str, list[int]] = {alice: [], bob: []}
    for n, who in enumerate([alice, bob, alice, alice, bob]):
        r = client.post(
            f"/v1/objects/{oid}/queries",
            headers={**auth(who), "Idempotency-Key": f"q{n}"},
            json={"query": QUERY},
        )
        assert r.status_code == 201, r.text
        mine[who].append(r.json()["query_id"])
    for who in (alice, bob):
        r = client.get(f"/v1/objects/{oid}/queries", headers=auth(who))
        assert r.status_code == 200
        assert [i["query_id"] for i in r.json()["items"]] == mine[who]
        # paging does not reveal the others' queries either
        r = client.get(
            f"/v1/objects/{oid}/queries", params={"limit": 1, "after": 1}, headers=auth(who)
        )
        assert all(i["query_id"] in mine[who] for i in r.json()["items"])
    everything = client.get(f"/v1/objects/{oid}/queries", headers=auth(ADMIN_KEY)).json()
    assert sorted(i["query_id"] for i in everything["items"]) == sorted(mine[alice] + mine[bob])
    # the odometer is the object's, whoever asked
    for who in (alice, bob):
        odo = client.get(f"/v1/objects/{oid}/odometer", headers=auth(who)).json()
        assert odo["accepted"] == 5


def test_an_analyst_cannot_replay_another_analysts_idempotency_key(client: TestClient) -> None:
    """Replaying alice's Idempotency-Key must not hand bob alice's stored output."""
    oid = register(client)
    alice, bob = new_key(client, ANALYST), new_key(client, ANALYST)
    r = client.post(
        f"/v1/objects/{oid}/queries",
        headers={**auth(alice), "Idempotency-Key": "order-1"},
        json={"query": QUERY},
    )
    assert r.status_code == 201, r.text
    alices = r.json()["query_id"]
    r = client.post(
        f"/v1/objects/{oid}/queries",
        headers={**auth(bob), "Idempotency-Key": "order-1"},
        json={"query": QUERY},
    )
    assert r.status_code in (201, 409, 422), r.text
    if r.status_code == 201:
        assert r.json()["query_id"] != alices, "bob was handed alice's stored query and output"
    bobs = client.get(f"/v1/objects/{oid}/queries", headers=auth(bob)).json()["items"]
    assert all(i["query_id"] != alices for i in bobs)


def test_keys_api(client: TestClient, database_url: str) -> None:
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": ANALYST, "label": "ci"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["role"] == ANALYST
    assert body["label"] == "ci"
    assert isinstance(body["id"], int)
    secret = body["key"]
    assert secret.startswith("gk_")
    assert len(secret) >= 40
    # the key works, with its role
    assert client.get("/v1/odometers", headers=auth(secret)).status_code == 200
    assert client.post("/v1/keys", headers=auth(secret), json={"role": ADMIN}).status_code == 403
    # stored hashed: the secret is nowhere in the table
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM api_keys")).all()
    finally:
        engine.dispose()
    assert rows
    assert not any(secret in str(v) for row in rows for v in row)
    assert not any(ADMIN_KEY in str(v) for row in rows for v in row)
    # revoke: 401 at once; revoking again is fine; an unknown id is 404
    r = client.delete(f"/v1/keys/{body['id']}", headers=auth(ADMIN_KEY))
    assert r.status_code == 200
    assert_unauthorized(client.get("/v1/odometers", headers=auth(secret)))
    assert client.delete(f"/v1/keys/{body['id']}", headers=auth(ADMIN_KEY)).status_code in (
        200,
        404,
    )
    assert_problem(client.delete("/v1/keys/987654321", headers=auth(ADMIN_KEY)), 404, "not-found")
    # every created key is different
    assert len({new_key(client, VIEWER) for _ in range(5)}) == 5


def test_a_created_admin_key_can_do_everything_admin(client: TestClient) -> None:
    admin = new_key(client, ADMIN)
    oid = unique_id("adm")
    r = client.post(
        "/v1/objects",
        headers=auth(admin),
        json={"id": oid, "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}},
    )
    assert r.status_code == 201
    r = client.post("/v1/keys", headers=auth(admin), json={"role": VIEWER})
    assert r.status_code == 201
    assert client.delete(f"/v1/objects/{oid}", headers=auth(admin)).status_code == 200


# ------------------------------------------------------------------------------------------------
# The bootstrap admin key from the environment
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_sqlite(tmp_path: Any) -> str:
    url = f"sqlite:///{tmp_path / 'boot.db'}"
    upgrade(url)
    return url


@pytest.fixture
def env_app(
    fresh_sqlite: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], TestClient]]:
    """Start apps whose settings come from the environment, like ``gatekeeper serve``."""
    opened: list[TestClient] = []

    def start(bootstrap: str) -> TestClient:
        monkeypatch.setenv("DATABASE_URL", fresh_sqlite)
        monkeypatch.setenv("REDIS_URL", "")
        monkeypatch.setenv("BOUND_PROCESSES", "0")
        monkeypatch.setenv("GATEKEEPER_BOOTSTRAP_ADMIN_KEY", bootstrap)
        settings = Settings()
        assert settings.gatekeeper_bootstrap_admin_key == (bootstrap or None)
        test_client = TestClient(create_app(settings))
        test_client.__enter__()
        opened.append(test_client)
        return test_client

    yield start
    for test_client in opened:
        test_client.__exit__(None, None, None)


def test_bootstrap_admin_key_from_the_environment(
    env_app: Callable[[str], TestClient], fresh_sqlite: str
) -> None:
    boot = "boot-" + secrets.token_urlsafe(32)
    app_client = env_app(boot)
    r = app_client.post(
        "/v1/objects",
        headers=auth(boot),
        json={"id": "b1", "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}},
    )
    assert r.status_code == 201, r.text
    r = app_client.post("/v1/keys", headers=auth(boot), json={"role": ANALYST})
    assert r.status_code == 201, r.text
    analyst = r.json()["key"]
    assert app_client.post("/v1/objects/b1/dry-run", headers=auth(analyst), json={"query": QUERY})
    # the test suite's admin key means nothing here
    assert_unauthorized(app_client.get("/v1/odometers", headers=auth(ADMIN_KEY)))
    # a restart with the same key does not duplicate it
    env_app(boot)
    engine = make_engine(fresh_sqlite)
    try:
        with engine.connect() as conn:
            admins = conn.execute(text("SELECT role FROM api_keys WHERE role = 'admin'")).all()
    finally:
        engine.dispose()
    assert len(admins) == 1


def test_no_bootstrap_key_means_no_admin(env_app: Callable[[str], TestClient]) -> None:
    app_client = env_app("")
    for key in ("", ADMIN_KEY, "None", "null"):
        r = app_client.get("/v1/odometers", headers=auth(key))
        assert_unauthorized(r)
    # health needs no key
    assert app_client.get("/healthz").status_code == 200
    assert app_client.get("/readyz").status_code == 200

"""The submit's short paths keep the protocol's answers (SQLite and PostgreSQL, in-process).

A fresh ``Idempotency-Key`` is not looked up before the INSERT (its unique constraint catches a
used one), so every answer other than an accepted submit must look the key up first: a retry of
a stored submit is replayed even after the budget ran out or the object was retired. Also:
``X-Request-ID`` from the pure ASGI middleware, and the per-process API-key cache with its
revocation semantics (``AUTH_CACHE_SECONDS``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.services.auth import KeyCache, RevocationListener, Role
from tests.service import factories
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key
from tests.service.factories import grr_query, integer_domain

DOMAIN = integer_domain(3)
QUERY = grr_query(0.6)


def _register(client: TestClient, budget: float) -> str:
    return factories.register(
        client, domain=DOMAIN, value={"x": 2}, budget=budget, filter="basic", prefix="paths"
    )


def _submit(
    client: TestClient, oid: str, key: str, idem: str | None, query: dict[str, Any] = QUERY
) -> httpx.Response:
    headers = auth(key) if idem is None else {**auth(key), "Idempotency-Key": idem}
    return client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": query})


def _problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["type"])


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> str:
    return new_key(client, "analyst")


def test_a_stored_submit_is_replayed_after_the_budget_ran_out(
    client: TestClient, analyst: str
) -> None:
    oid = _register(client, budget=1.0)  # basic filter: one query of 0.6 fits, two do not
    first = _submit(client, oid, analyst, "pay-1")
    assert first.status_code == 201, first.text
    # the budget is spent: a new submit is rejected and counted
    assert _problem_type(_submit(client, oid, analyst, "pay-2")) == "budget-exhausted"
    # a retry of the stored one is its stored answer, not a rejection, and not counted
    again = _submit(client, oid, analyst, "pay-1")
    assert again.status_code == 201, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()
    # the same key with another body is refused as such, not as a rejection
    other = _submit(client, oid, analyst, "pay-1", {**QUERY, "epsilon": 0.5})
    assert other.status_code == 422
    assert _problem_type(other) == "idempotency-key-reused"
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert (odometer["accepted"], odometer["rejected"]) == (1, 1)


def test_a_stored_submit_is_replayed_after_retirement(client: TestClient, analyst: str) -> None:
    oid = _register(client, budget=10.0)
    first = _submit(client, oid, analyst, "ret-1")
    assert first.status_code == 201, first.text
    assert client.delete(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).status_code == 200
    again = _submit(client, oid, analyst, "ret-1")
    assert again.status_code == 201, again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()
    assert _problem_type(_submit(client, oid, analyst, "ret-2")) == "object-retired"
    assert _problem_type(_submit(client, oid, analyst, None)) == "object-retired"


def test_a_stored_key_with_an_invalid_body_is_a_reused_key(
    client: TestClient, analyst: str
) -> None:
    oid = _register(client, budget=10.0)
    assert _submit(client, oid, analyst, "inv-1").status_code == 201
    bad = {**QUERY, "attribute": "nope"}
    assert _problem_type(_submit(client, oid, analyst, "inv-1", bad)) == "idempotency-key-reused"
    assert _problem_type(_submit(client, oid, analyst, "inv-2", bad)) == "validation-error"


def test_the_replayed_response_carries_the_query_id_of_the_history(
    client: TestClient, analyst: str
) -> None:
    oid = _register(client, budget=10.0)
    bodies = [_submit(client, oid, analyst, f"id-{n}").json() for n in range(3)]
    replays = [_submit(client, oid, analyst, f"id-{n}").json() for n in range(3)]
    assert replays == bodies
    items = client.get(f"/v1/objects/{oid}/queries", headers=auth(ADMIN_KEY)).json()["items"]
    assert [i["query_id"] for i in items] == [b["query_id"] for b in bodies]
    assert [i["seq"] for i in items] == [b["seq"] for b in bodies] == [1, 2, 3]


# --------------------------------------------------------------------------- request id


def test_every_response_has_a_request_id(client: TestClient) -> None:
    ids = {client.get("/healthz").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3
    assert all(len(i) == 32 for i in ids)
    echoed = client.get("/healthz", headers={"X-Request-ID": "trace-42"})
    assert echoed.headers["x-request-id"] == "trace-42"
    replaced = client.get("/healthz", headers={"X-Request-ID": "x" * 65})
    assert replaced.headers["x-request-id"] != "x" * 65
    # the body-size limit answers inside the request-id layer
    too_big = client.post(
        "/v1/objects",
        headers={**auth(ADMIN_KEY), "Content-Length": str(10**9), "X-Request-ID": "big"},
        content=b"{}",
    )
    assert too_big.status_code == 413
    assert too_big.headers["x-request-id"] == "big"
    unauthorized = client.get("/v1/odometers", headers={"X-Request-ID": "who"})
    assert unauthorized.status_code == 401
    assert unauthorized.headers["x-request-id"] == "who"


# --------------------------------------------------------------------------- key cache


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_key_cache_expires_forgets_and_can_be_off() -> None:
    clock = _Clock()
    cache = KeyCache(5.0, clock=clock)
    cache.put("h1", 1, Role.ANALYST)
    cache.put("h2", 2, Role.ADMIN)
    assert cache.get("h1") == (1, Role.ANALYST)
    clock.now += 4.9
    assert cache.get("h1") == (1, Role.ANALYST)
    clock.now += 0.1
    assert cache.get("h1") is None  # expired exactly at the TTL
    assert cache.get("h2") is None
    cache.put("h3", 3, Role.VIEWER)
    cache.forget(3)
    assert cache.get("h3") is None
    off = KeyCache(0.0, clock=clock)
    off.put("h1", 1, Role.ANALYST)
    assert off.get("h1") is None
    small = KeyCache(5.0, max_entries=2, clock=clock)
    for n in range(5):
        small.put(f"k{n}", n, Role.VIEWER)
    assert small.get("k4") == (4, Role.VIEWER)
    assert sum(small.get(f"k{n}") is not None for n in range(5)) <= 2


@pytest.fixture
def two_workers(database_url: str) -> Iterator[tuple[TestClient, TestClient]]:
    """Two app instances on one database, like two uvicorn workers (key cache TTL 1 s)."""
    settings = make_settings(database_url, auth_cache_seconds=1.0)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        yield a, b


def test_revocation_is_immediate_here_and_within_the_ttl_elsewhere(
    two_workers: tuple[TestClient, TestClient],
) -> None:
    a, b = two_workers
    created = a.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "viewer"}).json()
    secret = created["key"]
    assert a.get("/v1/odometers", headers=auth(secret)).status_code == 200
    assert b.get("/v1/odometers", headers=auth(secret)).status_code == 200  # b caches it
    assert a.delete(f"/v1/keys/{created['id']}", headers=auth(ADMIN_KEY)).status_code == 200
    revoked_at = time.monotonic()
    assert a.get("/v1/odometers", headers=auth(secret)).status_code == 401
    # b still trusts its cached entry (documented: up to AUTH_CACHE_SECONDS) ...
    still = b.get("/v1/odometers", headers=auth(secret)).status_code
    assert still == 200 or time.monotonic() - revoked_at >= 1.0
    # ... and no longer once it expired
    time.sleep(max(0.0, 1.05 - (time.monotonic() - revoked_at)))
    assert b.get("/v1/odometers", headers=auth(secret)).status_code == 401


def test_without_the_cache_revocation_is_immediate_everywhere(database_url: str) -> None:
    settings = make_settings(database_url, auth_cache_seconds=0.0)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        created = a.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "viewer"}).json()
        assert b.get("/v1/odometers", headers=auth(created["key"])).status_code == 200
        assert a.delete(f"/v1/keys/{created['id']}", headers=auth(ADMIN_KEY)).status_code == 200
        assert b.get("/v1/odometers", headers=auth(created["key"])).status_code == 401


def _rejection_events(client: TestClient, oid: str) -> int:
    r = client.get(
        "/v1/audit",
        params={"object_id": oid, "kind": "decision.rejected", "limit": 1000},
        headers=auth(ADMIN_KEY),
    )
    assert r.status_code == 200, r.text
    return len(r.json()["events"])


def test_a_replayed_rejection_returns_the_stored_answer_and_counts_nothing(
    client: TestClient, analyst: str
) -> None:
    """Two rejections and a replay of the second: 2 counted, 2 audited (issue #11, 4)."""
    oid = _register(client, 1.0)
    big = {**QUERY, "epsilon": 2.0}
    first = _submit(client, oid, analyst, "reject-a", big)
    second = _submit(client, oid, analyst, "reject-b", big)
    assert (first.status_code, second.status_code) == (409, 409)
    replay = _submit(client, oid, analyst, "reject-b", big)
    assert replay.status_code == 409
    assert _problem_type(replay) == "budget-exhausted"
    assert replay.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in second.headers
    assert replay.json() == second.json()
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odometer["rejected"] == 2
    assert _rejection_events(client, oid) == 2
    # the same key with another body is a mismatch, not a third rejection
    other = _submit(client, oid, analyst, "reject-b", {**QUERY, "epsilon": 3.0})
    assert _problem_type(other) == "idempotency-key-reused"
    # a key rejected before is not spent later by an acceptable query with the same body:
    # the stored rejection is the answer for that key
    small = {**QUERY, "epsilon": 0.5}
    rejected = _submit(client, oid, analyst, "reject-c", {**QUERY, "epsilon": 1.5})
    assert rejected.status_code == 409
    assert _submit(client, oid, analyst, "reject-c", small).status_code == 422
    accepted = _submit(client, oid, analyst, "accept-d", small)
    assert accepted.status_code == 201, accepted.text
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert (odometer["accepted"], odometer["rejected"]) == (1, 3)
    assert _rejection_events(client, oid) == 3


def test_another_analyst_cannot_replay_a_stored_rejection(client: TestClient, analyst: str) -> None:
    oid = _register(client, 1.0)
    big = {**QUERY, "epsilon": 2.0}
    assert _submit(client, oid, analyst, "mine", big).status_code == 409
    other = new_key(client, "analyst")
    r = _submit(client, oid, other, "mine", big)
    assert _problem_type(r) == "idempotency-key-reused"
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odometer["rejected"] == 1


@pytest.mark.parametrize("header", ["", " ", "\t"])
def test_an_empty_idempotency_key_is_a_400_naming_the_header(
    client: TestClient, analyst: str, header: str
) -> None:
    oid = _register(client, 5.0)
    r = _submit(client, oid, analyst, header)
    assert r.status_code == 400, r.text
    assert _problem_type(r) == "invalid-header"
    assert r.json()["errors"] == [{"field": "Idempotency-Key", "message": "must not be empty"}]
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odometer["accepted"] == 0


def test_the_odometer_history_places_each_rejection_between_accepted_queries(
    client: TestClient, analyst: str
) -> None:
    """The dashboard marks rejections on the loss chart (issue #11, 14)."""
    oid = _register(client, 1.0)  # basic filter
    answers = [
        _submit(client, oid, analyst, None, {**QUERY, "epsilon": eps}).status_code
        for eps in (0.6, 0.6, 0.6, 0.3, 0.3)
    ]
    assert answers == [201, 409, 409, 201, 409]
    url = f"/v1/objects/{oid}/odometer/history"
    whole = client.get(url, headers=auth(analyst)).json()
    assert [r["after_accepted"] for r in whole["rejections"]] == [1, 1, 2]
    assert all(r["at"] for r in whole["rejections"])
    paged, after = [], 0
    while True:
        page = client.get(url, params={"limit": 1, "after": after}, headers=auth(analyst)).json()
        paged += [r["after_accepted"] for r in page["rejections"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert paged == [1, 1, 2]


def test_a_lookup_that_raced_a_revocation_is_not_cached() -> None:
    cache = KeyCache(300.0)
    before = cache.generation  # read before the database lookup ...
    cache.forget(99)  # ... a revocation announced meanwhile (any key: the lookup may be stale)
    cache.put("h1", 1, Role.ANALYST, generation=before)
    assert cache.get("h1") is None
    cache.put("h1", 1, Role.ANALYST, generation=cache.generation)
    assert cache.get("h1") == (1, Role.ANALYST)
    cache.clear()
    assert cache.get("h1") is None


def _refused_within(client: TestClient, secret: str, seconds: float) -> float:
    """Seconds until ``client`` refuses ``secret`` (polled), failing after ``seconds``."""
    start = time.monotonic()
    while client.get("/v1/odometers", headers=auth(secret)).status_code != 401:
        assert time.monotonic() - start < seconds, "the revoked key is still accepted"
        time.sleep(0.005)
    return time.monotonic() - start


@pytest.fixture
def two_workers_with_redis(
    database_url: str, redis_url: str
) -> Iterator[tuple[TestClient, TestClient]]:
    """Two app instances on one database and one Redis, caching keys for 300 s."""
    settings = make_settings(database_url, redis_url, auth_cache_seconds=300.0)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        for app in (a.app, b.app):
            revocations = app.state.runtime.revocations  # type: ignore[attr-defined]
            assert revocations is not None
            assert revocations.subscribed.wait(5.0)
        yield a, b


def test_with_redis_a_revocation_reaches_every_worker_at_once(
    two_workers_with_redis: tuple[TestClient, TestClient],
) -> None:
    a, b = two_workers_with_redis
    created = a.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "viewer"}).json()
    secret = created["key"]
    assert a.get("/v1/odometers", headers=auth(secret)).status_code == 200
    assert b.get("/v1/odometers", headers=auth(secret)).status_code == 200  # b caches it
    assert a.delete(f"/v1/keys/{created['id']}", headers=auth(ADMIN_KEY)).status_code == 200
    assert a.get("/v1/odometers", headers=auth(secret)).status_code == 401
    # b cached the key for 300 s: only the announcement can make it refuse the key now
    assert _refused_within(b, secret, 1.0) < 1.0


def test_the_listener_stops_at_once_and_its_wake_up_forgets_no_key(redis_url: str) -> None:
    """A process's shutdown stops its listener; the thread waits for a message up to 0.5 s at a
    time, and every app with Redis (each server worker, each in-process app of the tests) waited
    that out at its shutdown until ``stop`` woke it (an empty message on a channel of its own)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        took = []
        for _ in range(3):
            cache = KeyCache(300.0)
            listener = RevocationListener(client, cache).start()
            assert listener.subscribed.wait(5.0)  # (subscribing clears the cache)
            cache.put("h1", 1, Role.ANALYST, generation=cache.generation)
            time.sleep(0.1)  # it has read the subscriptions' confirmations: it waits for a message
            started = time.monotonic()
            listener.stop()
            took.append(time.monotonic() - started)
            assert not listener._thread.is_alive()
            assert cache.get("h1") == (1, Role.ANALYST)  # the wake-up named no key
        assert min(took) < 0.3, took
    finally:
        client.close()


def test_with_redis_a_revocation_on_the_command_line_reaches_the_workers(
    two_workers_with_redis: tuple[TestClient, TestClient], database_url: str, redis_url: str
) -> None:
    a, b = two_workers_with_redis
    created = a.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "viewer"}).json()
    for worker in (a, b):
        assert worker.get("/v1/odometers", headers=auth(created["key"])).status_code == 200
    done = factories.run_cli(
        "keys", "revoke", str(created["id"]), database_url=database_url, REDIS_URL=redis_url
    )
    assert done.returncode == 0, done.stderr
    for worker in (a, b):
        _refused_within(worker, created["key"], 1.0)

"""No private value ever reaches a log line.

A real ``gatekeeper serve`` (two workers, PostgreSQL, Redis, a bound-worker process each, log
level DEBUG) goes through a walk-through with objects whose values are sentinels — including
bad requests that carry the sentinels in bodies, query strings, paths and headers. Its whole
output (every process) must not contain them, while it does contain a line for every request
sent (so the capture is known to work).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.logs import JsonFormatter
from tests.service.conftest import ADMIN_KEY, Server, auth, new_key, start_server, unique_id

FINITE_SENTINEL = "987654321007"
CONT_SENTINEL = "73137731377"
SENTINELS = (FINITE_SENTINEL, CONT_SENTINEL)
FINITE_DOMAIN = {
    "attributes": [
        {"name": "x", "type": "integer", "low": 0, "high": 3},
        {"name": "code", "type": "integer", "low": 987654321000, "high": 987654321009},
    ]
}
CONT_DOMAIN = {"attributes": [{"name": "r", "type": "real", "low": -1, "high": 1}]}
GRR = {"mechanism": "grr", "attribute": "x", "epsilon": 0.3}
LOGISTIC = {"mechanism": "logistic", "weights": {"r": 2.0}, "intercept": 0.1, "epsilon": 0.5}


class Walk:
    """Sends requests, each with its own X-Request-ID, and remembers the ids."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.ids: list[str] = []

    def __call__(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        rid = f"privacy-walk-{len(self.ids)}"
        self.ids.append(rid)
        headers = {"X-Request-ID": rid, **kwargs.pop("headers", {})}
        return self.http.request(method, url, headers=headers, **kwargs)


@pytest.fixture
def server(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Server]:
    running = start_server(
        tmp_path,
        database_url=postgres_url,
        redis_url=redis_url,
        workers=2,
        LOG_LEVEL="DEBUG",
        MAX_BODY_BYTES="4096",
    )
    yield running
    running.stop()


def walk_through(walk: Walk, analyst: str, viewer: str) -> None:
    admin = auth(ADMIN_KEY)
    finite, cont = unique_id("private"), unique_id("private")
    value = {"x": 2, "code": int(FINITE_SENTINEL)}
    r = walk(
        "POST",
        "/v1/objects",
        headers=admin,
        json={"id": finite, "domain": FINITE_DOMAIN, "value": value, "budget": {"epsilon": 2}},
    )
    assert r.status_code == 201, r.text
    r = walk(
        "POST",
        "/v1/objects",
        headers=admin,
        json={
            "id": cont,
            "domain": CONT_DOMAIN,
            "value": {"r": float("0." + CONT_SENTINEL)},
            "budget": {"epsilon": 2},
        },
    )
    assert r.status_code == 201, r.text
    for oid, query in ((finite, GRR), (cont, LOGISTIC)):
        assert walk("GET", f"/v1/objects/{oid}", headers=auth(analyst)).status_code == 200
        body = {"query": query}
        r = walk("POST", f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json=body)
        assert r.status_code == 200
        keyed = {**auth(analyst), "Idempotency-Key": f"k-{oid}"}
        for _ in range(2):  # the second one is a replay
            r = walk("POST", f"/v1/objects/{oid}/queries", headers=keyed, json=body)
            assert r.status_code == 201, r.text
        while (
            walk("POST", f"/v1/objects/{oid}/queries", headers=auth(analyst), json=body)
        ).status_code == 201:
            pass
        assert walk("GET", f"/v1/objects/{oid}/queries", headers=auth(analyst)).status_code == 200
        for tail in ("/odometer", "/odometer/history"):
            assert walk("GET", f"/v1/objects/{oid}{tail}", headers=auth(viewer)).status_code == 200
    assert walk("GET", "/v1/odometers", headers=auth(viewer)).status_code == 200
    assert walk("GET", "/metrics").status_code == 200
    assert walk("GET", "/dashboard/").status_code == 200
    assert walk("GET", "/v1/whoami", headers=auth(viewer)).status_code == 200

    # bad requests carrying the sentinels
    as_admin, as_analyst, as_viewer = auth(ADMIN_KEY), auth(analyst), auth(viewer)
    new = {"id": unique_id("bad"), "domain": FINITE_DOMAIN, "budget": {"epsilon": 1}}
    wrong_type = {**new, "value": {"x": 2, "code": FINITE_SENTINEL}}
    out_of_domain = {**new, "value": {"x": 9, "code": int(FINITE_SENTINEL)}}
    unknown_field = {**new, "value": {"x": 2}, FINITE_SENTINEL: 1}
    broken = '{"id": "a", "value": {"code": ' + FINITE_SENTINEL
    bad_intercept = {"query": {**LOGISTIC, "intercept": CONT_SENTINEL}}
    extra_value = {"query": GRR, "value": FINITE_SENTINEL}
    bad_output = {
        "domain": CONT_DOMAIN,
        "history": [{"query": LOGISTIC, "output": CONT_SENTINEL}],
    }
    bad_epsilon = {"query": {**GRR, "epsilon": FINITE_SENTINEL}}
    keyed = {**as_analyst, "Idempotency-Key": CONT_SENTINEL}
    bad: list[tuple[str, str, dict[str, str], dict[str, Any], int]] = [
        ("POST", "/v1/objects", as_admin, {"json": wrong_type}, 422),
        ("POST", "/v1/objects", as_admin, {"json": out_of_domain}, 422),
        ("POST", "/v1/objects", as_admin, {"json": unknown_field}, 422),
        ("POST", "/v1/objects", as_admin, {"content": broken}, 400),
        ("POST", "/v1/objects", as_admin, {"content": FINITE_SENTINEL * 400}, 413),
        ("POST", f"/v1/objects/{cont}/dry-run", as_analyst, {"json": bad_intercept}, 422),
        ("POST", f"/v1/objects/{finite}/dry-run", as_analyst, {"json": extra_value}, 422),
        ("POST", f"/v1/objects/{finite}/queries", keyed, {"json": bad_epsilon}, 422),
        ("POST", "/v1/loss", as_analyst, {"json": bad_output}, 422),
        ("GET", f"/v1/odometers?remaining_lt={FINITE_SENTINEL}x", as_viewer, {}, 422),
        ("GET", f"/v1/objects/{FINITE_SENTINEL}/odometer", as_viewer, {}, 404),
        ("GET", f"/v1/{CONT_SENTINEL}", as_viewer, {}, 404),
        ("GET", "/v1/whoami", auth(f"gk_{FINITE_SENTINEL}"), {}, 401),
    ]
    for method, url, headers, kwargs, status in bad:
        r = walk(method, url, headers=headers, **kwargs)
        assert r.status_code == status, (url, r.status_code, r.text)


@pytest.mark.slow
def test_no_private_value_reaches_the_logs(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        analyst = new_key(http, "analyst")
        viewer = new_key(http, "viewer")
        walk = Walk(http)
        walk_through(walk, analyst, viewer)
    server.stop()  # every process has flushed and exited
    text = server.log_path.read_text(errors="replace")
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    logged_ids = {line.get("request_id") for line in lines}
    assert set(walk.ids) <= logged_ids  # the capture holds every request of the walk
    assert any(line["level"] == "DEBUG" for line in lines)
    for sentinel in SENTINELS:
        hits = [line for line in text.splitlines() if sentinel in line]
        assert hits == [], f"{sentinel} logged: {hits[:3]}"


def test_the_formatter_drops_bodies_and_exception_messages() -> None:
    """Extras outside the allow-list and exception texts never reach the JSON line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.log_privacy")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError(f"bad value {FINITE_SENTINEL}")
        except ValueError:
            logger.exception(
                "failed",
                extra={"body": {"value": FINITE_SENTINEL}, "method": "POST", "status": 500},
            )
        logger.warning("plain", extra={"json": FINITE_SENTINEL, "value": FINITE_SENTINEL})
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert FINITE_SENTINEL not in out
    first = json.loads(out.splitlines()[0])
    assert first["error"] == "ValueError"
    assert first["method"] == "POST"
    assert first["status"] == 500
    assert "body" not in first
    second = json.loads(out.splitlines()[1])
    assert set(second) == {"time", "level", "logger", "message"}

"""No private value ever leaves the service: responses, headers and log lines (in-process).

Objects are registered with sentinel values that appear nowhere else — a real attribute of
``0.73182649517`` and an integer attribute of ``-4817263`` inside ``[-4999999, 4999999]`` (the
values of a finite domain are public, listed in the domain, so the sentinels sit in continuous
domains). Then every endpoint is called with every credential (admin, analyst, viewer, an
invalid key, no key), including the error paths: bad bodies, validation failures on the value
field (that carry the sentinels back to the service), 404s, 409s, 422 idempotency replays,
dry-runs, submits, odometers, audit, dashboard, metrics, ``whoami`` and the loss calculator.

Every response body and header is captured, and every log record of the run: through
``caplog`` (message, arguments, exception and traceback, as any handler could print them) and
through the app's own structured handler (:func:`app.logs.configure`) writing to a captured
stream. No rendering of either sentinel (decimal, scientific, grouped, hex, rounded to fewer
digits, float32) may appear in any of them; the capture is checked to hold every request.

``tests/service/test_log_privacy.py`` does the same for the logs of a multi-process server.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import sys
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app import logs
from app.api.routes.dashboard import assets
from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import credentials

REAL = 0.73182649517
INT = -4817263  # integers: at most 10**7 values, so a negative one


def renderings() -> set[str]:
    """Ways the sentinels could be written: decimal, scientific, grouped, hex, rounded, float32.

    Every one has at least seven significant digits (the integer keeps its minus sign), so a
    random hit in ids, timestamps or loss figures is practically impossible.
    """
    real, whole = REAL, INT
    return {
        repr(real),
        str(real)[2:],  # the digits alone
        f"{real:.10f}",
        f"{real:.9f}",
        f"{real:.8f}"[2:],
        f"{real:e}",
        f"{real:.10e}",
        f"{real:E}",
        repr(float(np.float32(real))),
        real.hex(),
        str(Fraction(repr(real))),
        str(whole),
        f"{whole:,}",
        f"{whole:_}",
        repr(float(whole)),
        f"{float(whole):e}",
        f"{float(whole):.10e}",
        f"{whole:#x}",
        f"{whole:#X}",
        json.dumps(whole),
    }


SENTINELS = sorted(renderings())
CONT_DOMAIN = {
    "attributes": [
        {"name": "r", "type": "real", "low": 0, "high": 1},
        {"name": "n", "type": "integer", "low": -4_999_999, "high": 4_999_999},
        {"name": "c", "type": "categorical", "values": ["p", "q"]},
    ]
}
VALUE = {"r": REAL, "n": INT, "c": "q"}
LOGISTIC = {"mechanism": "logistic", "weights": {"r": 2.0}, "intercept": -1.0, "epsilon": 0.4}
LINEAR = {
    "mechanism": "linear",
    "weights": {"n": 1e-7},
    "intercept": 0.5,
    "range": [0, 1],
    "truncate": True,
    "epsilon": 0.5,
}
LOGISTIC_N = {
    "mechanism": "logistic",
    "weights": {"r": -1.5, "n": 2e-7},
    "intercept": 0.2,
    "epsilon": 0.3,
}
#: continuous domains answer linear and logistic queries; others are 422 "unsupported"
GRR = {"mechanism": "grr", "attribute": "c", "epsilon": 0.7}
QUERIES = [LOGISTIC, LOGISTIC_N]


class Recorder:
    """Sends requests and keeps every response (status line, headers, body)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.responses: list[httpx.Response] = []
        self.request_ids: list[str] = []

    def __call__(self, method: str, url: str, key: str | None, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if key is not None:
            headers.update(auth(key))
        rid = f"secrecy-{secrets.token_hex(6)}"
        headers["X-Request-ID"] = rid
        self.request_ids.append(rid)
        response = self.client.request(method, url, headers=headers, **kwargs)
        response.read()
        self.responses.append(response)
        return response

    def text(self) -> str:
        """Every captured response as text: status, headers and body."""
        parts = []
        for r in self.responses:
            parts.append(f"{r.status_code} {r.request.method} {r.request.url}")
            parts.extend(f"{k}: {v}" for k, v in r.headers.multi_items())
            parts.append(r.content.decode("utf-8", errors="replace"))
        return "\n".join(parts)


@pytest.fixture
def structured_log() -> Iterator[io.StringIO]:
    """The app's JSON log handler (:func:`app.logs.configure`, DEBUG) writing to a buffer."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    saved_uvicorn = {
        name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate)
        for name in ("uvicorn", "uvicorn.error")
    }
    access_disabled = logging.getLogger("uvicorn.access").disabled
    stream = io.StringIO()
    real_stderr = sys.stderr
    sys.stderr = stream  # configure() binds its handler to sys.stderr as it is now
    try:
        logs.configure("DEBUG")
    finally:
        sys.stderr = real_stderr
    root.handlers.extend(h for h in saved[0] if h not in root.handlers)  # keep caplog's
    yield stream
    root.handlers[:], _ = saved
    root.setLevel(saved[1])
    for name, (handlers, propagate) in saved_uvicorn.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate
    logging.getLogger("uvicorn.access").disabled = access_disabled


def record_text(record: logging.LogRecord) -> str:
    """Everything a handler could print of ``record``: message, args, exception, traceback."""
    plain = logging.Formatter("%(name)s %(levelname)s %(message)s")
    text = [plain.format(record), repr(record.args), repr(record.msg)]
    if record.exc_info and record.exc_info[1] is not None:
        text.append(repr(record.exc_info[1]))
        text.append(plain.formatException(record.exc_info))
    for key, value in vars(record).items():
        if key not in logging.LogRecord("", 0, "", 0, "", None, None).__dict__:
            text.append(f"{key}={value!r}")  # extra= fields
    return "\n".join(text)


def exercise(call: Recorder, keys: dict[str, str | None]) -> None:
    """Every endpoint with every credential, errors included (statuses are not the point)."""
    admin, analyst, viewer = keys["admin"], keys["analyst"], keys["viewer"]
    oid, spent, retired = unique_id("secret"), unique_id("secret"), unique_id("secret")
    # ``spent`` uses basic composition, so that it runs out after two queries (409)
    for object_id, budget in ((oid, 50.0), (spent, 0.9), (retired, 5.0)):
        body = {
            "id": object_id,
            "domain": CONT_DOMAIN,
            "value": VALUE,
            "budget": {"epsilon": budget},
            "filter": "basic" if object_id == spent else "bayesian",
        }
        r = call("POST", "/v1/objects", admin, json=body)
        assert r.status_code == 201, r.text
    assert call("DELETE", f"/v1/objects/{retired}", admin).status_code == 200
    missing = unique_id("missing")
    bad_values: list[Any] = [
        {**VALUE, "r": 1 + REAL},  # out of the domain
        {**VALUE, "r": -REAL},
        {**VALUE, "n": INT * 10},
        {**VALUE, "n": INT - 10**7},
        {**VALUE, "n": INT + 0.5},  # not an integer
        {**VALUE, "r": repr(REAL)},  # wrong type
        {**VALUE, "n": str(INT)},
        {**VALUE, "c": repr(REAL)},  # not a category
        {"r": REAL, "n": INT},  # missing attribute
        {**VALUE, "extra": INT},  # unknown attribute
        [REAL, INT],
        REAL,
        str(INT),
    ]
    for who, key in keys.items():
        # registration: good, duplicate, invalid values, broken JSON
        body = {"id": unique_id("secret"), "domain": CONT_DOMAIN, "value": VALUE}
        call("POST", "/v1/objects", key, json={**body, "budget": {"epsilon": 1}})
        call("POST", "/v1/objects", key, json={**body, "id": oid, "budget": {"epsilon": 1}})
        for value in bad_values:
            wrong = {**body, "id": unique_id("bad"), "value": value, "budget": {"epsilon": 1}}
            r = call("POST", "/v1/objects", key, json=wrong)
            if who == "admin":
                assert r.status_code == 422, (value, r.text)
        call("POST", "/v1/objects", key, content=f'{{"value": {{"r": {REAL}, "n": {INT}')
        call("POST", "/v1/objects", key, content=f'{{"value": {{"r": {REAL}}}, "id": 1}}')
        # reading objects
        for object_id in (oid, spent, retired, missing):
            call("GET", f"/v1/objects/{object_id}", key)
            call("GET", f"/v1/objects/{object_id}/queries", key)
            call("GET", f"/v1/objects/{object_id}/odometer", key)
            call("GET", f"/v1/objects/{object_id}/odometer/history", key)
        # dry-runs and submits: accepted, retried, replayed with another body, rejected
        for n, query in enumerate(QUERIES):
            for object_id in (oid, spent, retired, missing):
                call("POST", f"/v1/objects/{object_id}/dry-run", key, json={"query": query})
                idem = {"Idempotency-Key": f"{who}-{n}-{object_id}"}
                path = f"/v1/objects/{object_id}/queries"
                call("POST", path, key, headers=idem, json={"query": query})
                call("POST", path, key, headers=idem, json={"query": query})
                other = QUERIES[(n + 1) % len(QUERIES)]
                call("POST", path, key, headers=idem, json={"query": other})
        bad_queries: list[Any] = [
            {"query": {**LOGISTIC, "weights": {"r": "x"}}},
            {"query": {**LINEAR, "truncate": False, "weights": {"n": 1.0}}},  # leaves the range
            {"query": {**GRR, "attribute": "r"}},
            {"query": GRR},
            {"query": LOGISTIC, "value": VALUE},
            {"query": None},
            [],
        ]
        for bad in bad_queries:
            call("POST", f"/v1/objects/{oid}/dry-run", key, json=bad)
            call("POST", f"/v1/objects/{oid}/queries", key, json=bad)
        call("POST", f"/v1/objects/{oid}/dry-run", key, content=b"{not json")
        call("POST", f"/v1/objects/{oid}/queries", key, content=b"")
        # the rest of the API
        call("GET", "/v1/odometers", key)
        call("GET", "/v1/odometers", key, params={"remaining_lt": 1, "include_retired": True})
        call("GET", "/v1/odometers", key, params={"remaining_gt": "x"})
        call("GET", "/v1/audit", key)
        call("GET", "/v1/audit", key, params={"object_id": oid, "limit": 1000})
        call("GET", "/v1/audit", key, params={"kind": "nonsense"})
        history = [{"query": LOGISTIC, "output": 1}, {"query": LINEAR, "output": 0}]
        loss = {"domain": CONT_DOMAIN, "history": history, "budget": 2, "candidate": LOGISTIC_N}
        call("POST", "/v1/loss", key, json=loss)
        call("POST", "/v1/loss", key, json={**loss, "history": [{"query": GRR, "output": "z"}]})
        call("GET", "/v1/whoami", key)
        call("POST", "/v1/keys", key, json={"role": "viewer", "label": "secrecy"})
        call("POST", "/v1/keys", key, json={"role": "root"})
        call("DELETE", "/v1/keys/2147483647", key)
        call("DELETE", f"/v1/objects/{missing}", key)
        for url in (
            "/healthz",
            "/readyz",
            "/metrics",
            "/dashboard",
            "/dashboard/",
            "/openapi.json",
        ):
            call("GET", url, key, follow_redirects=False)
        for name in sorted(assets()):
            call("GET", f"/dashboard/{name}", key)
        call("GET", "/dashboard/nothing.js", key)
        call("GET", "/v1/nothing", key)
    # exhaust the small object: 409 budget-exhausted with the loss and the worst case after
    statuses = [
        call("POST", f"/v1/objects/{spent}/queries", analyst, json={"query": LOGISTIC}).status_code
        for _ in range(6)
    ]
    assert 409 in statuses, statuses
    assert viewer is not None


@pytest.fixture(scope="module")
def keys(client: TestClient) -> dict[str, str | None]:
    """A key per role, a revoked and an invalid key, and no key."""
    return credentials(client)


def test_sentinels_are_distinctive() -> None:
    """The renderings are what the test looks for, and none is part of a public field."""
    assert "0.73182649517" in SENTINELS
    assert "-4817263" in SENTINELS
    assert "-4,817,263" in SENTINELS
    public = json.dumps([CONT_DOMAIN, QUERIES, ADMIN_KEY])
    assert not [s for s in SENTINELS if s in public]


@pytest.mark.slow
def test_no_sentinel_in_any_response_header_or_log_line(
    client: TestClient,
    keys: dict[str, str | None],
    caplog: pytest.LogCaptureFixture,
    structured_log: io.StringIO,
) -> None:
    """Every endpoint × credential × error path: zero hits of any rendering of the values."""
    caplog.set_level(logging.DEBUG)
    call = Recorder(client)
    exercise(call, keys)

    responses = call.text()
    records = [record_text(record) for record in caplog.records]
    structured = structured_log.getvalue()
    # the capture works: every request and its access line is in it
    assert len(call.responses) > 500
    statuses = {r.status_code for r in call.responses}
    assert {200, 201, 308, 400, 401, 403, 404, 409, 422} <= statuses, statuses
    lines = [json.loads(line) for line in structured.splitlines()]
    assert set(call.request_ids) <= {line.get("request_id") for line in lines}
    assert len(caplog.records) >= len(call.responses)
    for where, text in (
        ("responses", responses),
        ("log records", "\n".join(records)),
        ("structured log", structured),
    ):
        hits = [s for s in SENTINELS if s in text]
        assert hits == [], f"{hits} in {where}: {_context(text, hits[0])}"


def _context(text: str, needle: str) -> str:
    at = text.find(needle)
    return text[max(0, at - 300) : at + 100]


def test_an_unhandled_error_is_diagnosable_and_still_secret(
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    structured_log: io.StringIO,
) -> None:
    """A 500's log line has the error's type, a scrubbed message and the stack frames.

    The failure is a real database error whose statement parameters carry the sentinels (as a
    value, a string and a number): PostgreSQL even quotes the failing row in its ``DETAIL``.
    Before issue #11 (7) the line said only ``"unhandled error: IntegrityError"``.
    """
    from sqlalchemy import text

    from app.services import objects as object_service

    def failing_register(*, engine: Any, **_: Any) -> dict[str, Any]:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO audit_events (at, kind, detail) VALUES (NULL, :kind, :detail)"),
                {"kind": str(INT), "detail": json.dumps({"value": REAL})},
            )
        raise AssertionError("the insert above fails")  # pragma: no cover

    monkeypatch.setattr(object_service, "register_object", failing_register)
    raw = TestClient(client.app, raise_server_exceptions=False)
    r = raw.post("/v1/objects", json={"id": "boom"}, headers=auth(ADMIN_KEY))
    assert r.status_code == 500
    assert r.json()["type"] == "internal-error"
    lines = [json.loads(line) for line in structured_log.getvalue().splitlines()]
    errors = [line for line in lines if line.get("level") == "ERROR"]
    assert len(errors) == 1, lines
    error = errors[0]
    assert error["error"] == "IntegrityError"
    assert error["error_type"] == "sqlalchemy.exc.IntegrityError"
    assert "null" in error["error_message"].lower() or "not" in error["error_message"].lower()
    assert any(
        "test_secrecy.py" in frame and "failing_register" in frame for frame in error["stack"]
    )
    assert any(frame.startswith("app/api/") for frame in error["stack"]), error["stack"]
    structured = structured_log.getvalue()
    hits = [s for s in SENTINELS if s in structured]
    assert hits == [], f"{hits} in structured log: {_context(structured, hits[0])}"
    assert str(INT) not in structured

"""The HTTP layer's per-request work: the access record, and FastAPI's own telemetry left off."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api import middleware
from app.api.middleware import RequestContext
from app.logs import JsonFormatter
from tests.service.conftest import ADMIN_KEY, auth, make_settings
from tests.service.factories import KeptRecords, kept_access_records


@pytest.fixture
def kept() -> Iterator[KeptRecords]:
    with kept_access_records() as handler:
        yield handler


def _serve_once(path: str = "/v1/things/x") -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = type("Route", (), {"path": "/v1/things/{id}"})()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    asyncio.run(RequestContext(app, max_bytes=1000)(scope, receive, send))


def test_the_access_record_is_the_one_access_info_makes(kept: KeptRecords) -> None:
    """The access record is made without looking up the caller's frame, and is the record
    ``access.info("request", extra=...)`` on that line made: same logger, level, message,
    source (file, line, function) and fields, and the same JSON line."""
    _serve_once()
    (record,) = kept.records
    source = open(middleware.__file__, encoding="utf-8").read().splitlines()  # noqa: SIM115
    line = next(n for n, text in enumerate(source, 1) if "sys._getframe().f_lineno" in text)
    assert (record.name, record.levelno, record.getMessage()) == (
        "gatekeeper.access",
        logging.INFO,
        "request",
    )
    assert (record.pathname, record.lineno, record.funcName) == (
        middleware.__file__,
        line,
        "__call__",
    )
    fields = {k: getattr(record, k) for k in ("method", "path", "status")}
    assert fields == {"method": "POST", "path": "/v1/things/{id}", "status": 201}
    assert isinstance(record.duration_ms, float)
    # the same record access.info makes, formatted: the same JSON line but for the time
    made = logging.getLogger("gatekeeper.access").makeRecord(
        "gatekeeper.access",
        logging.INFO,
        middleware.__file__,
        line,
        "request",
        (),
        None,
        "__call__",
        {**fields, "duration_ms": record.duration_ms},
    )
    made.created = record.created
    assert JsonFormatter().format(record) == JsonFormatter().format(made)
    body = json.loads(JsonFormatter().format(record))
    assert set(body) == {"time", "level", "logger", "message", *fields, "duration_ms"}


def test_no_access_record_is_made_when_the_access_logger_is_above_info(kept: KeptRecords) -> None:
    logging.getLogger("gatekeeper.access").setLevel(logging.WARNING)
    _serve_once()
    assert kept.records == []


def test_the_json_line_is_json_dumps_with_str_for_the_rest() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m %s", ("a",), None)
    record.status = 201
    record.path = object()  # not JSON: written as its str, as json.dumps(default=str) did
    text = JsonFormatter().format(record)
    body = json.loads(text)
    assert body["message"] == "m a"
    assert body["status"] == 201
    assert body["path"] == str(record.path)
    assert text == json.dumps(body)


class _TracedProvider:
    """A configured OpenTelemetry provider that refuses to be used."""

    def get_tracer(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("FastAPI traced a request")

    def get_meter(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("FastAPI measured a request")

    def get_logger(self, *args: object, **kwargs: object) -> Any:
        raise AssertionError("FastAPI logged a request")


def test_fastapi_telemetry_stays_off_with_configured_providers(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI's native OpenTelemetry is off: with providers configured globally, no request
    is traced, measured or logged by it (the service's logs scrub what they write; and the
    check of the providers cost every request ≈ 4 µs)."""
    from opentelemetry import _logs, metrics, trace

    provider = _TracedProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: provider)
    monkeypatch.setattr(_logs, "get_logger_provider", lambda: provider)
    with TestClient(create_app_for(database_url)) as client:
        assert client.get("/v1/keys", headers=auth(ADMIN_KEY)).status_code == 200
        assert client.get("/v1/objects/missing", headers=auth(ADMIN_KEY)).status_code == 404


def create_app_for(database_url: str) -> Any:
    from app.bootstrap import create_app

    return create_app(make_settings(database_url))

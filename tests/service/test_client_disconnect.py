"""A client that disconnects before its body is read is not an internal error.

Seen in the fault-injection runs: the request was logged as an unhandled ``ClientDisconnect``
with status 500. It is now a 499 logged at INFO, with no ERROR record.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from tests.service.conftest import ADMIN_KEY, make_settings


def test_disconnect_before_the_body_is_499_not_500(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with TestClient(create_app(make_settings(sqlite_url))) as client:
        app = client.app
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/objects",
            "raw_path": b"/v1/objects",
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"testserver"),
                (b"authorization", f"Bearer {ADMIN_KEY}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", b"1000"),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("testserver", 80),
            "state": {},
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        with caplog.at_level(logging.INFO):
            asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [499]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "closed the connection" in caplog.text

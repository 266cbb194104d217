"""What a newcomer sees at start and in the access log (issue #11, 11).

``gatekeeper serve`` used to print seven ``alembic.runtime.plugins`` INFO lines at every start,
and ``GET /openapi.json`` (and ``/docs``) was logged and counted under the path ``unmatched``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import start_server


def test_serve_starts_without_alembic_plugin_lines_and_logs_documents_by_path(
    tmp_path: Path,
) -> None:
    server = start_server(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'fresh.db'}",
        redis_url=None,
        workers=1,
        GATEKEEPER_ENCRYPTION_KEY_FILE=str(tmp_path / "key"),
        BOUND_PROCESSES="0",
    )
    try:
        for path in ("/openapi.json", "/docs", "/no-such-page"):
            httpx.get(server.url + path, timeout=10)
    finally:
        server.stop()
    lines = [
        json.loads(line)
        for line in server.log_path.read_text().splitlines()
        if line.startswith("{")
    ]
    loggers = {line["logger"] for line in lines}
    assert "alembic.runtime.plugins" not in loggers, loggers
    # the migrations themselves are still announced
    assert any(line["logger"] == "alembic.runtime.migration" for line in lines)
    access = {line["path"]: line["status"] for line in lines if line["logger"].endswith("access")}
    assert access.get("/openapi.json") == 200, access
    assert access.get("/docs") == 200, access
    assert access.get("unmatched") == 404, access


def test_documents_are_counted_under_their_own_path(client: TestClient) -> None:
    assert client.get("/openapi.json").status_code == 200
    text = client.get("/metrics").text
    paths = {
        sample.labels.get("path")
        for family in text_string_to_metric_families(text)
        if family.name == "gatekeeper_request_seconds"
        for sample in family.samples
    }
    assert "/openapi.json" in paths, paths

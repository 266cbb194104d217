"""Every timestamp in every response is RFC 3339 with an offset, on every backend (issue #11, 5).

SQLite returned naive datetimes, so ``created_at`` of the history and ``at`` of the audit log
read ``"2026-11-23T21:28:45.429395"`` there (no zone), ``...+00:00`` on PostgreSQL.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import integer_domain

RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
DOMAIN = integer_domain(3)
BOX = {"attributes": [{"name": "r", "type": "real", "low": 0, "high": 1}]}


def timestamps(node: Any, at: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``at`` / ``*_at`` field of a JSON document, with its path."""
    if isinstance(node, dict):
        for key, child in node.items():
            where = f"{at}.{key}"
            if key == "at" or key.endswith("_at"):
                yield where, child
            else:
                yield from timestamps(child, where)
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from timestamps(child, f"{at}[{i}]")


@pytest.fixture(scope="module")
def documents(client: TestClient) -> dict[str, Any]:
    """One response of every GET that carries a timestamp, after some activity."""
    admin, analyst = auth(ADMIN_KEY), auth(new_key(client, "analyst"))
    finite, box = unique_id("ts"), unique_id("ts")
    for oid, domain, value in ((finite, DOMAIN, {"x": 1}), (box, BOX, {"r": 0.2})):
        body = {"id": oid, "domain": domain, "value": value, "budget": {"epsilon": 2.0}}
        assert client.post("/v1/objects", json=body, headers=admin).status_code == 201
    grr = {"mechanism": "grr", "attribute": "x", "epsilon": 0.5}
    linear = {"mechanism": "linear", "weights": {"r": 1}, "range": [0, 1], "epsilon": 0.5}
    assert client.post(f"/v1/objects/{finite}/queries", json={"query": grr}, headers=analyst)
    assert client.post(f"/v1/objects/{box}/queries", json={"query": linear}, headers=analyst)
    retired = unique_id("ts")
    body = {"id": retired, "domain": DOMAIN, "value": {"x": 0}, "budget": {"epsilon": 1.0}}
    assert client.post("/v1/objects", json=body, headers=admin).status_code == 201
    assert client.delete(f"/v1/objects/{retired}", headers=admin).status_code == 200
    urls = [
        f"/v1/objects/{finite}",
        f"/v1/objects/{retired}",
        f"/v1/objects/{finite}/queries",
        f"/v1/objects/{box}/queries",
        f"/v1/objects/{finite}/odometer",
        f"/v1/objects/{box}/odometer",
        f"/v1/objects/{finite}/odometer/history",
        "/v1/odometers",
        "/v1/audit",
        "/v1/keys",
    ]
    answers = {}
    for url in urls:
        r = client.get(url, headers=admin)
        assert r.status_code == 200, (url, r.text)
        answers[url] = r.json()
    return answers


def test_every_timestamp_has_an_offset(documents: dict[str, Any]) -> None:
    seen = 0
    for url, document in documents.items():
        for where, value in timestamps(document):
            if value is None:
                continue
            seen += 1
            assert isinstance(value, str), (url, where, value)
            assert RFC3339.fullmatch(value), (url, where, value)
            assert datetime.fromisoformat(value).utcoffset() is not None
    # objects (created/updated/retired), history rows, odometers and audit events
    assert seen >= 15


@pytest.mark.parametrize(
    "url_part",
    ["/queries", "/v1/audit", "/odometer", "/v1/odometers", "/odometer/history", "/v1/keys"],
)
def test_each_kind_of_document_carries_timestamps(documents: dict[str, Any], url_part: str) -> None:
    found = [
        value
        for url, document in documents.items()
        if url_part in url
        for _, value in timestamps(document)
        if value is not None
    ]
    assert found, f"no timestamp in any {url_part} answer"

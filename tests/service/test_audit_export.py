"""``GET /v1/audit/export`` and ``gatekeeper audit export``: the audit log as NDJSON.

The export is the log as ``GET /v1/audit`` pages it (same events, same shape, oldest first),
streamed in keyset pages: an export longer than one page is whole and in order, the last line's
id resumes it exactly where it stopped, and ``since`` starts it at a time. Bad input (both starts,
a time that is not RFC 3339 with an offset) is a 422 naming the parameter; only admins may export.
Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.services import audit
from app.store import transaction
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import grr_query, integer_domain, run_cli

NDJSON = "application/x-ndjson"


def export(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/audit/export", params=params, headers=auth(ADMIN_KEY))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(NDJSON)
    text = response.text
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def paged(client: TestClient, after: int) -> list[dict[str, Any]]:
    """Every event after ``after`` through ``GET /v1/audit``'s pages."""
    found: list[dict[str, Any]] = []
    while True:
        response = client.get(
            "/v1/audit", params={"after": after, "limit": 1000}, headers=auth(ADMIN_KEY)
        )
        assert response.status_code == 200, response.text
        body = response.json()
        found.extend(body["events"])
        if body["next_after"] is None:
            return found
        after = body["next_after"]


def last_id(client: TestClient) -> int:
    events = paged(client, 0)
    return int(events[-1]["id"]) if events else 0


def record_many(client: TestClient, count: int, marker: str) -> None:
    """``count`` events written in one transaction through the service's writer."""
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    with transaction(runtime.engine) as conn:
        for n in range(count):
            audit.record(
                conn,
                kind=audit.AuditKind.KEY_CREATED,
                actor_key_id=None,
                object_id=None,
                detail={"marker": marker, "n": n},
            )


def test_the_export_is_the_log_as_its_pages_show_it(client: TestClient) -> None:
    start = last_id(client)
    object_id = unique_id("export")
    registered = client.post(
        "/v1/objects",
        json={
            "id": object_id,
            "domain": integer_domain(9),
            "value": {"x": 7},
            "budget": {"epsilon": 1.0},
            "filter": "basic",
        },
        headers=auth(ADMIN_KEY),
    )
    assert registered.status_code == 201, registered.text
    analyst = new_key(client, "analyst")
    submitted = client.post(
        f"/v1/objects/{object_id}/queries", json={"query": grr_query(0.4)}, headers=auth(analyst)
    )
    assert submitted.status_code == 201, submitted.text

    lines = export(client, after=start)
    assert lines == paged(client, start)
    assert [e["kind"] for e in lines] == ["object.registered", "key.created", "decision.accepted"]
    assert [e["object_id"] for e in lines] == [object_id, None, object_id]
    assert export(client)[-3:] == lines  # no start: the whole log
    assert export(client, after=lines[-1]["id"]) == []  # at the end: nothing, still 200


def test_an_export_of_several_pages_is_whole_and_resumes_from_the_last_line(
    client: TestClient,
) -> None:
    start = last_id(client)
    count = 2 * audit.EXPORT_PAGE + 345  # three keyset pages
    marker = unique_id("pages")
    record_many(client, count, marker)

    lines = export(client, after=start)
    assert [e["detail"] for e in lines] == [{"marker": marker, "n": n} for n in range(count)]
    ids = [e["id"] for e in lines]
    assert ids == sorted(ids)
    assert len(set(ids)) == count
    assert lines == paged(client, start)

    # an export cut after 1,500 lines resumes from its last line's id: the rest, exactly once
    cut = lines[:1500]
    rest = export(client, after=cut[-1]["id"])
    assert cut + rest == lines

    # the CLI writes the same lines (the bytes of the HTTP export)
    done = run_cli(
        "audit", "export", "--after", str(cut[-1]["id"]), database_url=client_url(client)
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == rest
    http = client.get("/v1/audit/export", params={"after": cut[-1]["id"]}, headers=auth(ADMIN_KEY))
    assert done.stdout == http.text


def client_url(client: TestClient) -> str:
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return str(runtime.engine.url.render_as_string(hide_password=False))


def test_since_starts_the_export_at_a_time(client: TestClient) -> None:
    start = last_id(client)
    record_many(client, 3, unique_id("before"))
    middle = last_id(client)
    record_many(client, 4, unique_id("after"))
    later = paged(client, middle)
    assert len(later) == 4
    since = later[0]["at"]  # the first later event's time, as the log shows it (RFC 3339)
    at = datetime.fromisoformat(since)

    lines = export(client, since=since)
    assert all(datetime.fromisoformat(e["at"]) >= at for e in lines)
    expected = [e for e in paged(client, start) if datetime.fromisoformat(e["at"]) >= at]
    assert lines[-len(expected) :] == expected
    assert lines[-4:] == later
    # the same instant written in Z or another offset
    zulu = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert export(client, since=zulu) == lines
    done = run_cli("audit", "export", "--since", zulu, database_url=client_url(client))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == lines


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"after": 0, "since": "2026-11-25T00:00:00Z"}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-11-25T10:00:00"}, "since"),  # no offset: no instant
        ({"since": "2026-11-25"}, "since"),
        ({"since": "2026-13-01T00:00:00Z"}, "since"),  # month 13
        ({"since": "2026-02-30T00:00:00+01:00"}, "since"),
        ({"since": "2026-11-25T00:00:00\x00Z"}, "since"),
        ({"after": -1}, "after"),
        ({"after": 2**31}, "after"),
        ({"after": "x"}, "after"),
    ],
)
def test_bad_input_is_a_422_naming_the_parameter(
    client: TestClient, params: dict[str, Any], field: str
) -> None:
    response = client.get("/v1/audit/export", params=params, headers=auth(ADMIN_KEY))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert field in [e["field"] for e in body["errors"]], body
    assert "yesterday" not in response.text


def test_only_admins_export(client: TestClient) -> None:
    for role in ("viewer", "analyst"):
        response = client.get("/v1/audit/export", headers=auth(new_key(client, role)))
        assert response.status_code == 403, response.text
    assert client.get("/v1/audit/export").status_code == 401


def test_the_cli_refuses_bad_starts(client: TestClient) -> None:
    url = client_url(client)
    done = run_cli("audit", "export", "--since", "yesterday", database_url=url)
    assert done.returncode == 2
    assert "--since" in done.stderr
    assert "RFC 3339" in done.stderr
    both = run_cli(
        "audit", "export", "--after", "1", "--since", "2026-01-01T00:00:00Z", database_url=url
    )
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr

"""The client's retries against a live server that fails: never a second spend.

* A uvicorn worker is SIGKILLed after a submit committed and before it answered
  (``tests/hooks/sitecustomize.py`` does it inside the server, exactly once): the client sees
  the connection drop, sends the submit again with the same Idempotency-Key, and gets the output
  the dead worker stored — one history row, on SQLite and on PostgreSQL.
* With ``RATE_LIMIT_PER_SECOND`` set, a client going faster gets ``429`` with ``Retry-After``:
  it waits at least that long, resends with the same key, and every call succeeds once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from ldp_gatekeeper_client import Client, GrrQuery, RetryPolicy

from tests.client.conftest import ADMIN_KEY, QUICK
from tests.client.test_client_live import DOMAIN
from tests.service.conftest import start_server, unique_id
from tests.service.factories import run_cli

pytestmark = pytest.mark.slow

HOOKS = Path(__file__).parents[1] / "hooks"
QUERY = GrrQuery(attribute="disease", epsilon=0.5)
#: enough patience for uvicorn to start a new worker on a loaded machine
PATIENT = RetryPolicy(backoff=0.2, max_backoff=2.0, max_retries=8)


class Seen:
    """What an httpx client's event hooks saw: each request's path and key, each status."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        self.statuses: list[int] = []
        self.retry_after: list[float] = []

    def request(self, request: httpx.Request) -> None:
        self.requests.append(
            (request.method, request.url.path, request.headers.get("idempotency-key"))
        )

    def response(self, response: httpx.Response) -> None:
        self.statuses.append(response.status_code)
        if "retry-after" in response.headers:
            self.retry_after.append(float(response.headers["retry-after"]))

    def client(self) -> httpx.Client:
        return httpx.Client(
            timeout=60.0, event_hooks={"request": [self.request], "response": [self.response]}
        )

    def submits(self) -> list[str | None]:
        """The Idempotency-Key of every submit sent (retries included)."""
        return [
            k for method, path, k in self.requests if method == "POST" and path.endswith("/queries")
        ]


def test_a_submit_whose_worker_died_after_the_commit_is_retried_into_the_same_output(
    database_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "killed.json"
    paths = [str(HOOKS), *filter(None, [os.environ.get("PYTHONPATH")])]
    server = start_server(
        tmp_path,
        database_url=database_url,
        redis_url=None,
        workers=2,
        BOUND_PROCESSES="0",
        PYTHONPATH=os.pathsep.join(paths),
        GATEKEEPER_TEST_KILL_AFTER_COMMIT=str(marker),
    )
    seen = Seen()
    try:
        with Client(server.url, ADMIN_KEY, retry=QUICK) as admin:
            analyst_key = admin.keys.create("analyst").key
            oid = unique_id("killed")
            admin.objects.register(
                oid, domain=DOMAIN, value={"age": 30, "disease": "flu"}, budget=1.0
            )
        with (
            seen.client() as http,
            Client(server.url, analyst_key, retry=PATIENT, http_client=http) as analyst,
        ):
            result = analyst.objects.submit(oid, QUERY)
            assert marker.exists(), "the hook must have killed the worker that committed"
            history = list(analyst.objects.history(oid))
            odometer = analyst.objects.odometer(oid)
    finally:
        server.stop()
    killed = json.loads(marker.read_text())
    keys = seen.submits()
    assert len(keys) == 2, "the first attempt died with its worker, the retry was answered"
    assert keys[0] is not None
    assert keys[0] == keys[1]
    assert result.replayed, "the retry got the answer the dead worker had stored"
    assert (result.output, result.query_id) == (killed["output"], killed["query_id"])
    assert [(item.query_id, item.output) for item in history] == [
        (killed["query_id"], killed["output"])
    ]
    assert odometer.accepted == 1
    verified = run_cli("verify", database_url=database_url)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_client_over_its_rate_limit_waits_retry_after_and_spends_once(
    sqlite_url: str, tmp_path: Path
) -> None:
    server = start_server(
        tmp_path,
        database_url=sqlite_url,
        redis_url=None,
        workers=1,
        BOUND_PROCESSES="0",
        RATE_LIMIT_PER_SECOND="4",
        RATE_LIMIT_BURST="2",
    )
    seen = Seen()
    try:
        with Client(server.url, ADMIN_KEY, retry=QUICK) as admin:
            analyst_key = admin.keys.create("analyst").key
            oid = unique_id("limited")
            admin.objects.register(
                oid, domain=DOMAIN, value={"age": 30, "disease": "flu"}, budget=10.0
            )
        with (
            seen.client() as http,
            Client(server.url, analyst_key, retry=QUICK, http_client=http) as analyst,
        ):
            started = time.monotonic()
            outputs = []
            for _ in range(3):
                outputs.append(analyst.objects.submit(oid, QUERY).output)
                analyst.objects.odometer(oid)
            history = list(analyst.objects.history(oid))
            elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert seen.statuses.count(429) >= 2, seen.statuses
    assert elapsed >= sum(seen.retry_after), "each retry waited at least its Retry-After"
    keys = seen.submits()
    assert len(set(keys)) == 3, "one key per logical submit, reused by its retries"
    assert [item.output for item in history] == outputs, "three submits, three rows"

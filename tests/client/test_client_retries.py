"""The client's retry policy, idempotency keys and typed errors, on scripted HTTP answers.

The answers come from :class:`httpx.MockTransport` (no server: each test scripts the statuses
and connection failures it needs, which a live server cannot produce on demand). The same
behaviour against a live server — a worker killed between commit and answer, a real 429 — is
in ``test_client_faults.py``.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from ldp_gatekeeper_client import (
    AsyncClient,
    BudgetExhausted,
    Client,
    ConnectionFailed,
    Forbidden,
    GrrQuery,
    IdempotencyKeyReused,
    InvalidCohort,
    NotFound,
    ObjectRetired,
    RateLimited,
    RetryPolicy,
    ServerBusy,
    ServerError,
    Unauthorized,
    ValidationFailed,
)
from ldp_gatekeeper_client._ops import ndjson_batches
from ldp_gatekeeper_client.errors import error_from_response, retry_after_seconds

FAST = RetryPolicy(backoff=0.001, max_backoff=0.004)
QUERY = GrrQuery(attribute="disease", epsilon=0.5)
ODOMETER = {
    "budget": 1.0,
    "realized_loss": {"lower": 0.5, "upper": 0.5},
    "remaining": 0.5,
    "basic_composition": 0.5,
    "accepted": 1,
    "rejected": 0,
    "updated_at": "2026-11-24T10:00:00+00:00",
    "version": 1,
}
SUBMITTED = {
    "query_id": 7,
    "object_id": "p-1",
    "seq": 1,
    "version": 1,
    "output": "flu",
    "epsilon": 0.5,
    "odometer": ODOMETER,
}
PROBLEM = "application/problem+json"


def problem(status: int, type_: str, headers: dict[str, str] | None = None, **extra: Any) -> Any:
    body = {"type": type_, "title": type_, "status": status, "detail": "d", **extra}
    return httpx.Response(status, json=body, headers={"content-type": PROBLEM, **(headers or {})})


Script = list[Callable[[httpx.Request], httpx.Response]]


class Recorder:
    """A MockTransport handler answering from a script and keeping every request it saw."""

    def __init__(self, script: Script) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.script.pop(0)(request)

    @property
    def keys(self) -> list[str | None]:
        return [r.headers.get("idempotency-key") for r in self.requests]

    @property
    def bodies(self) -> list[bytes]:
        return [r.content for r in self.requests]


def answer(response: httpx.Response) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: response


def drop(kind: type[httpx.TransportError]) -> Callable[[httpx.Request], httpx.Response]:
    def fail(request: httpx.Request) -> httpx.Response:
        raise kind("scripted failure", request=request)

    return fail


def client_for(recorder: Recorder, retry: RetryPolicy = FAST) -> Client:
    http = httpx.Client(transport=httpx.MockTransport(recorder))
    return Client("http://gatekeeper.test", "secret-key", retry=retry, http_client=http)


# ------------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("retry", range(6))
def test_backoff_is_exponential_with_equal_jitter(retry: int) -> None:
    policy = RetryPolicy(backoff=0.5, max_backoff=8.0, max_retries=10)
    ceiling = min(8.0, 0.5 * 2**retry)
    delays = [policy.delay(retry, None) for _ in range(200)]
    assert all(d is not None and ceiling / 2 <= d <= ceiling for d in delays)
    assert len(set(delays)) > 100, "jittered: clients failing together come back apart"


def test_retry_after_is_honoured_with_jitter_and_a_long_one_is_not_waited_for() -> None:
    policy = RetryPolicy(backoff=0.1, max_retry_after=30.0)
    delays = [policy.delay(0, 3.0) for _ in range(100)]
    assert all(d is not None and 3.0 <= d <= 3.6 for d in delays)
    assert policy.delay(0, 31.0) is None
    assert policy.delay(policy.max_retries, 1.0) is None
    assert policy.delay(policy.max_retries - 1, None) is not None


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    def header(value: str) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": value})

    assert retry_after_seconds(header("2")) == 2.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25.0 < (retry_after_seconds(header(later)) or 0.0) <= 30.0
    assert retry_after_seconds(header("soon")) is None
    assert retry_after_seconds(httpx.Response(429)) is None


# ----------------------------------------------------------------------- idempotency keys
def test_a_submit_retried_after_503_and_a_dropped_connection_reuses_its_key_and_body() -> None:
    recorder = Recorder(
        [
            answer(problem(503, "busy", {"Retry-After": "0"})),
            drop(httpx.RemoteProtocolError),  # sent, then the server vanished: ambiguous
            drop(httpx.ReadTimeout),
            answer(httpx.Response(201, json=SUBMITTED, headers={"Idempotent-Replayed": "true"})),
        ]
    )
    with client_for(recorder) as gk:
        result = gk.objects.submit("p-1", QUERY)
    assert result.output == "flu"
    assert result.replayed
    assert len(recorder.requests) == 4
    assert len(set(recorder.keys)) == 1
    assert recorder.keys[0] is not None
    assert len(set(recorder.bodies)) == 1
    assert json.loads(recorder.bodies[0]) == {
        "query": {"mechanism": "grr", "attribute": "disease", "epsilon": 0.5}
    }
    assert recorder.requests[0].headers["authorization"] == "Bearer secret-key"
    assert recorder.requests[0].url.path == "/v1/objects/p-1/queries"


def test_two_logical_submits_send_two_keys_and_a_given_key_is_sent_as_is() -> None:
    created = answer(httpx.Response(201, json=SUBMITTED))
    recorder = Recorder([created, created, created])
    with client_for(recorder) as gk:
        gk.objects.submit("p-1", QUERY)
        first = gk.objects.submit("p-1", QUERY)
        gk.objects.submit("p-1", QUERY, idempotency_key="mine-1")
    assert not first.replayed
    assert recorder.keys[0] != recorder.keys[1]
    assert recorder.keys[2] == "mine-1"
    with pytest.raises(ValueError, match="Idempotency-Key"):
        client_for(Recorder([])).objects.submit("p-1", QUERY, idempotency_key=" ")


def test_imports_and_surveys_carry_one_key_across_retries() -> None:
    survey = {
        "id": 3,
        "name": "s",
        "status": "queued",
        "query": {},
        "cohort": {},
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "progress": {
            "total": 2,
            "decided": 0,
            "accepted": 0,
            "refused": {"budget-exhausted": 0, "invalid-for-domain": 0, "retired": 0},
        },
        "groups": 0,
        "estimate": None,
        "waiting_for_workers": False,
    }
    recorder = Recorder(
        [
            drop(httpx.WriteError),
            answer(httpx.Response(200, json={"created": 2, "existing": 0})),
            answer(problem(500, "internal-error")),
            answer(httpx.Response(202, json=survey)),
        ]
    )
    with client_for(recorder) as gk:
        imported = gk.objects.import_objects([{"id": "a"}, {"id": "b"}])
        run = gk.surveys.create("s", QUERY, labels={"study": "x"})
    assert (imported.created, imported.existing) == (2, 0)
    assert run.id == 3
    assert run.view.progress.refused.budget_exhausted == 0
    assert recorder.keys[0] == recorder.keys[1] != recorder.keys[2] == recorder.keys[3]
    assert recorder.bodies[0] == recorder.bodies[1]
    assert json.loads(recorder.bodies[2])["cohort"] == {"labels": {"study": "x"}}


def test_a_registration_is_not_resent_once_it_may_have_arrived() -> None:
    recorder = Recorder([drop(httpx.RemoteProtocolError)])
    with client_for(recorder) as gk, pytest.raises(ConnectionFailed):
        gk.objects.register("p-1", domain={"attributes": []}, value={}, budget=1.0)
    assert len(recorder.requests) == 1
    recorder = Recorder([answer(problem(503, "database-unavailable", {"Retry-After": "0"}))])
    with client_for(recorder) as gk, pytest.raises(ServerBusy):
        gk.keys.create("viewer")
    assert len(recorder.requests) == 1


def test_a_registration_is_resent_when_it_certainly_did_not_arrive() -> None:
    view = {
        "id": "p-1",
        "domain": {"attributes": []},
        "budget": {"epsilon": 1.0},
        "filter": "bayesian",
        "finite": True,
        "labels": {},
        "status": "active",
        "created_at": None,
        "retired_at": None,
        "version": 1,
        "odometer": ODOMETER,
    }
    recorder = Recorder(
        [
            drop(httpx.ConnectError),
            answer(problem(429, "rate-limited", {"Retry-After": "0"})),
            answer(httpx.Response(201, json=view)),
        ]
    )
    with client_for(recorder) as gk:
        registered = gk.objects.register("p-1", domain={"attributes": []}, value={}, budget=1.0)
    assert registered.odometer.accepted == 1
    assert len(recorder.requests) == 3


def client_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The client's own log records (in the whole suite, httpx's INFO lines reach caplog too)."""
    return [r for r in caplog.records if r.name.startswith("ldp_gatekeeper_client")]


def test_a_bad_url_is_not_retried_and_retries_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="ldp_gatekeeper_client")
    with Client("ftp://gatekeeper.test", retry=FAST) as gk, pytest.raises(ConnectionFailed) as e:
        gk.health()
    assert isinstance(e.value.__cause__, httpx.UnsupportedProtocol)
    assert client_records(caplog) == []
    recorder = Recorder([drop(httpx.ConnectError), answer(httpx.Response(200, json=ODOMETER))])
    with client_for(recorder) as gk:
        gk.objects.odometer("p-1")
    (message,) = [r.getMessage() for r in client_records(caplog)]
    assert message.startswith("GET /v1/objects/p-1/odometer: ConnectError; retry 1 of 4 in ")


def test_retries_wait_at_least_retry_after_then_give_up_with_the_last_error() -> None:
    slow = RetryPolicy(backoff=0.001, max_backoff=0.001, max_retries=2)
    limited = answer(problem(429, "rate-limited", {"Retry-After": "0.2"}))
    recorder = Recorder([limited, limited, limited])
    started = time.monotonic()
    with client_for(recorder, slow) as gk, pytest.raises(RateLimited) as caught:
        gk.objects.odometer("p-1")
    assert time.monotonic() - started >= 0.4
    assert len(recorder.requests) == 3
    assert caught.value.retry_after == 0.2


def test_errors_that_a_retry_cannot_fix_are_raised_at_once() -> None:
    for status, kind in [(404, "not-found"), (409, "budget-exhausted"), (422, "validation-error")]:
        recorder = Recorder([answer(problem(status, kind))])
        with client_for(recorder) as gk, pytest.raises(Exception, match=kind):
            gk.objects.submit("p-1", QUERY)
        assert len(recorder.requests) == 1


def test_the_async_client_retries_with_the_same_key() -> None:
    recorder = Recorder(
        [drop(httpx.RemoteProtocolError), answer(httpx.Response(201, json=SUBMITTED))]
    )

    async def go() -> Any:
        http = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
        async with AsyncClient("http://gatekeeper.test", "k", retry=FAST, http_client=http) as gk:
            result = await gk.objects.submit("p-1", QUERY)
        await http.aclose()
        return result

    assert asyncio.run(go()).output == "flu"
    assert len(recorder.requests) == 2
    assert recorder.keys[0] == recorder.keys[1] is not None


# ----------------------------------------------------------------------------- typed errors
def test_budget_exhausted_carries_the_bounds_of_every_output() -> None:
    error = error_from_response(
        problem(
            409,
            "budget-exhausted",
            {"Idempotent-Replayed": "true"},
            realized_loss={"lower": 0.5, "upper": 0.5},
            worst_case_after=1.4,
            per_output=[
                {"output": "a", "lower": 1.4, "upper": 1.4},
                {"output": "b", "lower": 0.1, "upper": 0.1},
            ],
        )
    )
    assert isinstance(error, BudgetExhausted)
    assert error.worst_case_after == 1.4
    assert error.realized_loss is not None
    assert error.realized_loss.upper == 0.5
    assert [(o.output, o.upper) for o in error.per_output] == [("a", 1.4), ("b", 0.1)]
    assert error.replayed


def test_validation_errors_name_the_fields() -> None:
    error = error_from_response(
        problem(
            422,
            "validation-error",
            errors=[
                {"field": "query.epsilon", "message": "must be at least 1e-06"},
                {"field": "objects[3].id", "message": "is required"},
            ],
        )
    )
    assert isinstance(error, ValidationFailed)
    assert error.fields == ["query.epsilon", "objects[3].id"]
    cohort = error_from_response(problem(422, "invalid-cohort", unknown_ids=["x", "y"]))
    assert isinstance(cohort, InvalidCohort)
    assert isinstance(cohort, ValidationFailed)
    assert cohort.unknown_ids == ["x", "y"]


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (401, "unauthorized", Unauthorized),
        (403, "forbidden", Forbidden),
        (404, "not-found", NotFound),
        (409, "object-retired", ObjectRetired),
        (422, "idempotency-key-reused", IdempotencyKeyReused),
        (429, "rate-limited", RateLimited),
        (503, "busy", ServerBusy),
        (503, "database-unavailable", ServerBusy),
        (500, "internal-error", ServerError),
    ],
)
def test_each_problem_type_has_its_class(status: int, kind: str, expected: type) -> None:
    error = error_from_response(problem(status, kind, {"X-Request-Id": "r-1"}))
    assert type(error) is expected
    assert (error.status, error.type, error.request_id) == (status, kind, "r-1")


def test_an_answer_without_a_problem_document_is_still_typed() -> None:
    error = error_from_response(httpx.Response(502, text="<html>bad gateway</html>"))
    assert isinstance(error, ServerError)
    assert error.status == 502


# ------------------------------------------------------------------------------------ imports
def test_ndjson_batches_skip_blank_lines_and_number_the_rest() -> None:
    text = b'{"id": "a"}\n\n{"id": "b"}\r\n{"id": "c"}\n  \n{"id": "d"}'
    batches = list(ndjson_batches(io.BytesIO(text), 2))
    assert [(b.first, b.last) for b in batches] == [(1, 3), (4, 6)]
    assert batches[0].content == b'{"id": "a"}\n{"id": "b"}\n'
    assert batches[1].content == b'{"id": "c"}\n{"id": "d"}\n'
    assert sum(b.nbytes for b in batches) == len(text)
    with pytest.raises(ValueError, match="batch_size"):
        list(ndjson_batches(io.BytesIO(text), 10_001))

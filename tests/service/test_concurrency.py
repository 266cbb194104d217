"""Concurrency and idempotency of submits through a real multi-worker server.

A ``gatekeeper serve`` subprocess with 4 uvicorn workers runs on a fresh PostgreSQL database,
once per lock mode:

* ``redis-locks``: ``REDIS_URL`` set, Redis per-object locks on (the production setting);
* ``db-only``: ``REDIS_URL`` set (result cache) but ``REDIS_LOCKS=false``, so only the
  in-process lock of each worker and the database compare-and-set stand between 4 workers.
  (Without ``REDIS_URL`` at all the submit path of a finite object is the same: no Redis lock.)

200 submits with distinct ``Idempotency-Key`` headers are fired at ONE object at the same time
(one ``httpx.AsyncClient`` with 200 connections). With the ``basic`` filter and a budget of
``N x 0.1`` the budget admits exactly N of them (basic composition is summed in exact
rationals, so 37 x 0.1 fits 3.7 exactly): exactly N answers are 201, all others 409
``budget-exhausted`` problem+json, nothing else (a 5xx or a 503 ``busy`` is a failure), and the
stored history, the odometer and ``gatekeeper verify`` agree. With the Bayesian filter the
number accepted depends on the sampled outputs; the test then checks the invariants and replays
the stored history through the engine to check that every accepted query was admissible when it
was accepted and that the final state rejects the query (so no rejection was premature).

The server fixture registers the bootstrap admin key in the database before starting the
workers, so that these tests do not depend on the start-up of several workers on a fresh
database; that start-up has its own test, :func:`test_first_start_of_several_workers`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.session import make_engine
from app.engine.accountant import Accountant
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.mechanisms import parse_query
from app.services.auth import ensure_bootstrap_admin
from tests.service.conftest import (
    ADMIN_KEY,
    POSTGRES_URL,
    Server,
    auth,
    new_key,
    start_server,
    unique_id,
)
from tests.service.factories import integer_domain, run_cli_process

pytestmark = [pytest.mark.slow, pytest.mark.shared_fixtures]

CONCURRENCY = 200
WORKERS = 4
EPSILON = 0.1
N_BASIC = 37  # budget 3.7 = 37 x 0.1 exactly in rationals
REQUEST_TIMEOUT = 120.0  # a submit slower than this is reported as a hang

SMALL_DOMAIN = integer_domain(3)
# A product domain: a binary attribute queried by the Bayesian run, and a categorical one.
PRODUCT_DOMAIN = {
    "attributes": [
        {"name": "s", "type": "integer", "low": 0, "high": 1},
        {"name": "c", "type": "categorical", "values": ["a", "b", "c"]},
    ]
}

LOCK_MODES = ["redis-locks", "db-only"]


def _provision_admin(database_url: str) -> None:
    """Store the bootstrap admin key before the workers start (see the module docstring)."""
    engine = make_engine(database_url)
    try:
        ensure_bootstrap_admin(engine=engine, secret=ADMIN_KEY)
    finally:
        engine.dispose()


@pytest.fixture(scope="module", params=LOCK_MODES)
def server(
    request: pytest.FixtureRequest,
    postgres_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """A 4-worker server on the module's PostgreSQL database, in one lock mode."""
    mode = request.param
    env = {"REDIS_LOCKS": "false"} if mode == "db-only" else {}
    _provision_admin(postgres_url)
    srv = start_server(
        tmp_path_factory.mktemp(mode),
        database_url=postgres_url,
        redis_url=redis_url,
        workers=WORKERS,
        **env,
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def analyst(server: Server) -> str:
    """An analyst key (created through the server, stored in the shared database)."""
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        return new_key(client, "analyst")


def _log_tail(server: Server, chars: int = 3000) -> str:
    return server.log_path.read_text(errors="replace")[-chars:]


def _register(server: Server, body: dict[str, Any]) -> str:
    oid = unique_id("conc")
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json={"id": oid, **body})
    assert r.status_code == 201, r.text
    return oid


async def _fire(
    url: str, path: str, body: dict[str, Any], headers: list[dict[str, str]]
) -> list[httpx.Response | BaseException]:
    """POST ``body`` to ``path`` once per header set, all at the same time."""
    limits = httpx.Limits(max_connections=len(headers) + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(REQUEST_TIMEOUT, connect=30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        tasks = [client.post(path, json=body, headers=h) for h in headers]
        return list(await asyncio.gather(*tasks, return_exceptions=True))


def _concurrent_submits(
    server: Server, oid: str, query: dict[str, Any], analyst: str, keys: list[str]
) -> list[httpx.Response]:
    headers = [{**auth(analyst), "Idempotency-Key": k} for k in keys]
    results = asyncio.run(
        _fire(server.url, f"/v1/objects/{oid}/queries", {"query": query}, headers)
    )
    failures = [repr(r) for r in results if isinstance(r, BaseException)]
    assert not failures, (
        f"{len(failures)} of {len(keys)} requests failed at the transport level (hang or "
        f"dropped connection): {failures[:3]}\nserver log tail:\n{_log_tail(server)}"
    )
    return [r for r in results if isinstance(r, httpx.Response)]


def _describe(responses: list[httpx.Response]) -> str:
    counts = Counter(r.status_code for r in responses)
    odd = [f"{r.status_code} {r.text[:300]}" for r in responses if r.status_code not in (201, 409)]
    return f"status counts {dict(counts)}; unexpected answers (first 3): {odd[:3]}"


def _history(server: Server, oid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after = 0
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        while True:
            r = client.get(
                f"/v1/objects/{oid}/queries",
                params={"limit": 1000, "after": after},
                headers=auth(ADMIN_KEY),
            )
            assert r.status_code == 200, r.text
            page = r.json()
            items.extend(page["items"])
            if page["next_after"] is None:
                return items
            after = page["next_after"]


def _odometer(server: Server, oid: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        r = client.get(f"/v1/objects/{oid}/odometer", headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _dry_run(server: Server, oid: str, query: dict[str, Any], analyst: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        r = client.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": query})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _verify(database_url: str) -> None:
    # a subprocess: its timeout fails a hung verify instead of stalling the suite (this slow
    # test runs for minutes; the interpreter's start is nothing next to that)
    done = run_cli_process("verify", database_url=database_url, timeout=300, REDIS_URL="")
    assert done.returncode == 0, f"gatekeeper verify failed:\n{done.stdout}\n{done.stderr}"
    assert "ok" in done.stdout, done.stdout


def _check_outcome(
    server: Server,
    oid: str,
    responses: list[httpx.Response],
    accepted_expected: int | None,
) -> tuple[list[httpx.Response], list[dict[str, Any]]]:
    """Status codes, problem bodies, history and odometer of one burst; returns (201s, history)."""
    detail = _describe(responses) + f"\nserver log tail:\n{_log_tail(server)}"
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {201, 409}, detail  # no 5xx, no 503 busy, no 422
    created = [r for r in responses if r.status_code == 201]
    rejected = [r for r in responses if r.status_code == 409]
    if accepted_expected is not None:
        assert len(created) == accepted_expected, detail
    assert len(created) + len(rejected) == CONCURRENCY
    for r in rejected:
        assert r.headers["content-type"].startswith("application/problem+json"), r.headers
        problem = r.json()
        assert problem["type"] == "budget-exhausted", problem
        assert problem["status"] == 409

    n = len(created)
    history = _history(server, oid)
    assert [item["seq"] for item in history] == list(range(1, n + 1)), (
        "stored sequence numbers are not 1..N"
    )
    # every 201 is in the stored history with the same output (no lost or phantom outputs)
    answered = {r.json()["query_id"]: (r.json()["seq"], r.json()["output"]) for r in created}
    stored = {item["query_id"]: (item["seq"], item["output"]) for item in history}
    assert answered == stored
    odometer = _odometer(server, oid)
    assert odometer["accepted"] == n
    assert odometer["rejected"] == CONCURRENCY - n
    assert odometer["realized_loss"]["upper"] <= odometer["budget"]
    return created, history


def test_exactly_n_accepted_basic(
    server: Server, analyst: str, postgres_url: str, record_property: Any
) -> None:
    """200 concurrent distinct submits, basic filter, budget 37 x 0.1: exactly 37 accepted."""
    oid = _register(
        server,
        {
            "domain": SMALL_DOMAIN,
            "value": {"x": 2},
            "budget": {"epsilon": N_BASIC * EPSILON},
            "filter": "basic",
        },
    )
    query = {"mechanism": "grr", "attribute": "x", "epsilon": EPSILON}
    keys = [f"{oid}-{i}" for i in range(CONCURRENCY)]
    started = time.perf_counter()
    responses = _concurrent_submits(server, oid, query, analyst, keys)
    record_property("burst_seconds", round(time.perf_counter() - started, 3))

    _, history = _check_outcome(server, oid, responses, N_BASIC)
    odometer = _odometer(server, oid)
    assert odometer["basic_composition"] == pytest.approx(N_BASIC * EPSILON, abs=1e-12)
    assert all(item["epsilon"] == EPSILON for item in history)
    assert _dry_run(server, oid, query, analyst)["decision"] == "reject"
    _verify(postgres_url)


def test_bayesian_invariants(
    server: Server, analyst: str, postgres_url: str, record_property: Any
) -> None:
    """200 concurrent submits, Bayesian filter: every decision is the filter's on the stored order.

    ``grr`` with ε = 0.25 on the binary attribute ``s`` and a budget of 2.0: basic composition
    certifies the first 8; after that the realized loss is 0.25 x |#1 - #0| of the outputs so
    far (a random walk) and the filter accepts while the worst output keeps it within 2.0.
    """
    budget, eps = 2.0, 0.25
    oid = _register(
        server,
        {
            "domain": PRODUCT_DOMAIN,
            "value": {"s": 1, "c": "b"},
            "budget": {"epsilon": budget},
            "filter": "bayesian",
        },
    )
    query = {"mechanism": "grr", "attribute": "s", "epsilon": eps}
    keys = [f"{oid}-{i}" for i in range(CONCURRENCY)]
    started = time.perf_counter()
    responses = _concurrent_submits(server, oid, query, analyst, keys)
    record_property("burst_seconds", round(time.perf_counter() - started, 3))

    created, history = _check_outcome(server, oid, responses, None)
    n = len(created)
    record_property("bayesian_accepted", n)
    assert n >= round(budget / eps)  # basic composition alone certifies 8
    for item in history:
        assert item["realized_loss_after"]["upper"] <= budget

    # Replay the stored order through the engine: each accepted query was admissible then.
    domain = parse_domain(PRODUCT_DOMAIN, "domain")
    accountant = Accountant(domain, budget, FilterKind.BAYESIAN)
    for item in history:
        mech = parse_query(item["query"], domain, "query")
        decision = accountant.dry_run(mech)
        assert decision.accepted, f"query {item['seq']} was accepted but {decision.reason}"
        accountant.record(mech, mech.parse_output(item["output"], "output"))
        assert accountant.loss().upper == pytest.approx(
            item["realized_loss_after"]["upper"], abs=1e-9
        )
    final = accountant.dry_run(parse_query(query, domain, "query"))
    if n < CONCURRENCY:
        # identical queries: once one is rejected no later one can be accepted, so the state
        # after the last acceptance must reject it (otherwise a rejection was premature)
        assert not final.accepted
        assert _dry_run(server, oid, query, analyst)["decision"] == "reject"
    _verify(postgres_url)


def test_idempotency_key_concurrent_and_replayed(
    server: Server, analyst: str, postgres_url: str
) -> None:
    """One key 20 times at once, then 20 times more: one stored query, one output."""
    oid = _register(
        server,
        {
            "domain": SMALL_DOMAIN,
            "value": {"x": 1},
            "budget": {"epsilon": 100.0},
            "filter": "bayesian",
        },
    )
    query = {"mechanism": "grr", "attribute": "x", "epsilon": 1.0}
    key = f"{oid}-the-key"
    headers = [{**auth(analyst), "Idempotency-Key": key} for _ in range(20)]
    path = f"/v1/objects/{oid}/queries"
    first = asyncio.run(_fire(server.url, path, {"query": query}, headers))
    failures = [repr(r) for r in first if isinstance(r, BaseException)]
    assert not failures, f"{failures[:3]}\nserver log tail:\n{_log_tail(server)}"
    responses = [r for r in first if isinstance(r, httpx.Response)]
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
        for h in headers:
            responses.append(client.post(path, json={"query": query}, headers=h))

    assert len(responses) == 40
    detail = _describe(responses) + f"\nserver log tail:\n{_log_tail(server)}"
    assert all(r.status_code == 201 for r in responses), detail
    bodies = [r.json() for r in responses]
    assert len({b["query_id"] for b in bodies}) == 1, bodies
    assert len({json.dumps(b["output"]) for b in bodies}) == 1, bodies
    assert all(b == bodies[0] for b in bodies)  # the stored response, replayed verbatim
    replayed = [r.headers.get("idempotent-replayed") for r in responses]
    assert replayed.count("true") == 39, replayed
    assert replayed.count(None) == 1, replayed
    # the original (non-replayed) answer came from the concurrent burst
    assert None in replayed[:20]

    history = _history(server, oid)
    assert len(history) == 1
    assert history[0]["query_id"] == bodies[0]["query_id"]
    assert history[0]["output"] == bodies[0]["output"]
    odometer = _odometer(server, oid)
    assert odometer["accepted"] == 1
    assert odometer["rejected"] == 0
    _verify(postgres_url)


def test_server_log_has_no_errors(server: Server) -> None:
    """The server logged no unhandled error or traceback during this lock mode's tests."""
    text = Path(server.log_path).read_text(errors="replace")
    assert "Traceback" not in text, _log_tail(server)
    assert "unhandled error" not in text, _log_tail(server)


@contextmanager
def _fresh_database(template: str) -> Iterator[str]:
    """A new, migrated PostgreSQL database, dropped after: like the ``postgres_url`` fixture, a
    copy of the test process's migrated ``template`` (what the migration wrote: the schema and
    ``alembic_version``, no key, no object), without migrating again at each attempt."""
    import psycopg

    admin = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    name = "gk_test_" + secrets.token_hex(6)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        url = admin.rsplit("/", 1)[0] + "/" + name
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


STARTUP_ATTEMPTS = 3


def test_first_start_of_several_workers(
    _postgres_template: str,  # noqa: PT019 - its value is used: the template's name
    redis_url: str,
    tmp_path: Path,
) -> None:
    """``gatekeeper serve --workers 4`` with a bootstrap admin key on a fresh database starts.

    Every worker runs ``ensure_bootstrap_admin`` in its lifespan at the same moment; all four
    must start (a worker whose start-up fails makes uvicorn stop the whole server a few seconds
    later). A race, so the start is tried on up to three fresh databases.
    """
    for attempt in range(STARTUP_ATTEMPTS):
        with _fresh_database(_postgres_template) as url:
            folder = tmp_path / f"start{attempt}"
            folder.mkdir()
            srv = start_server(folder, database_url=url, redis_url=redis_url, workers=WORKERS)
            try:
                deadline = time.monotonic() + 90.0
                while time.monotonic() < deadline:
                    text = srv.log_path.read_text(errors="replace")
                    failed = "Application startup failed" in text or srv.process.poll() is not None
                    if failed or text.count("Application startup complete") >= WORKERS:
                        break
                    time.sleep(0.2)
                text = srv.log_path.read_text(errors="replace")
                failed_start = "Application startup failed" in text
                assert not failed_start, (
                    f"attempt {attempt + 1}: a worker failed to start on a fresh database "
                    f"(uvicorn then stops the server):\n{_startup_error(text)}"
                )
                assert text.count("Application startup complete") == WORKERS, text[-3000:]
                assert srv.process.poll() is None, text[-3000:]
            finally:
                srv.stop()


def _startup_error(log_text: str) -> str:
    for line in log_text.splitlines():
        if '"level": "ERROR"' in line:
            try:
                message = str(json.loads(line)["message"])
            except (ValueError, KeyError):
                return line[-1500:]
            return message[-1500:]
    return log_text[-1500:]

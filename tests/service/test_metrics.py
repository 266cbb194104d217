"""``/metrics`` in one process: every family is exported and moves with what it counts.

The process's registry is shared by every test of the process, so each check compares a scrape
before and after the action it counts. Across several workers: ``test_metrics_multiprocess.py``.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.bootstrap import create_app
from app.services.errors import Busy
from app.services.locks import ObjectLocks
from app.settings import Settings
from app.worker.pool import BoundWorker, WorkerSettings
from tests.service import factories
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import grr_query, integer_domain

Sample = tuple[str, tuple[tuple[str, str], ...]]
DOMAIN = integer_domain(3)
GRR = grr_query(0.3)
FAMILIES = {
    "gatekeeper_decisions": "counter",
    "gatekeeper_request_seconds": "histogram",
    "gatekeeper_requests_in_progress": "gauge",
    "gatekeeper_web_workers": "gauge",
    "gatekeeper_bound_cache": "counter",
    "gatekeeper_bound_seconds": "histogram",
    "gatekeeper_bound_fallbacks": "counter",
    "gatekeeper_lock_wait_seconds": "histogram",
    "gatekeeper_objects": "gauge",
    "gatekeeper_objects_near_exhaustion": "gauge",
}


def scrape(client: TestClient) -> dict[Sample, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    return parse(r.text)


def parse(text: str) -> dict[Sample, float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def analyst(client: TestClient) -> str:
    return new_key(client, "analyst")


def register(client: TestClient, budget: float) -> str:
    return factories.register(
        client, domain=DOMAIN, value={"x": 1}, budget=budget, prefix="metrics"
    )


def test_every_family_is_exported_with_its_type(client: TestClient) -> None:
    client.get("/healthz")
    r = client.get("/metrics")
    types = {f.name: f.type for f in text_string_to_metric_families(r.text)}
    for name, kind in FAMILIES.items():
        assert types.get(name) == kind, (name, types.get(name))


def test_submits_move_decisions_lock_waits_and_accountant_time(
    client: TestClient, analyst: str
) -> None:
    oid = register(client, budget=1.0)
    before = scrape(client)
    accepted = rejected = 0
    while not rejected:
        r = client.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": GRR})
        assert r.status_code in (201, 409), r.text
        accepted += r.status_code == 201
        rejected += r.status_code == 409
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("gatekeeper_decisions_total", filter="bayesian", outcome="accept") == accepted
    assert moved("gatekeeper_decisions_total", filter="bayesian", outcome="reject") == 1
    assert moved("gatekeeper_lock_wait_seconds_count", result="acquired") == accepted + 1
    assert moved("gatekeeper_lock_wait_seconds_sum", result="acquired") > 0
    # the accountant evaluates every rejected candidate and records every accepted output
    assert moved("gatekeeper_bound_seconds_count", engine="accountant") >= accepted + 1
    path = "/v1/objects/{object_id}/queries"
    assert moved("gatekeeper_request_seconds_count", method="POST", path=path, status="201") == (
        accepted
    )
    assert moved("gatekeeper_request_seconds_count", method="POST", path=path, status="409") == 1


def test_the_calculator_moves_cache_and_calculator_time(client: TestClient, analyst: str) -> None:
    # a request no other test sends (the budget makes its cache key unique)
    body = {
        "domain": DOMAIN,
        "history": [{"query": GRR, "output": 1}],
        "budget": 1 + secrets.randbelow(10**9) / 10**9,
        "candidate": GRR,
    }
    before = scrape(client)
    assert client.post("/v1/loss", headers=auth(analyst), json=body).status_code == 200
    middle = scrape(client)
    assert client.post("/v1/loss", headers=auth(analyst), json=body).status_code == 200
    after = scrape(client)
    assert (
        value(middle, "gatekeeper_bound_cache_total", result="miss")
        - value(before, "gatekeeper_bound_cache_total", result="miss")
        == 1
    )
    assert (
        value(middle, "gatekeeper_bound_seconds_count", engine="calculator")
        - value(before, "gatekeeper_bound_seconds_count", engine="calculator")
        == 1
    )
    assert (
        value(after, "gatekeeper_bound_cache_total", result="hit")
        - value(middle, "gatekeeper_bound_cache_total", result="hit")
        == 1
    )
    assert value(after, "gatekeeper_bound_seconds_count", engine="calculator") == value(
        middle, "gatekeeper_bound_seconds_count", engine="calculator"
    )


def test_object_gauges_are_read_from_the_database(client: TestClient, analyst: str) -> None:
    before = scrape(client)
    # grr's realized loss is a whole multiple of its ε (0.3): with a budget of 0.95 the filter
    # stops at 0.9, remaining 0.05 < 0.095. With a budget of 1.0 it also stops at 0.9, and the
    # remaining 0.1 is exactly the threshold (the gauge compares in NUMERIC, so not "near"):
    # the test failed whenever three equal outputs came first.
    spent = register(client, budget=0.95)
    register(client, budget=1.0)
    while (
        client.post(
            f"/v1/objects/{spent}/queries", headers=auth(analyst), json={"query": GRR}
        ).status_code
        == 201
    ):
        pass
    remaining = client.get(f"/v1/objects/{spent}/odometer", headers=auth(analyst)).json()
    assert remaining["remaining"] < 0.1  # the filter stopped within 10% of the budget
    middle = scrape(client)
    assert (
        value(middle, "gatekeeper_objects", status="active")
        - value(before, "gatekeeper_objects", status="active")
        == 2
    )
    assert (
        value(middle, "gatekeeper_objects_near_exhaustion")
        - value(before, "gatekeeper_objects_near_exhaustion")
        == 1
    )
    assert client.delete(f"/v1/objects/{spent}", headers=auth(ADMIN_KEY)).status_code == 200
    after = scrape(client)
    assert (
        value(after, "gatekeeper_objects", status="retired")
        - value(middle, "gatekeeper_objects", status="retired")
        == 1
    )
    # a retired object is not "near exhaustion": it answers nothing any more
    assert value(after, "gatekeeper_objects_near_exhaustion") == value(
        before, "gatekeeper_objects_near_exhaustion"
    )


def test_paths_are_route_templates_so_ids_never_become_labels(client: TestClient) -> None:
    oid = "never-a-label-" + secrets.token_hex(8)
    viewer = new_key(client, "viewer")
    assert client.get(f"/v1/objects/{oid}/odometer", headers=auth(viewer)).status_code == 404
    assert client.get(f"/no/such/{oid}").status_code == 404
    r = client.get("/metrics")
    assert oid not in r.text
    samples = parse(r.text)
    template = "/v1/objects/{object_id}/odometer"
    assert (
        value(
            samples, "gatekeeper_request_seconds_count", method="GET", path=template, status="404"
        )
        >= 1
    )
    assert (
        value(
            samples,
            "gatekeeper_request_seconds_count",
            method="GET",
            path="unmatched",
            status="404",
        )
        >= 1
    )


def test_in_progress_counts_the_scrape_itself_and_one_worker_serves(client: TestClient) -> None:
    samples = scrape(client)
    assert value(samples, "gatekeeper_requests_in_progress") == 1
    assert value(samples, "gatekeeper_web_workers") == 1


def test_a_busy_lock_is_observed_as_busy(client: TestClient) -> None:
    locks = ObjectLocks(None, wait=0.05)
    oid = unique_id("lock")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with locks.hold(oid):
            held.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    before = scrape(client)
    with pytest.raises(Busy), locks.hold(oid):
        pass
    release.set()
    holder.join()
    after = scrape(client)
    busy = "gatekeeper_lock_wait_seconds_count"
    assert value(after, busy, result="busy") - value(before, busy, result="busy") == 1
    waited = value(after, "gatekeeper_lock_wait_seconds_sum", result="busy") - value(
        before, "gatekeeper_lock_wait_seconds_sum", result="busy"
    )
    assert waited >= 0.05


def test_a_fallback_is_counted(client: TestClient) -> None:
    before = scrape(client)
    # the deadline (4 * 0.01 + 0 s) passes while the fresh worker process is still starting
    with BoundWorker(WorkerSettings(processes=1, time_limit=0.01, grace=0.0)) as worker:
        answer = worker.compute(
            {"domain": DOMAIN, "history": [{"query": GRR, "output": secrets.randbelow(4)}]}
        )
    assert answer["status"] == "limit"
    after = scrape(client)
    assert (
        value(after, "gatekeeper_bound_fallbacks_total")
        - value(before, "gatekeeper_bound_fallbacks_total")
        == 1
    )


@pytest.fixture
def unmigrated(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}", bound_processes=0)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_without_a_usable_database_the_process_metrics_are_still_served(
    unmigrated: TestClient,
) -> None:
    r = unmigrated.get("/metrics")
    assert r.status_code == 200
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert "gatekeeper_request_seconds" in names
    assert "gatekeeper_objects" not in names
    assert "gatekeeper_objects_near_exhaustion" not in names


def test_a_submits_decision_counter_is_the_metrics_own_child() -> None:
    """The accepted and rejected counters a submit increments are looked up once per (filter,
    outcome) and are the metric's children: each count lands in ``gatekeeper_decisions_total``."""
    from app import metrics
    from app.services.queries import _decisions

    for outcome in ("accept", "reject"):
        child = _decisions("bayesian", outcome)
        assert child is metrics.DECISIONS.labels("bayesian", outcome)
        before = metrics.DECISIONS.labels("bayesian", outcome)._value.get()
        _decisions("bayesian", outcome).inc()
        assert metrics.DECISIONS.labels("bayesian", outcome)._value.get() == before + 1

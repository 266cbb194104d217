"""``/metrics`` of a real ``gatekeeper serve --workers 2``: a scrape shows the sum of the workers.

Requests go out on fresh connections until both workers have served some (each worker's own
counts are read from its files in ``PROMETHEUS_MULTIPROC_DIR``); then every scrape, whichever
worker answers it, must show the total sent. A worker killed with SIGKILL is replaced by uvicorn:
its requests stay counted, and the live-worker gauge forgets it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.service.conftest import Server, start_server
from tests.service.test_metrics import parse, value

HEALTHZ = {"method": "GET", "path": "/healthz", "status": "200"}
COUNT = "gatekeeper_request_seconds_count"


def per_process_healthz(directory: Path, scratch: Path) -> dict[int, float]:
    """Each worker's own count of /healthz requests, read from its histogram file alone."""
    counts = {}
    for file in directory.glob("histogram_*.db"):
        pid = int(file.stem.split("_")[1])
        single = scratch / str(pid)
        single.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, single / file.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, str(single))
        counts[pid] = value(parse(generate_latest(registry).decode()), COUNT, **HEALTHZ)
    return counts


def healthz_burst(url: str, n: int) -> None:
    """``n`` requests, each on a new connection, 8 at a time (so both workers accept some)."""

    def one(_: int) -> None:
        with httpx.Client(timeout=10) as fresh:
            assert fresh.get(url + "/healthz").status_code == 200

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(n)))


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with httpx.Client(timeout=10) as fresh:  # a new connection: any worker may answer
        r = fresh.get(url + "/metrics")
    assert r.status_code == 200
    return parse(r.text)


def counted(url: str, sent: int) -> None:
    """Wait until a scrape counts exactly ``sent`` ``/healthz`` requests (at most 10 s).

    The request context counts a request once its answer is sent, so a scrape right after the
    last answer can come before that answer's count; the count must reach ``sent``, and a
    scrape never shows more than was sent.
    """
    deadline = time.monotonic() + 10
    while True:
        seen = value(scrape(url), COUNT, **HEALTHZ)
        assert seen <= sent, f"{seen} requests counted, {sent} sent"
        if seen == sent:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{seen} of {sent} requests counted after 10 s")
        time.sleep(0.05)


def live_workers(directory: Path) -> set[int]:
    return {int(f.stem.split("_")[-1]) for f in directory.glob("gauge_livesum_*.db")}


@pytest.fixture
def server(tmp_path: Path, postgres_url: str) -> Iterator[tuple[Server, Path]]:
    metrics_dir = tmp_path / "metrics"
    running = start_server(
        tmp_path,
        database_url=postgres_url,
        redis_url=None,
        workers=2,
        BOUND_PROCESSES="0",
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
    )
    yield running, metrics_dir
    running.stop()


@pytest.mark.slow
def test_every_scrape_shows_the_sum_over_workers(
    server: tuple[Server, Path], tmp_path: Path
) -> None:
    running, directory = server
    sent = 0
    for _ in range(20):
        healthz_burst(running.url, 40)
        sent += 40
        per_worker = per_process_healthz(directory, tmp_path / f"split{sent}")
        if sum(1 for c in per_worker.values() if c > 0) >= 2:
            break
    else:
        pytest.fail(f"all {sent} requests went to one worker: {per_worker}")
    assert sum(per_worker.values()) == sent
    assert len(live_workers(directory)) == 2
    for _ in range(6):
        samples = scrape(running.url)
        assert value(samples, COUNT, **HEALTHZ) == sent
        assert value(samples, "gatekeeper_web_workers") == 2

    # a worker dies: uvicorn starts another; its counts stay, the live gauge forgets it
    victim = max(per_worker, key=lambda pid: per_worker[pid])
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:  # until a scrape has marked the victim dead and its replacement serves
        workers = value(scrape(running.url), "gatekeeper_web_workers")
        if workers == 2 and victim not in live_workers(directory):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"gauge {workers}, live gauge files of {live_workers(directory)}")
        time.sleep(0.2)
    healthz_burst(running.url, 10)
    sent += 10
    counted(running.url, sent)
    for _ in range(4):
        samples = scrape(running.url)
        assert value(samples, COUNT, **HEALTHZ) == sent
        assert value(samples, "gatekeeper_web_workers") == 2
    assert victim not in live_workers(directory)


@pytest.mark.slow
def test_serve_makes_and_removes_a_private_directory(tmp_path: Path, postgres_url: str) -> None:
    running = start_server(
        tmp_path, database_url=postgres_url, redis_url=None, workers=2, BOUND_PROCESSES="0"
    )
    try:
        found = re.search(
            r"metrics of all workers are summed in (\S+)", running.log_path.read_text()
        )
        assert found, running.log_path.read_text()[-2000:]
        directory = Path(found.group(1))
        assert directory.is_dir()
        healthz_burst(running.url, 4)
        counted(running.url, 4)
        assert list(directory.glob("histogram_*.db"))
    finally:
        running.stop()
    assert not directory.exists()


@pytest.mark.slow
def test_a_given_directory_is_emptied_of_stale_counts(tmp_path: Path, postgres_url: str) -> None:
    directory = tmp_path / "given"
    for name in ("given", "a", "b"):
        (tmp_path / name).mkdir()
    first = start_server(
        tmp_path / "a",
        database_url=postgres_url,
        redis_url=None,
        workers=2,
        BOUND_PROCESSES="0",
        PROMETHEUS_MULTIPROC_DIR=str(directory),
    )
    healthz_burst(first.url, 5)
    first.stop()
    assert list(directory.glob("histogram_*.db"))  # left for inspection, not removed
    second = start_server(
        tmp_path / "b",
        database_url=postgres_url,
        redis_url=None,
        workers=2,
        BOUND_PROCESSES="0",
        PROMETHEUS_MULTIPROC_DIR=str(directory),
    )
    try:
        assert value(scrape(second.url), COUNT, **HEALTHZ) == 0
    finally:
        second.stop()

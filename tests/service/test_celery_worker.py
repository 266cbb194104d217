"""The distributed worker module on real brokers: Redis and RabbitMQ, real ``gatekeeper worker``.

Every test starts its own ``gatekeeper worker`` processes (in their own session, so that a
SIGKILL reaches the whole node as a machine failure would) with a namespace of its own: the
machine's broker is shared with other test runs, and a foreign worker must never take our
tasks. RabbitMQ comes from ``GATEKEEPER_TEST_AMQP_URL`` (default
``amqp://guest:guest@127.0.0.1:5672//``); without it these tests skip, and under ``CI=true``
they fail (like PostgreSQL and Redis in :mod:`tests.service.conftest`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap import celery_settings, create_app, survey_handlers
from app.db.session import make_engine
from app.node import NODE_MODULES
from app.store import reading
from app.store import surveys as survey_store
from app.store.chunks import CHUNKS
from app.worker.celery_app import RANGE_TASK, make_celery
from app.worker.jobs import InProcessJobs
from tests.service.conftest import (
    ADMIN_KEY,
    ROOT,
    _free_port,
    _reachable,
    _unavailable,
    auth,
    make_settings,
    new_key,
    start_server,
    unique_id,
)
from tests.service.factories import driven_survey
from tests.service.test_survey_faults import survey_rows_per_member
from tests.service.test_surveys import GRR, import_study, verify_clean, wait_done

AMQP_URL = os.environ.get("GATEKEEPER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")

#: A continuous calculator request whose search runs until its 1-second time limit.
SLOW_LOSS = {
    "domain": {
        "attributes": [
            {"name": n, "type": "real", "low": 0, "high": 1} for n in ("a", "b", "c", "d")
        ]
    },
    "history": [
        {
            "query": {
                "mechanism": "logistic",
                "weights": {"a": w, "b": -w / 2, "c": 1.5 - w, "d": w / 3},
                "intercept": 0.1 * k,
                "epsilon": 0.7,
            },
            "output": k % 2,
        }
        for k, w in enumerate((0.3, 1.1, -0.8, 2.0, -1.7, 0.9, 1.4, -0.4))
    ],
    "options": {"tolerance": 1e-12, "time_limit": 1.0},
}


@pytest.fixture(scope="module")
def amqp_url() -> str:
    """The machine's RabbitMQ."""
    if not _reachable(AMQP_URL, 5672):
        _unavailable(f"RabbitMQ at {AMQP_URL}", "start it or set GATEKEEPER_TEST_AMQP_URL")
    return AMQP_URL


class Worker:
    """A ``gatekeeper worker`` command (both nodes) in a session of its own."""

    def __init__(self, env: dict[str, str], log_path: Path, concurrency: int = 1) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        full = {**os.environ, **env}
        # JSON tasks: the worker runs as whatever user runs the tests (root here), unforced
        full.pop("C_FORCE_ROOT", None)
        self.process = subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "app.cli", "worker", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL every process of the worker at once: nothing gets to clean up."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def wait_nodes(result_url: str, namespace: str, nodes: int, timeout: float = 60) -> None:
    """Wait until ``nodes`` worker nodes of ``namespace`` have announced themselves."""
    client = redis.Redis.from_url(result_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            found = list(client.scan_iter(match=f"gatekeeper:celery:{namespace}:workers:*"))
            if len(found) >= nodes:
                return
            time.sleep(0.2)
    finally:
        client.close()
    raise AssertionError(f"{nodes} worker nodes of {namespace} did not start")


def _tasks_counted(client: redis.Redis, namespace: str, task: str) -> int:
    return int(client.hget(f"gatekeeper:celery:{namespace}:tasks", task) or 0)


def tasks_run(result_url: str, namespace: str, task: str) -> int:
    """How many ``task`` tasks the workers of ``namespace`` ran (the workers' own count)."""
    client = redis.Redis.from_url(result_url)
    try:
        return _tasks_counted(client, namespace, task)
    finally:
        client.close()


def settled_tasks(result_url: str, namespace: str, task: str, quiet: float = 2.0) -> int:
    """The workers' count of ``task`` once the namespace's survey queue is empty and the count
    has not moved for ``quiet`` seconds (at most 60 s): what they ran of everything queued.

    The queue is every priority list of ``<namespace>.surveys``; a revoked task leaves it too
    (the worker takes it and drops it unrun), so an empty queue and a still count mean that
    nothing queued is left to run.
    """
    client = redis.Redis.from_url(result_url)
    try:
        deadline = time.monotonic() + 60
        count, since = _tasks_counted(client, namespace, task), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = _tasks_counted(client, namespace, task)
            queued = sum(
                int(client.llen(key)) for key in client.scan_iter(match=f"{namespace}.surveys*")
            )
            if now != count or queued:
                count, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return count
        raise AssertionError(f"the {namespace} workers did not settle within 60 s")
    finally:
        client.close()


def drop_namespace(result_url: str, namespace: str) -> None:
    """Remove the Redis keys a test's namespace left (never anyone else's)."""
    client = redis.Redis.from_url(result_url)
    try:
        for pattern in (
            f"gatekeeper:celery:{namespace}:*",
            f"celery-task-meta-{namespace}:*",
            f"{namespace}.*",
            f"_kombu.binding.{namespace}.*",
            f"_kombu.binding_permanent.{namespace}.*",
        ):
            for key in client.scan_iter(match=pattern):
                client.delete(key)
    finally:
        client.close()


def drop_amqp_namespace(url: str, namespace: str) -> None:
    """Delete the queues and exchanges a test's namespace declared on the shared RabbitMQ."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for name in (f"{namespace}.bounds", f"{namespace}.surveys"):
            channel.queue_delete(name)
            channel.exchange_delete(name)


def survey_env(
    database_url: str, broker: str, results: str | None, namespace: str
) -> dict[str, str]:
    """What the server and the workers share (small chunks: many tasks per survey)."""
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": results or "",
        "BROKER_URL": broker,
        "BROKER_NAMESPACE": namespace,
        "SURVEY_CHUNK_SIZE": "4",
        "SURVEY_LEASE_SECONDS": "3",
        "BOUND_TIME_LIMIT": "2",
        "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
    }


def decided_at_least(http: httpx.Client, headers: dict[str, str], survey_id: int, n: int) -> int:
    """Poll the survey until ``n`` members are decided; returns how many were."""
    deadline = time.monotonic() + 60
    decided = 0
    while time.monotonic() < deadline:
        decided = http.get(f"/v1/surveys/{survey_id}", headers=headers).json()["progress"][
            "decided"
        ]
        if decided >= n:
            return int(decided)
        time.sleep(0.01)
    raise AssertionError(f"only {decided} members decided")


def test_without_a_broker_everything_runs_in_process(sqlite_url: str) -> None:
    """No BROKER_URL: the embedded default, no Celery anywhere."""
    with TestClient(create_app(make_settings(sqlite_url))) as client:
        runtime = client.app.state.runtime  # type: ignore[attr-defined]
        assert runtime.celery is None
        assert isinstance(runtime.surveys, InProcessJobs)
        assert client.get("/readyz").json() == {"status": "ok", "database": "ok"}
        assert runtime.surveys.waiting_for_workers() is False  # this process runs surveys


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_a_survey_waits_for_workers_visibly_then_a_root_worker_runs_it_on_postgres(
    tmp_path: Path, postgres_url: str, redis_url: str, broker: str, request: pytest.FixtureRequest
) -> None:
    """A broker and no worker: the survey says waiting_for_workers (GET and list) instead of
    sitting queued with no sign why; a ``gatekeeper worker`` started as this user (root on
    this machine, no C_FORCE_ROOT) then runs it to the end, and the flag clears. On Redis and
    on RabbitMQ (results in Redis)."""
    namespace = "t" + secrets.token_hex(4)
    broker_url = redis_url if broker == "redis" else request.getfixturevalue("amqp_url")
    env = survey_env(postgres_url, broker_url, redis_url, namespace)
    settings = make_settings(
        postgres_url,
        redis_url,
        broker_url=broker_url,
        broker_namespace=namespace,
        survey_chunk_size=4,
    )
    worker = None
    try:
        with TestClient(create_app(settings)) as client:
            analyst = auth(new_key(client, "analyst"))
            study = "wait-" + namespace
            import_study(client, study, 20)
            body = {"name": "waits", "query": GRR, "cohort": {"labels": {"study": study}}}
            created = client.post("/v1/surveys", headers=analyst, json=body)
            assert created.status_code == 202, created.text
            survey_id = created.json()["id"]
            assert created.json()["waiting_for_workers"] is True
            waiting = client.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
            listed = client.get("/v1/surveys", headers=analyst).json()["items"]
            worker = Worker(env, tmp_path / "worker.log")
            wait_nodes(redis_url, namespace, 2)
            done = wait_done(client, analyst, survey_id)
            listed_done = client.get("/v1/surveys", headers=analyst).json()["items"]
            # a continuous dry-run: its search is a typed engine call sent as JSON to the worker
            oid = "wc-" + secrets.token_hex(4)
            domain = {
                "attributes": [
                    {"name": "x", "type": "real", "low": 0, "high": 1},
                    {"name": "y", "type": "real", "low": -1, "high": 1},
                ]
            }
            registered = client.post(
                "/v1/objects",
                headers=auth(ADMIN_KEY),
                json={
                    "id": oid,
                    "domain": domain,
                    "value": {"x": 0.4, "y": 0.1},
                    "budget": {"epsilon": 3},
                },
            )
            assert registered.status_code == 201, registered.text
            query = {"mechanism": "linear", "weights": {"x": 1}, "range": [0, 1], "epsilon": 1}
            submitted = client.post(
                f"/v1/objects/{oid}/queries",
                headers={**analyst, "Idempotency-Key": "w"},
                json={"query": query},
            )
            assert submitted.status_code == 201, submitted.text
            logistic = {"mechanism": "logistic", "weights": {"x": 2, "y": -1}, "epsilon": 1.5}
            dry = client.post(
                f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": logistic}
            )
            calls = tasks_run(redis_url, namespace, "gatekeeper.bounds.call")
            metrics = client.get("/metrics").text
    finally:
        if worker is not None:
            worker.stop()
        drop_namespace(redis_url, namespace)
        if broker == "amqp":
            drop_amqp_namespace(broker_url, namespace)
    assert waiting["status"] == "queued"
    assert waiting["waiting_for_workers"] is True
    assert [s["waiting_for_workers"] for s in listed if s["id"] == survey_id] == [True]
    assert done["status"] == "done", done
    assert done["progress"]["decided"] == 20
    assert done["groups"] == 1  # five chunk tasks met the one group: counted once
    assert done["waiting_for_workers"] is False
    assert [s["waiting_for_workers"] for s in listed_done if s["id"] == survey_id] == [False]
    assert dry.status_code == 200, dry.text
    assert dry.json()["per_output_complete"] is True
    assert calls >= 1, "the dry-run's search ran on the worker"
    assert 'gatekeeper_celery_task_wait_seconds_count{outcome="done",task="call"}' in metrics
    verify_clean(postgres_url)


def test_a_worker_that_cannot_start_exits_non_zero_before_any_heartbeat(
    tmp_path: Path, redis_url: str
) -> None:
    """A broker that refuses connections: ``gatekeeper worker`` exits non-zero within its
    wait, and never announces a node (``/readyz`` counts none)."""
    namespace = "t" + secrets.token_hex(4)
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path}/w.db",
        "REDIS_URL": redis_url,
        "BROKER_URL": "amqp://guest:guest@127.0.0.1:1//",  # nothing listens on port 1
        "BROKER_NAMESPACE": namespace,
        "DATABASE_WAIT_SECONDS": "1",
    }
    env.pop("C_FORCE_ROOT", None)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "worker", "--concurrency", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        client = redis.Redis.from_url(redis_url)
        try:
            beats = list(client.scan_iter(match=f"gatekeeper:celery:{namespace}:workers:*"))
        finally:
            client.close()
    finally:
        drop_namespace(redis_url, namespace)
    assert done.returncode != 0, done.stderr
    assert "unreachable" in done.stderr
    assert beats == []


def imported_by(log: Path) -> Counter[str]:
    """How many processes imported each module, from ``-X importtime`` lines in ``log``."""
    return Counter(
        line.split("|")[2].strip()
        for line in log.read_text().splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    )


@pytest.mark.slow
def test_the_nodes_find_their_modules_imported_by_the_command(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """``gatekeeper worker`` imports :data:`app.node.NODE_MODULES` once before it forks its two
    nodes: in the importtime lines of the command and both nodes none of them, and no ``app``
    module, appears twice (each node importing one itself writes a line each: twice)."""
    namespace = "t" + secrets.token_hex(4)
    env = {
        "DATABASE_URL": sqlite_url,
        "BROKER_URL": redis_url,
        "BROKER_NAMESPACE": namespace,
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    worker = Worker(env, tmp_path / "worker.log")
    try:
        wait_nodes(redis_url, namespace, 2)
    finally:
        worker.stop()
        drop_namespace(redis_url, namespace)
    imported = imported_by(worker.log_path)
    assert imported["app.node"] == 1  # the command's own import: the lines are there
    # (importlib.import_module, the command's preload, writes no line of its own: 0 or 1)
    twice = [
        name
        for name, n in imported.items()
        if n > 1 and (name.startswith("app.") or name in NODE_MODULES)
    ]
    assert twice == []


@pytest.mark.slow
def test_sigkill_of_a_worker_mid_survey_on_rabbitmq(
    tmp_path: Path, postgres_url: str, redis_url: str, amqp_url: str
) -> None:
    """Two workers; one is SIGKILLed (all its processes) mid-survey; the other finishes it.

    RabbitMQ gives the killed node's unacknowledged task back at once (acks_late); the chunk it
    was deciding rolled back with its connection. Every member is queried exactly once.
    """
    namespace = "t" + secrets.token_hex(4)
    env = survey_env(postgres_url, amqp_url, redis_url, namespace)
    workers = [Worker(env, tmp_path / f"worker{i}.log") for i in range(2)]
    server = start_server(
        tmp_path, database_url=postgres_url, redis_url=redis_url, workers=1, **env
    )
    try:
        wait_nodes(redis_url, namespace, 4)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            analyst = auth(new_key(http, "analyst"))
            study = "kill-" + namespace
            ids = import_study(http, study, 400)
            body = {"name": "killed", "query": GRR, "cohort": {"labels": {"study": study}}}
            survey_id = http.post("/v1/surveys", headers=analyst, json=body).json()["id"]
            at_kill = decided_at_least(http, analyst, survey_id, 8)
            workers[0].kill()
            final = wait_done(http, analyst, survey_id)
    finally:
        server.stop()
        for worker in workers:
            worker.stop()
        drop_namespace(redis_url, namespace)
        drop_amqp_namespace(amqp_url, namespace)
    assert at_kill < 400, "the kill must land mid-survey"
    assert final["status"] == "done", final
    assert final["progress"]["decided"] == 400
    rows = survey_rows_per_member(postgres_url, survey_id)
    assert set(rows) == set(ids)
    assert set(rows.values()) == {1}  # at most once, and every member once
    verify_clean(postgres_url)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A ``redis-server`` of this test's own (no persistence), with a function restarting it.

    The machine's Redis is shared by other tests and agents: restarting it would break them,
    so the broker-restart test owns its broker.
    """
    server = shutil.which("redis-server")
    if server is None:
        _unavailable("redis-server", "install Redis (the redis-server binary)")
    assert server is not None
    port = _free_port()
    argv = [server, "--port", str(port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"]
    argv += ["--dir", str(tmp_path)]
    state: dict[str, subprocess.Popen[bytes]] = {}

    def start() -> None:
        state["p"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL)  # noqa: S603
        deadline = time.monotonic() + 10
        while not _reachable(f"redis://127.0.0.1:{port}", port):
            assert time.monotonic() < deadline, "private redis-server did not start"
            time.sleep(0.05)

    def restart() -> None:
        state["p"].kill()  # SIGKILL: every queued and unacknowledged message is lost
        state["p"].wait()
        start()

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", restart
    finally:
        state["p"].kill()
        state["p"].wait()


@pytest.mark.slow
def test_broker_restart_mid_survey_on_redis(
    tmp_path: Path, postgres_url: str, private_redis: tuple[str, Any]
) -> None:
    """The broker (Redis, no persistence) is killed and restarted mid-survey: the tasks it held
    are lost, the survey's lease expires, a web process's sweeper plans the pending members
    again, and the survey completes with every member queried exactly once."""
    url, restart = private_redis
    namespace = "t" + secrets.token_hex(4)
    env = survey_env(postgres_url, url, None, namespace)
    worker = Worker(env, tmp_path / "worker.log")
    server = start_server(tmp_path, database_url=postgres_url, redis_url=None, workers=1, **env)
    try:
        wait_nodes(url, namespace, 2)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            analyst = auth(new_key(http, "analyst"))
            study = "restart-" + namespace
            ids = import_study(http, study, 400)
            body = {"name": "restart", "query": GRR, "cohort": {"labels": {"study": study}}}
            survey_id = http.post("/v1/surveys", headers=analyst, json=body).json()["id"]
            at_restart = decided_at_least(http, analyst, survey_id, 8)
            restart()
            final = wait_done(http, analyst, survey_id)
    finally:
        server.stop()
        worker.stop()
    assert at_restart < 400, "the restart must land mid-survey"
    assert final["status"] == "done", final
    rows = survey_rows_per_member(postgres_url, survey_id)
    assert set(rows) == set(ids)
    assert set(rows.values()) == {1}
    verify_clean(postgres_url)


@pytest.mark.slow
def test_fifty_identical_bound_requests_share_one_computation(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    """50 concurrent identical continuous calculator requests to two web workers: one task."""
    namespace = "t" + secrets.token_hex(4)
    env = {
        "DATABASE_URL": postgres_url,
        "REDIS_URL": redis_url,
        "BROKER_URL": redis_url,
        "BROKER_NAMESPACE": namespace,
        "BOUND_TIME_LIMIT": "2",
    }
    worker = Worker(env, tmp_path / "worker.log", concurrency=2)
    server = start_server(
        tmp_path, database_url=postgres_url, redis_url=redis_url, workers=2, **env
    )
    answers: list[httpx.Response] = []
    # a computation of this run's own: nothing in the shared Redis cache may answer it
    request = {**SLOW_LOSS, "options": {"tolerance": 1e-12 * (1 + secrets.randbelow(10**6))}}
    request["options"]["time_limit"] = 1.0
    try:
        wait_nodes(redis_url, namespace, 2)
        barrier = threading.Barrier(50)

        def ask() -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                barrier.wait()
                answers.append(http.post("/v1/loss", json=request, headers=auth(ADMIN_KEY)))

        threads = [threading.Thread(target=ask) for _ in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ran = tasks_run(redis_url, namespace, "gatekeeper.bounds.calculator")
    finally:
        server.stop()
        worker.stop()
        drop_namespace(redis_url, namespace)
    assert [r.status_code for r in answers] == [200] * 50
    assert len({r.text for r in answers}) == 1  # the same computation's answer
    assert answers[0].json()["basic_composition"] > answers[0].json()["realized_loss"]["upper"]
    assert ran == 1


@pytest.mark.slow
def test_no_live_worker_answers_by_the_deadline_with_a_sound_fallback(
    postgres_url: str, redis_url: str
) -> None:
    """A broker but no worker: continuous requests answer by the deadline with basic
    composition (always sound) instead of hanging; the unrun tasks expire.

    The two requests wait out their deadlines side by side (the loss request on a thread while
    the object is registered and submitted to): each is timed from its own start, as before,
    and the test waits one deadline instead of two."""
    namespace = "t" + secrets.token_hex(4)
    settings = make_settings(
        postgres_url,
        redis_url,
        broker_url=redis_url,
        broker_namespace=namespace,
        bound_time_limit=0.25,
    )
    try:
        with TestClient(create_app(settings)) as client:
            runtime = client.app.state.runtime  # type: ignore[attr-defined]
            deadline = runtime.worker.deadline
            assert client.get("/readyz").json()["workers"] == 0
            # a request of its own: a computation nobody made before (nor cached in Redis)
            request = {**SLOW_LOSS, "options": {"tolerance": 1e-12, "time_limit": 0.9}}

            def timed_loss() -> tuple[httpx.Response, float]:
                started = time.monotonic()
                answer = client.post("/v1/loss", json=request, headers=auth(ADMIN_KEY))
                return answer, time.monotonic() - started

            with ThreadPoolExecutor(1) as thread:
                loss_future = thread.submit(timed_loss)
                oid = "nw-" + secrets.token_hex(4)
                domain = {"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]}
                registered = client.post(
                    "/v1/objects",
                    headers=auth(ADMIN_KEY),
                    json={
                        "id": oid,
                        "domain": domain,
                        "value": {"x": 0.4},
                        "budget": {"epsilon": 3},
                    },
                )
                assert registered.status_code == 201, registered.text
                query = {"mechanism": "linear", "weights": {"x": 1}, "range": [0, 1], "epsilon": 1}
                analyst = auth(new_key(client, "analyst"))
                started = time.monotonic()
                submitted = client.post(
                    f"/v1/objects/{oid}/queries",
                    headers={**analyst, "Idempotency-Key": "a"},
                    json={"query": query},
                )
                submit_seconds = time.monotonic() - started
                loss, loss_seconds = loss_future.result()
            metrics = client.get("/metrics").text
    finally:
        drop_namespace(redis_url, namespace)
    assert loss.status_code == 200, loss.text
    assert loss.json()["status"] == "limit"
    assert loss.json()["realized_loss"]["upper"] >= loss.json()["basic_composition"] - 1e-9
    assert loss_seconds < deadline + 3
    # basic composition certifies the query without a search; its loss is sound either way
    assert submitted.status_code == 201, submitted.text
    assert submitted.json()["odometer"]["realized_loss"]["upper"] <= 1.0 + 1e-9
    assert submit_seconds < deadline + 3
    assert "gatekeeper_bound_fallbacks_total" in metrics
    assert 'gatekeeper_celery_task_wait_seconds_count{outcome="fallback"' in metrics


@pytest.mark.slow
def test_cancel_revokes_the_queued_range_tasks(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    """Cancelling a survey revokes its queued chunks: the worker drops them unrun (its own
    count of range tasks stays below the number planned), and no member is asked after.

    Race-free: how many chunks ran before the revocation reached the worker depends on the
    machine (66 of 100 once, with three test processes on two cores), so the count is read once
    the queue is empty and the worker idle: without the revocation every one of them would
    have run by then (each counts itself, even when it finds the survey cancelled).
    """
    namespace = "t" + secrets.token_hex(4)
    env = survey_env(postgres_url, redis_url, redis_url, namespace)
    worker = Worker(env, tmp_path / "worker.log")
    server = start_server(
        tmp_path, database_url=postgres_url, redis_url=redis_url, workers=1, **env
    )
    try:
        wait_nodes(redis_url, namespace, 2)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            analyst = auth(new_key(http, "analyst"))
            study = "cancel-" + namespace
            import_study(http, study, 400)  # 100 range tasks of 4 members
            body = {"name": "cancel", "query": GRR, "cohort": {"labels": {"study": study}}}
            survey_id = http.post("/v1/surveys", headers=analyst, json=body).json()["id"]
            decided_at_least(http, analyst, survey_id, 8)
            cancelled = http.delete(f"/v1/surveys/{survey_id}", headers=analyst).json()
            at_cancel = tasks_run(redis_url, namespace, "gatekeeper.surveys.chunk")
            ranges = settled_tasks(redis_url, namespace, "gatekeeper.surveys.chunk")
            final = http.get(f"/v1/surveys/{survey_id}", headers=analyst).json()
    finally:
        server.stop()
        worker.stop()
        drop_namespace(redis_url, namespace)
    assert cancelled["status"] == "cancelled"
    assert final["status"] == "cancelled"
    assert final["progress"]["decided"] == cancelled["progress"]["decided"] < 400
    planned = chunks_of(postgres_url, survey_id)
    assert ranges < planned, (
        f"revoked range tasks must not run: {ranges} of {planned} ran ({at_cancel} by the cancel)"
    )
    rows = survey_rows_per_member(postgres_url, survey_id)
    assert set(rows.values()) <= {1}
    assert len(rows) == final["progress"]["accepted"]


def chunks_of(database_url: str, survey_id: int) -> int:
    """How many chunks the survey's members were packed into (one range task planned each)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            query = select(func.count()).select_from(CHUNKS).where(CHUNKS.c.survey_id == survey_id)
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def test_a_group_met_by_two_chunk_tasks_is_counted_once(database_url: str, redis_url: str) -> None:
    """The survey's ``groups`` on the distributed road: a worker's chunk tasks, run in process.

    Twenty fresh members (one decision group) in five chunks, each decided by the worker app's
    chunk task called here (no broker between: :func:`~app.bootstrap.survey_handlers` under
    :func:`~app.worker.celery_app.make_celery`, each call with a run cache of its own): the
    survey counts one group, as threads and child processes count it
    (tests/service/test_survey_children.py) — the chunks' groups are checked against the
    survey's set in the worker's result Redis. Without that ledger the count stands (five).
    """
    studies = [unique_id("cg"), unique_id("cg")]
    with TestClient(create_app(make_settings(database_url))) as client:
        for study in studies:
            import_study(client, study, 20)
    # the app is stopped: its runner takes no survey; these are decided by the handlers
    namespace = "t" + secrets.token_hex(4)
    ledger = make_settings(
        database_url, redis_url, broker_url=redis_url, broker_namespace=namespace
    )
    engine = make_engine(database_url)
    found = []
    try:
        for study, settings in zip(studies, (ledger, make_settings(database_url)), strict=True):
            body = {"name": "counted", "query": GRR, "cohort": {"labels": {"study": study}}}
            survey_id, _ = driven_survey(engine, body, max_members=100, chunk_size=4)
            handlers = survey_handlers(settings)
            planned = handlers.plan(survey_id)
            assert planned is not None
            owner, chunks = planned
            assert len(chunks) == 5
            if settings is ledger:  # the chunk task of a worker's app: its Redis is the ledger
                task = make_celery(celery_settings(ledger), handlers).tasks[RANGE_TASK]
                statuses = [task(survey_id, owner, chunk) for chunk in chunks]
            else:
                statuses = [handlers.run_range(survey_id, owner, chunk, None) for chunk in chunks]
            assert statuses[-1] == "done"
            with reading(engine) as conn:
                survey = survey_store.get_survey(conn, survey_id)
            assert survey is not None
            assert (survey.decided, survey.accepted) == (20, 20)
            found.append(survey.groups)
    finally:
        engine.dispose()
        drop_namespace(redis_url, namespace)
    assert found == [1, 5]


def test_worker_command_needs_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gatekeeper worker`` without BROKER_URL says so and exits 2; settings refuse an amqp
    broker without a Redis for the results."""
    from app.cli import main
    from app.settings import Settings, get_settings

    monkeypatch.delenv("BROKER_URL", raising=False)
    get_settings.cache_clear()
    try:
        assert main(["worker"]) == 2
    finally:
        get_settings.cache_clear()
    with pytest.raises(ValueError, match="REDIS_URL is required"):
        Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    with pytest.raises(ValueError, match="BROKER_URL must be"):
        Settings(broker_url="http://example.org", redis_url="redis://127.0.0.1:6379/0")
    assert Settings(broker_url="redis://127.0.0.1:6379/1").result_url == "redis://127.0.0.1:6379/1"

"""Fixtures for service tests on SQLite, a real PostgreSQL and a real Redis.

PostgreSQL and Redis come from ``GATEKEEPER_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and ``GATEKEEPER_TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379/15``; each xdist process takes its own database, counting down from
that one: ``process_redis_url``). Each test module gets a fresh PostgreSQL database (created from
the admin URL, migrated with Alembic like production, dropped afterwards) and a fresh SQLite
file, so tests never see each other's rows. Each test process migrates one PostgreSQL database
and one SQLite file, and the modules' databases are copies of them (``CREATE DATABASE ...
TEMPLATE``, a file copy): the same migrated schema without migrating again for every module
(``tests/service/test_migrations.py`` migrates fresh databases itself). When a service is
unreachable the tests that need it are skipped with instructions — except under ``CI=true``,
where they fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from app import crypto
from app.bootstrap import create_app
from app.db.migrate import upgrade
from app.settings import DEFAULT_BOUND_TIME_LIMIT, Settings

ADMIN_KEY = "test-admin-" + "k" * 40
POSTGRES_URL = os.environ.get(
    "GATEKEEPER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("GATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
IN_CI = os.environ.get("CI", "").lower() == "true"
ROOT = Path(__file__).resolve().parents[2]


def _unavailable(what: str, how: str) -> None:
    message = f"{what} is not reachable; {how}"
    if IN_CI:
        pytest.fail(f"CI=true requires it: {message}", pytrace=False)
    pytest.skip(message)


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=1.0
        ):
            return True
    except OSError:
        return False


def _admin_url() -> str:
    return POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture(scope="session")
def _postgres_template() -> Iterator[str]:
    """A PostgreSQL database migrated once per test process: the module databases' template.

    ``CREATE DATABASE ... TEMPLATE`` copies it file by file (about 0.05 s) where a migration of
    a new database took 0.3-0.9 s of wall time (PostgreSQL's catalog work included); the copy
    holds exactly what the migration wrote (schema, indexes, ``alembic_version``). Nothing ever
    connects to the template after its migration (PostgreSQL refuses to copy a database in
    use), so it is dropped when the process's tests end.
    """
    if not _reachable(POSTGRES_URL, 5432):
        _unavailable(
            f"PostgreSQL at {POSTGRES_URL}",
            "start it or set GATEKEEPER_TEST_POSTGRES_URL to an admin URL",
        )
    import psycopg

    admin = _admin_url()
    name = "gk_template_" + secrets.token_hex(6)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade(admin.rsplit("/", 1)[0] + "/" + name)  # disposes its engine when done
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def postgres_url(_postgres_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this module (a copy of the migrated template)."""
    import psycopg

    admin = _admin_url()
    name = "gk_test_" + secrets.token_hex(6)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{_postgres_template}"')
    url = admin.rsplit("/", 1)[0] + "/" + name
    yield url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def process_redis_url(url: str, worker: str | None) -> str:
    """The Redis database of one test process: ``url``'s database minus the xdist worker's number.

    The service's keys carry no database name (``gatekeeper:lock:<object>``,
    ``gatekeeper:rate:<key id>:<window>``, the Celery namespaces' sets under
    ``gatekeeper:celery:``), and every module's database numbers its keys and objects alike,
    so two test processes on one Redis database would share locks and rate counters, and one
    module's cleanup would delete the keys of a test still running in another process (it did:
    a held lock vanished, a survey's task ids before its cancel could revoke them). Each
    process therefore gets a database of its own (``gw0`` the URL's, ``gw1`` the one below, …);
    within a process the modules run one after another.

    >>> process_redis_url("redis://127.0.0.1:6379/15", "gw2")
    'redis://127.0.0.1:6379/13'
    >>> process_redis_url("redis://127.0.0.1:6379/15", None)
    'redis://127.0.0.1:6379/15'
    """
    if not worker or not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    db = base - int(worker[2:])
    if db < 0:
        raise pytest.UsageError(
            f"GATEKEEPER_TEST_REDIS_URL's database {base} leaves none for xdist worker {worker}: "
            "each test process takes the database below the previous one's"
        )
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A reachable Redis (database 15 by default, one per test process: ``process_redis_url``);
    the keys the module's tests create are removed."""
    if not _reachable(REDIS_URL, 6379):
        _unavailable(f"Redis at {REDIS_URL}", "start it or set GATEKEEPER_TEST_REDIS_URL")
    import redis

    url = process_redis_url(REDIS_URL, os.environ.get("PYTEST_XDIST_WORKER"))
    client = redis.Redis.from_url(url)
    yield url
    for key in client.scan_iter("gatekeeper:*"):
        client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per test process: the module files are copies of it.

    A copy of the closed file is byte for byte what the migration wrote (the 15 migrations
    rebuild tables in batch mode: 0.15-0.2 s each time quiet, seconds under load). The
    migration's engine is disposed when it ends, which checkpoints and removes the WAL, so the
    main file holds everything; a leftover ``-wal`` would be copied along.
    """
    path = tmp_path_factory.mktemp("template") / "gatekeeper.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory, _sqlite_template: Path) -> str:
    """A fresh, migrated SQLite file for this module (a copy of the migrated template)."""
    path = tmp_path_factory.mktemp("db") / "gatekeeper.db"
    shutil.copyfile(_sqlite_template, path)
    wal = _sqlite_template.with_name(_sqlite_template.name + "-wal")
    if wal.exists():
        shutil.copyfile(wal, path.with_name(path.name + "-wal"))
    return f"sqlite:///{path}"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


def make_settings(database_url: str, redis_url: str | None = None, **extra: Any) -> Settings:
    """Settings for an in-process app."""
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        gatekeeper_bootstrap_admin_key=ADMIN_KEY,
        **{"bound_processes": 0, "bound_time_limit": 5.0, **extra},
    )


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """An in-process client of the app on SQLite or PostgreSQL (bootstrap admin key set)."""
    with TestClient(create_app(make_settings(database_url))) as test_client:
        yield test_client


def auth(key: str) -> dict[str, str]:
    """The Authorization header for ``key``."""
    return {"Authorization": f"Bearer {key}"}


def new_key(client: TestClient | httpx.Client, role: str) -> str:
    """Create a key with ``role`` through the API (as the bootstrap admin)."""
    response = client.post("/v1/keys", json={"role": role}, headers=auth(ADMIN_KEY))
    assert response.status_code == 201, response.text
    return str(response.json()["key"])


def unique_id(prefix: str = "obj") -> str:
    """An object id no other test uses."""
    return f"{prefix}-{secrets.token_hex(6)}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A ``gatekeeper serve`` subprocess (several uvicorn workers) for multi-process tests."""

    def __init__(self, env: dict[str, str], workers: int, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        full_env = {**os.environ, "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, **env}
        self.process = subprocess.Popen(  # noqa: S603 - our own CLI
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready()
        except BaseException:  # not ready (or interrupted): never leave it serving on its own
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 60.0) -> None:
        # one client for every poll: each ``httpx.get`` builds a client and its SSL context,
        # about 26 ms of this process's CPU a poll, 0.4-1.3 s a server start at five polls a
        # second; a kept client's refused poll costs ~0.3 ms (docs/benchmarks.md, "Eighteenth
        # session, h/start"), so polling more often costs nothing and finds the server sooner
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0) as poll:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
                try:
                    if poll.get(self.url + "/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"server not ready: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        """Terminate the server and its workers."""
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class ThreadServer:
    """The app served by uvicorn on a thread of the test process, on a port of its own.

    For tests that need a server on a socket (a client, a generated client, the schemathesis
    command line) but do not test the process itself: no interpreter to start, no app to import
    again, no migration (the fixtures' databases are migrated). Tests of the process — ``serve``'s
    start-up and its log, several workers, signals, kills and restarts — use :class:`Server`.
    ``stop`` asks uvicorn to exit (``should_exit``), as SIGTERM does ``gatekeeper serve``: the
    open requests finish and the app's lifespan shutdown runs. The app configures the process's
    cipher of values at rest (:func:`app.crypto.configure`); ``stop`` puts the previous one back.
    While it serves, an in-process ``run_cli`` would swap that cipher under it
    (``tests/inprocess.py``): a test that runs commands beside it uses ``run_cli_process``.
    """

    def __init__(self, settings: Settings) -> None:
        import uvicorn

        self._saved_cipher = crypto._active
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_config=None
        )
        self._server = uvicorn.Server(config)
        # a daemon: a run interrupted before the fixture's teardown still exits
        self._thread = threading.Thread(
            target=self._server.run, name=f"uvicorn-{self.port}", daemon=True
        )
        self._thread.start()
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("server exited before it started (see the captured log)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server not started")
            time.sleep(0.01)
        ready = httpx.get(self.url + "/readyz", timeout=10.0)
        if ready.status_code != 200:
            self.stop()
            raise RuntimeError(f"server not ready: {ready.status_code} {ready.text}")

    def stop(self) -> None:
        """Let uvicorn finish its open requests and the app's shutdown, then join its thread."""
        self._server.should_exit = True
        self._thread.join(timeout=30)
        crypto._active = self._saved_cipher
        if self._thread.is_alive():
            raise RuntimeError("the server's thread did not stop within 30 s")


def start_thread_server(
    *, database_url: str, redis_url: str | None, **settings: Any
) -> ThreadServer:
    """Serve the app on a thread, with :func:`start_server`'s defaults (admin key, one bound
    process, the default bound time limit); ``settings`` are :class:`Settings` fields."""
    defaults = {"bound_processes": 1, "bound_time_limit": DEFAULT_BOUND_TIME_LIMIT}
    return ThreadServer(make_settings(database_url, redis_url, **{**defaults, **settings}))


def start_server(
    tmp_path: Path, *, database_url: str, redis_url: str | None, workers: int = 4, **env: str
) -> Server:
    """Start a multi-worker server against ``database_url`` (and Redis if given)."""
    settings_env = {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url or "",
        "BOUND_PROCESSES": "1",
        **env,
    }
    return Server(settings_env, workers, tmp_path / "server.log")

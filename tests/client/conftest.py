"""Fixtures of the client's tests: a live server on SQLite and on PostgreSQL.

The database fixtures are those of the service tests (a fresh migrated database per module,
PostgreSQL skipped with a reason when unreachable, failing under ``CI=true``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ldp_gatekeeper_client import Client, RetryPolicy

from tests.service.conftest import (  # noqa: F401 - fixtures shared with the service tests
    ADMIN_KEY,
    Server,
    ThreadServer,
    _postgres_template,
    _sqlite_template,
    database_url,
    postgres_url,
    sqlite_url,
    start_server,
    start_thread_server,
)

#: Retries as the client's default, with shorter waits (the tests' servers answer at once).
QUICK = RetryPolicy(backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def server(database_url: str) -> Iterator[ThreadServer]:  # noqa: F811 - the fixture imported above
    """The app on a socket (uvicorn on a thread of the test process) on the module's database.

    The client's tests test the client against a live server, not the server's process: one
    worker, no bound pool, as ``gatekeeper serve --workers 1`` with ``BOUND_PROCESSES=0`` served
    them before, without starting and importing a second interpreter per module.
    """
    live = start_thread_server(database_url=database_url, redis_url=None, bound_processes=0)
    yield live
    live.stop()


@pytest.fixture
def admin(server: ThreadServer) -> Iterator[Client]:
    """A client with the bootstrap admin key."""
    with Client(server.url, ADMIN_KEY, retry=QUICK) as client:
        yield client

"""Fixtures of the client's tests: a live ``gatekeeper serve`` on SQLite and on PostgreSQL.

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
    _postgres_template,
    _sqlite_template,
    database_url,
    postgres_url,
    sqlite_url,
    start_server,
)

#: Retries as the client's default, with shorter waits (the tests' servers answer at once).
QUICK = RetryPolicy(backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def server(
    database_url: str,  # noqa: F811 - the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """One ``gatekeeper serve`` (one worker) on the module's database."""
    where = tmp_path_factory.mktemp("server")
    live = start_server(
        where, database_url=database_url, redis_url=None, workers=1, BOUND_PROCESSES="0"
    )
    yield live
    live.stop()


@pytest.fixture
def admin(server: Server) -> Iterator[Client]:
    """A client with the bootstrap admin key."""
    with Client(server.url, ADMIN_KEY, retry=QUICK) as client:
        yield client

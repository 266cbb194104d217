"""Factories the service tests share: objects, credentials and the ``gatekeeper`` command.

One way to register an object, one set of credentials per kind and one way to run the CLI on a
database, instead of a copy per test module (issue #12).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.services import surveys as survey_service
from app.services.surveys import SurveyRequest
from tests.inprocess import fresh_process_state, run_main
from tests.service.conftest import ADMIN_KEY, ROOT, auth, new_key, unique_id

#: Credential kinds of the authorization tests (``None`` secret: no Authorization header).
ADMIN, ANALYST, VIEWER = "admin", "analyst", "viewer"
MISSING, INVALID, REVOKED = "missing", "invalid", "revoked"
CREDENTIALS = [ADMIN, ANALYST, VIEWER, MISSING, INVALID, REVOKED]


def register(
    client: TestClient | httpx.Client,
    *,
    domain: Any,
    value: Any,
    budget: Any = 10_000.0,
    filter: str | None = None,
    oid: str | None = None,
    prefix: str = "obj",
) -> str:
    """Register an object as the bootstrap admin (201 asserted); returns its id."""
    object_id = oid or unique_id(prefix)
    body: dict[str, Any] = {
        "id": object_id,
        "domain": domain,
        "value": value,
        "budget": {"epsilon": budget},
    }
    if filter is not None:
        body["filter"] = filter
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 201, r.text
    return object_id


def credentials(client: TestClient | httpx.Client) -> dict[str, str | None]:
    """A secret per credential kind: one key per role, a revoked admin key, an invalid one.

    The revoked key is an admin key, so that only its revocation can refuse it.
    """
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": ADMIN})
    assert r.status_code == 201, r.text
    revoked = str(r.json()["key"])
    assert client.get("/v1/whoami", headers=auth(revoked)).status_code == 200
    revoked_id = r.json()["id"]
    r = client.delete(f"/v1/keys/{revoked_id}", headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    assert r.json() == {"id": revoked_id, "revoked": True}
    return {
        ADMIN: new_key(client, ADMIN),
        ANALYST: new_key(client, ANALYST),
        VIEWER: new_key(client, VIEWER),
        MISSING: None,
        INVALID: "gk_" + secrets.token_urlsafe(32),
        REVOKED: revoked,
    }


# Environment variables of Settings that the tests set explicitly (never inherited).
SETTINGS_ENV = (
    "DATABASE_URL",
    "REDIS_URL",
    "GATEKEEPER_ENV",
    "GATEKEEPER_BOOTSTRAP_ADMIN_KEY",
    "WEB_WORKERS",
    "BOUND_PROCESSES",
)


def _cli_env(database_url: str, bound_processes: str | None, env: dict[str, str]) -> dict[str, str]:
    """The settings a ``run_cli`` command gets: ``DATABASE_URL``, ``BOUND_PROCESSES``, ``env``."""
    given = {"DATABASE_URL": database_url, **env}
    if bound_processes is not None:
        given["BOUND_PROCESSES"] = bound_processes
    return given


def run_cli(
    *args: str,
    database_url: str,
    bound_processes: str | None = "0",
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``gatekeeper ARGS`` with ``DATABASE_URL`` set (and no other inherited setting), in process.

    What :func:`run_cli_process` answers, without a new interpreter's 0.6-0.8 s of CPU: the
    settings, cipher, caches and engines are the command's own and gone afterwards, the
    environment and working directory put back (:func:`tests.inprocess.fresh_process_state`).
    """
    given = _cli_env(database_url, bound_processes, env)
    with fresh_process_state(given, unset=SETTINGS_ENV, cwd=ROOT):
        return run_main(*args)


def run_cli_process(
    *args: str,
    database_url: str,
    bound_processes: str | None = "0",
    timeout: float = 180,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``python -m app.cli ARGS`` as a subprocess, for tests of the process itself.

    The environment is :func:`run_cli`'s: ``DATABASE_URL`` set and no other inherited setting.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    full_env.update({"PYTHONPATH": str(ROOT), **_cli_env(database_url, bound_processes, env)})
    return subprocess.run(  # noqa: S603 - our own CLI, fixed argv
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def integer_domain(high: int = 3, name: str = "x") -> dict[str, Any]:
    """A domain of one integer attribute ``name`` in ``0..high`` (``high + 1`` points)."""
    return {"attributes": [{"name": name, "type": "integer", "low": 0, "high": high}]}


def grr_query(epsilon: float, attribute: str = "x") -> dict[str, Any]:
    """A ``grr`` query on ``attribute``."""
    return {"mechanism": "grr", "attribute": attribute, "epsilon": epsilon}


class KeptRecords(logging.Handler):
    """A log handler that keeps every record it is given (the access line's tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def kept_access_records() -> Iterator[KeptRecords]:
    """The access logger at INFO with a :class:`KeptRecords` handler, both undone on exit."""
    handler = KeptRecords()
    access = logging.getLogger("gatekeeper.access")
    level = access.level
    access.setLevel(logging.INFO)
    access.addHandler(handler)
    try:
        yield handler
    finally:
        access.removeHandler(handler)
        access.setLevel(level)


#: How long :func:`driven_survey` holds the lease for its test (renewed by the test's runs).
DRIVEN_LEASE_SECONDS = 600.0


def driven_survey(
    engine: Engine,
    body: dict[str, Any],
    *,
    max_members: int,
    chunk_size: int,
    owner: str | None = None,
) -> tuple[int, SurveyRequest]:
    """A survey created through the service with no runner: the test decides its chunks.

    ``owner``: the lease is taken under it for :data:`DRIVEN_LEASE_SECONDS`, so that the
    service beside the test (whose sweeper resumes surveys nobody holds, every 10 s) never runs
    it too — on a loaded machine it did, deciding a chunk the test had not asked for. The
    test's own runs renew it under the same owner. Without ``owner`` the survey is queued and
    unheld (a distributed plan claims it at once with an owner of its own).
    Returns its id and the parsed request (its ``query`` starts a run cache).
    """
    request = survey_service.parse_request(body, max_members=max_members)
    view, _ = survey_service.create_survey(
        engine=engine,
        request=request,
        fingerprint="f",
        idempotency_key=None,
        analyst_key_id=None,
        max_members=max_members,
        limits=DEFAULT_LIMITS,
        chunk_size=chunk_size,
    )
    if owner is not None:
        held = survey_runs.claim(
            engine=engine, survey_id=view.id, owner=owner, lease_seconds=DRIVEN_LEASE_SECONDS
        )
        assert held, "the service's sweeper took the survey before the test"
    return view.id, request

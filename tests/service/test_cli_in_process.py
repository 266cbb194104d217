"""``run_cli`` runs ``gatekeeper`` in the test process and leaves nothing of the command behind.

Commands opened for one run do not all dispose their engine (a process exit closes it): in the
test process their PostgreSQL connections would stay open, and a cached ``Settings`` or cipher
would answer the next command with the previous one's configuration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest

from app import crypto
from app.cli import describe_database
from app.services import snapshots
from app.settings import get_settings
from tests.inprocess import fresh_process_state, run_main
from tests.service.factories import SETTINGS_ENV, run_cli, run_cli_process

#: Commands that open the database; ``keys create`` and ``keys list`` never dispose their engine.
OPENING = [
    ["keys", "create", "--role", "viewer"],
    ["keys", "list", "--json"],
    ["verify", "--quiet"],
    ["audit", "export"],
]


def _connections(url: str) -> int:
    """Sessions open on ``url``'s database (the asking one is on the admin database)."""
    admin, name = url.rsplit("/", 1)
    with psycopg.connect(admin + "/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _settled(url: str, expected: int, seconds: float = 10.0) -> int:
    """The count of sessions once it is ``expected`` (a closed session takes a moment to go)."""
    deadline = time.monotonic() + seconds
    while (count := _connections(url)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def test_no_connection_or_engine_outlives_an_in_process_command(postgres_url: str) -> None:
    before = _settled(postgres_url, 0)
    assert before == 0
    for args in OPENING:
        done = run_cli(*args, database_url=postgres_url)
        assert done.returncode == 0, (args, done.stderr)
        assert _settled(postgres_url, before) == before, args
    # what run_cli cleans up is there to clean: the same command, its engines not yet disposed,
    # holds a connection open
    given = {"DATABASE_URL": postgres_url, "BOUND_PROCESSES": "0"}
    with fresh_process_state(given, unset=SETTINGS_ENV) as engines:
        listed = run_main("keys", "list")
        assert listed.returncode == 0, listed.stderr
        assert engines
        assert _connections(postgres_url) > before
    assert _settled(postgres_url, before) == before


def test_settings_of_one_command_do_not_reach_the_next(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings, cipher = get_settings(), crypto.active()
    histories, environ = snapshots.HISTORIES, dict(os.environ)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert run_cli("migrate", database_url=other).returncode == 0

    bad = run_cli("verify", database_url=sqlite_url, GATEKEEPER_ENCRYPTION_KEYS="not-a-key")
    assert bad.returncode == 2, bad.stderr
    assert "an encryption key is not a valid Fernet key" in bad.stderr
    # the next commands read their own settings: their database, the suite's key
    for url in (sqlite_url, other, sqlite_url):
        done = run_cli("verify", "--quiet", database_url=url)
        assert done.returncode == 0, done.stderr
        assert done.stderr == f"gatekeeper: database {describe_database(url)}\n"
    # and this process is as it was: environment, directory, settings, cipher, caches
    assert dict(os.environ) == environ
    assert Path.cwd() == tmp_path
    assert get_settings() == settings
    assert crypto.active() is cipher
    assert snapshots.HISTORIES is histories


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "list", "--json"],
        ["audit", "export"],
        ["keys", "revoke", "2147483000"],
        ["keys", "create", "--role", "viewer", "--project", "nope"],
        ["keys", "create", "--role", "owner"],
    ],
    ids=["keys-list", "audit-export", "revoke-unknown", "unknown-project", "usage-error"],
)
def test_in_process_answers_as_the_subprocess(
    database_url: str, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`run_cli` and :func:`run_cli_process` give the same exit code, output and errors."""
    monkeypatch.setenv("COLUMNS", "80")  # argparse's line width, the same on both sides
    here = run_cli(*args, database_url=database_url)
    there = run_cli_process(*args, database_url=database_url)
    assert (here.returncode, here.stdout, here.stderr) == (
        there.returncode,
        there.stdout,
        there.stderr,
    )
    assert here.stdout or here.stderr

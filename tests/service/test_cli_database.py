"""The commands name their database and refuse one they have not migrated (issue 23, 7).

Run outside the project directory, ``gatekeeper keys``, ``import`` and ``verify`` silently
created ``./data/gatekeeper.db`` there, with a new encryption key, and answered from that empty
database (``verify``: "0 objects: ok"). Now every command that opens a database names it on
standard error (a password masked), ``serve`` and ``migrate`` alone create or upgrade one, and
the others refuse a missing or unmigrated database, saying to run ``gatekeeper migrate``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command

from app.cli import describe_database
from app.db.migrate import alembic_config, head_revision
from tests.inprocess import fresh_process_state, run_main
from tests.service.conftest import ROOT
from tests.service.factories import SETTINGS_ENV, run_cli

#: The commands that read or write the database but never create it.
COMMANDS = [
    ["keys", "list"],
    ["keys", "create", "--role", "admin"],
    ["keys", "revoke", "1"],
    ["verify"],
    ["import", "objects.ndjson"],
    ["encryption", "rotate"],
    ["states", "collect"],
]
IDS = [" ".join(c[:2]) for c in COMMANDS]


#: What a command run here inherits of none: the settings and the keys of the values at rest.
DROPPED = (*SETTINGS_ENV, "GATEKEEPER_ENCRYPTION_KEYS", "GATEKEEPER_ENCRYPTION_KEY_FILE")


def gatekeeper(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The command in ``cwd`` in this process, with no setting inherited (no key: the default).

    As a new ``gatekeeper`` process there would run it (:func:`tests.inprocess.fresh_process_state`:
    the environment, working directory, settings and cipher its own, put back afterwards),
    without its 0.6-0.8 s of CPU; :func:`gatekeeper_process` runs the interpreter, and
    ``test_a_refusal_is_the_same_from_the_console_script`` checks that both answer alike.
    """
    with fresh_process_state(env, unset=DROPPED, cwd=cwd):
        return run_main(*args)


def gatekeeper_process(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The command in ``cwd`` as a new process, with no setting inherited (no key: the default)."""
    full_env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    full_env.update({"PYTHONPATH": str(ROOT), **env})
    return subprocess.run(  # noqa: S603 - our own CLI, fixed argv
        [sys.executable, "-m", "app.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A directory that is not the project's, with an NDJSON file to import."""
    (tmp_path / "objects.ndjson").write_text(
        '{"id": "a", "domain": {"attributes": [{"name": "x", "type": "integer", "low": 0, '
        '"high": 1}]}, "value": {"x": 1}, "budget": {"epsilon": 1}}\n'
    )
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_outside_the_project_a_command_creates_nothing(elsewhere: Path, args: list[str]) -> None:
    done = gatekeeper(*args, cwd=elsewhere)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    expected = elsewhere.resolve() / "data" / "gatekeeper.db"
    assert f"gatekeeper: database sqlite:///{expected}" in done.stderr
    assert "DATABASE_URL" in done.stderr
    assert f"no database at {expected}" in done.stderr
    assert "gatekeeper migrate" in done.stderr
    assert not (elsewhere / "data").exists()  # no database, no folder, no encryption key


@pytest.mark.slow
@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_an_unmigrated_database_is_refused(tmp_path: Path, args: list[str]) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:  # a SQLite file, but not a gatekeeper database
        conn.execute("CREATE TABLE notes (body TEXT)")
    (tmp_path / "objects.ndjson").write_text("{}\n")
    done = gatekeeper(*args, cwd=tmp_path, DATABASE_URL=f"sqlite:///{path}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"database sqlite:///{path.resolve()} has no gatekeeper tables" in done.stderr
    assert "run `gatekeeper migrate`" in done.stderr
    with sqlite3.connect(path) as conn:  # nothing was created in it
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"notes"}
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_a_database_behind_this_version_is_refused_until_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0006")
    done = gatekeeper("verify", cwd=tmp_path, DATABASE_URL=url)
    assert done.returncode == 2
    assert f"is at migration 0006; this version needs {head_revision()}" in done.stderr
    migrated = gatekeeper("migrate", cwd=tmp_path, DATABASE_URL=url)
    assert migrated.returncode == 0, migrated.stderr
    assert f"database at migration {head_revision()}" in migrated.stderr
    done = gatekeeper("verify", cwd=tmp_path, DATABASE_URL=url)
    assert done.returncode == 0, done.stderr
    assert "verified 0 object(s)" in done.stdout


@pytest.mark.slow
def test_migrate_then_the_commands_work_on_the_default_database(elsewhere: Path) -> None:
    # as new processes: the end-to-end path, the console script's own start included
    migrated = gatekeeper_process("migrate", cwd=elsewhere)
    assert migrated.returncode == 0, migrated.stderr
    database = elsewhere.resolve() / "data" / "gatekeeper.db"
    assert f"gatekeeper: database sqlite:///{database}" in migrated.stderr
    assert database.is_file()
    assert (elsewhere / "data" / "encryption.key").is_file()  # as `serve` would create it
    created = gatekeeper_process("keys", "create", "--role", "admin", cwd=elsewhere)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("gk_")
    assert f"gatekeeper: database sqlite:///{database}" in created.stderr
    imported = gatekeeper_process("import", "objects.ndjson", "--jobs", "0", cwd=elsewhere)
    assert imported.returncode == 0, imported.stderr
    verified = gatekeeper_process("verify", cwd=elsewhere)
    assert verified.returncode == 0, verified.stderr
    assert "verified 1 object(s)" in verified.stdout


@pytest.mark.slow
@pytest.mark.parametrize("unmigrated", [False, True], ids=["missing", "unmigrated"])
def test_a_refusal_is_the_same_from_the_console_script(elsewhere: Path, unmigrated: bool) -> None:
    env = {}
    if unmigrated:  # a SQLite file, not a gatekeeper database
        with sqlite3.connect(elsewhere / "other.db") as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
        env["DATABASE_URL"] = f"sqlite:///{elsewhere / 'other.db'}"
    here = gatekeeper("keys", "list", cwd=elsewhere, **env)
    there = gatekeeper_process("keys", "list", cwd=elsewhere, **env)
    assert (here.returncode, here.stdout, here.stderr) == (
        there.returncode,
        there.stdout,
        there.stderr,
    )
    assert here.returncode == 2
    assert not (elsewhere / "data").exists()


@pytest.mark.slow
def test_a_missing_key_file_is_not_created_by_the_other_commands(elsewhere: Path) -> None:
    assert gatekeeper("migrate", cwd=elsewhere).returncode == 0
    key = elsewhere / "data" / "encryption.key"
    key.unlink()
    done = gatekeeper("import", "objects.ndjson", "--jobs", "0", cwd=elsewhere)
    assert done.returncode == 2
    assert f"no file at {key.resolve()}" in done.stderr
    assert not key.exists()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://gk:s3cret-pw@db.internal:5432/gatekeeper",
            "postgresql://gk:***@db.internal:5432/gatekeeper",
        ),
        ("postgresql+psycopg://gk@db/gk", "postgresql+psycopg://gk@db/gk"),
        ("sqlite:////srv/gk/gatekeeper.db", "sqlite:////srv/gk/gatekeeper.db"),
        ("sqlite://", "sqlite://"),
    ],
)
def test_a_named_database_never_shows_its_password(url: str, shown: str) -> None:
    assert describe_database(url) == shown


def test_a_relative_sqlite_path_is_named_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert describe_database("sqlite:///./data/x.db") == f"sqlite:///{tmp_path.resolve()}/data/x.db"


@pytest.mark.slow
def test_the_import_progress_bar_counts_in_integers(sqlite_url: str, tmp_path: Path) -> None:
    """tqdm wrote ``created=1e+4`` for 10,000 objects."""
    path = tmp_path / "many.ndjson"
    domain = '{"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 1}]}'
    path.write_text(
        "".join(
            f'{{"id": "bar-{i:05d}", "domain": {domain}, "value": {{"x": 1}}, '
            '"budget": {"epsilon": 1}}\n'
            for i in range(10_000)
        )
    )
    done = run_cli(
        "import", str(path), "--jobs", "0", "--batch-size", "10000", database_url=sqlite_url
    )
    assert done.returncode == 0, done.stderr
    assert "created=10000, existing=0" in done.stderr
    assert "e+" not in done.stderr


@pytest.mark.slow
def test_a_closed_pipe_stops_the_output_without_a_traceback(
    sqlite_url: str, tmp_path: Path
) -> None:
    """``gatekeeper keys list --json | head`` printed a BrokenPipeError traceback."""
    for _ in range(3):
        created = run_cli("keys", "create", "--role", "viewer", database_url=sqlite_url)
        assert created.returncode == 0, created.stderr
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update({"DATABASE_URL": sqlite_url, "PYTHONPATH": str(ROOT)})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "keys", "list", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=env,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert "BrokenPipeError" not in done.stderr
    assert "Traceback" not in done.stderr
    assert done.returncode == 141

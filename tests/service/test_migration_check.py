"""The commands' migration check reads what Alembic reads, without Alembic (issue 27 item 5).

Every command but ``serve`` and ``migrate`` refuses a database not at this version's schema
(``app.db.migrate.migration_problem``; the refusals themselves: ``test_cli_database.py``).
Importing Alembic for it, and loading every migration script, was about a fifth of a
``gatekeeper keys list``'s CPU; the check now reads the revisions from the scripts' text and
the database's from ``alembic_version``. These tests hold both readings to Alembic's own.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import text

from app.db import migrate
from app.db.migrate import (
    MIGRATIONS,
    Lineage,
    alembic_lineage,
    current_revision,
    head_revision,
    migration_problem,
    read_lineage,
)
from app.db.session import make_engine
from tests.service.conftest import ROOT
from tests.service.factories import SETTINGS_ENV, run_cli

SCRIPT = '''"""{doc}"""

from alembic import op

{lines}


def upgrade() -> None:
    op.execute("SELECT 1")


def downgrade() -> None:
    pass
'''


def _scripts(directory: Path, **scripts: str) -> Path:
    """A script location holding ``versions/NAME.py`` with each of ``scripts``' assignments."""
    (directory / "versions").mkdir(parents=True)
    for name, lines in scripts.items():
        (directory / "versions" / f"{name}.py").write_text(SCRIPT.format(doc=name, lines=lines))
    return directory


def _plain(revision: str, down: str | None, annotated: bool = False) -> str:
    kind = ": str" if annotated else ""
    down_kind = ": str | None" if annotated else ""
    return (
        f"revision{kind} = {revision!r}\ndown_revision{down_kind} = {down!r}\n"
        "branch_labels = None\ndepends_on = None"
    )


def test_the_project_scripts_are_read_without_alembic_as_alembic_reads_them() -> None:
    plain = migrate._plain_lineage(MIGRATIONS)
    assert plain is not None  # the scripts are plain: no command falls back to Alembic
    assert plain == alembic_lineage()
    assert read_lineage() == plain
    assert head_revision() == plain.head
    assert len(plain.known) == len(list((MIGRATIONS / "versions").glob("0*.py")))


def test_plain_scripts_in_either_form_are_read_as_alembic_reads_them(tmp_path: Path) -> None:
    location = _scripts(
        tmp_path,
        a_first=_plain("aaa1", None),
        b_second=_plain("bbb2", "aaa1", annotated=True),
        c_third=_plain("ccc3", "bbb2") + "  # a comment",
    )
    (tmp_path / "versions" / "__init__.py").write_text("revision = 'not a script'\n")
    (tmp_path / "versions" / "notes.txt").write_text("revision = 'not a script'\n")
    expected = Lineage(head="ccc3", known=frozenset({"aaa1", "bbb2", "ccc3"}))
    assert migrate._plain_lineage(location) == expected
    assert alembic_lineage(location) == expected


def test_scripts_not_in_the_plain_form_are_left_to_alembic(tmp_path: Path) -> None:
    # a merge of two branches: a tuple of down revisions, which only Alembic reads
    merged = _scripts(
        tmp_path / "merged",
        a=_plain("aaa1", None),
        b=_plain("bbb2", "aaa1"),
        c=_plain("ccc3", "aaa1"),
        d="revision = 'ddd4'\ndown_revision = ('bbb2', 'ccc3')\n"
        "branch_labels = None\ndepends_on = None",
    )
    assert migrate._plain_lineage(merged) is None
    assert read_lineage(merged) == Lineage(
        head="ddd4", known=frozenset({"aaa1", "bbb2", "ccc3", "ddd4"})
    )
    # two heads: neither reading picks one (Alembic refuses, as it did for every command)
    forked = _scripts(
        tmp_path / "forked",
        a=_plain("aaa1", None),
        b=_plain("bbb2", "aaa1"),
        c=_plain("ccc3", "aaa1"),
    )
    assert migrate._plain_lineage(forked) is None
    with pytest.raises(CommandError):
        read_lineage(forked)
    # a down revision that is no script's, a branch label, a revision written twice, a computed one
    for name, lines in {
        "orphan": _plain("bbb2", "zzz9"),
        "labelled": _plain("aaa1", None).replace("branch_labels = None", "branch_labels = ('x',)"),
        "twice": _plain("aaa1", None) + "\nrevision = 'aaa2'",
        "computed": _plain("aaa1", None).replace("'aaa1'", "'aa' + 'a1'"),
    }.items():
        assert migrate._plain_lineage(_scripts(tmp_path / name, one=lines)) is None, name
    # one chain and, beside it, two scripts that name each other: not one chain
    looped = _scripts(
        tmp_path / "looped",
        a=_plain("aaa1", None),
        b=_plain("bbb2", "ccc3"),
        c=_plain("ccc3", "bbb2"),
    )
    assert migrate._plain_lineage(looped) is None


def test_the_database_revision_is_read_as_alembic_reads_it(
    database_url: str, tmp_path: Path
) -> None:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            alembic_reads = MigrationContext.configure(conn).get_current_revision()
        assert alembic_reads == head_revision()
        assert current_revision(engine) == alembic_reads
        assert migration_problem(engine) is None
    finally:
        engine.dispose()
    # a database with no version table, then an empty one: never migrated, for both readings
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    other = make_engine(f"sqlite:///{path}")
    try:
        assert current_revision(other) is None
        with other.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        with other.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() is None
        assert current_revision(other) is None
        assert migration_problem(other) == "has no gatekeeper tables (it was never migrated)"
    finally:
        other.dispose()


def test_a_database_a_newer_version_migrated_is_refused(database_url: str) -> None:
    engine = make_engine(database_url)
    head = head_revision()
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'ffff9'"))
        assert migration_problem(engine) == (
            "is at migration ffff9, unknown to this version (a newer gatekeeper migrated it)"
        )
        done = run_cli("keys", "list", database_url=database_url)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stdout == ""
        assert "is at migration ffff9, unknown to this version" in done.stderr
        assert "run `gatekeeper migrate`" in done.stderr
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :head"), {"head": head})
        engine.dispose()
    assert run_cli("keys", "list", database_url=database_url).returncode == 0


PROBE = """
import json, sys
from app.cli import main
code = main(["keys", "list"])
print(json.dumps([code, sorted(m for m in sys.modules if m.split(".")[0] in ("alembic", "mako"))]))
"""


def test_a_command_checks_its_database_without_importing_alembic(sqlite_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update({"PYTHONPATH": str(ROOT), "DATABASE_URL": sqlite_url})
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0, done.stderr
    assert loaded == []


MIGRATE_PROBE = """
import json, sys
from app.cli import main
code = main(["migrate"])
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & {"alembic", "mako"})]))
"""


def _migrate_in_a_new_process(url: str, key_file: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update({"PYTHONPATH": str(ROOT), "DATABASE_URL": url})
    env["GATEKEEPER_ENCRYPTION_KEY_FILE"] = str(key_file)
    return subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", MIGRATE_PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_and_migrate_start_alembic_only_for_a_database_not_at_the_newest_migration(
    tmp_path: Path,
) -> None:
    # serve's and migrate's prestart step (app.bootstrap.prepare_database): a fresh database is
    # migrated by Alembic, one at the newest migration is left alone without importing it, and
    # one a newer version migrated still goes to Alembic, which refuses it loudly
    url = f"sqlite:///{tmp_path / 'gatekeeper.db'}"
    key_file = tmp_path / "key"
    fresh = _migrate_in_a_new_process(url, key_file)
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout.strip().splitlines()[-1]) == [0, ["alembic", "mako"]]
    engine = make_engine(url)
    try:
        assert migration_problem(engine) is None
        at_head = _migrate_in_a_new_process(url, key_file)
        assert at_head.returncode == 0, at_head.stderr
        assert json.loads(at_head.stdout.strip().splitlines()[-1]) == [0, []]
        assert f"database at migration {head_revision()} (the newest)" in at_head.stderr
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'ffff9'"))
        newer = _migrate_in_a_new_process(url, key_file)
        assert newer.returncode != 0
        assert "Can't locate revision identified by 'ffff9'" in newer.stderr, newer.stderr[-2000:]
    finally:
        engine.dispose()

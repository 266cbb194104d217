"""Programmatic Alembic upgrade (used by ``gatekeeper serve`` and the container entrypoint)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

#: The Alembic scripts: ``migrations/`` at the project root, or ``GATEKEEPER_MIGRATIONS_DIR``.
MIGRATIONS = Path(
    os.environ.get("GATEKEEPER_MIGRATIONS_DIR")
    or Path(__file__).resolve().parents[2] / "migrations"
)


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at ``migrations/`` and ``url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Migrate the database at ``url`` to the newest revision."""
    command.upgrade(alembic_config(url), "head")


def head_revision() -> str:
    """The newest revision of ``migrations/``: the schema this code needs."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None  # noqa: S101 - migrations/ always has revisions
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None``: never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migration_problem(engine: Engine) -> str | None:
    """Why the database is not at this code's schema, or ``None`` when it is."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return None
    if current is None:
        return "has no gatekeeper tables (it was never migrated)"
    known = {
        script.revision
        for script in ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions()
    }
    if current in known:
        return f"is at migration {current}; this version needs {head}"
    return f"is at migration {current}, unknown to this version (a newer gatekeeper migrated it)"

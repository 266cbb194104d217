"""Programmatic Alembic upgrade (used by ``gatekeeper serve`` and the container entrypoint)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config

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

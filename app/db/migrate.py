"""Alembic's upgrade (``serve``, ``migrate``, the container) and the other commands' check.

Every command but ``serve`` and ``migrate`` checks that its database is at this version's schema
(:func:`migration_problem`) without importing Alembic: Alembic with Mako and Pygments, and
loading every migration script with what the scripts import (services, engine), were a sixth
of a ``gatekeeper keys list``'s instructions and a quarter of its CPU (docs/benchmarks.md,
"h/start" and "h/ci"). The check reads the revisions from the scripts'
text (:func:`read_lineage`, which falls back to Alembic for a script not in the plain form its
template writes; a test holds it to Alembic's answer for ``migrations/``) and the database's
revision from ``alembic_version``. Alembic is imported only to migrate.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

#: The Alembic scripts: ``migrations/`` at the project root, or ``GATEKEEPER_MIGRATIONS_DIR``.
MIGRATIONS = Path(
    os.environ.get("GATEKEEPER_MIGRATIONS_DIR")
    or Path(__file__).resolve().parents[2] / "migrations"
)

#: Alembic's table of the database's revision (its default name; ``migrations/env.py`` keeps it).
VERSION_TABLE = "alembic_version"

#: The files of ``versions/`` Alembic reads as revisions (its own pattern, source files only).
_SCRIPT_NAME = re.compile(r"(?!\.#|__init__).*\.py")

#: A module-level ``revision = "…"`` or ``down_revision = "…" | None``, as the template writes.
_ASSIGNMENT = re.compile(
    r"^(revision|down_revision|branch_labels|depends_on)\b[^=\n]*=(.*)$", re.MULTILINE
)


@dataclass(frozen=True)
class Lineage:
    """The revisions of the migration scripts: the newest one and all of them."""

    head: str
    known: frozenset[str]


def alembic_config(url: str | None = None, *, directory: Path = MIGRATIONS) -> Config:
    """An Alembic config pointing at ``directory`` (``migrations/``) and ``url`` if given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(directory))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Migrate the database at ``url`` to the newest revision."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")


def _plain_lineage(directory: Path) -> Lineage | None:
    """The lineage read from the scripts' text; ``None`` unless it is one plain chain.

    Plain: each script assigns ``revision`` a string and ``down_revision`` a string or
    ``None`` once, each at the start of a line, ``branch_labels`` and ``depends_on`` ``None``,
    and the revisions form one chain (one head, every ``down_revision`` a known revision).
    """
    down: dict[str, str | None] = {}
    for path in sorted((directory / "versions").iterdir()):
        if not (path.is_file() and _SCRIPT_NAME.fullmatch(path.name)):
            continue
        found: dict[str, list[object]] = {}
        for name, value in _ASSIGNMENT.findall(path.read_text(encoding="utf-8")):
            try:
                found.setdefault(name, []).append(ast.literal_eval(value.strip()))
            except (ValueError, SyntaxError):
                return None
        match found:
            case {
                "revision": [str() as revision],
                "down_revision": [str() | None as parent],
                "branch_labels": [None],
                "depends_on": [None],
            } if revision not in down:
                down[revision] = parent
            case _:
                return None
    heads = down.keys() - set(down.values())
    if len(heads) != 1:
        return None
    head = heads.pop()
    at: str | None = head
    length = 0
    while at is not None and at in down and length <= len(down):  # down from the head
        at, length = down[at], length + 1
    if at is not None or length != len(down):  # an unknown parent, or scripts off the chain
        return None
    return Lineage(head=head, known=frozenset(down))


def alembic_lineage(directory: Path = MIGRATIONS) -> Lineage:
    """The lineage as Alembic reads it (importing Alembic and every migration script)."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config(directory=directory))
    head = scripts.get_current_head()  # refuses several heads
    if head is None:
        raise ValueError(f"no migration scripts in {directory}")
    known = frozenset(script.revision for script in scripts.walk_revisions())
    return Lineage(head=head, known=known)


def read_lineage(directory: Path = MIGRATIONS) -> Lineage:
    """The revisions of ``directory``: from the scripts' text when plain, else from Alembic."""
    return _plain_lineage(directory) or alembic_lineage(directory)


def head_revision() -> str:
    """The newest revision of ``migrations/``: the schema this code needs."""
    return read_lineage().head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None``: never migrated), read as Alembic reads it."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        select = text(f"SELECT version_num FROM {VERSION_TABLE}")  # noqa: S608 - a constant
        rows = conn.execute(select).scalars().all()
    if len(rows) > 1:  # Alembic's get_current_revision refuses this too
        raise RuntimeError(f"{VERSION_TABLE} holds {len(rows)} revisions, not one")
    return rows[0] if rows else None


def migration_problem(engine: Engine) -> str | None:
    """Why the database is not at this code's schema, or ``None`` when it is."""
    current, lineage = current_revision(engine), read_lineage()
    if current == lineage.head:
        return None
    if current is None:
        return "has no gatekeeper tables (it was never migrated)"
    if current in lineage.known:
        return f"is at migration {current}; this version needs {lineage.head}"
    return f"is at migration {current}, unknown to this version (a newer gatekeeper migrated it)"

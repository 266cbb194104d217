"""Engines for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@dataclass(frozen=True)
class PoolBounds:
    """What :func:`make_engine` gave a PostgreSQL engine's pool (``Engine.dispose()`` keeps it)."""

    size: int
    max_overflow: int
    recycle: float


#: The bounds of the pools :func:`make_engine` made (SQLAlchemy keeps them private).
_BOUNDS: weakref.WeakKeyDictionary[Engine, PoolBounds] = weakref.WeakKeyDictionary()


#: The key of ``Connection.info`` (the pooled connection's own, kept as long as it lives)
#: holding when it was made, ``time.monotonic()`` at the pool's ``connect`` event: the age
#: ``pool_recycle`` counts from, for a connection a thread keeps (:mod:`app.store.base`) as for
#: the pool's own (which keeps it private).
MADE_AT = "gatekeeper_made_at"


def _made(_dbapi_connection: Any, record: Any) -> None:
    record.info[MADE_AT] = time.monotonic()


def pool_bounds(engine: Engine) -> PoolBounds | None:
    """The bounds of ``engine``'s pool, None for an engine :func:`make_engine` did not pool."""
    return _BOUNDS.get(engine)


def make_engine(
    url: str, pool_size: int = 5, max_overflow: int = 5, pool_recycle: float = 1800
) -> Engine:
    """An engine for ``url``; SQLite files get their folder, WAL mode and a busy timeout.

    PostgreSQL pools are per process: keep ``WEB_WORKERS * (pool_size + max_overflow)`` below the
    server's ``max_connections``. A PostgreSQL connection is made anew after ``pool_recycle``
    seconds (at its next check-out; a kept one, :mod:`app.store.base`, at its thread's next
    block after that age: :data:`MADE_AT`).
    """
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            hide_parameters=True,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=10,
        pool_recycle=pool_recycle,
        # an error's text never quotes a statement's parameters (values, outputs, keys)
        hide_parameters=True,
    )
    event.listen(engine, "connect", _made)
    _BOUNDS[engine] = PoolBounds(pool_size, max_overflow, pool_recycle)
    return engine


def wait_for_database(engine: Engine, seconds: float) -> None:
    """Retry ``SELECT 1`` until the database answers or ``seconds`` pass (prestart step)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return
        except OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)

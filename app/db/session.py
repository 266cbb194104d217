"""Engines for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import time
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


def make_engine(url: str, pool_size: int = 5, max_overflow: int = 5) -> Engine:
    """An engine for ``url``; SQLite files get their folder, WAL mode and a busy timeout.

    PostgreSQL pools are per process: keep ``WEB_WORKERS * (pool_size + max_overflow)`` below the
    server's ``max_connections``.
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
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=10,
        pool_recycle=1800,
        # an error's text never quotes a statement's parameters (values, outputs, keys)
        hide_parameters=True,
    )


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

"""The readiness probe's statement."""

from __future__ import annotations

from sqlalchemy import text

from app.store.base import Tx

_PING = text("SELECT 1")


def ping(conn: Tx) -> None:
    """Run a trivial statement: raises if the database does not answer."""
    conn.execute(_PING)

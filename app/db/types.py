"""Column types shared by the models."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from app.crypto import active


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp on every backend, always read back in UTC.

    PostgreSQL's ``timestamptz`` returns aware datetimes; SQLite stores text without an offset
    and returned naive ones, so responses said ``"2026-11-23T21:28:45.429395"`` there and
    ``"...+00:00"`` on PostgreSQL. Values are written in UTC (a naive value is taken as UTC)
    and read back aware, so every timestamp renders as RFC 3339 with an offset.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        """Store in UTC (naive values are taken as UTC)."""
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError("a timestamp column takes a datetime")
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """Read back aware, in UTC."""
        if value is None:
            return None
        if not isinstance(value, datetime):  # pragma: no cover - drivers return datetimes
            raise TypeError("a timestamp column holds datetimes")
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class EncryptedText(TypeDecorator[str]):
    """A text column stored encrypted with the process's cipher (:mod:`app.crypto`)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        """Encrypt on the way in."""
        return None if value is None else active().encrypt(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        """Decrypt on the way out."""
        return None if value is None else active().decrypt(str(value))

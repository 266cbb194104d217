"""Rows of a small table read as a dataclass: by one unique column, and a page by id.

The statements are built once, when a table module creates its :class:`Rows` (every
authenticated request that misses the key cache runs the key lookup).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import Column, ColumnElement, bindparam, select

from app.store.base import Tx

T = TypeVar("T")


class Rows(Generic[T]):
    """``make(*columns)`` of a table's rows: one by a unique column, or a page in id order."""

    def __init__(
        self,
        make: Callable[..., T],
        columns: Sequence[Column[Any]],
        *,
        id_: Column[Any],
        listed: ColumnElement[bool] | None = None,
    ):
        """``listed``: the condition a row must meet to be in a page (lookups see every row)."""
        self._make = make
        self.columns = tuple(columns)
        self._page = (
            select(*self.columns)
            .where(id_ > bindparam("after"), *(() if listed is None else (listed,)))
            .order_by(id_)
            .limit(bindparam("limit"))
        )

    def by(self, column: Column[Any]) -> Callable[[Tx, Any], T | None]:
        """A lookup of the row whose ``column`` (unique) equals a value; None if there is none."""
        statement = select(*self.columns).where(column == bindparam("value"))

        def one(conn: Tx, value: Any) -> T | None:
            row = conn.execute(statement, {"value": value}).one_or_none()
            return None if row is None else self._make(*row)

        return one

    def page(self, conn: Tx, *, after: int, limit: int) -> list[T]:
        """At most ``limit`` rows with ``id > after``, in id order."""
        return [self._make(*r) for r in conn.execute(self._page, {"after": after, "limit": limit})]

"""The wire format of each compiled read's columns (PostgreSQL: 0 text, 1 binary)."""

from __future__ import annotations

from typing import Any

import pytest

from app.store import compiled


def record_result_formats(patch: pytest.MonkeyPatch, formats: list[tuple[int, ...]]) -> None:
    """While ``patch`` holds, append each compiled read's column formats to ``formats``.

    Spies on :meth:`app.store.compiled.Compiled.processors`, which every row read through
    :mod:`app.store.compiled` asks once per result (psycopg's ``pgresult.fformat`` per field).
    """
    processors = compiled.Compiled.processors

    def spied(self: compiled.Compiled, cursor: Any) -> Any:
        result = cursor.pgresult
        formats.append(tuple(result.fformat(i) for i in range(result.nfields)))
        return processors(self, cursor)

    patch.setattr(compiled.Compiled, "processors", spied)

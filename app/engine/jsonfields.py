"""Typed readers for JSON-decoded input that raise :class:`InvalidInput` naming the field.

The readers reject the JSON corner cases that silently corrupt numeric code: booleans where
numbers are expected (``True`` is an ``int`` in Python), NaN and infinities, and unknown keys.
Messages never include the offending value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.engine.errors import InvalidInput


def path(parent: str, key: str | int) -> str:
    """Join a JSON path and a key or index.

    ``path("a", "b") == "a.b"`` and ``path("a", 2) == "a[2]"``.
    """
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def as_object(raw: Any, field: str) -> Mapping[str, Any]:
    """Return ``raw`` if it is a JSON object, else raise."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(field, "must be an object")
    return raw


def as_list(raw: Any, field: str, *, min_len: int = 0, max_len: int | None = None) -> list[Any]:
    """Return ``raw`` as a list if it is a JSON array within the length limits, else raise."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise InvalidInput(field, "must be an array")
    items = list(raw)
    if len(items) < min_len:
        raise InvalidInput(field, f"must have at least {min_len} item(s)")
    if max_len is not None and len(items) > max_len:
        raise InvalidInput(field, f"must have at most {max_len} items")
    return items


def check_keys(
    obj: Mapping[str, Any], field: str, *, required: Iterable[str], optional: Iterable[str] = ()
) -> None:
    """Raise if a required key is missing or an unknown key is present."""
    required = tuple(required)
    allowed = set(required) | set(optional)
    for key in required:
        if key not in obj:
            raise InvalidInput(path(field, key), "is required")
    for key in obj:
        if key not in allowed:
            raise InvalidInput(path(field, str(key)), "is not a known field")


def as_number(raw: Any, field: str) -> float:
    """Return a finite JSON number as float; reject booleans, strings, NaN and infinities."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidInput(field, "must be a number")
    try:
        value = float(raw)
    except OverflowError:
        raise InvalidInput(field, "must be a finite number") from None
    if not math.isfinite(value):
        raise InvalidInput(field, "must be a finite number")
    return value


def as_integer(raw: Any, field: str) -> int:
    """Return a JSON integer (``3`` or ``3.0``); reject booleans, fractions and non-numbers."""
    if isinstance(raw, bool):
        raise InvalidInput(field, "must be an integer")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        return int(raw)
    raise InvalidInput(field, "must be an integer")


def as_positive_number(raw: Any, field: str, *, maximum: float | None = None) -> float:
    """Return a finite number ``> 0`` (and ``<= maximum`` when given)."""
    value = as_number(raw, field)
    if value <= 0.0:
        raise InvalidInput(field, "must be greater than 0")
    if maximum is not None and value > maximum:
        raise InvalidInput(field, f"must be at most {maximum:g}")
    return value


def as_string(raw: Any, field: str, *, max_len: int = 256) -> str:
    """Return a non-empty string of at most ``max_len`` characters."""
    if not isinstance(raw, str):
        raise InvalidInput(field, "must be a string")
    if not raw:
        raise InvalidInput(field, "must not be empty")
    if len(raw) > max_len:
        raise InvalidInput(field, f"must be at most {max_len} characters")
    if "\x00" in raw:
        raise InvalidInput(field, "must not contain NUL characters")
    return raw


def as_bool(raw: Any, field: str) -> bool:
    """Return a JSON boolean."""
    if not isinstance(raw, bool):
        raise InvalidInput(field, "must be true or false")
    return raw

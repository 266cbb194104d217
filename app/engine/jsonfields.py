"""Typed readers for JSON-decoded input that raise :class:`InvalidInput` naming the field.

The readers reject the JSON corner cases that silently corrupt numeric code: booleans where
numbers are expected (``True`` is an ``int`` in Python), NaN and infinities, and unknown keys.
Messages never include the offending value.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def as_positive_number(
    raw: Any, field: str, *, maximum: float | None = None, minimum: float | None = None
) -> float:
    """Return a finite number ``> 0`` (and ``>= minimum``, ``<= maximum`` when given)."""
    value = as_number(raw, field)
    if value <= 0.0:
        raise InvalidInput(field, "must be greater than 0")
    if minimum is not None and value < minimum:
        raise InvalidInput(
            field,
            f"must be at least {minimum:g} (a smaller epsilon is below the filter's rounding "
            "resolution)",
        )
    if maximum is not None and value > maximum:
        raise InvalidInput(field, f"must be at most {maximum:g}")
    return value


#: The longest attribute name (a domain's, a query's, a predicate's): the one definition, read by
#: the domain's parser and by the request models (:mod:`app.services.schemas`).
MAX_NAME = 128


def as_string(raw: Any, field: str, *, max_len: int = MAX_NAME) -> str:
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


class RepeatedKey(ValueError):
    """A JSON document gives one key twice in an object; ``field`` is its path."""

    def __init__(self, field: str) -> None:
        super().__init__(f"the key {field} is given more than once")
        self.field = field


class NotText(ValueError):
    r"""A JSON string escapes a lone UTF-16 surrogate (``"\ud800"``): no Unicode text.

    RFC 8259 (section 8.2) leaves such strings' meaning unpredictable; no database stores them.
    ``field`` is the path of the string (or of the object holding such a key).
    """

    def __init__(self, field: str) -> None:
        super().__init__(f"{field} holds a lone UTF-16 surrogate, which is not Unicode text")
        self.field = field


class _Twice(dict[str, Any]):
    """A JSON object in which some key was given more than once (the last value wins)."""

    repeated: str


def _first_repeated(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("called only when a key repeats")  # pragma: no cover


def _first_path(node: Any, at: str, found: Callable[[Any, str], str | None]) -> str | None:
    """The path ``found`` names in ``node`` or its descendants (depth first), if any."""
    here = found(node, at)
    if here is not None:
        return here
    if isinstance(node, dict):
        children: Any = node.items()
    elif isinstance(node, list):
        children = enumerate(node)
    else:
        return None
    for key, child in children:
        below = _first_path(child, path(at, key), found)
        if below is not None:
            return below
    return None


def _repeated_here(node: Any, at: str) -> str | None:
    return path(at, node.repeated) if isinstance(node, _Twice) else None


def _not_text(value: str) -> bool:
    """Whether ``value`` holds a lone UTF-16 surrogate (no Unicode text, no UTF-8 encoding)."""
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _surrogate_here(node: Any, at: str) -> str | None:
    if isinstance(node, str):
        return at if _not_text(node) else None
    if isinstance(node, dict):
        for key in node:
            if _not_text(key):
                return path(at, key.encode("utf-8", "backslashreplace").decode("ascii"))
    return None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


#: Whether the calling thread's :func:`loads_strict` met a repeated key (set by the hook).
_SEEN = threading.local()


def _as_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """:data:`_STRICT`'s object hook: a ``dict``, or a :class:`_Twice` naming a repeated key."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    _SEEN.twice = True
    twice = _Twice(obj)
    twice.repeated = _first_repeated(pairs)
    return twice


#: The strict parser, made once: ``json.loads(raw, object_pairs_hook=...)`` builds a new
#: ``JSONDecoder`` (and its C scanner) per call, ≈ 3 µs of a request body's 7 (docs/benchmarks.md,
#: "h/prof"). ``decode`` keeps no state of its own between calls (the scanner's key memo is
#: only an interning cache), so one serves every thread; whether a key repeated is the calling
#: thread's (:data:`_SEEN`).
_STRICT = json.JSONDecoder(object_pairs_hook=_as_object)


def _json_text(raw: str | bytes) -> str:
    """What ``json.loads`` decodes ``raw`` to before parsing it, with its errors (Python 3.11+)."""
    if isinstance(raw, str):
        if raw.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
        return raw
    if not isinstance(raw, (bytes, bytearray)):
        raise TypeError(
            f"the JSON object must be str, bytes or bytearray, not {raw.__class__.__name__}"
        )
    return raw.decode(json.detect_encoding(raw), "surrogatepass")


def loads_strict(raw: str | bytes) -> Any:
    """``json.loads`` that refuses a key given twice in one object (:class:`RepeatedKey`).

    The standard parser keeps the last of two equal keys silently; in a query that decided
    which ε was spent. Documents without repeats cost one ``dict`` per object more than
    ``json.loads`` and no second walk.

    >>> loads_strict('{"query": {"epsilon": 1}}')
    {'query': {'epsilon': 1}}
    >>> try:
    ...     loads_strict('{"query": [{"epsilon": 0.1, "epsilon": 50}]}')
    ... except RepeatedKey as exc:
    ...     print(exc.field)
    query[0].epsilon
    """
    _SEEN.twice = False
    # json.loads(raw, object_pairs_hook=_as_object), its decoder made once
    document = _STRICT.decode(_json_text(raw))
    if _SEEN.twice:
        try:
            repeated = _first_path(document, "", _repeated_here)
        except RecursionError:  # nested too deep to name: the document as a whole
            repeated = "body"
        raise RepeatedKey(repeated or "body")
    # request bodies (bytes) are walked only when they escape a surrogate; text (the CLI's
    # files) may also hold surrogates decoded already, so it is always walked
    if isinstance(raw, str) or _SURROGATE_ESCAPE.search(raw):
        try:
            where = _first_path(document, "", _surrogate_here)
        except RecursionError:
            where = "body"
        if where is not None:
            raise NotText(where or "body")
    return document

"""Request bodies validated by their models (:mod:`app.services.schemas`), in our words.

:func:`validated` runs ``Model.model_validate`` on a body the route parsed with the raw JSON
checks (a key given twice, a lone surrogate: :func:`app.api.deps.parse_json`) and turns
Pydantic's errors into one :class:`~app.engine.errors.InvalidInput` that names every bad field
as a path (``versions[3].value.x``, ``query.epsilon``) with the service's message, never the
value. The leaves of the models read their values with the engine's own readers
(:mod:`app.engine.jsonfields`), so a field says what it said before it had a model.

A path is the JSON's, not Pydantic's location: a union's member name (``grr``, ``str``) is not
part of the document and is left out, a missing discriminator names its field (``query.
mechanism``), and a bad key of a mapping names the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app.engine.errors import FieldError, InvalidInput
from app.engine.jsonfields import path

ModelT = TypeVar("ModelT", bound=BaseModel)


def _one_of(values: Any) -> str:
    return str(values).replace("'", "").replace(" or ", ", ")


#: Pydantic's error types in our words (never the input, which may be a private value).
_OUR_WORDS: dict[str, Any] = {
    "missing": lambda c: "is required",
    "extra_forbidden": lambda c: "is not a known field",
    "greater_than_equal": lambda c: f"must be at least {c['ge']}",
    "greater_than": lambda c: f"must be greater than {c['gt']}",
    "less_than_equal": lambda c: f"must be at most {c['le']}",
    "less_than": lambda c: f"must be less than {c['lt']}",
    "string_too_long": lambda c: f"must be at most {c['max_length']} characters",
    "string_too_short": lambda c: f"must be at least {c['min_length']} characters",
    "string_pattern_mismatch": lambda c: "is not in the expected format",
    "string_type": lambda c: "must be a string",
    "int_parsing": lambda c: "must be an integer",
    "int_type": lambda c: "must be an integer",
    "int_from_float": lambda c: "must be an integer",
    "float_parsing": lambda c: "must be a number",
    "float_type": lambda c: "must be a number",
    "finite_number": lambda c: "must be a finite number",
    "bool_parsing": lambda c: "must be true or false",
    "bool_type": lambda c: "must be true or false",
    "literal_error": lambda c: f"must be one of {_one_of(c.get('expected', ''))}",
    "enum": lambda c: f"must be one of {_one_of(c.get('expected', ''))}",
    "union_tag_invalid": lambda c: f"must be one of {_one_of(c.get('expected_tags', ''))}",
    "union_tag_not_found": lambda c: "is required",
    "dict_type": lambda c: "must be an object",
    "model_type": lambda c: "must be an object",
    "model_attributes_type": lambda c: "must be an object",
    "list_type": lambda c: "must be an array",
    "too_long": lambda c: f"must have at most {c.get('max_length')} items",
    "too_short": lambda c: f"must have at least {c.get('min_length')} item(s)",
    "json_type": lambda c: "must be JSON",
    # raised by the models' own validators (PydanticCustomError("invalid", "{message}"))
    "invalid": lambda c: c["message"],
}


def our_words(error: Mapping[str, Any]) -> str:
    """The message of one Pydantic validation error in the service's words.

    Pydantic's stock messages ("Input should be greater than or equal to 1", "String should have
    at most 255 characters") read unlike every other message of the API; the input itself is
    never quoted.

    >>> our_words({"type": "greater_than_equal", "ctx": {"ge": 1}, "msg": "Input should be..."})
    'must be at least 1'
    >>> our_words({"type": "something_new", "msg": "Input should be fine"})
    'is not valid'
    """
    kind = str(error.get("type", ""))
    words = _OUR_WORDS.get(kind)
    if words is None:
        if kind == "value_error":
            cause = (error.get("ctx") or {}).get("error")
            return str(cause) if cause is not None else "is not valid"
        return "is not valid"
    try:
        return str(words(error.get("ctx") or {}))
    except (KeyError, TypeError):
        return "is not valid"


def _has(node: Any, step: Any) -> bool:
    """Whether ``step`` is a key or an index of ``node`` (not a union member's name)."""
    if isinstance(step, int) and not isinstance(step, bool):
        return isinstance(node, list) and 0 <= step < len(node)
    return isinstance(step, str) and isinstance(node, Mapping) and step in node


def json_path(loc: Sequence[Any], data: Any, error: Mapping[str, Any], field: str = "") -> str:
    """The JSON path of a Pydantic error's ``loc`` in ``data`` (under ``field``).

    Pydantic's location also names the member of a union it tried (``("query", "grr",
    "epsilon")``, ``("value", "x", "str")``): a step that is not in the document is skipped.
    A missing or unknown key (the last step) is kept; a bad key of a mapping (``"[key]"``) names
    the mapping.
    """
    at, node = field, data
    last = len(loc) - 1
    for i, step in enumerate(loc):
        if step == "[key]":
            break
        if _has(node, step):
            at, node = path(at, step), node[step]
        elif i == last and error.get("type") == "missing" and isinstance(step, str):
            at = path(at, step)
    kind = error.get("type")
    ctx = error.get("ctx") or {}
    if kind in ("union_tag_invalid", "union_tag_not_found") and "discriminator" in ctx:
        at = path(at, str(ctx["discriminator"]).strip("'"))
    if "at" in ctx:  # a model's rule between fields names the field it is about
        at = path(at, str(ctx["at"]))
    return at or "body"


def validated(
    model: type[ModelT], data: Any, field: str = "", context: dict[str, Any] | None = None
) -> ModelT:
    """``model.model_validate(data, context=...)``, or :class:`InvalidInput` naming each field.

    ``field`` prefixes the paths (``objects[3]``). A field named twice (the members of a union
    it matches none of) is reported once, with the first member's message.
    """
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        errors: dict[str, str] = {}
        found = exc.errors(include_url=False, include_input=False)
        # an optional field's None member (``X | None``: null is refused before) says nothing
        found = [e for e in found if e["type"] != "none_required"] or found
        for error in found:
            at = json_path(error["loc"], data, error, field)
            errors.setdefault(at, our_words(error))
        raise invalid([FieldError(at, message) for at, message in errors.items()]) from None


def invalid(errors: Sequence[FieldError]) -> InvalidInput:
    """One :class:`InvalidInput` carrying every error (the first is its field and message)."""
    exc = InvalidInput(errors[0].field, errors[0].message)
    exc.errors = tuple(errors)
    return exc

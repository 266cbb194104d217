"""Predicates of ``binary_rr`` queries: ``{"attribute": a, "op": op, "value": v}``.

Operators: ``==``, ``!=`` (any attribute), ``<``, ``<=``, ``>``, ``>=`` (numeric attributes) and
``in`` (``value`` is a list). For categorical attributes every compared value must be one of the
attribute's values, which catches typos that would otherwise make the predicate constant.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine.domain import Attribute, AttributeKind, Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_list, as_number, as_object, check_keys, path

_ORDER_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
OPS = ("==", "!=", "<", "<=", ">", ">=", "in")


@dataclass(frozen=True)
class Predicate:
    """A validated predicate over one attribute."""

    axis: int
    attribute: Attribute
    op: str
    #: The compared values: one for every operator but ``in``.
    operands: tuple[Scalar, ...]

    def evaluate(self, x: Scalar) -> bool:
        """Truth of the predicate for one attribute value."""
        if self.op == "in":
            return any(x == v for v in self.operands)
        if self.op == "==":
            return x == self.operands[0]
        if self.op == "!=":
            return x != self.operands[0]
        return bool(_ORDER_OPS[self.op](x, self.operands[0]))

    def truth_table(self) -> npt.NDArray[np.bool_]:
        """Truth for every value of a finite attribute, in the attribute's order."""
        attr = self.attribute
        if attr.kind is AttributeKind.INTEGER:
            xs = attr.numeric_values()
            if self.op == "in":
                return np.isin(xs, np.asarray(self.operands, dtype=np.float64))
            if self.op == "==":
                return np.asarray(xs == self.operands[0])
            if self.op == "!=":
                return np.asarray(xs != self.operands[0])
            return np.asarray(_ORDER_OPS[self.op](xs, self.operands[0]), dtype=np.bool_)
        return np.array([self.evaluate(v) for v in attr.values], dtype=np.bool_)

    def attainable(self) -> tuple[bool, bool]:
        """Whether the predicate can be true, and whether it can be false, over the domain."""
        attr = self.attribute
        if attr.is_finite:
            table = self.truth_table()
            return bool(table.any()), bool(not table.all())
        lo, hi = attr.low, attr.high
        if self.op == "in":
            return any(lo <= float(v) <= hi for v in self.operands), True
        v = float(self.operands[0])
        inside = lo <= v <= hi
        return {
            "==": (inside, True),
            "!=": (True, inside),
            "<": (lo < v, hi >= v),
            "<=": (lo <= v, hi > v),
            ">": (hi > v, lo <= v),
            ">=": (hi >= v, lo < v),
        }[self.op]

    def to_json(self) -> dict[str, Any]:
        """The predicate in canonical JSON form."""
        operand: Any = list(self.operands) if self.op == "in" else self.operands[0]
        return {"attribute": self.attribute.name, "op": self.op, "value": operand}


def _operand(attr: Attribute, raw: Any, field: str) -> Scalar:
    if attr.kind is AttributeKind.CATEGORICAL:
        attr.index_of(raw, field)
        return raw  # type: ignore[no-any-return]
    return as_number(raw, field)


def parse_predicate(raw: Any, domain: Domain, field: str) -> Predicate:
    """Validate a predicate against ``domain``."""
    obj = as_object(raw, field)
    check_keys(obj, field, required=("attribute", "op", "value"))
    attr_field = path(field, "attribute")
    if not isinstance(obj["attribute"], str):
        raise InvalidInput(attr_field, "must be a string")
    axis = domain.axis(obj["attribute"], attr_field)
    attr = domain.attributes[axis]
    op = obj["op"]
    if op not in OPS:
        raise InvalidInput(path(field, "op"), "must be one of " + ", ".join(OPS))
    value_field = path(field, "value")
    if op == "in":
        items = as_list(obj["value"], value_field, min_len=1, max_len=10_000)
        operands = tuple(_operand(attr, v, path(value_field, i)) for i, v in enumerate(items))
    else:
        if op in _ORDER_OPS and not attr.is_numeric:
            raise InvalidInput(path(field, "op"), "order comparisons need a numeric attribute")
        operands = (_operand(attr, obj["value"], value_field),)
    return Predicate(axis, attr, op, operands)

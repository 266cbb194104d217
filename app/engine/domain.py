"""Domains: the set of values a protected object could take (contract.md, "Domain").

A domain is an ordered list of attributes, each ``integer`` (inclusive ``low..high``),
``categorical`` (a list of distinct values) or ``real`` (a closed interval). A domain without a
``real`` attribute is **finite**: its points are the Cartesian product of the attributes' values
in attribute order with the *last attribute varying fastest* (C order), so point ``i`` has the
coordinates ``numpy.unravel_index(i, domain.shape)``. A domain with a ``real`` attribute is
**continuous**: a box, possibly with integer/categorical coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine.errors import InvalidInput
from app.engine.jsonfields import (
    MAX_NAME,
    as_integer,
    as_list,
    as_number,
    as_object,
    as_string,
    check_keys,
    path,
)
from app.engine.limits import DEFAULT_LIMITS, EngineLimits

#: A JSON scalar an attribute can take: ``int`` for integer attributes, ``float`` for real ones,
#: ``str`` or ``int`` for categorical ones.
Scalar = int | float | str
#: A value of an object: attribute name -> scalar, validated and canonical.
Value = dict[str, Scalar]

_MAX_EXACT_INT = 2**53


class AttributeKind(StrEnum):
    """The three attribute types of the JSON contract."""

    INTEGER = "integer"
    CATEGORICAL = "categorical"
    REAL = "real"


@dataclass(frozen=True)
class Attribute:
    """One attribute of a domain.

    ``low``/``high`` are set for ``integer`` and ``real`` attributes, ``values`` for
    ``categorical`` ones.
    """

    name: str
    kind: AttributeKind
    low: float = 0.0
    high: float = 0.0
    values: tuple[str | int, ...] = ()
    _index: Mapping[str | int, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_finite(self) -> bool:
        """Whether the attribute has finitely many values (integer or categorical)."""
        return self.kind is not AttributeKind.REAL

    @property
    def is_numeric(self) -> bool:
        """Whether the attribute can carry a weight in ``linear``/``logistic`` queries."""
        return self.kind is not AttributeKind.CATEGORICAL

    @property
    def size(self) -> int:
        """Number of values of a finite attribute."""
        if self.kind is AttributeKind.INTEGER:
            return int(self.high) - int(self.low) + 1
        if self.kind is AttributeKind.CATEGORICAL:
            return len(self.values)
        raise ValueError(f"real attribute {self.name!r} has no finite size")

    def numeric_values(self) -> npt.NDArray[np.float64]:
        """The values of a finite numeric attribute, in order, as float64."""
        if self.kind is not AttributeKind.INTEGER:
            raise ValueError(f"attribute {self.name!r} has no enumerable numeric values")
        return np.arange(int(self.low), int(self.high) + 1, dtype=np.float64)

    def index_of(self, raw: Any, field_path: str) -> int:
        """Position of ``raw`` among the values of a finite attribute (raises if absent)."""
        if self.kind is AttributeKind.INTEGER:
            v = as_integer(raw, field_path)
            if not int(self.low) <= v <= int(self.high):
                raise InvalidInput(
                    field_path, f"must be between {int(self.low)} and {int(self.high)}"
                )
            return v - int(self.low)
        if self.kind is AttributeKind.CATEGORICAL:
            if isinstance(raw, bool) or not isinstance(raw, (str, int)) or raw not in self._index:
                raise InvalidInput(
                    field_path, f"must be one of the values of attribute {self.name!r}"
                )
            return self._index[raw]
        raise ValueError(f"real attribute {self.name!r} has no value index")

    def indexes_of(self, raws: Iterable[Any], field_path: str) -> list[int]:
        """:meth:`index_of` of each of ``raws``, in order (raising at the first it refuses).

        Each distinct ``str`` or ``int`` is checked once (a survey chunk samples 5,000 values
        of a few hundred): its position is a function of the value alone. Any other type is
        checked every time (``True == 1`` and ``1.0 == 1`` would share a dict key, not an
        answer: a boolean is refused, a float accepted as an integer).
        """
        found: dict[str | int, int] = {}
        index_of = self.index_of
        indexes = []
        for raw in raws:
            kind = type(raw)
            if kind is str or kind is int:
                at = found.get(raw)
                if at is None:
                    at = found[raw] = index_of(raw, field_path)
            else:
                at = index_of(raw, field_path)
            indexes.append(at)
        return indexes

    def value_at(self, index: int) -> str | int:
        """The value at position ``index`` of a finite attribute."""
        if self.kind is AttributeKind.INTEGER:
            return int(self.low) + index
        return self.values[index]

    def parse(self, raw: Any, field_path: str) -> Scalar:
        """Validate one coordinate of a value and return it in canonical form."""
        if self.kind is AttributeKind.REAL:
            v = as_number(raw, field_path)
            if not self.low <= v <= self.high:
                raise InvalidInput(field_path, f"must be between {self.low:g} and {self.high:g}")
            return v
        return self.value_at(self.index_of(raw, field_path))

    def to_json(self) -> dict[str, Any]:
        """The attribute in the JSON contract's form."""
        if self.kind is AttributeKind.CATEGORICAL:
            return {"name": self.name, "type": self.kind.value, "values": list(self.values)}
        if self.kind is AttributeKind.INTEGER:
            return {
                "name": self.name,
                "type": "integer",
                "low": int(self.low),
                "high": int(self.high),
            }
        return {"name": self.name, "type": "real", "low": self.low, "high": self.high}


@dataclass(frozen=True)
class Domain:
    """An ordered tuple of attributes: finite (a grid of points) or continuous (a box)."""

    attributes: tuple[Attribute, ...]
    _by_name: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    # computed once per domain (frozen: its attributes never change); a survey chunk asks
    # them per member and per (group, output)
    @cached_property
    def is_finite(self) -> bool:
        """True when no attribute is ``real``."""
        return all(a.is_finite for a in self.attributes)

    @cached_property
    def shape(self) -> tuple[int, ...]:
        """Values per attribute of a finite domain (the shape of its likelihood array)."""
        return tuple(a.size for a in self.attributes)

    @property
    def size(self) -> int:
        """Number of points of a finite domain."""
        return math.prod(self.shape)

    @property
    def names(self) -> tuple[str, ...]:
        """Attribute names in order."""
        return tuple(a.name for a in self.attributes)

    def axis(self, name: str, field_path: str) -> int:
        """Index of the attribute called ``name`` (raises naming ``field_path`` if unknown)."""
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise InvalidInput(field_path, "is not an attribute of the domain") from None

    def attribute(self, name: str, field_path: str) -> Attribute:
        """The attribute called ``name``."""
        return self.attributes[self.axis(name, field_path)]

    def parse_value(self, raw: Any, field_path: str = "value") -> Value:
        """Validate a value object ``{"age": 34.5, ...}`` and return it in canonical form."""
        obj = as_object(raw, field_path)
        check_keys(obj, field_path, required=self.names)
        return {a.name: a.parse(obj[a.name], path(field_path, a.name)) for a in self.attributes}

    def coordinates(self, value: Mapping[str, Scalar]) -> tuple[int, ...]:
        """Per-attribute value indexes of a canonical value of a finite domain."""
        return tuple(a.index_of(value[a.name], a.name) for a in self.attributes)

    def point_index(self, value: Mapping[str, Scalar]) -> int:
        """Position of a canonical value among the points of a finite domain."""
        return int(np.ravel_multi_index(self.coordinates(value), self.shape))

    def value_at(self, index: int) -> Value:
        """The value of point ``index`` of a finite domain."""
        coords = np.unravel_index(index, self.shape)
        return {a.name: a.value_at(int(c)) for a, c in zip(self.attributes, coords, strict=True)}

    def to_json(self) -> dict[str, Any]:
        """The domain in the JSON contract's form."""
        return {"attributes": [a.to_json() for a in self.attributes]}


def _parse_attribute(raw: Any, field_path: str, limits: EngineLimits) -> Attribute:
    obj = as_object(raw, field_path)
    kind_raw = obj.get("type")
    if "type" not in obj:
        raise InvalidInput(path(field_path, "type"), "is required")
    if not isinstance(kind_raw, str) or kind_raw not in {k.value for k in AttributeKind}:
        raise InvalidInput(path(field_path, "type"), "must be one of integer, categorical, real")
    kind = AttributeKind(kind_raw)
    name = (
        as_string(obj.get("name"), path(field_path, "name"), max_len=MAX_NAME)
        if "name" in obj
        else None
    )
    if name is None:
        raise InvalidInput(path(field_path, "name"), "is required")

    if kind is AttributeKind.CATEGORICAL:
        check_keys(obj, field_path, required=("name", "type", "values"))
        values_path = path(field_path, "values")
        items = as_list(
            obj["values"], values_path, min_len=1, max_len=limits.max_values_per_attribute
        )
        index: dict[str | int, int] = {}
        for i, v in enumerate(items):
            item_path = path(values_path, i)
            if isinstance(v, bool) or not isinstance(v, (str, int)):
                raise InvalidInput(item_path, "must be a string or an integer")
            if isinstance(v, str) and (not v or len(v) > 256):
                raise InvalidInput(
                    item_path, "must be a non-empty string of at most 256 characters"
                )
            if v in index:
                raise InvalidInput(item_path, "duplicates an earlier value")
            index[v] = i
        return Attribute(name, kind, values=tuple(items), _index=index)

    check_keys(obj, field_path, required=("name", "type", "low", "high"))
    low_path, high_path = path(field_path, "low"), path(field_path, "high")
    if kind is AttributeKind.INTEGER:
        low, high = as_integer(obj["low"], low_path), as_integer(obj["high"], high_path)
        for v, p in ((low, low_path), (high, high_path)):
            if abs(v) > _MAX_EXACT_INT:
                raise InvalidInput(p, "must be between -2**53 and 2**53")
        if high < low:
            raise InvalidInput(high_path, "must be greater than or equal to low")
        if high - low + 1 > limits.max_values_per_attribute:
            raise InvalidInput(
                high_path, f"makes the attribute exceed {limits.max_values_per_attribute} values"
            )
        return Attribute(name, kind, low=float(low), high=float(high))

    low_f, high_f = as_number(obj["low"], low_path), as_number(obj["high"], high_path)
    if not high_f > low_f:
        raise InvalidInput(high_path, "must be greater than low")
    return Attribute(name, kind, low=low_f, high=high_f)


def parse_domain(
    raw: Any, field_path: str = "domain", *, limits: EngineLimits = DEFAULT_LIMITS
) -> Domain:
    """Validate a domain of the JSON contract and build a :class:`Domain`.

    Raises
    ------
    InvalidInput
        Naming the first offending field: missing/unknown keys, bad types, empty or inverted
        ranges, duplicate names or values, NaN/infinities, or a finite domain with more than
        ``limits.max_points`` points.
    """
    obj = as_object(raw, field_path)
    check_keys(obj, field_path, required=("attributes",))
    attrs_path = path(field_path, "attributes")
    items = as_list(obj["attributes"], attrs_path, min_len=1, max_len=limits.max_attributes)
    attributes: list[Attribute] = []
    by_name: dict[str, int] = {}
    for i, item in enumerate(items):
        attr = _parse_attribute(item, path(attrs_path, i), limits)
        if attr.name in by_name:
            raise InvalidInput(
                path(path(attrs_path, i), "name"), "duplicates an earlier attribute name"
            )
        by_name[attr.name] = i
        attributes.append(attr)
    domain = Domain(tuple(attributes), _by_name=by_name)
    if domain.is_finite and domain.size > limits.max_points:
        raise InvalidInput(
            attrs_path,
            f"describe a domain of {domain.size:,} points; at most {limits.max_points:,} are "
            "supported (the product of the attributes' numbers of values)",
        )
    return domain

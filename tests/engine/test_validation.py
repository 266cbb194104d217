"""Input validation of the engine: every bad input is rejected naming the field, never the value.

Each table row is a bad input, the exact JSON path the error must name, and (where feasible) a
distinctive sentinel planted as the offending value, which the error message must not repeat.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest

from app.engine.calculator import compute_loss
from app.engine.domain import parse_domain
from app.engine.errors import InvalidInput, Unsupported
from app.engine.limits import EngineLimits
from app.engine.mechanisms import MECHANISMS, parse_query

# --- sentinels ---------------------------------------------------------------------------------
S = "SENTINEL-9137"  # a distinctive string value
N = 987654.321  # a distinctive float value
NI = 987654  # a distinctive integer value
KEY = "SENTINEL_KEY_4242"  # a distinctive unknown key (keys are named in the field path)
NAN = float("nan")
INF = float("inf")


def _representations(sentinel: Any) -> set[str]:
    """Ways a sentinel could show up in a message if the engine echoed it."""
    if isinstance(sentinel, str):
        return {sentinel}
    reps = {repr(sentinel), str(sentinel)}
    if isinstance(sentinel, (int, float)) and math.isfinite(sentinel):
        reps |= {f"{sentinel:g}", f"{sentinel:.6g}"}
        if abs(sentinel) >= 1000:
            reps.add(str(int(abs(sentinel))))
    return reps


def assert_not_echoed(message: str, sentinel: Any) -> None:
    for rep in _representations(sentinel):
        assert rep not in message, f"message {message!r} echoes the submitted value {rep!r}"


def expect_error(
    fn: Callable[[], Any],
    field: str,
    sentinel: Any = None,
    exc_type: type[Exception] = InvalidInput,
) -> Exception:
    """Run ``fn`` and check it raises ``exc_type`` naming ``field`` without echoing ``sentinel``."""
    with pytest.raises(exc_type) as info:
        fn()
    err = info.value
    assert type(err) is exc_type
    assert err.field == field  # type: ignore[attr-defined]
    message = err.message  # type: ignore[attr-defined]
    assert isinstance(message, str)
    assert message.strip()
    if isinstance(err, InvalidInput):
        assert err.errors[0].field == field
        assert err.errors[0].message == message
    if sentinel is not None:
        assert_not_echoed(message, sentinel)
    return err


# --- fixtures ----------------------------------------------------------------------------------
FINITE: dict[str, Any] = {
    "attributes": [
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
        {"name": "level", "type": "integer", "low": 0, "high": 4},
    ]
}
FINITE_SIZE = 2 * 3 * 5

CONTINUOUS: dict[str, Any] = {
    "attributes": [
        {"name": "age", "type": "real", "low": 10, "high": 100},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
    ]
}

DOMAINS = {"finite": FINITE, "continuous": CONTINUOUS}


def rows(n: int = FINITE_SIZE) -> list[list[float]]:
    """A valid probability matrix with two outputs; tight epsilon log 3."""
    return [[0.25, 0.75] if i % 2 == 0 else [0.75, 0.25] for i in range(n)]


def with_row(row_index: int, row: list[Any], n: int = FINITE_SIZE) -> list[list[Any]]:
    matrix: list[list[Any]] = rows(n)  # type: ignore[assignment]
    matrix[row_index] = row
    return matrix


GRR = {"mechanism": "grr", "attribute": "disease", "epsilon": 1.0}
BRR = {
    "mechanism": "binary_rr",
    "predicate": {"attribute": "level", "op": ">=", "value": 2},
    "epsilon": 0.5,
}
UE = {"mechanism": "unary_encoding", "attribute": "disease", "epsilon": 2.0, "variant": "symmetric"}
MATRIX = {"mechanism": "matrix", "outputs": ["lo", "hi"], "probabilities": rows(), "epsilon": 1.2}
LINEAR = {
    "mechanism": "linear",
    "weights": {"level": 0.5, "sex": 1.0},
    "intercept": -1.0,
    "range": [-1, 2],
    "truncate": False,
    "epsilon": 1.0,
}
LOGISTIC = {"mechanism": "logistic", "weights": {"level": 0.3}, "intercept": 0.1, "epsilon": 1.0}

BASES = {
    "grr": GRR,
    "binary_rr": BRR,
    "unary_encoding": UE,
    "matrix": MATRIX,
    "linear": LINEAR,
    "logistic": LOGISTIC,
}
VALID_OUTPUTS = {
    "grr": "flu",
    "binary_rr": 1,
    "unary_encoding": [0, 1, 1],
    "matrix": "hi",
    "linear": 2,
    "logistic": 0,
}
REQUIRED = {
    "grr": ("attribute", "epsilon"),
    "binary_rr": ("predicate", "epsilon"),
    "unary_encoding": ("attribute", "epsilon"),
    "matrix": ("outputs", "probabilities"),
    "linear": ("weights", "range", "epsilon"),
    "logistic": ("weights", "epsilon"),
}


def q(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with keys replaced (a value of ``...`` deletes the key)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def pred(attribute: str, op: Any, value: Any) -> dict[str, Any]:
    return {"attribute": attribute, "op": op, "value": value}


def brr(predicate: Any, **changes: Any) -> dict[str, Any]:
    return q(BRR, predicate=predicate, **changes)


def domain_of(name: str, limits: EngineLimits | None = None) -> Any:
    if limits is None:
        return parse_domain(copy.deepcopy(DOMAINS[name]))
    return parse_domain(copy.deepcopy(DOMAINS[name]), limits=limits)


# =============================================================================================
# Domains
# =============================================================================================
def attrs(*items: Any) -> dict[str, Any]:
    return {"attributes": list(items)}


def integer(name: str = "i", low: Any = 0, high: Any = 3, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "integer", "low": low, "high": high, **extra}


def real(name: str = "r", low: Any = 0.0, high: Any = 1.0, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "real", "low": low, "high": high, **extra}


def categorical(name: str = "c", values: Any = ("a", "b"), **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "categorical", "values": list(values), **extra}


BAD_DOMAINS = [
    # shape of the domain object
    pytest.param(S, "domain", S, id="domain-not-object"),
    pytest.param([integer()], "domain", None, id="domain-is-array"),
    pytest.param({}, "domain.attributes", None, id="missing-attributes"),
    pytest.param({"attributes": [integer()], KEY: N}, f"domain.{KEY}", N, id="unknown-domain-key"),
    pytest.param({"attributes": S}, "domain.attributes", S, id="attributes-not-array"),
    pytest.param({"attributes": {"x": 1}}, "domain.attributes", None, id="attributes-object"),
    pytest.param(attrs(), "domain.attributes", None, id="empty-attribute-list"),
    pytest.param(attrs(integer(), S), "domain.attributes[1]", S, id="attribute-not-object"),
    # missing keys
    pytest.param(
        attrs(integer(), {"type": "integer", "low": 0, "high": 1}),
        "domain.attributes[1].name",
        None,
        id="missing-name",
    ),
    pytest.param(
        attrs(integer(), {"name": "x", "low": 0, "high": 1}),
        "domain.attributes[1].type",
        None,
        id="missing-type",
    ),
    pytest.param(
        attrs(integer(), {"name": "x", "type": "integer", "high": 1}),
        "domain.attributes[1].low",
        None,
        id="missing-low-integer",
    ),
    pytest.param(
        attrs(integer(), {"name": "x", "type": "integer", "low": 0}),
        "domain.attributes[1].high",
        None,
        id="missing-high-integer",
    ),
    pytest.param(
        attrs({"name": "x", "type": "real", "low": 0}),
        "domain.attributes[0].high",
        None,
        id="missing-high-real",
    ),
    pytest.param(
        attrs(integer(), {"name": "x", "type": "categorical"}),
        "domain.attributes[1].values",
        None,
        id="missing-values",
    ),
    # unknown types and keys
    pytest.param(
        attrs(integer(), {"name": "x", "type": S, "low": 0, "high": 1}),
        "domain.attributes[1].type",
        S,
        id="unknown-type",
    ),
    pytest.param(
        attrs({"name": "x", "type": "float", "low": 0, "high": 1}),
        "domain.attributes[0].type",
        None,
        id="unknown-type-float",
    ),
    pytest.param(
        attrs({"name": "x", "type": ["integer"], "low": 0, "high": 1}),
        "domain.attributes[0].type",
        None,
        id="type-is-array",
    ),
    pytest.param(
        attrs({"name": "x", "type": {"k": "integer"}, "low": 0, "high": 1}),
        "domain.attributes[0].type",
        None,
        id="type-is-object",
    ),
    pytest.param(
        attrs(integer(), integer("j", **{KEY: N})),
        f"domain.attributes[1].{KEY}",
        N,
        id="unknown-attribute-key",
    ),
    pytest.param(
        attrs(categorical(low=0)),
        "domain.attributes[0].low",
        None,
        id="categorical-with-low",
    ),
    pytest.param(
        attrs(integer(values=["a"])),
        "domain.attributes[0].values",
        None,
        id="integer-with-values",
    ),
    # names
    pytest.param(attrs(integer(name="")), "domain.attributes[0].name", None, id="empty-name"),
    pytest.param(attrs(integer(name=NI)), "domain.attributes[0].name", NI, id="name-not-string"),
    pytest.param(attrs(integer(name="n" * 129)), "domain.attributes[0].name", None, id="long-name"),
    pytest.param(
        attrs(integer(S), real("r"), categorical(S)),
        "domain.attributes[2].name",
        S,
        id="duplicate-attribute-name",
    ),
    # integer ranges
    pytest.param(
        attrs(real(), integer(low=NI, high=3)),
        "domain.attributes[1].high",
        NI,
        id="integer-low-above-high",
    ),
    pytest.param(
        attrs(integer(low=1.5, high=3)), "domain.attributes[0].low", None, id="integer-low-fraction"
    ),
    pytest.param(
        attrs(integer(low=0, high=N)), "domain.attributes[0].high", N, id="integer-high-fraction"
    ),
    pytest.param(
        attrs(integer(low=True, high=3)), "domain.attributes[0].low", None, id="integer-low-bool"
    ),
    pytest.param(
        attrs(integer(low=0, high=False)),
        "domain.attributes[0].high",
        None,
        id="integer-high-bool",
    ),
    pytest.param(
        attrs(integer(low=S, high=3)), "domain.attributes[0].low", S, id="integer-low-string"
    ),
    pytest.param(
        attrs(integer(low=NAN, high=3)), "domain.attributes[0].low", None, id="integer-low-nan"
    ),
    pytest.param(
        attrs(integer(low=0, high=INF)), "domain.attributes[0].high", None, id="integer-high-inf"
    ),
    pytest.param(
        attrs(integer(low=0, high=2**60)), "domain.attributes[0].high", 2**60, id="integer-huge"
    ),
    pytest.param(
        attrs(integer(low=None, high=3)), "domain.attributes[0].low", None, id="integer-low-null"
    ),
    # real ranges
    pytest.param(
        attrs(integer(), real(low=N, high=N)),
        "domain.attributes[1].high",
        N,
        id="real-high-equals-low",
    ),
    pytest.param(
        attrs(real(low=N, high=-N)), "domain.attributes[0].high", N, id="real-high-below-low"
    ),
    pytest.param(attrs(real(low=NAN, high=1.0)), "domain.attributes[0].low", None, id="real-nan"),
    pytest.param(attrs(real(low=0.0, high=INF)), "domain.attributes[0].high", None, id="real-inf"),
    pytest.param(
        attrs(real(low=-INF, high=1.0)), "domain.attributes[0].low", None, id="real-minus-inf"
    ),
    pytest.param(
        attrs(real(low=0.0, high=10**400)),
        "domain.attributes[0].high",
        None,
        id="real-high-overflows",
    ),
    pytest.param(attrs(real(low=True, high=2.0)), "domain.attributes[0].low", None, id="real-bool"),
    pytest.param(attrs(real(low=S, high=2.0)), "domain.attributes[0].low", S, id="real-string"),
    # categorical values
    pytest.param(
        attrs(categorical(values=[])), "domain.attributes[0].values", None, id="no-values"
    ),
    pytest.param(
        {"attributes": [{"name": "c", "type": "categorical", "values": S}]},
        "domain.attributes[0].values",
        S,
        id="values-not-array",
    ),
    pytest.param(
        attrs(integer(), categorical(values=["a", S, "b", S])),
        "domain.attributes[1].values[3]",
        S,
        id="duplicate-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=[NI, NI])),
        "domain.attributes[0].values[1]",
        NI,
        id="duplicate-integer-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=["a", True])),
        "domain.attributes[0].values[1]",
        None,
        id="bool-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=["a", N])),
        "domain.attributes[0].values[1]",
        N,
        id="float-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=["a", None])),
        "domain.attributes[0].values[1]",
        None,
        id="null-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=[["a"]])),
        "domain.attributes[0].values[0]",
        None,
        id="nested-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=["", "a"])),
        "domain.attributes[0].values[0]",
        None,
        id="empty-categorical-value",
    ),
    pytest.param(
        attrs(categorical(values=["a", "v" * 257])),
        "domain.attributes[0].values[1]",
        None,
        id="long-categorical-value",
    ),
]


@pytest.mark.parametrize(("raw", "field", "sentinel"), BAD_DOMAINS)
def test_bad_domain_is_rejected_naming_the_field(raw: Any, field: str, sentinel: Any) -> None:
    expect_error(lambda: parse_domain(raw), field, sentinel)


@pytest.mark.parametrize(
    ("raw", "limits", "field"),
    [
        pytest.param(
            FINITE, EngineLimits(max_points=FINITE_SIZE - 1), "domain.attributes", id="points"
        ),
        pytest.param(FINITE, EngineLimits(max_attributes=2), "domain.attributes", id="attributes"),
        pytest.param(
            FINITE, EngineLimits(max_values_per_attribute=4), "domain.attributes[2].high", id="int"
        ),
        pytest.param(
            FINITE,
            EngineLimits(max_values_per_attribute=2),
            "domain.attributes[1].values",
            id="cat",
        ),
        pytest.param(
            attrs(*(integer(f"a{i}", 0, 0) for i in range(65))),
            EngineLimits(),
            "domain.attributes",
            id="default-max-attributes",
        ),
        pytest.param(
            attrs(integer("a", 0, 9999), integer("b", 0, 9999)),
            EngineLimits(),
            "domain.attributes",
            id="default-max-points",
        ),
    ],
)
def test_domain_limits(raw: Any, limits: EngineLimits, field: str) -> None:
    expect_error(lambda: parse_domain(copy.deepcopy(raw), limits=limits), field)


def test_domain_limits_are_inclusive() -> None:
    limits = EngineLimits(max_points=FINITE_SIZE, max_attributes=3, max_values_per_attribute=5)
    assert parse_domain(copy.deepcopy(FINITE), limits=limits).size == FINITE_SIZE


def test_domain_field_prefix_is_the_given_path() -> None:
    expect_error(
        lambda: parse_domain(attrs(integer(low=3, high=2)), "objects[4].domain"),
        "objects[4].domain.attributes[0].high",
    )


def test_continuous_domain_points_are_not_limited() -> None:
    domain = parse_domain(
        attrs(real("x", 0, 1), integer("a", 0, 9999), integer("b", 0, 9999)),
        limits=EngineLimits(max_points=10),
    )
    assert not domain.is_finite


# =============================================================================================
# Values
# =============================================================================================
BAD_VALUES = [
    pytest.param("finite", S, "value", S, id="not-object"),
    pytest.param("finite", {"sex": 1, "disease": "flu"}, "value.level", None, id="missing"),
    pytest.param(
        "finite",
        {"sex": 1, "disease": "flu", "level": 2, KEY: S},
        f"value.{KEY}",
        S,
        id="unknown-attribute",
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": "flu", "level": NI}, "value.level", NI, id="int-above"
    ),
    pytest.param(
        "finite", {"sex": -NI, "disease": "flu", "level": 0}, "value.sex", NI, id="int-below"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": S, "level": 2}, "value.disease", S, id="unknown-category"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": True, "level": 2}, "value.disease", None, id="bool-category"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": ["flu"], "level": 2}, "value.disease", None, id="list-cat"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": "flu", "level": 2.5}, "value.level", None, id="fraction"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": "flu", "level": "2"}, "value.level", None, id="int-string"
    ),
    pytest.param(
        "finite", {"sex": True, "disease": "flu", "level": 2}, "value.sex", None, id="int-bool"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": "flu", "level": NAN}, "value.level", None, id="int-nan"
    ),
    pytest.param(
        "finite", {"sex": 1, "disease": "flu", "level": None}, "value.level", None, id="int-null"
    ),
    pytest.param(
        "continuous", {"age": NAN, "sex": 1, "disease": "flu"}, "value.age", None, id="real-nan"
    ),
    pytest.param(
        "continuous", {"age": INF, "sex": 1, "disease": "flu"}, "value.age", None, id="real-inf"
    ),
    pytest.param(
        "continuous", {"age": N, "sex": 1, "disease": "flu"}, "value.age", N, id="real-above"
    ),
    pytest.param(
        "continuous", {"age": 9.5, "sex": 1, "disease": "flu"}, "value.age", 9.5, id="real-below"
    ),
    pytest.param(
        "continuous", {"age": True, "sex": 1, "disease": "flu"}, "value.age", None, id="real-bool"
    ),
    pytest.param(
        "continuous", {"age": S, "sex": 1, "disease": "flu"}, "value.age", S, id="real-string"
    ),
]


@pytest.mark.parametrize(("domain", "raw", "field", "sentinel"), BAD_VALUES)
def test_bad_value_is_rejected_naming_the_field(
    domain: str, raw: Any, field: str, sentinel: Any
) -> None:
    d = domain_of(domain)
    expect_error(lambda: d.parse_value(raw), field, sentinel)


def test_value_field_prefix_is_the_given_path() -> None:
    d = domain_of("finite")
    expect_error(
        lambda: d.parse_value({"sex": 1, "disease": "flu", "level": 9}, "object.value"),
        "object.value.level",
    )


def test_valid_values_are_canonicalised() -> None:
    d = domain_of("finite")
    assert d.parse_value({"level": 2.0, "disease": "covid", "sex": 0}) == {
        "sex": 0,
        "disease": "covid",
        "level": 2,
    }
    value = d.parse_value({"sex": 1, "disease": "none", "level": 4.0})
    assert type(value["level"]) is int
    c = domain_of("continuous")
    assert c.parse_value({"age": 10, "sex": 1, "disease": "flu"}) == {
        "age": 10.0,
        "sex": 1,
        "disease": "flu",
    }
    assert c.parse_value({"age": 100.0, "sex": 0, "disease": "none"})["age"] == 100.0


# =============================================================================================
# Queries
# =============================================================================================
def _epsilon_cases() -> list[Any]:
    bad = [
        (0, None, "zero"),
        (0.0, None, "zero-float"),
        (-N, N, "negative"),
        (NAN, None, "nan"),
        (INF, None, "inf"),
        (-INF, None, "minus-inf"),
        (True, None, "bool"),
        (S, S, "string"),
        ("1.0", None, "numeric-string"),
        (None, None, "null"),
        ([1.0], None, "list"),
        (N, N, "above-max"),
        (100.000001, None, "just-above-max"),
        (10**400, None, "overflowing-int"),
    ]
    return [
        pytest.param(name, eps, sentinel, id=f"{name}-{label}")
        for name in BASES
        for eps, sentinel, label in bad
    ]


@pytest.mark.parametrize(("mechanism", "epsilon", "sentinel"), _epsilon_cases())
def test_bad_epsilon_is_rejected(mechanism: str, epsilon: Any, sentinel: Any) -> None:
    d = domain_of("finite")
    raw = q(BASES[mechanism], epsilon=epsilon)
    expect_error(lambda: parse_query(raw, d), "query.epsilon", sentinel)


def test_epsilon_above_a_configured_max_is_rejected() -> None:
    limits = EngineLimits(max_epsilon=0.75)
    d = domain_of("finite")
    for name, base in BASES.items():
        if name == "matrix":
            continue
        expect_error(
            lambda b=base: parse_query(q(b, epsilon=0.8), d, limits=limits), "query.epsilon"
        )
        assert parse_query(q(base, epsilon=0.75), d, limits=limits).declared_epsilon == 0.75


@pytest.mark.parametrize(
    ("mechanism", "key"),
    [pytest.param(m, k, id=f"{m}-{k}") for m, keys in REQUIRED.items() for k in keys],
)
def test_missing_query_field(mechanism: str, key: str) -> None:
    d = domain_of("finite")
    expect_error(lambda: parse_query(q(BASES[mechanism], **{key: ...}), d), f"query.{key}")


@pytest.mark.parametrize("mechanism", list(BASES))
def test_unknown_query_field(mechanism: str) -> None:
    d = domain_of("finite")
    raw = q(BASES[mechanism], **{KEY: N})
    expect_error(lambda: parse_query(raw, d), f"query.{KEY}", N)


@pytest.mark.parametrize(
    ("mechanism", "key"),
    [
        ("grr", "variant"),
        ("grr", "predicate"),
        ("binary_rr", "attribute"),
        ("unary_encoding", "outputs"),
        ("matrix", "attribute"),
        ("linear", "variant"),
        ("logistic", "range"),
        ("logistic", "truncate"),
    ],
)
def test_field_of_another_mechanism_is_unknown(mechanism: str, key: str) -> None:
    d = domain_of("finite")
    raw = q(BASES[mechanism], **{key: copy.deepcopy({**LINEAR, **BRR, **UE, **MATRIX}[key])})
    expect_error(lambda: parse_query(raw, d), f"query.{key}")


BAD_QUERIES = [
    # mechanism
    pytest.param("finite", S, "query", S, id="query-not-object"),
    pytest.param("finite", q(GRR, mechanism=S), "query.mechanism", S, id="unknown-mechanism"),
    pytest.param("finite", q(GRR, mechanism="GRR"), "query.mechanism", None, id="mechanism-case"),
    pytest.param("finite", q(GRR, mechanism=["grr"]), "query.mechanism", None, id="mech-list"),
    pytest.param("finite", q(GRR, mechanism=...), "query.mechanism", None, id="missing-mechanism"),
    # grr
    pytest.param("finite", q(GRR, attribute=S), "query.attribute", S, id="grr-unknown-attr"),
    pytest.param("finite", q(GRR, attribute=NI), "query.attribute", NI, id="grr-attr-not-str"),
    pytest.param("finite", q(GRR, attribute=["sex"]), "query.attribute", None, id="grr-attr-list"),
    pytest.param("continuous", q(GRR, attribute="age"), "query.attribute", None, id="grr-real"),
    # unary encoding
    pytest.param("finite", q(UE, attribute=S), "query.attribute", S, id="ue-unknown-attr"),
    pytest.param("continuous", q(UE, attribute="age"), "query.attribute", None, id="ue-real"),
    pytest.param("finite", q(UE, variant=S), "query.variant", S, id="ue-unknown-variant"),
    pytest.param("finite", q(UE, variant="Optimized"), "query.variant", None, id="ue-variant-case"),
    pytest.param("finite", q(UE, variant=None), "query.variant", None, id="ue-variant-null"),
    pytest.param("finite", q(UE, variant=["symmetric"]), "query.variant", None, id="ue-var-list"),
    # binary_rr predicates
    pytest.param("finite", brr(S), "query.predicate", S, id="predicate-not-object"),
    pytest.param("finite", brr(pred(S, "==", 1)), "query.predicate.attribute", S, id="pred-attr"),
    pytest.param(
        "finite", brr(pred(NI, "==", 1)), "query.predicate.attribute", NI, id="pred-attr-not-str"
    ),
    pytest.param("finite", brr(pred("level", S, 1)), "query.predicate.op", S, id="unknown-op"),
    pytest.param("finite", brr(pred("level", "=", 1)), "query.predicate.op", None, id="op-="),
    pytest.param("finite", brr(pred("level", "not in", [1])), "query.predicate.op", None, id="nin"),
    pytest.param("finite", brr(pred("level", ["=="], 1)), "query.predicate.op", None, id="op-list"),
    pytest.param("finite", brr(pred("level", None, 1)), "query.predicate.op", None, id="op-null"),
    *(
        pytest.param(
            "finite",
            brr(pred("disease", op, "flu")),
            "query.predicate.op",
            None,
            id=f"order-op-{op}-on-categorical",
        )
        for op in ("<", "<=", ">", ">=")
    ),
    pytest.param(
        "finite", brr(pred("disease", "==", S)), "query.predicate.value", S, id="pred-unknown-cat"
    ),
    pytest.param(
        "finite", brr(pred("disease", "!=", S)), "query.predicate.value", S, id="pred-ne-unknown"
    ),
    pytest.param(
        "finite",
        brr(pred("disease", "in", ["flu", S])),
        "query.predicate.value[1]",
        S,
        id="pred-in-unknown-cat",
    ),
    pytest.param(
        "finite", brr(pred("disease", "in", "flu")), "query.predicate.value", None, id="in-not-list"
    ),
    pytest.param(
        "finite", brr(pred("disease", "in", [])), "query.predicate.value", None, id="in-0"
    ),
    pytest.param(
        "finite", brr(pred("disease", "==", True)), "query.predicate.value", None, id="cat-bool"
    ),
    pytest.param(
        "finite", brr(pred("level", "==", True)), "query.predicate.value", None, id="int-bool"
    ),
    pytest.param(
        "finite", brr(pred("level", "<", NAN)), "query.predicate.value", None, id="pred-nan"
    ),
    pytest.param(
        "finite", brr(pred("level", "<", INF)), "query.predicate.value", None, id="pred-inf"
    ),
    pytest.param(
        "finite", brr(pred("level", ">", S)), "query.predicate.value", S, id="pred-num-string"
    ),
    pytest.param(
        "continuous",
        brr(pred("age", "in", [20, S])),
        "query.predicate.value[1]",
        S,
        id="pred-in-real-string",
    ),
    pytest.param(
        "finite",
        brr({"attribute": "level", "op": "=="}),
        "query.predicate.value",
        None,
        id="pred-missing-value",
    ),
    pytest.param(
        "finite",
        brr({"attribute": "level", "value": 1}),
        "query.predicate.op",
        None,
        id="pred-missing-op",
    ),
    pytest.param(
        "finite",
        brr({"op": "==", "value": 1}),
        "query.predicate.attribute",
        None,
        id="pred-missing-attribute",
    ),
    pytest.param(
        "finite",
        brr({**pred("level", "==", 1), KEY: N}),
        f"query.predicate.{KEY}",
        N,
        id="pred-unknown-key",
    ),
    # matrix
    pytest.param(
        "finite",
        q(MATRIX, probabilities=rows(FINITE_SIZE - 1)),
        "query.probabilities",
        None,
        id="matrix-too-few-rows",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=rows(FINITE_SIZE + 1)),
        "query.probabilities",
        None,
        id="matrix-too-many-rows",
    ),
    pytest.param(
        "finite", q(MATRIX, probabilities=S), "query.probabilities", S, id="matrix-not-array"
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(3, [0.25, 0.25, 0.5])),
        "query.probabilities[3]",
        None,
        id="matrix-long-row",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(7, [1.0])),
        "query.probabilities[7]",
        None,
        id="matrix-short-row",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(7, S)),
        "query.probabilities[7]",
        S,
        id="matrix-row-not-array",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(4, [1 + N, -N])),
        "query.probabilities[4][1]",
        N,
        id="matrix-negative",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(5, [NAN, 0.5])),
        "query.probabilities[5][0]",
        None,
        id="matrix-nan",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(5, [0.5, INF])),
        "query.probabilities[5][1]",
        None,
        id="matrix-inf",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(2, [S, 0.5])),
        "query.probabilities[2][0]",
        S,
        id="matrix-string-entry",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(2, ["0.5", "0.5"])),
        "query.probabilities[2][0]",
        None,
        id="matrix-numeric-string-entry",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(1, [False, True])),
        "query.probabilities[1][0]",
        None,
        id="matrix-bool-entry",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(1, [None, 1.0])),
        "query.probabilities[1][0]",
        None,
        id="matrix-null-entry",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(1, [[0.5], 0.5])),
        "query.probabilities[1][0]",
        None,
        id="matrix-nested-entry",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(6, [0.5, 0.6])),
        "query.probabilities[6]",
        None,
        id="matrix-row-sum-above-1",
    ),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(9, [0.25, 0.5])),
        "query.probabilities[9]",
        None,
        id="matrix-row-sum-below-1",
    ),
    pytest.param(
        "finite", q(MATRIX, outputs=[S, S]), "query.outputs[1]", S, id="matrix-duplicate-output"
    ),
    pytest.param(
        "finite", q(MATRIX, outputs=[1, 1.0]), "query.outputs[1]", None, id="matrix-dup-1-1.0"
    ),
    pytest.param("finite", q(MATRIX, outputs=[0, True]), "query.outputs[1]", None, id="out-bool"),
    pytest.param("finite", q(MATRIX, outputs=[0, NAN]), "query.outputs[1]", None, id="out-nan"),
    pytest.param("finite", q(MATRIX, outputs=[0, None]), "query.outputs[1]", None, id="out-null"),
    pytest.param("finite", q(MATRIX, outputs=[[0], 1]), "query.outputs[0]", None, id="out-list"),
    pytest.param("finite", q(MATRIX, outputs=[]), "query.outputs", None, id="outputs-empty"),
    pytest.param("finite", q(MATRIX, outputs=S), "query.outputs", S, id="outputs-not-array"),
    pytest.param(
        "finite",
        q(MATRIX, probabilities=with_row(0, [1.0, 0.0])),
        "query.outputs[1]",
        None,
        id="matrix-partly-zero-column",
    ),
    pytest.param(
        "finite",
        q(
            MATRIX,
            outputs=["a", "b", "c"],
            probabilities=[[0.5, 0.5, 0.0]] * (FINITE_SIZE - 1) + [[0.5, 0.0, 0.5]],
        ),
        "query.outputs[1]",
        None,
        id="matrix-partly-zero-column-among-three",
    ),
    pytest.param(
        "finite",
        q(MATRIX, epsilon=0.987654321),
        "query.epsilon",
        0.987654321,
        id="matrix-declared-epsilon-below-real",
    ),
    pytest.param(
        "finite",
        q(MATRIX, epsilon=1.0986),  # log 3 = 1.09861228...
        "query.epsilon",
        None,
        id="matrix-declared-epsilon-just-below-real",
    ),
    pytest.param(
        "finite",
        q(
            MATRIX,
            epsilon=...,
            probabilities=[
                [1e-300, 1 - 1e-300] if i % 2 else [1 - 1e-300, 1e-300] for i in range(FINITE_SIZE)
            ],
        ),
        "query.probabilities",
        None,
        id="matrix-computed-epsilon-above-max",
    ),
    pytest.param(
        "continuous",
        q(MATRIX, probabilities=[[0.5, 0.5]]),
        "query.mechanism",
        None,
        id="matrix-on-continuous-domain",
    ),
    # linear
    pytest.param("finite", q(LINEAR, weights=S), "query.weights", S, id="lin-weights-not-object"),
    pytest.param(
        "finite", q(LINEAR, weights=[["level", 1]]), "query.weights", None, id="lin-weights-list"
    ),
    pytest.param(
        "finite",
        q(LINEAR, weights={"level": 0.5, "disease": N}),
        "query.weights.disease",
        N,
        id="lin-weight-on-categorical",
    ),
    pytest.param(
        "finite",
        q(LINEAR, weights={"level": 0.5, S: 1.0}),
        f"query.weights.{S}",
        S,
        id="lin-unknown-weight-attribute",
    ),
    pytest.param(
        "finite", q(LINEAR, weights={"level": NAN}), "query.weights.level", None, id="lin-w-nan"
    ),
    pytest.param(
        "finite", q(LINEAR, weights={"level": True}), "query.weights.level", None, id="lin-w-bool"
    ),
    pytest.param(
        "finite", q(LINEAR, weights={"level": S}), "query.weights.level", S, id="lin-w-string"
    ),
    pytest.param("finite", q(LINEAR, intercept=NAN), "query.intercept", None, id="lin-c-nan"),
    pytest.param("finite", q(LINEAR, intercept=S), "query.intercept", S, id="lin-c-string"),
    pytest.param("finite", q(LINEAR, intercept=False), "query.intercept", None, id="lin-c-bool"),
    pytest.param("finite", q(LINEAR, range=[2, 2]), "query.range[1]", None, id="range-b-eq-a"),
    pytest.param("finite", q(LINEAR, range=[N, -N]), "query.range[1]", N, id="range-b-lt-a"),
    pytest.param("finite", q(LINEAR, range=[0]), "query.range", None, id="range-length-1"),
    pytest.param("finite", q(LINEAR, range=[-1, 2, 3]), "query.range", None, id="range-length-3"),
    pytest.param("finite", q(LINEAR, range=[]), "query.range", None, id="range-empty"),
    pytest.param("finite", q(LINEAR, range=S), "query.range", S, id="range-not-array"),
    pytest.param("finite", q(LINEAR, range=[NAN, 2]), "query.range[0]", None, id="range-nan"),
    pytest.param("finite", q(LINEAR, range=[-1, INF]), "query.range[1]", None, id="range-inf"),
    pytest.param("finite", q(LINEAR, range=[True, 2]), "query.range[0]", None, id="range-bool"),
    pytest.param("finite", q(LINEAR, range=[-1, S]), "query.range[1]", S, id="range-string"),
    pytest.param("finite", q(LINEAR, truncate=S), "query.truncate", S, id="truncate-string"),
    pytest.param("finite", q(LINEAR, truncate=1), "query.truncate", None, id="truncate-1"),
    pytest.param("finite", q(LINEAR, truncate=None), "query.truncate", None, id="truncate-null"),
    pytest.param("finite", q(LINEAR, truncate="true"), "query.truncate", None, id="truncate-str"),
    pytest.param(
        "continuous",
        q(LINEAR, weights={"age": 1.0, "disease": 1.0}, range=[0, 200]),
        "query.weights.disease",
        None,
        id="lin-weight-on-categorical-continuous",
    ),
    # logistic
    pytest.param("finite", q(LOGISTIC, weights=S), "query.weights", S, id="log-weights-not-obj"),
    pytest.param(
        "finite",
        q(LOGISTIC, weights={"disease": N}),
        "query.weights.disease",
        N,
        id="log-weight-on-categorical",
    ),
    pytest.param(
        "finite",
        q(LOGISTIC, weights={"level": 0.3, S: 1.0}),
        f"query.weights.{S}",
        S,
        id="log-unknown-weight-attribute",
    ),
    pytest.param(
        "finite", q(LOGISTIC, weights={"level": INF}), "query.weights.level", None, id="log-w-inf"
    ),
    pytest.param(
        "finite", q(LOGISTIC, weights={"level": False}), "query.weights.level", None, id="log-bool"
    ),
    pytest.param(
        "finite", q(LOGISTIC, weights={"level": S}), "query.weights.level", S, id="log-w-string"
    ),
    pytest.param("finite", q(LOGISTIC, intercept=INF), "query.intercept", None, id="log-c-inf"),
    pytest.param("finite", q(LOGISTIC, intercept=S), "query.intercept", S, id="log-c-string"),
]


@pytest.mark.parametrize(("domain", "raw", "field", "sentinel"), BAD_QUERIES)
def test_bad_query_is_rejected_naming_the_field(
    domain: str, raw: Any, field: str, sentinel: Any
) -> None:
    d = domain_of(domain)
    expect_error(lambda: parse_query(raw, d), field, sentinel)


@pytest.mark.parametrize(
    ("raw", "limits", "field"),
    [
        pytest.param(
            MATRIX,
            EngineLimits(max_matrix_entries=2 * FINITE_SIZE - 1),
            "query.probabilities",
            id="matrix-entries",
        ),
        pytest.param(MATRIX, EngineLimits(max_outputs=1), "query.outputs", id="matrix-outputs"),
        pytest.param(UE, EngineLimits(max_outputs=2), "query.attribute", id="ue-bits"),
    ],
)
def test_query_limits(raw: Any, limits: EngineLimits, field: str) -> None:
    d = domain_of("finite")
    expect_error(lambda: parse_query(copy.deepcopy(raw), d, limits=limits), field)


def test_matrix_entry_limit_is_inclusive() -> None:
    d = domain_of("finite")
    limits = EngineLimits(max_matrix_entries=2 * FINITE_SIZE, max_outputs=2)
    assert parse_query(copy.deepcopy(MATRIX), d, limits=limits).output_count == 2


@pytest.mark.parametrize(
    ("weights", "intercept", "range_", "reached"),
    [
        # level in 0..4: 3*level + 7 reaches [7, 19]
        pytest.param({"level": 3.0}, 7.0, [8, 19], ("7", "19"), id="below-a"),
        pytest.param({"level": 3.0}, 7.0, [7, 18], ("7", "19"), id="above-b"),
        # -2.5*level - 1.25*sex + 0.5 reaches [-10.75, 0.5]
        pytest.param(
            {"level": -2.5, "sex": -1.25}, 0.5, [-10, 1], ("-10.75", "0.5"), id="negative-weights"
        ),
    ],
)
def test_linear_leaving_its_range_names_min_and_max(
    weights: dict[str, float], intercept: float, range_: list[float], reached: tuple[str, str]
) -> None:
    d = domain_of("finite")
    raw = q(LINEAR, weights=weights, intercept=intercept, range=range_)
    err = expect_error(lambda: parse_query(raw, d), "query.range")
    message = err.message  # type: ignore[attr-defined]
    low, high = reached
    assert low in message
    assert high in message
    assert message.index(low) < message.rindex(high)
    # the same query with truncate is fine, and so is one whose range is met exactly
    assert parse_query(q(raw, truncate=True), d).to_json()["truncate"] is True
    exact = [float(low), float(high)]
    assert parse_query(q(raw, range=exact), d).to_json()["range"] == exact


def test_linear_leaving_its_range_on_a_continuous_domain() -> None:
    d = domain_of("continuous")
    # age in [10, 100]: 1.5 * age - 3.3 reaches [11.7, 146.7]
    raw = q(LINEAR, weights={"age": 1.5}, intercept=-3.3, range=[0, 100])
    err = expect_error(lambda: parse_query(raw, d), "query.range")
    assert "11.7" in err.message  # type: ignore[attr-defined]
    assert "146.7" in err.message  # type: ignore[attr-defined]


@pytest.mark.parametrize("where", ["history", "candidate"])
@pytest.mark.parametrize("mechanism", ["linear", "logistic"])
def test_overflowing_weights_never_give_nan_losses(mechanism: str, where: str) -> None:
    """Σ w·x overflowing to ±inf (inf - inf = NaN) must be rejected or handled soundly."""
    domain = attrs(integer("a", 0, 3), integer("b", 0, 3))
    query: dict[str, Any] = {"mechanism": mechanism, "weights": {"a": 1e308, "b": -1e308}}
    query["epsilon"] = 1.0
    if mechanism == "linear":
        query |= {"range": [0, 1], "truncate": True}
    if where == "history":
        request: dict[str, Any] = {"domain": domain, "history": [{"query": query, "output": 1}]}
        prefix = "history[0].query.weights"
    else:
        request = {"domain": domain, "history": [], "budget": 0.5, "candidate": query}
        prefix = "candidate.weights"
    rejected: InvalidInput | None = None
    answer: dict[str, Any] = {}
    try:
        answer = compute_loss(request)
    except InvalidInput as err:
        rejected = err
    if rejected is not None:
        assert rejected.field.startswith(prefix)
        return
    bounds = [answer["realized_loss"]["lower"], answer["realized_loss"]["upper"]]
    if where == "candidate":
        bounds += [answer["candidate"]["worst_case_upper"]]
        bounds += [o["upper"] for o in answer["candidate"]["per_output"]]
        # the query's tight epsilon is 1 > budget 0.5 and basic composition would reject it
        assert answer["candidate"]["accepted"]["basic"] is False
    assert all(math.isfinite(b) for b in bounds), bounds
    assert bounds[0] <= bounds[1]


# =============================================================================================
# History outputs and calculator requests
# =============================================================================================
def history_request(mechanism: str, output: Any, domain: str = "finite") -> dict[str, Any]:
    base = BASES[mechanism]
    return {
        "domain": copy.deepcopy(DOMAINS[domain]),
        "history": [
            {"query": copy.deepcopy(base), "output": copy.deepcopy(VALID_OUTPUTS[mechanism])},
            {"query": copy.deepcopy(base), "output": output},
        ],
    }


BAD_OUTPUTS = [
    # grr over the categorical "disease"
    pytest.param("grr", S, "history[1].output", S, id="grr-unknown-category"),
    pytest.param("grr", True, "history[1].output", None, id="grr-bool"),
    pytest.param("grr", ["flu"], "history[1].output", None, id="grr-list"),
    pytest.param("grr", None, "history[1].output", None, id="grr-null"),
    pytest.param("grr", 1, "history[1].output", None, id="grr-index-not-value"),
    # binary_rr
    pytest.param("binary_rr", 2, "history[1].output", None, id="brr-2"),
    pytest.param("binary_rr", -1, "history[1].output", None, id="brr-minus-1"),
    pytest.param("binary_rr", NI, "history[1].output", NI, id="brr-sentinel"),
    pytest.param("binary_rr", True, "history[1].output", None, id="brr-bool"),
    pytest.param("binary_rr", "1", "history[1].output", None, id="brr-string"),
    pytest.param("binary_rr", 0.5, "history[1].output", None, id="brr-fraction"),
    pytest.param("binary_rr", NAN, "history[1].output", None, id="brr-nan"),
    pytest.param("binary_rr", [1], "history[1].output", None, id="brr-list"),
    # unary encoding over "disease" (3 bits)
    pytest.param("unary_encoding", [0, 1], "history[1].output", None, id="ue-short"),
    pytest.param("unary_encoding", [0, 1, 0, 1], "history[1].output", None, id="ue-long"),
    pytest.param("unary_encoding", [], "history[1].output", None, id="ue-empty"),
    pytest.param("unary_encoding", S, "history[1].output", S, id="ue-not-list"),
    pytest.param("unary_encoding", 1, "history[1].output", None, id="ue-scalar"),
    pytest.param("unary_encoding", [0, 2, 0], "history[1].output[1]", None, id="ue-bit-2"),
    pytest.param("unary_encoding", [0, 0, NI], "history[1].output[2]", NI, id="ue-bit-big"),
    pytest.param("unary_encoding", [0, 0, -1], "history[1].output[2]", None, id="ue-bit-neg"),
    pytest.param("unary_encoding", [0, True, 0], "history[1].output[1]", None, id="ue-bit-bool"),
    pytest.param("unary_encoding", ["1", 0, 0], "history[1].output[0]", None, id="ue-bit-str"),
    pytest.param("unary_encoding", [0, 0.5, 0], "history[1].output[1]", None, id="ue-bit-frac"),
    pytest.param("unary_encoding", [0, NAN, 0], "history[1].output[1]", None, id="ue-bit-nan"),
    # matrix
    pytest.param("matrix", S, "history[1].output", S, id="matrix-unknown"),
    pytest.param("matrix", 1, "history[1].output", None, id="matrix-index-not-output"),
    pytest.param("matrix", ["hi"], "history[1].output", None, id="matrix-list"),
    pytest.param("matrix", None, "history[1].output", None, id="matrix-null"),
    # linear: range [-1, 2]
    pytest.param("linear", N, "history[1].output", N, id="linear-not-a-or-b"),
    pytest.param("linear", 0, "history[1].output", None, id="linear-inside-range"),
    pytest.param("linear", "2", "history[1].output", None, id="linear-string"),
    pytest.param("linear", True, "history[1].output", None, id="linear-bool"),
    pytest.param("linear", NAN, "history[1].output", None, id="linear-nan"),
    # logistic
    pytest.param("logistic", 2, "history[1].output", None, id="logistic-2"),
    pytest.param("logistic", N, "history[1].output", N, id="logistic-sentinel"),
    pytest.param("logistic", 0.5, "history[1].output", None, id="logistic-fraction"),
    pytest.param("logistic", True, "history[1].output", None, id="logistic-bool"),
    pytest.param("logistic", "1", "history[1].output", None, id="logistic-string"),
    pytest.param("logistic", [0], "history[1].output", None, id="logistic-list"),
]


@pytest.mark.parametrize(("mechanism", "output", "field", "sentinel"), BAD_OUTPUTS)
def test_bad_history_output_is_rejected(
    mechanism: str, output: Any, field: str, sentinel: Any
) -> None:
    expect_error(lambda: compute_loss(history_request(mechanism, output)), field, sentinel)


def test_grr_output_out_of_integer_range() -> None:
    query = {"mechanism": "grr", "attribute": "level", "epsilon": 1.0}
    request = {
        "domain": copy.deepcopy(FINITE),
        "history": [{"query": query, "output": 4}, {"query": query, "output": NI}],
    }
    expect_error(lambda: compute_loss(request), "history[1].output", NI)
    request["history"][1]["output"] = 2.5  # type: ignore[index]
    expect_error(lambda: compute_loss(request), "history[1].output")


def test_matrix_output_that_can_never_occur_is_rejected() -> None:
    query = q(
        MATRIX,
        outputs=["lo", "hi", "never"],
        probabilities=[[*r, 0.0] for r in rows()],
        epsilon=...,
    )
    request = {
        "domain": copy.deepcopy(FINITE),
        "history": [{"query": query, "output": "lo"}, {"query": query, "output": "never"}],
    }
    expect_error(lambda: compute_loss(request), "history[1].output")


def _valid_history() -> list[dict[str, Any]]:
    return [
        {"query": copy.deepcopy(BASES[m]), "output": copy.deepcopy(VALID_OUTPUTS[m])}
        for m in ("grr", "binary_rr")
    ]


def _request(**changes: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "domain": copy.deepcopy(FINITE),
        "history": _valid_history(),
        "budget": 4.0,
        "candidate": copy.deepcopy(GRR),
        "options": {"tolerance": 1e-4},
    }
    for key, value in changes.items():
        if value is ...:
            request.pop(key, None)
        else:
            request[key] = value
    return request


def _history_with(bad_entry: Any) -> list[Any]:
    return [*_valid_history(), bad_entry]


BAD_REQUESTS = [
    pytest.param(_request(domain=...), "domain", None, InvalidInput, id="missing-domain"),
    pytest.param(_request(history=...), "history", None, InvalidInput, id="missing-history"),
    pytest.param(_request(**{KEY: N}), KEY, N, InvalidInput, id="unknown-top-level-key"),
    pytest.param(_request(value={"sex": 1}), "value", None, InvalidInput, id="value-not-accepted"),
    pytest.param(_request(history=S), "history", S, InvalidInput, id="history-not-array"),
    pytest.param(_request(history={}), "history", None, InvalidInput, id="history-object"),
    pytest.param(
        _request(history=_history_with(S)), "history[2]", S, InvalidInput, id="entry-not-object"
    ),
    pytest.param(
        _request(history=_history_with({"query": GRR})),
        "history[2].output",
        None,
        InvalidInput,
        id="entry-missing-output",
    ),
    pytest.param(
        _request(history=_history_with({"output": 1})),
        "history[2].query",
        None,
        InvalidInput,
        id="entry-missing-query",
    ),
    pytest.param(
        _request(history=_history_with({"query": GRR, "output": "flu", KEY: N})),
        f"history[2].{KEY}",
        N,
        InvalidInput,
        id="entry-unknown-key",
    ),
    pytest.param(
        _request(history=_history_with({"query": q(BRR, epsilon=N), "output": 1})),
        "history[2].query.epsilon",
        N,
        InvalidInput,
        id="history-epsilon",
    ),
    pytest.param(
        _request(history=_history_with({"query": q(GRR, mechanism=S), "output": 1})),
        "history[2].query.mechanism",
        S,
        InvalidInput,
        id="history-mechanism",
    ),
    pytest.param(
        _request(candidate=brr(pred("level", S, 1))),
        "candidate.predicate.op",
        S,
        InvalidInput,
        id="candidate-op",
    ),
    pytest.param(
        _request(candidate=q(UE, variant=S)), "candidate.variant", S, InvalidInput, id="cand-var"
    ),
    pytest.param(_request(candidate=S), "candidate", S, InvalidInput, id="candidate-not-object"),
    pytest.param(_request(budget=...), "budget", None, InvalidInput, id="candidate-no-budget"),
    pytest.param(_request(budget=0), "budget", None, InvalidInput, id="budget-zero"),
    pytest.param(_request(budget=-N), "budget", N, InvalidInput, id="budget-negative"),
    pytest.param(_request(budget=NAN), "budget", None, InvalidInput, id="budget-nan"),
    pytest.param(_request(budget=INF), "budget", None, InvalidInput, id="budget-inf"),
    pytest.param(_request(budget=True), "budget", None, InvalidInput, id="budget-bool"),
    pytest.param(_request(budget=S), "budget", S, InvalidInput, id="budget-string"),
    pytest.param(_request(budget=N * 10), "budget", N * 10, InvalidInput, id="budget-too-big"),
    pytest.param(
        _request(budget=0, candidate=...), "budget", None, InvalidInput, id="budget-0-no-cand"
    ),
    pytest.param(_request(options=S), "options", S, InvalidInput, id="options-not-object"),
    pytest.param(
        _request(options={KEY: N}), f"options.{KEY}", N, InvalidInput, id="options-unknown-key"
    ),
    *(
        pytest.param(
            _request(options={"tolerance": tol}),
            "options.tolerance",
            sentinel,
            InvalidInput,
            id=f"tolerance-{label}",
        )
        for tol, sentinel, label in [
            (0, None, "zero"),
            (-N, N, "negative"),
            (NAN, None, "nan"),
            (INF, None, "inf"),
            (True, None, "bool"),
            (S, S, "string"),
        ]
    ),
    pytest.param(
        _request(
            domain=copy.deepcopy(CONTINUOUS),
            history=[],
            candidate=q(GRR, attribute="sex"),
        ),
        "candidate",
        None,
        Unsupported,
        id="continuous-unsupported-candidate",
    ),
    pytest.param(
        _request(
            domain=copy.deepcopy(CONTINUOUS),
            history=[{"query": brr(pred("age", ">", 40)), "output": 1}],
            candidate=brr(pred("age", "<", 30)),
        ),
        "history[0].query",
        None,
        Unsupported,
        id="continuous-history-and-candidate",
    ),
    pytest.param(
        _request(domain=attrs(integer(low=2, high=1))),
        "domain.attributes[0].high",
        None,
        InvalidInput,
        id="bad-domain",
    ),
]


@pytest.mark.parametrize(("request_", "field", "sentinel", "exc_type"), BAD_REQUESTS)
def test_bad_calculator_request(
    request_: dict[str, Any], field: str, sentinel: Any, exc_type: type[Exception]
) -> None:
    expect_error(lambda: compute_loss(copy.deepcopy(request_)), field, sentinel, exc_type)


@pytest.mark.parametrize("request_", [[], S, None, 1.5])
def test_calculator_request_must_be_an_object(request_: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        compute_loss(request_)
    assert_not_echoed(info.value.message, request_)


def test_unsupported_is_not_an_invalid_input() -> None:
    assert not issubclass(Unsupported, InvalidInput)
    request = {
        "domain": copy.deepcopy(CONTINUOUS),
        "history": [],
        "budget": 1.0,
        "candidate": q(GRR, attribute="sex"),
    }
    err = expect_error(lambda: compute_loss(request), "candidate", exc_type=Unsupported)
    assert "not supported" in err.message  # type: ignore[attr-defined]
    # an empty history on a continuous domain is fine: nothing learned, loss 0
    empty = compute_loss({"domain": copy.deepcopy(CONTINUOUS), "history": []})
    assert empty["realized_loss"] == {"lower": 0.0, "upper": 0.0, "exact": True}


def test_history_length_limit() -> None:
    limits = EngineLimits(max_history=2)
    ok = {"domain": copy.deepcopy(FINITE), "history": _valid_history()}
    assert compute_loss(copy.deepcopy(ok), limits=limits)["realized_loss"]["lower"] >= 0.0
    too_long = {**ok, "history": [*_valid_history(), *_valid_history()[:1]]}
    expect_error(lambda: compute_loss(too_long, limits=limits), "history")


def test_calculator_passes_limits_to_domain_and_queries() -> None:
    request = {"domain": copy.deepcopy(FINITE), "history": _valid_history()}
    expect_error(
        lambda: compute_loss(request, limits=EngineLimits(max_points=FINITE_SIZE - 1)),
        "domain.attributes",
    )
    expect_error(
        lambda: compute_loss(request, limits=EngineLimits(max_epsilon=0.75)),
        "history[0].query.epsilon",
    )


# =============================================================================================
# Positive tests
# =============================================================================================
VALID_QUERIES = [
    *(pytest.param("finite", base, id=f"finite-{name}") for name, base in BASES.items()),
    pytest.param("finite", q(MATRIX, epsilon=...), id="finite-matrix-no-epsilon"),
    pytest.param(
        "finite",
        q(MATRIX, outputs=[0, 1.5, "z"], probabilities=[[0.5, 0.5, 0.0]] * FINITE_SIZE),
        id="finite-matrix-zero-column-mixed-outputs",
    ),
    pytest.param("finite", q(UE, variant=...), id="finite-ue-default-variant"),
    pytest.param("finite", q(UE, variant="optimized"), id="finite-ue-optimized"),
    pytest.param("finite", q(GRR, attribute="level", epsilon=100), id="finite-grr-max-epsilon"),
    pytest.param("finite", brr(pred("disease", "in", ["flu", "covid"])), id="finite-brr-in"),
    pytest.param("finite", brr(pred("disease", "!=", "none")), id="finite-brr-ne-cat"),
    pytest.param("finite", brr(pred("level", "<", 2.5)), id="finite-brr-lt-fraction"),
    pytest.param("finite", brr(pred("level", "in", [0, 4])), id="finite-brr-in-int"),
    pytest.param("finite", q(LINEAR, intercept=..., truncate=..., range=[0, 3]), id="lin-min"),
    pytest.param("finite", q(LINEAR, weights={}, intercept=0.5, range=[0, 1]), id="lin-no-weights"),
    pytest.param("finite", q(LINEAR, weights={"level": 10.0}, truncate=True), id="lin-truncate"),
    pytest.param("finite", q(LOGISTIC, intercept=...), id="logistic-no-intercept"),
    pytest.param("continuous", brr(pred("age", ">=", 40.5)), id="continuous-brr-real"),
    pytest.param("continuous", brr(pred("age", "in", [20, 30])), id="continuous-brr-in"),
    pytest.param("continuous", q(GRR, attribute="sex"), id="continuous-grr"),
    pytest.param("continuous", q(UE, attribute="disease"), id="continuous-ue"),
    pytest.param(
        "continuous",
        q(LINEAR, weights={"age": 0.01, "sex": -0.5}, intercept=0.0, range=[-0.5, 1.0]),
        id="continuous-linear",
    ),
    pytest.param(
        "continuous", q(LOGISTIC, weights={"age": -0.05}, intercept=2.0), id="continuous-logistic"
    ),
]


@pytest.mark.parametrize(("domain", "raw"), VALID_QUERIES)
def test_valid_query_parses_and_round_trips(domain: str, raw: dict[str, Any]) -> None:
    d = domain_of(domain)
    mechanism = parse_query(copy.deepcopy(raw), d)
    canonical = mechanism.to_json()
    assert canonical["mechanism"] == raw["mechanism"]
    assert type(mechanism) is MECHANISMS[raw["mechanism"]]
    again = parse_query(copy.deepcopy(canonical), d)
    assert again.to_json() == canonical
    assert again.epsilon == pytest.approx(mechanism.epsilon, rel=1e-12, abs=0.0)
    assert mechanism.epsilon >= 0.0
    if "epsilon" in raw:
        assert mechanism.epsilon <= raw["epsilon"] * (1 + 1e-9)


def test_canonical_json_fills_defaults() -> None:
    d = domain_of("finite")
    ue = parse_query(q(UE, variant=...), d).to_json()
    assert ue == {
        "mechanism": "unary_encoding",
        "attribute": "disease",
        "epsilon": 2.0,
        "variant": "optimized",
    }
    lin = parse_query(q(LINEAR, intercept=..., truncate=..., range=[0, 3]), d).to_json()
    assert lin["intercept"] == 0.0
    assert lin["truncate"] is False
    assert lin["range"] == [0, 3]
    assert lin["weights"] == {"level": 0.5, "sex": 1.0}


def test_matrix_tight_epsilon_is_computed() -> None:
    d = domain_of("finite")
    m = parse_query(q(MATRIX, epsilon=...), d)
    assert m.epsilon == pytest.approx(math.log(3), rel=1e-12)
    assert m.declared_epsilon is None
    assert "epsilon" not in m.to_json()
    declared = parse_query(q(MATRIX, epsilon=math.log(3)), d)
    assert declared.declared_epsilon == math.log(3)


@pytest.mark.parametrize("mechanism", list(BASES))
def test_valid_outputs_of_every_mechanism(mechanism: str) -> None:
    answer = compute_loss(history_request(mechanism, copy.deepcopy(VALID_OUTPUTS[mechanism])))
    lower, upper = answer["realized_loss"]["lower"], answer["realized_loss"]["upper"]
    assert math.isfinite(lower)
    assert math.isfinite(upper)
    assert 0.0 <= lower <= upper
    tight = parse_query(copy.deepcopy(BASES[mechanism]), domain_of("finite")).epsilon
    assert answer["basic_composition"] == pytest.approx(2 * tight, rel=1e-9)
    assert upper <= 2 * tight + 1e-9


@pytest.mark.parametrize(
    ("mechanism", "output"),
    [
        ("grr", "none"),
        ("binary_rr", 0),
        ("binary_rr", 1.0),
        ("unary_encoding", [0, 0, 0]),
        ("unary_encoding", [1.0, 1, 1]),
        ("matrix", "lo"),
        ("linear", -1),
        ("linear", 2.0),
        ("logistic", 1),
    ],
)
def test_other_valid_outputs(mechanism: str, output: Any) -> None:
    answer = compute_loss(history_request(mechanism, output))
    assert answer["realized_loss"]["lower"] <= answer["realized_loss"]["upper"]


def test_valid_domains_round_trip() -> None:
    for raw in (FINITE, CONTINUOUS):
        d = parse_domain(copy.deepcopy(raw))
        assert d.to_json() == raw
        assert parse_domain(d.to_json()).to_json() == d.to_json()
    assert parse_domain(copy.deepcopy(FINITE)).is_finite
    assert not parse_domain(copy.deepcopy(CONTINUOUS)).is_finite


def test_finite_domain_enumeration_order() -> None:
    d = domain_of("finite")
    assert d.shape == (2, 3, 5)
    assert d.size == FINITE_SIZE
    expected = [
        {"sex": s, "disease": c, "level": lv}
        for s, c, lv in itertools.product(range(2), ["none", "flu", "covid"], range(5))
    ]
    points = [d.value_at(i) for i in range(d.size)]
    assert points == expected
    # the last attribute varies fastest
    assert points[0] == {"sex": 0, "disease": "none", "level": 0}
    assert points[1] == {"sex": 0, "disease": "none", "level": 1}
    assert points[5] == {"sex": 0, "disease": "flu", "level": 0}
    assert points[15] == {"sex": 1, "disease": "none", "level": 0}
    for i, point in enumerate(points):
        assert d.point_index(point) == i
        assert d.point_index(d.parse_value(point)) == i


def test_enumeration_with_negative_integers_and_integer_categories() -> None:
    d = parse_domain(attrs(categorical("c", [7, "x"]), integer("i", -2, 0)))
    points = [d.value_at(i) for i in range(d.size)]
    assert points == [
        {"c": 7, "i": -2},
        {"c": 7, "i": -1},
        {"c": 7, "i": 0},
        {"c": "x", "i": -2},
        {"c": "x", "i": -1},
        {"c": "x", "i": 0},
    ]
    assert [d.point_index(p) for p in points] == list(range(6))


def test_indexes_of_is_index_of_of_each_value() -> None:
    """``Attribute.indexes_of`` (a survey chunk's values at once, each distinct str/int checked
    once) answers and refuses as ``index_of`` of each: equal values of other types (``True``,
    ``1.0``) are not taken for the ``int`` met before them."""
    domain = parse_domain(
        {
            "attributes": [
                {"name": "age", "type": "integer", "low": 1, "high": 9},
                {"name": "region", "type": "categorical", "values": ["a", "b", 3]},
            ]
        },
        limits=EngineLimits(),
    )
    age, region = domain.attributes
    assert age.indexes_of([1, 5, 1, 5.0, 9, 5], "v") == [0, 4, 0, 4, 8, 4]
    assert region.indexes_of(["b", 3, "a", "b", 3], "v") == [1, 2, 0, 1, 2]
    for attribute, raws in ((age, [1, 2, True]), (age, [5, 5, 10]), (region, [3, "b", 3.0])):
        with pytest.raises(InvalidInput):
            attribute.indexes_of(raws, "v")
        with pytest.raises(InvalidInput):
            [attribute.index_of(raw, "v") for raw in raws]  # the same refusal, one by one
    assert age.indexes_of([], "v") == []

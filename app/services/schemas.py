"""The JSON contract's types (contract.md, "JSON contract"): one Pydantic model per shape.

They live in the services layer, not in ``app.api``, so that the use cases build and return
them and the routes declare them as ``response_model`` (docs/architecture.md, "The contract's
types"): each field is written once, here. A use case returns an instance of its route's model,
which FastAPI serialises without validating it again; it writes the OpenAPI document from the
same classes (:mod:`app.api.openapi` adds only the problem+json errors, links and request
bodies); client generators (openapi-python-client) get typed models, and schemathesis checks
every response against its schema.

Routes answer with ``response_model_exclude_unset``: a field the service did not set (``delta``
of an object that is not ``approx_bayesian``, ``exact`` of bounds that are not exact) stays
absent from the wire as before, never ``null``.

Request models are the server's structural validation: a route receives its body as its model
(:func:`app.api.deps.typed_body` → :func:`app.services.bodies.validated`), which refuses unknown
fields, missing ones, wrong types, a union discriminated by ``mechanism`` with each mechanism's
required fields... Their leaves read values with the engine's readers
(:mod:`app.engine.jsonfields`: a boolean is no number, NaN is refused, ``3.0`` is an integer),
so each error says what it said before and names its field. What needs the object's domain —
an attribute named by a query exists there, a value lies in it, a declared ε is at least the
mechanism's tight ε — stays in the engine, which parses the domain, the value and the query
*as the client wrote them* (:meth:`_Body.written`: decimals as written) and answers 422.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from enum import StrEnum
from functools import cache, partial
from typing import (
    Annotated,
    Any,
    Generic,
    Literal,
    NotRequired,
    Self,
    TypeVar,
    cast,
    get_args,
    get_origin,
)

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema, WithJsonSchema
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from app.engine.approx import MIN_DELTA, NEEDS_FINITE_DOMAIN, parse_delta_value
from app.engine.calculator import DEFAULT_TOLERANCE, MAX_GROUPING, MAX_NODES, MAX_TIME_LIMIT
from app.engine.errors import InvalidInput
from app.engine.jsonfields import MAX_NAME, as_integer, as_number, as_positive_number, as_string
from app.engine.likelihood import LossBounds as Bounds
from app.engine.limits import DEFAULT_LIMITS, MAX_BUDGET, MIN_EPSILON
from app.services.bodies import our_words

#: The ids of objects: 1-128 letters, digits and ``._:@-``, starting with a letter or digit.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
#: Labels an object may carry, at most.
MAX_LABELS = 20
LABEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Label values: 1-256 characters, no control characters (``:`` allowed).
LABEL_VALUE = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
#: Objects one import request may register.
MAX_IMPORT = 10_000
#: New data versions one bulk request may store.
MAX_VERSIONS = 10_000


def refused(message: str) -> PydanticCustomError:
    """A model's own error (``message`` in our words; :mod:`app.services.bodies` reports it)."""
    return PydanticCustomError("invalid", "{message}", {"message": message})


def _refused_at(field: str, message: str) -> PydanticCustomError:
    """A model's rule between its fields, about ``field`` (a path below the model)."""
    return PydanticCustomError("invalid", "{message}", {"message": message, "at": field})


def _reads(reader: Callable[[Any, str], Any]) -> BeforeValidator:
    """Read a leaf with an engine reader (:mod:`app.engine.jsonfields`): its checks, its words."""

    def read(raw: Any) -> Any:
        try:
            return reader(raw, "")
        except InvalidInput as exc:
            raise refused(exc.message) from None

    return BeforeValidator(read)


def _holds(test: Callable[[Any], bool], message: str) -> BeforeValidator:
    """Refuse a leaf ``test`` fails with ``message``."""

    def check(raw: Any) -> Any:
        if not test(raw):
            raise refused(message)
        return raw

    return BeforeValidator(check)


def _matches(pattern: re.Pattern[str]) -> Callable[[Any], bool]:
    return lambda raw: isinstance(raw, str) and pattern.fullmatch(raw) is not None


def _is_output(raw: Any) -> bool:
    return _is_scalar(raw) and not (isinstance(raw, float) and not math.isfinite(raw))


def _is_scalar(raw: Any) -> bool:
    return not isinstance(raw, bool) and isinstance(raw, (str, int, float))


#: Free text the server stores: anything but NUL, which no PostgreSQL text column holds.
NO_NUL_PATTERN = r"^[^\x00]*$"

#: The ids ``register_object`` accepts, anchored for JSON Schema and FastAPI's ``pattern=``.
OBJECT_ID_PATTERN = f"^{ID_PATTERN.pattern}$"

#: A finite JSON number (a boolean is none); an integer (``3.0`` is one).
Number = Annotated[float, _reads(as_number)]
Integer = Annotated[int, _reads(as_integer)]
Epsilon = Annotated[
    float,
    Field(ge=MIN_EPSILON, le=DEFAULT_LIMITS.max_epsilon),
    _reads(
        partial(
            as_positive_number,
            maximum=DEFAULT_LIMITS.max_epsilon,
            minimum=DEFAULT_LIMITS.min_epsilon,
        )
    ),
]
Budget = Annotated[
    float,
    Field(ge=MIN_EPSILON, le=MAX_BUDGET),
    _reads(partial(as_positive_number, maximum=MAX_BUDGET, minimum=MIN_EPSILON)),
]
#: δ_g: ``MIN_DELTA <= δ_g < 1`` (the largest float below 1 as the inclusive bound).
MAX_DELTA = 1.0 - 2.0**-53
Delta = Annotated[float, Field(ge=MIN_DELTA, le=MAX_DELTA), _reads(parse_delta_value)]
Name = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME, pattern=NO_NUL_PATTERN), _reads(as_string)
]
#: Label names are checked where a mapping's keys are (:class:`Labels`).
LabelName = Annotated[str, Field(pattern=f"^{LABEL_NAME.pattern}$")]
LabelValue = Annotated[
    str,
    Field(pattern=f"^{LABEL_VALUE.pattern}$"),
    _holds(
        _matches(LABEL_VALUE), "must be a string of 1-256 characters without control characters"
    ),
]
LABEL_NAMES_MESSAGE = (
    "label names are 1-64 letters, digits and ._- starting with one of the first two"
)
#: A project's name: 1-64 letters, digits and ``._-``, starting with a letter or digit.
PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PROJECT_NAME_RULE = "must be 1-64 letters, digits and ._- starting with a letter or digit"
ProjectName = Annotated[
    str,
    Field(pattern=f"^{PROJECT_NAME.pattern}$"),
    _holds(_matches(PROJECT_NAME), PROJECT_NAME_RULE),
]
#: The longest survey name and API key label (the services check these very constants).
MAX_SURVEY_NAME = 200
MAX_KEY_LABEL = 200
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Scalar = Annotated[str | int | float, _holds(_is_scalar, "must be a string or a number")]
ObjectId = Annotated[
    str,
    Field(pattern=OBJECT_ID_PATTERN),
    _holds(
        _matches(ID_PATTERN),
        "must be 1-128 characters of letters, digits and ._:@- starting with a letter or digit",
    ),
]


def _labels(raw: Any) -> Any:
    """Labels: at most :data:`MAX_LABELS`, names by :data:`LABEL_NAME` (the mapping's errors)."""
    if isinstance(raw, dict):
        if len(raw) > MAX_LABELS:
            raise refused(f"at most {MAX_LABELS} labels")
        if not all(_matches(LABEL_NAME)(name) for name in raw):
            raise refused(LABEL_NAMES_MESSAGE)
    return raw


#: Public metadata of an object: ``name: value`` strings.
Labels = Annotated[
    dict[LabelName, LabelValue],
    Field(max_length=MAX_LABELS, description="Public metadata (never a private value)"),
    BeforeValidator(_labels),
]


class Role(StrEnum):
    """What a key may do: the one definition (requests, answers, the routes' role checks)."""

    ADMIN = "admin"
    ANALYST = "analyst"
    VIEWER = "viewer"


#: A role in a request or an answer: inline in the document, as the literal it was.
RoleName = Annotated[
    Role, WithJsonSchema({"type": "string", "enum": [r.value for r in Role], "title": "Role"})
]


class _Strict(BaseModel):
    """A request object: unknown fields are refused, as the server does.

    An optional field is ``X | SkipJsonSchema[None] = None``: it may be left out but not sent as
    ``null`` (the server refuses ``null``), so the schema shows only ``X``. Strict: a string is
    no number and a number no string (the leaves' readers say so in our words).
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_null(cls, data: Any) -> Any:
        """An optional field is left out, never ``null`` (refused in its type's words)."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if value is None else None
                if field is not None and field.default is None:
                    raise _refused_at(name, _null_message(cls, name))
        return data


@cache
def _null_message(model: type[BaseModel], name: str) -> str:
    """What an optional field's type says of ``null`` (``must be a number``...)."""
    for kind in get_args(model.model_fields[name].rebuild_annotation()):
        base = get_args(kind)[0] if get_origin(kind) is Annotated else kind
        if base is None or base is type(None):
            continue
        try:
            TypeAdapter(kind).validate_python(None)
        except ValidationError as exc:
            return our_words(exc.errors()[0])
    return "must not be null"


class _Body(_Strict):
    """A request body: its model, and its JSON as the client wrote it (:meth:`written`)."""

    _written: Any = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_written(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        model = handler(data)
        model._written = data
        return model

    def written(self, field: str | None = None) -> Any:
        """``field`` (None: the whole body) as the client wrote it, decimals as written.

        Domains, values and queries are parsed by the engine against a domain from the JSON
        itself: ``1`` and ``1.0`` differ for an integer attribute, and an idempotency key's
        fingerprint is the query as sent.
        """
        # read from the private attributes' dict: ``self._written`` goes through
        # ``BaseModel.__getattr__`` (a failed ``hasattr`` on the attribute's descriptor), ≈ 3.5
        # against 0.1 µs — once per dry-run and submit (docs/benchmarks.md, "h/prof")
        written = self.__pydantic_private__["_written"]  # type: ignore[index]
        return written if field is None else written[field]


class _Open(BaseModel):
    """A response object: clients should ignore fields added by later versions."""

    model_config = ConfigDict(extra="allow")


ItemT = TypeVar("ItemT")
CursorT = TypeVar("CursorT")


class Page(_Open, Generic[ItemT]):
    """A page of a list: its ``items``; subclasses add how to get the next page.

    Every paged list of the API is one of its named subclasses (the OpenAPI document and a
    generated client see ``HistoryPage``, ``KeyPage``...). A list whose wire names differ (the
    audit log's ``events``, the surveys' ``next_before``) renames the fields with
    :func:`_wire_names`, never by declaring them again.
    """

    items: list[ItemT]


class CursorPage(Page[ItemT], Generic[ItemT, CursorT]):
    """A page that ends where the next begins: ``next_after`` is the next page's cursor."""

    next_after: Annotated[CursorT | None, Field(description="The next page's cursor (null: last)")]


class OffsetPage(Page[ItemT], Generic[ItemT]):
    """A page at ``offset`` of ``total`` items, ``limit`` at most."""

    total: int
    limit: int
    offset: int


def _wire_names(**names: str) -> ConfigDict:
    """The config of a page whose fields travel under other names (``items="events"``)."""
    return ConfigDict(alias_generator=lambda field: names.get(field, field), populate_by_name=True)


# --------------------------------------------------------------------------------- domain
class RealAttribute(_Strict):
    """A real attribute: a closed interval."""

    name: Name
    type: Literal["real"]
    low: Number
    high: Number


class IntegerAttribute(_Strict):
    """An integer attribute: ``low``, ``low + 1``, ..., ``high``."""

    name: Name
    type: Literal["integer"]
    low: Integer
    high: Integer


class CategoricalAttribute(_Strict):
    """A categorical attribute: a list of distinct values."""

    name: Name
    type: Literal["categorical"]
    values: Annotated[
        list[
            Annotated[
                str | int,
                _holds(
                    lambda v: not isinstance(v, bool) and isinstance(v, (str, int)),
                    "must be a string or an integer",
                ),
            ]
        ],
        Field(min_length=1),
    ]


Attribute = Annotated[
    IntegerAttribute | CategoricalAttribute | RealAttribute, Field(discriminator="type")
]


class Domain(_Strict):
    """The values an object could take (finite when no attribute is ``real``)."""

    attributes: Annotated[list[Attribute], Field(min_length=1)]


# --------------------------------------------------------------------------------- queries
class Predicate(_Strict):
    """``attribute op value``; ``in`` takes a list of values."""

    attribute: Name
    op: Literal["==", "!=", "<", "<=", ">", ">=", "in"]
    value: Annotated[
        Scalar | list[Scalar],
        _holds(
            lambda v: _is_scalar(v) or (isinstance(v, list) and all(map(_is_scalar, v))),
            "must be a string, a number or a list of them",
        ),
    ]


class GrrQuery(_Strict):
    """Generalised randomised response on a finite attribute."""

    mechanism: Literal["grr"]
    attribute: Name
    epsilon: Epsilon


class BinaryRrQuery(_Strict):
    """Binary randomised response on a predicate; outputs 1 or 0."""

    mechanism: Literal["binary_rr"]
    predicate: Predicate
    epsilon: Epsilon


class UnaryEncodingQuery(_Strict):
    """Unary encoding of a finite attribute; outputs a list of bits."""

    mechanism: Literal["unary_encoding"]
    attribute: Name
    epsilon: Epsilon
    variant: Literal["optimized", "symmetric"] = "optimized"


class MatrixQuery(_Strict):
    """Any mechanism on a finite domain: one row of probabilities per domain point."""

    mechanism: Literal["matrix"]
    outputs: Annotated[
        list[Annotated[Any, _holds(_is_output, "must be a string or a finite number")]],
        Field(min_length=1, max_length=DEFAULT_LIMITS.max_outputs),
    ]
    #: one row per point of the domain, one probability per output: the engine reads the
    #: numbers after counting the rows and entries (a too large matrix says so first)
    probabilities: Annotated[
        list[list[Annotated[Any, WithJsonSchema({"type": "number"})]]],
        Field(json_schema_extra={"minItems": 1}),
    ]
    epsilon: Epsilon | SkipJsonSchema[None] = None


class LinearQuery(_Strict):
    """A linear query ``Σ w·x + c`` on numeric attributes, answered ``a`` or ``b``."""

    mechanism: Literal["linear"]
    weights: dict[str, Number]
    intercept: Number = 0.0
    range: Annotated[list[Number], Field(min_length=2, max_length=2)]
    truncate: bool = False
    epsilon: Epsilon


class LogisticQuery(_Strict):
    """A logistic query ``sigmoid(Σ w·x + c)``, answered 0 or 1."""

    mechanism: Literal["logistic"]
    weights: dict[str, Number]
    intercept: Number = 0.0
    epsilon: Epsilon


class OlhQuery(_Strict):
    """Optimized local hashing of a finite attribute; outputs a seed and a bucket.

    The hash and the estimators are in docs/oracles.md.
    """

    mechanism: Literal["olh"]
    attribute: Name
    epsilon: Epsilon
    # at least 2 (and at most max(2, k) for the attribute: the engine says both)
    g: Annotated[Integer, Field(json_schema_extra={"minimum": 2})] | SkipJsonSchema[None] = None


class HadamardQuery(_Strict):
    """Hadamard response on a finite attribute (at most 2^20 values); outputs a column."""

    mechanism: Literal["hadamard"]
    attribute: Name
    epsilon: Epsilon


Query = Annotated[
    GrrQuery
    | BinaryRrQuery
    | UnaryEncodingQuery
    | MatrixQuery
    | LinearQuery
    | LogisticQuery
    | OlhQuery
    | HadamardQuery,
    Field(discriminator="mechanism"),
]


# --------------------------------------------------------------------------------- requests
class BudgetBody(_Strict):
    """An object's budget ε_g, and δ_g for the ``approx_bayesian`` filter (required there).

    ``approx_bayesian`` needs a finite domain (a continuous one is a 422 naming ``filter``).
    """

    epsilon: Budget
    delta: (
        Annotated[Delta, Field(description="δ_g: approx_bayesian only (finite domains only)")]
        | SkipJsonSchema[None]
    ) = None


class LifetimeBody(_Strict):
    """A lifetime budget ε_L over every data version of an object (at least ``budget.epsilon``)."""

    epsilon: Budget


#: The key of a bulk request's validation context (``validated(..., context=...)``) holding
#: the domains its items wrote, validated once each (:meth:`RegisterRequest._domain_once`).
DOMAINS_SEEN = "domains"


class RegisterRequest(_Body):
    """``POST /v1/objects``: a protected object with its private value.

    ``budget.delta`` is required by the ``approx_bayesian`` filter and refused by the others;
    ``approx_bayesian`` needs a finite domain (no ``real`` attribute).
    """

    id: ObjectId
    domain: Domain
    value: Annotated[
        dict[str, Scalar], Field(description="One point of the domain; never returned")
    ]
    budget: BudgetBody
    filter: Literal["bayesian", "simplified", "basic", "approx_bayesian"] = "bayesian"
    labels: Labels | SkipJsonSchema[None] = None
    lifetime: LifetimeBody | SkipJsonSchema[None] = Field(
        default=None,
        description="ε_L: the realized loss summed over the object's data versions stays within it",
    )

    @field_validator("domain", mode="wrap")
    @classmethod
    def _domain_once(
        cls, raw: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Domain:
        """The domain validated once per bulk request (:data:`DOMAINS_SEEN` in the context).

        An import's lines usually repeat one domain, and its validation was half of an item's
        (docs/benchmarks.md, "Sixteenth session, the import"). The key is the ``repr`` of the
        JSON as decoded (equal ``repr``, equal JSON: see ``app.services.objects``' engine cache);
        a refused domain raises here and is not kept, so each line that repeats it is refused
        with its own path. Without the context (one registration) it is validated as any field.
        """
        seen: dict[str, Domain] | None = (
            info.context.get(DOMAINS_SEEN) if isinstance(info.context, dict) else None
        )
        if seen is None:
            return cast(Domain, handler(raw))
        key = repr(raw)
        found = seen.get(key)
        if found is None:
            found = seen[key] = handler(raw)
        return found

    @model_validator(mode="after")
    def _delta_with_approx_only(self) -> Self:
        approx = self.filter == "approx_bayesian"
        if self.budget.delta is None and approx:
            raise _refused_at("budget.delta", "is required by the approx_bayesian filter")
        if self.budget.delta is not None and not approx:
            raise _refused_at("budget.delta", "is only allowed with the approx_bayesian filter")
        if approx and any(a.type == "real" for a in self.domain.attributes):
            raise _refused_at("filter", f"approx_bayesian {NEEDS_FINITE_DOMAIN}")
        return self


class ImportRequest(_Body):
    """``POST /v1/imports``: up to 10,000 registrations, stored all or nothing."""

    objects: Annotated[
        list[RegisterRequest],
        Field(min_length=1, max_length=MAX_IMPORT),
        _holds(lambda v: not isinstance(v, list) or bool(v), "must have at least 1 item"),
        _holds(
            lambda v: not isinstance(v, list) or len(v) <= MAX_IMPORT,
            f"at most {MAX_IMPORT} objects a request",
        ),
    ]


class ImportResult(_Open):
    """Objects created by an import, and those already registered identically."""

    created: int
    existing: int


class VersionRequest(_Body):
    """``POST /v1/objects/{id}/versions``: the object's new value (checked against its domain)."""

    value: Annotated[
        dict[str, Scalar], Field(description="One point of the domain; never returned")
    ]


class VersionItem(_Strict):
    """One object's new value in a bulk request."""

    id: Annotated[
        str,
        Field(pattern=OBJECT_ID_PATTERN),
        _holds(_matches(ID_PATTERN), "must be the id of a registered object"),
    ]
    value: Annotated[
        dict[str, Scalar], Field(description="One point of the domain; never returned")
    ]


class VersionsRequest(_Body):
    """``POST /v1/versions``: up to 10,000 new values, stored all or nothing; ids not repeated."""

    versions: Annotated[
        list[VersionItem],
        Field(min_length=1, max_length=MAX_VERSIONS),
        _holds(lambda v: not isinstance(v, list) or bool(v), "must have at least 1 item"),
        _holds(
            lambda v: not isinstance(v, list) or len(v) <= MAX_VERSIONS,
            f"must have at most {MAX_VERSIONS} items",
        ),
    ]

    @model_validator(mode="after")
    def _ids_once(self) -> Self:
        first: dict[str, int] = {}
        for i, item in enumerate(self.versions):
            if item.id in first:
                raise _refused_at(
                    f"versions[{i}].id", f"repeats the id of versions[{first[item.id]}]"
                )
            first[item.id] = i
        return self


class VersionCreated(_Open):
    """The object's new data version."""

    object_id: str
    version: int


class CreatedVersion(_Open):
    """One object's new data version in a bulk answer."""

    id: str
    version: int


class VersionsResult(_Open):
    """The versions a bulk request created, in the request's order."""

    created: int
    versions: list[CreatedVersion]


class LabelsCohort(_Strict):
    """Every object carrying all these labels (membership fixed at creation)."""

    labels: Annotated[
        Labels,
        Field(json_schema_extra={"minProperties": 1}),
        _holds(lambda v: not isinstance(v, dict) or bool(v), "must name at least one label"),
    ]


class IdsCohort(_Strict):
    """These objects."""

    ids: Annotated[
        list[
            Annotated[
                str,
                Field(pattern=OBJECT_ID_PATTERN),
                _holds(_matches(ID_PATTERN), "must be an object id"),
            ]
        ],
        Field(min_length=1),
    ]

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        seen: set[str] = set()
        for i, member in enumerate(self.ids):
            if member in seen:
                raise _refused_at(f"ids[{i}]", "repeats an earlier id")
            seen.add(member)
        return self


def _one_cohort(raw: Any) -> bool:
    return not isinstance(raw, dict) or (len(raw) == 1 and next(iter(raw)) in ("labels", "ids"))


Cohort = Annotated[
    Annotated[LabelsCohort, Tag("by-labels")] | Annotated[IdsCohort, Tag("by-ids")],
    Discriminator(
        lambda raw: "by-labels" if isinstance(raw, dict) and "labels" in raw else "by-ids"
    ),
    _holds(_one_cohort, "must be exactly one of {'labels': {...}} or {'ids': [...]}"),
]


class SurveyRequest(_Body):
    """``POST /v1/surveys`` (and its dry-run): one query to every member of a cohort."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=MAX_SURVEY_NAME, pattern=NO_NUL_PATTERN),
        _holds(
            lambda v: isinstance(v, str) and 1 <= len(v) <= MAX_SURVEY_NAME and "\x00" not in v,
            f"must be a string of 1-{MAX_SURVEY_NAME} characters",
        ),
    ]
    query: Query
    cohort: Cohort
    reuse: bool = Field(
        default=False,
        description="Return a stored answer of the identical query (canonical JSON: keys sorted, "
        "numbers as written) already given by the object's current data version, charging "
        "nothing and recording nothing, per member (an analyst's or project key's own answers "
        "only); "
        "otherwise decide as usual",
    )

    @model_validator(mode="after")
    def _finite_query(self) -> Self:
        # a survey stores its query as JSON text before any member's domain is read
        try:
            json.dumps(self.query.model_dump(), allow_nan=False)
        except ValueError:
            raise _refused_at("query", "must not contain NaN or infinite numbers") from None
        return self


class QueryRequest(_Body):
    """Dry-run and submit: the query to decide."""

    query: Query
    reuse: bool = Field(
        default=False,
        description="Return a stored answer of the identical query (canonical JSON: keys sorted, "
        "numbers as written) already given by the object's current data version, charging "
        "nothing and recording nothing (an analyst's or project key's own answers only); "
        "otherwise decide as usual",
    )


def _as_sent(raw: Any, _: ValidatorFunctionWrapHandler) -> Any:
    return raw


class HistoryEntry(_Strict):
    """One past query and the output it gave.

    The engine replays it under the rules it was accepted by (any ε, below today's floor too):
    the query is its to read, as sent.
    """

    query: Annotated[Query, WrapValidator(_as_sent)]
    output: Any


def _between(low: int, high: int) -> Callable[[Any, str], int]:
    """An integer reader for ``low..high`` (the calculator's words)."""

    def read(raw: Any, field: str) -> int:
        value = as_integer(raw, field)
        if not low <= value <= high:
            raise InvalidInput(field, f"must be between {low} and {high}")
        return value

    return read


class LossOptions(_Strict):
    """Calculator options."""

    tolerance: Annotated[float, Field(gt=0), _reads(as_positive_number)] = DEFAULT_TOLERANCE
    time_limit: (
        Annotated[
            float,
            Field(gt=0, le=MAX_TIME_LIMIT),
            _reads(partial(as_positive_number, maximum=MAX_TIME_LIMIT)),
        ]
        | SkipJsonSchema[None]
    ) = None
    max_nodes: (
        Annotated[int, Field(ge=1, le=MAX_NODES), _reads(_between(1, MAX_NODES))]
        | SkipJsonSchema[None]
    ) = None
    grouping: (
        Annotated[int, Field(ge=1, le=MAX_GROUPING), _reads(_between(1, MAX_GROUPING))]
        | SkipJsonSchema[None]
    ) = None
    fast: bool = False


class LossRequest(_Body):
    """``POST /v1/loss``: the stateless calculator.

    ``budget`` is required with a ``candidate`` or a ``delta``; ``delta`` needs a finite domain
    (the engine's calculator says so, as it does for ``gatekeeper loss``).
    """

    domain: Domain
    history: Annotated[list[HistoryEntry], Field(max_length=DEFAULT_LIMITS.max_history)]
    budget: Budget | SkipJsonSchema[None] = None
    delta: (
        Annotated[
            Delta, Field(description="δ_g: also decide with approx_bayesian (finite domains only)")
        ]
        | SkipJsonSchema[None]
    ) = None
    candidate: Query | SkipJsonSchema[None] = None
    options: LossOptions | SkipJsonSchema[None] = None


class KeyRequest(_Body):
    """``POST /v1/keys``: a key, optionally in a project (analyst or viewer keys only)."""

    role: Annotated[RoleName, Field(strict=False)]
    label: (
        Annotated[
            str,
            Field(min_length=1, max_length=MAX_KEY_LABEL, pattern=NO_NUL_PATTERN),
            _reads(partial(as_string, max_len=MAX_KEY_LABEL)),
        ]
        | SkipJsonSchema[None]
    ) = None
    project: (
        Annotated[
            ProjectName,
            Field(description="The project's name: the key inherits its scope and quota"),
        ]
        | SkipJsonSchema[None]
    ) = None


class ProjectScope(_Strict):
    """A project's scope: the labels an object must all carry to be seen by its keys."""

    labels: Annotated[
        Labels,
        Field(min_length=1),
        _holds(lambda v: not isinstance(v, dict) or bool(v), "must name at least one label"),
    ]


class Quota(_Strict):
    """A project's quota: the ε bound on the realized loss of its own sub-history."""

    epsilon: Annotated[
        float,
        Field(gt=0, le=MAX_BUDGET),
        _reads(partial(as_positive_number, maximum=MAX_BUDGET)),
    ]


class ProjectRequest(_Body):
    """``POST /v1/projects``."""

    name: ProjectName
    scope: ProjectScope
    quota: Quota


class ProjectPatch(_Body):
    """``PATCH /v1/projects/{name}``: a new quota (the scope is fixed)."""

    quota: Quota


# --------------------------------------------------------------------------------- responses
#: What ``exact`` says in a bounds object (contract.md, "Decimals as written").
EXACT_DESCRIPTION = (
    "true: the loss is known exactly (randomized response, every epsilon and the budget as "
    "written) and lower and upper are both its nearest double, so upper <= budget holds in "
    "doubles exactly when it holds for the written numbers; false: certified bounds, rounded "
    "outwards"
)


class LossBounds(_Open):
    """Bounds of a realized loss: certified ``lower <= loss <= upper``, or the exact loss."""

    lower: float
    upper: float
    exact: bool = Field(default=False, description=EXACT_DESCRIPTION)

    @classmethod
    def of(cls, bounds: Bounds) -> LossBounds:
        """The engine's bounds as the contract writes them (``exact`` always present)."""
        return cls(lower=bounds.lower, upper=bounds.upper, exact=bounds.exact)


class LifetimeOdometer(_Open):
    """The lifetime budget's account: the realized loss summed over every data version."""

    budget: float
    realized_loss: LossBounds
    versions: int
    remaining: float


class Odometer(_Open):
    """An object's accounting: budget, certified loss, remaining, basic composition, counts.

    All of the current data version (``version``), except ``lifetime``.
    """

    budget: float
    realized_loss: LossBounds
    remaining: float
    basic_composition: float
    accepted: int
    rejected: int
    updated_at: Timestamp | None
    delta: float | SkipJsonSchema[None] = Field(
        default=None, description="δ_g (approx_bayesian objects only)"
    )
    phase: Literal["output-independent", "bayesian"] | SkipJsonSchema[None] = Field(
        default=None, description="Algorithm 4's phase (approx_bayesian objects only)"
    )
    version: int = Field(description="The current data version (1 at registration)")
    lifetime: LifetimeOdometer | SkipJsonSchema[None] = Field(
        default=None, description="Objects registered with a lifetime budget only"
    )
    projects: list[ProjectLoss] | SkipJsonSchema[None] = Field(
        default=None,
        description="Admins only: each project's sub-history loss against its quota",
    )


class ObjectBudget(_Open):
    """The budget of an object."""

    epsilon: float
    delta: float | SkipJsonSchema[None] = None


class ObjectView(_Open):
    """An object's metadata (never its value) with its odometer."""

    id: str
    domain: dict[str, Any]
    budget: ObjectBudget
    filter: Literal["bayesian", "simplified", "basic", "approx_bayesian"]
    finite: bool
    labels: dict[str, str]
    lifetime: ObjectBudget | SkipJsonSchema[None] = Field(
        default=None, description="ε_L, when registered with a lifetime budget"
    )
    version: int = Field(description="The current data version (1 at registration)")
    status: Literal["active", "retired"]
    created_at: Timestamp | None
    retired_at: Timestamp | None
    odometer: Odometer


class OutputLoss(_Open):
    """The loss bounds after one possible output of a candidate query."""

    output: Any
    lower: float
    upper: float
    exact: bool = Field(default=False, description=EXACT_DESCRIPTION)


class QuotaDecision(_Open):
    """The project's quota on its own sub-history of the object (a project key's dry-run)."""

    project: str
    quota: float
    decision: Literal["accept", "reject"]
    reason: str
    realized_loss: LossBounds
    worst_case_after: float


class ProjectLoss(_Open):
    """One project's sub-history of an object (an admin's odometer)."""

    project: str
    quota: float
    realized_loss: LossBounds
    accepted: int
    basic_composition: float


class Decision(_Open):
    """A dry-run: would the filter accept the query now, and the loss after each output."""

    decision: Literal["accept", "reject"]
    reason: str
    filter: str
    budget: float
    realized_loss: LossBounds
    worst_case_after: float
    per_output: list[OutputLoss]
    per_output_complete: bool
    epsilon: float
    basic_composition: float
    basic_composition_after: float
    delta: float | SkipJsonSchema[None] = Field(
        default=None, description="δ_g (approx_bayesian objects only)"
    )
    phase: Literal["output-independent", "bayesian"] | SkipJsonSchema[None] = Field(
        default=None, description="Algorithm 4's phase after this decision (approx_bayesian)"
    )
    refusal: (
        Literal["budget-exhausted", "lifetime-exhausted", "quota-exhausted"] | SkipJsonSchema[None]
    ) = Field(
        default=None,
        description="Which check refused (a rejection only): the version's filter, the lifetime "
        "budget after it, or a project key's quota (reported only when the object's own checks "
        "would accept)",
    )
    quota: QuotaDecision | SkipJsonSchema[None] = Field(
        default=None, description="A project key's dry-run: its quota's filter"
    )
    would_reuse: bool = Field(
        default=False,
        description='With `"reuse": true`: a submit would return a stored identical answer '
        "of the current version (the decision above is for a fresh answer)",
    )


class SubmitResult(_Open):
    """An accepted submit: the sampled output and the odometer after it (or a reused answer)."""

    query_id: int | None = Field(
        description="The accepted query's id (null: a reused answer a survey gave)"
    )
    object_id: str
    seq: int = Field(description="The answer's number in the history (a reused one's own)")
    version: int = Field(description="The data version the query read")
    output: Any
    epsilon: float
    odometer: Odometer
    reused: bool = Field(
        default=False,
        description='`"reuse": true` returned a stored identical answer of the current '
        "version (status 200): nothing was charged or recorded",
    )
    survey_id: int | SkipJsonSchema[None] = Field(
        default=None, description="A reused answer a survey gave: that survey"
    )


class HistoryItem(_Open):
    """One accepted query of an object's history: a single submit or a survey's answer."""

    query_id: int | None = Field(
        description="The submit's query id; null for a survey's answer (see survey_id)"
    )
    survey_id: int | None = Field(
        default=None, description="The survey that asked it (null: a single submit)"
    )
    seq: int
    version: int = Field(description="The data version the query read")
    query: dict[str, Any]
    output: Any
    epsilon: float
    realized_loss_after: LossBounds
    basic_composition_after: float
    created_at: Timestamp | None


class HistoryPage(CursorPage[HistoryItem, int]):
    """A page of history; ``next_after`` is the ``after`` of the next page (null: last)."""


class OdometerPoint(_Open):
    """The loss after one accepted query."""

    accepted: int
    realized_loss: LossBounds
    basic_composition: float
    epsilon: float
    at: Timestamp | None


class Rejection(_Open):
    """A rejected submit: ``after_accepted`` queries had been accepted when it came."""

    after_accepted: int
    at: Timestamp | None


class OdometerHistory(_Open):
    """The loss over time of one object, and the rejections between its accepted queries."""

    object_id: str
    budget: float
    version: int = Field(description="The data version of these points")
    created_at: Timestamp | None = Field(
        default=None,
        description="When this data version began: the registration for version 1, "
        "the new version's creation otherwise",
    )
    points: list[OdometerPoint]
    rejections: list[Rejection]
    next_after: int | None


class OdometerSummary(Odometer):
    """One object in the odometers list: its odometer with its id, filter and status."""

    id: str
    filter: str
    labels: dict[str, str]
    status: Literal["active", "retired"]


class OdometerPage(OffsetPage[OdometerSummary]):
    """A page of odometers."""


class OdometerTotals(_Open):
    """Counts of the objects a filter covers, by status (``GET /v1/odometers/totals``).

    The statuses are the ones ``GET /v1/odometers?status=`` lists and the Prometheus gauges
    count: ``exhausted`` — active, remaining below the smallest ε a query may declare;
    ``near_exhaustion`` — active, remaining below 0.1 of the budget (the exhausted included).
    """

    objects: Annotated[
        int,
        Field(description="The objects listed: active ones, and retired ones if included"),
    ]
    active: int
    retired: int
    exhausted: int
    near_exhaustion: int
    rejected: Annotated[int, Field(description="Rejected submits, summed over `objects`")]


class CandidateAcceptance(_Open):
    """Whether each filter would accept the candidate."""

    bayesian: bool
    simplified: bool
    basic: bool
    approx_bayesian: bool | SkipJsonSchema[None] = None


class CandidateLoss(_Open):
    """The calculator's evaluation of a candidate query."""

    per_output: list[OutputLoss]
    per_output_complete: bool
    worst_case_upper: float
    epsilon: float
    accepted: CandidateAcceptance


class LossResult(_Open):
    """The calculator's answer."""

    realized_loss: LossBounds
    basic_composition: float
    status: Literal["ok", "limit"]
    #: With ``status: limit`` only: which limit kept ``upper - lower`` above the tolerance.
    reason: str | SkipJsonSchema[None] = None
    candidate: CandidateLoss | None = None
    approx: ApproxState | SkipJsonSchema[None] = None


class ApproxState(_Open):
    """With ``delta``: Algorithm 4's state of the history (F₀'s account and the phase)."""

    delta: float
    f0_account: float
    f0_threshold: float
    phase: Literal["output-independent", "bayesian"]


class CreatedKey(_Open):
    """A new API key: ``key`` is the secret, shown this once."""

    id: int
    role: RoleName
    label: str | None
    key: str
    project: str | None = Field(default=None, description="The key's project (null: unscoped)")


class KeyInfo(_Open):
    """An API key's public facts (never its secret)."""

    id: int
    role: RoleName
    label: str | None
    created_at: Timestamp | None
    revoked_at: Timestamp | None
    project: str | None = Field(default=None, description="The key's project (null: unscoped)")


class KeyPage(CursorPage[KeyInfo, int]):
    """A page of API keys."""


class RevokedKey(_Open):
    """A revoked key."""

    id: int
    revoked: bool


class AuditEvent(_Open):
    """One entry of the audit log: public facts only."""

    id: int
    at: Timestamp
    kind: str
    actor_key_id: int | None
    object_id: str | None
    detail: dict[str, Any]


class AuditPage(CursorPage[AuditEvent, int]):
    """A page of the audit log: its items are ``events`` on the wire."""

    model_config = _wire_names(items="events")


class WhoAmI(_Open):
    """The calling key."""

    key_id: int
    role: RoleName
    project: str | None = Field(default=None, description="The key's project (null: unscoped)")


class ScopeView(_Open):
    """A project's scope: its keys see only objects carrying all these labels."""

    labels: dict[str, str]


class QuotaView(_Open):
    """A project's quota: the bound on its own sub-history's realized loss, per object."""

    epsilon: float


class ProjectView(_Open):
    """A project: its unique name, scope and quota."""

    name: str
    scope: ScopeView
    quota: QuotaView
    created_at: Timestamp
    updated_at: Timestamp


class ProjectPage(CursorPage[ProjectView, int]):
    """A page of projects."""


class Health(_Open):
    """The process is up."""

    status: Literal["ok"]


class Ready(_Open):
    """Ready to serve: the database (and Redis and the broker, when configured) answered."""

    status: Literal["ok"]
    database: Literal["ok"]
    redis: Literal["ok"] | None = None
    broker: Literal["ok"] | SkipJsonSchema[None] = None
    workers: int | SkipJsonSchema[None] = Field(
        default=None, description="live `gatekeeper worker` nodes (BROKER_URL set)"
    )


class SurveyRefusals(_Open):
    """Members refused, by reason."""

    budget_exhausted: int = Field(alias="budget-exhausted")
    invalid_for_domain: int = Field(alias="invalid-for-domain")
    retired: int
    lifetime_exhausted: int = Field(
        default=0,
        alias="lifetime-exhausted",
        description="The version's filter accepted but the object's lifetime budget did not",
    )
    quota_exhausted: int = Field(
        default=0,
        alias="quota-exhausted",
        description="The object's filters accepted but the quota of the survey's project did not",
    )


class SurveyProgress(_Open):
    """How far a survey got."""

    total: int
    decided: int
    accepted: int = Field(description="Members answered, reused answers included")
    reused: int = Field(
        default=0, description="Accepted members answered by a stored identical answer"
    )
    refused: SurveyRefusals


class ScalarEstimate(_Open):
    """A proportion (``binary_rr``) or a mean (``linear``, ``logistic``) over ``n`` members."""

    kind: Literal["proportion", "mean"]
    value: float
    n: int
    stderr: float
    ci95: Annotated[list[float], Field(min_length=2, max_length=2)]


class HistogramEstimate(_Open):
    """The share of each value, with its error, per value.

    ``grr``, ``unary_encoding``, ``olh`` and ``hadamard`` estimate a histogram.
    """

    kind: Literal["histogram"]
    values: dict[str, float]
    n: int
    stderr: dict[str, float]
    ci95: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]]


#: A survey's estimate (contract.md, "Estimates"), by ``kind``.
Estimate = Annotated[ScalarEstimate | HistogramEstimate, Field(discriminator="kind")]


class SurveyView(_Open):
    """A survey: status, progress and the estimate over its accepted members."""

    id: int
    name: str
    status: Literal["queued", "running", "done", "cancelled", "failed"]
    query: dict[str, Any]
    cohort: dict[str, Any]
    reuse: bool = Field(
        default=False, description="Members answer from stored identical answers where they can"
    )
    created_at: Timestamp | None
    started_at: Timestamp | None
    finished_at: Timestamp | None
    progress: SurveyProgress
    groups: int
    estimate: Estimate | None
    estimate_unavailable: str | SkipJsonSchema[None] = None
    outputs: dict[str, int] | SkipJsonSchema[None] = None
    waiting_for_workers: bool = Field(
        description="Members are left to decide, BROKER_URL is set and no `gatekeeper worker` "
        "runs surveys (no live heartbeat of a surveys node): the survey waits until one starts"
    )


class SurveyPage(CursorPage[SurveyView, int]):
    """Surveys, newest first: the cursor is ``next_before`` on the wire (ids decrease)."""

    model_config = _wire_names(next_after="next_before")


class SurveyResponse(TypedDict):
    """One member's decision (``output``: for the survey's analyst and admins).

    ``pending``: not decided yet; ``cancelled``: never to be decided, the survey was cancelled
    first.
    """

    # A validated dict, not a model: a page holds up to 1,000 of them and building a model
    # instance each cost more than half of validating the page (docs/benchmarks.md, "Response
    # validation: the survey responses page"). Same fields, types, open extras and schema.
    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    object_id: str
    decision: Literal["pending", "accepted", "refused", "cancelled"]
    reason: str | None
    version: NotRequired[
        Annotated[int, Field(description="The data version an accepted member answered from")]
    ]
    output: NotRequired[Any]


class SurveyResponsePage(CursorPage[SurveyResponse, str]):
    """A page of members' decisions in object-id order."""


class SurveyDryRun(_Open):
    """What a survey would do now, spending nothing."""

    members: int
    would_accept: int
    would_refuse: SurveyRefusals
    groups: int
    would_reuse: int = Field(
        default=0,
        description='With `"reuse": true`: members that would get a stored identical answer '
        "(also counted in would_accept)",
    )


#: The named schema of each JSON request body: (method, path template) -> model.
REQUESTS: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/v1/objects"): RegisterRequest,
    ("post", "/v1/imports"): ImportRequest,
    ("post", "/v1/versions"): VersionsRequest,
    ("post", "/v1/objects/{object_id}/versions"): VersionRequest,
    ("post", "/v1/surveys"): SurveyRequest,
    ("post", "/v1/surveys/dry-run"): SurveyRequest,
    ("post", "/v1/objects/{object_id}/dry-run"): QueryRequest,
    ("post", "/v1/objects/{object_id}/queries"): QueryRequest,
    ("post", "/v1/loss"): LossRequest,
    ("post", "/v1/keys"): KeyRequest,
    ("post", "/v1/projects"): ProjectRequest,
    ("patch", "/v1/projects/{name}"): ProjectPatch,
}

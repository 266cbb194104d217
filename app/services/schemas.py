"""The JSON contract's types (contract.md, "JSON contract"): one Pydantic model per shape.

They live in the services layer, not in ``app.api``, so that the use cases can build and return
them and the routes declare them as ``response_model`` (docs/architecture.md, "The contract's
types"): each field is written once, here. FastAPI validates every answer against its route's
model and writes the OpenAPI document from the same classes (:mod:`app.api.openapi` adds only
the problem+json errors, links and request bodies); client generators (openapi-python-client)
get typed models, and schemathesis checks every response against its schema.

Routes answer with ``response_model_exclude_unset``: a field the service did not set (``delta``
of an object that is not ``approx_bayesian``, ``exact`` of bounds that are not exact) stays
absent from the wire as before, never ``null``.

Request schemas are as strict as the server's structural checks (a union discriminated by
``mechanism`` with each mechanism's required fields; ``low``/``high`` required for ``real``);
the routes still validate with the engine's own code (:mod:`app.engine.jsonfields`), which names
the field of every error. What JSON Schema cannot say — an attribute named by a query exists in
the object's domain, a value lies in its domain, a declared ε is at least the mechanism's tight
ε — is answered 422.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from app.engine.approx import MIN_DELTA
from app.engine.calculator import MAX_GROUPING, MAX_NODES, MAX_TIME_LIMIT
from app.engine.jsonfields import MAX_NAME
from app.engine.limits import DEFAULT_LIMITS, MAX_BUDGET, MIN_EPSILON
from app.services.imports import MAX_IMPORT
from app.services.objects import ID_PATTERN, LABEL_NAME, LABEL_VALUE, MAX_LABELS
from app.services.versions import MAX_VERSIONS

#: Free text the server stores: anything but NUL, which no PostgreSQL text column holds.
NO_NUL_PATTERN = r"^[^\x00]*$"

#: The ids ``register_object`` accepts, anchored for JSON Schema and FastAPI's ``pattern=``.
OBJECT_ID_PATTERN = f"^{ID_PATTERN.pattern}$"

Epsilon = Annotated[float, Field(ge=MIN_EPSILON, le=DEFAULT_LIMITS.max_epsilon)]
Budget = Annotated[float, Field(ge=MIN_EPSILON, le=MAX_BUDGET)]
#: δ_g: ``MIN_DELTA <= δ_g < 1`` (the largest float below 1 as the inclusive bound).
MAX_DELTA = 1.0 - 2.0**-53
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=NO_NUL_PATTERN)]
LabelName = Annotated[str, Field(pattern=f"^{LABEL_NAME.pattern}$")]
LabelValue = Annotated[str, Field(pattern=f"^{LABEL_VALUE.pattern}$")]
ProjectName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
#: The longest survey name and API key label (the services check these very constants).
MAX_SURVEY_NAME = 200
MAX_KEY_LABEL = 200
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Scalar = str | int | float


class _Strict(BaseModel):
    """A request object: unknown fields are refused, as the server does.

    An optional field is ``X | SkipJsonSchema[None] = None``: it may be left out but not sent as
    ``null`` (the server refuses ``null``), so the schema shows only ``X``.
    """

    model_config = ConfigDict(extra="forbid")


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
    low: float
    high: float


class IntegerAttribute(_Strict):
    """An integer attribute: ``low``, ``low + 1``, ..., ``high``."""

    name: Name
    type: Literal["integer"]
    low: int
    high: int


class CategoricalAttribute(_Strict):
    """A categorical attribute: a list of distinct values."""

    name: Name
    type: Literal["categorical"]
    values: Annotated[list[str | int], Field(min_length=1)]


Attribute = Annotated[
    RealAttribute | IntegerAttribute | CategoricalAttribute, Field(discriminator="type")
]


class Domain(_Strict):
    """The values an object could take (finite when no attribute is ``real``)."""

    attributes: Annotated[list[Attribute], Field(min_length=1)]


# --------------------------------------------------------------------------------- queries
class Predicate(_Strict):
    """``attribute op value``; ``in`` takes a list of values."""

    attribute: Name
    op: Literal["==", "!=", "<", "<=", ">", ">=", "in"]
    value: Scalar | list[Scalar]


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
    outputs: Annotated[list[Any], Field(min_length=1)]
    probabilities: Annotated[list[list[float]], Field(min_length=1)]
    epsilon: Epsilon | SkipJsonSchema[None] = None


class LinearQuery(_Strict):
    """A linear query ``Σ w·x + c`` on numeric attributes, answered ``a`` or ``b``."""

    mechanism: Literal["linear"]
    weights: dict[str, float]
    intercept: float = 0.0
    range: Annotated[list[float], Field(min_length=2, max_length=2)]
    truncate: bool = False
    epsilon: Epsilon


class LogisticQuery(_Strict):
    """A logistic query ``sigmoid(Σ w·x + c)``, answered 0 or 1."""

    mechanism: Literal["logistic"]
    weights: dict[str, float]
    intercept: float = 0.0
    epsilon: Epsilon


class OlhQuery(_Strict):
    """Optimized local hashing of a finite attribute; outputs a seed and a bucket.

    The hash and the estimators are in docs/oracles.md.
    """

    mechanism: Literal["olh"]
    attribute: Name
    epsilon: Epsilon
    g: Annotated[int, Field(ge=2)] | SkipJsonSchema[None] = None


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
        Annotated[
            float,
            Field(
                ge=MIN_DELTA,
                le=MAX_DELTA,
                description="δ_g: approx_bayesian only (finite domains only)",
            ),
        ]
        | SkipJsonSchema[None]
    ) = None


class LifetimeBody(_Strict):
    """A lifetime budget ε_L over every data version of an object (at least ``budget.epsilon``)."""

    epsilon: Budget


class RegisterRequest(_Strict):
    """``POST /v1/objects``: a protected object with its private value."""

    id: Annotated[str, Field(pattern=OBJECT_ID_PATTERN)]
    domain: Domain
    value: Annotated[
        dict[str, Scalar], Field(description="One point of the domain; never returned")
    ]
    budget: BudgetBody
    filter: Literal["bayesian", "simplified", "basic", "approx_bayesian"] = "bayesian"
    labels: (
        Annotated[
            dict[LabelName, LabelValue],
            Field(max_length=MAX_LABELS, description="Public metadata (never a private value)"),
        ]
        | SkipJsonSchema[None]
    ) = None
    lifetime: LifetimeBody | SkipJsonSchema[None] = Field(
        default=None,
        description="ε_L: the realized loss summed over the object's data versions stays within it",
    )


class ImportRequest(_Strict):
    """``POST /v1/imports``: up to 10,000 registrations, stored all or nothing."""

    objects: Annotated[list[RegisterRequest], Field(min_length=1, max_length=MAX_IMPORT)]


class ImportResult(_Open):
    """Objects created by an import, and those already registered identically."""

    created: int
    existing: int


class VersionRequest(_Strict):
    """``POST /v1/objects/{id}/versions``: the object's new value."""

    value: Annotated[
        dict[str, Scalar], Field(description="One point of the domain; never returned")
    ]


class VersionItem(_Strict):
    """One object's new value in a bulk request."""

    id: Annotated[str, Field(pattern=OBJECT_ID_PATTERN)]
    value: Annotated[
        dict[str, Scalar], Field(description="One point of the domain; never returned")
    ]


class VersionsRequest(_Strict):
    """``POST /v1/versions``: up to 10,000 new values, stored all or nothing."""

    versions: Annotated[list[VersionItem], Field(min_length=1, max_length=MAX_VERSIONS)]


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

    labels: Annotated[dict[LabelName, LabelValue], Field(min_length=1, max_length=MAX_LABELS)]


class IdsCohort(_Strict):
    """These objects."""

    ids: Annotated[list[Annotated[str, Field(pattern=OBJECT_ID_PATTERN)]], Field(min_length=1)]


class SurveyRequest(_Strict):
    """``POST /v1/surveys`` (and its dry-run): one query to every member of a cohort."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_SURVEY_NAME, pattern=NO_NUL_PATTERN)]
    query: Query
    cohort: LabelsCohort | IdsCohort


class QueryRequest(_Strict):
    """Dry-run and submit: the query to decide."""

    query: Query


class HistoryEntry(_Strict):
    """One past query and the output it gave."""

    query: Query
    output: Any


class LossOptions(_Strict):
    """Calculator options."""

    tolerance: Annotated[float, Field(gt=0)] = 1e-4
    time_limit: Annotated[float, Field(gt=0, le=MAX_TIME_LIMIT)] | SkipJsonSchema[None] = None
    max_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | SkipJsonSchema[None] = None
    grouping: Annotated[int, Field(ge=1, le=MAX_GROUPING)] | SkipJsonSchema[None] = None
    fast: bool = False


class LossRequest(_Strict):
    """``POST /v1/loss``: the stateless calculator."""

    domain: Domain
    history: list[HistoryEntry]
    budget: Budget | SkipJsonSchema[None] = None
    delta: (
        Annotated[
            float,
            Field(
                ge=MIN_DELTA,
                le=MAX_DELTA,
                description="δ_g: also decide with approx_bayesian (finite domains only)",
            ),
        ]
        | SkipJsonSchema[None]
    ) = None
    candidate: Query | SkipJsonSchema[None] = None
    options: LossOptions | SkipJsonSchema[None] = None


class KeyRequest(_Strict):
    """``POST /v1/keys``: a key, optionally in a project (analyst or viewer keys only)."""

    role: Literal["admin", "analyst", "viewer"]
    label: (
        Annotated[str, Field(min_length=1, max_length=MAX_KEY_LABEL, pattern=NO_NUL_PATTERN)]
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

    labels: Annotated[dict[LabelName, LabelValue], Field(min_length=1, max_length=MAX_LABELS)]


class Quota(_Strict):
    """A project's quota: the ε bound on the realized loss of its own sub-history."""

    epsilon: Annotated[float, Field(gt=0, le=MAX_BUDGET)]


class ProjectRequest(_Strict):
    """``POST /v1/projects``."""

    name: ProjectName
    scope: ProjectScope
    quota: Quota


class ProjectPatch(_Strict):
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


class SubmitResult(_Open):
    """An accepted submit: the sampled output and the odometer after it."""

    query_id: int
    object_id: str
    seq: int
    version: int = Field(description="The data version the query read")
    output: Any
    epsilon: float
    odometer: Odometer


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
    role: Literal["admin", "analyst", "viewer"]
    label: str | None
    key: str
    project: str | None = Field(default=None, description="The key's project (null: unscoped)")


class KeyInfo(_Open):
    """An API key's public facts (never its secret)."""

    id: int
    role: Literal["admin", "analyst", "viewer"]
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
    role: Literal["admin", "analyst", "viewer"]
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


class SurveyProgress(_Open):
    """How far a survey got."""

    total: int
    decided: int
    accepted: int
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


class SurveyResponse(_Open):
    """One member's decision (``output``: for the survey's analyst and admins).

    ``pending``: not decided yet; ``cancelled``: never to be decided, the survey was cancelled
    first.
    """

    object_id: str
    decision: Literal["pending", "accepted", "refused", "cancelled"]
    reason: str | None
    version: int | SkipJsonSchema[None] = Field(
        default=None, description="The data version an accepted member answered from"
    )
    output: Any = None


class SurveyResponsePage(CursorPage[SurveyResponse, str]):
    """A page of members' decisions in object-id order."""


class SurveyDryRun(_Open):
    """What a survey would do now, spending nothing."""

    members: int
    would_accept: int
    would_refuse: SurveyRefusals
    groups: int


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

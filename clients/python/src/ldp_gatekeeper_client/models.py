"""Typed models of every request and response of the gatekeeper's API (v1).

Each class bears the name of a schema of the service's OpenAPI document (``/openapi.json``,
``components.schemas``) and has its properties; ``tests/client/test_client_contract.py`` holds
the two to the same names, properties, required fields, request enums and, field by field, the
same types; a response's constraints are the document's.

*Requests* refuse unknown fields (as the server does); their discriminator fields have defaults
(``GrrQuery(attribute="disease", epsilon=0.5)``). Numeric ranges and patterns are left to the
server (the test checks the client states none the server does not), which answers ``422``
naming the field (:class:`~ldp_gatekeeper_client.errors.ValidationFailed`).
*Responses* keep fields added by later versions of the server (``extra="allow"``) and parse
timestamps into timezone-aware :class:`~datetime.datetime`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

Scalar = str | int | float
Role = Literal["admin", "analyst", "viewer"]
Filter = Literal["bayesian", "simplified", "basic", "approx_bayesian"]
#: Algorithm 4's phase of an ``approx_bayesian`` object.
Phase = Literal["output-independent", "bayesian"]
AuditKind = Literal[
    "object.registered",
    "object.retired",
    "key.created",
    "key.revoked",
    "decision.accepted",
    "decision.rejected",
    "objects.imported",
    "object.version_created",
    "objects.versions_imported",
    "survey.created",
    "survey.finished",
    "survey.cancelled",
    "project.created",
    "project.quota_changed",
    "project.deleted",
]
SurveyStatus = Literal["queued", "running", "done", "cancelled", "failed"]
#: What ``GET /v1/odometers?status=`` lists (``near_exhaustion`` includes the exhausted).
OdometerStatus = Literal["active", "exhausted", "near_exhaustion", "retired"]
#: Statuses after which a survey changes no more.
FINISHED: frozenset[str] = frozenset({"done", "cancelled", "failed"})


class _Request(BaseModel):
    """A request body: unknown fields are refused, as the server refuses them."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    """A response body: fields added by later server versions are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class _Replayable(_Response):
    """An answer an ``Idempotency-Key`` may have replayed (header ``Idempotent-Replayed``)."""

    _replayed: bool = PrivateAttr(default=False)

    @property
    def replayed(self) -> bool:
        """True when the server answered a retry with the answer it had stored."""
        return self._replayed


# ----------------------------------------------------------------------------------- domains
class RealAttribute(_Request):
    """A real attribute: the closed interval ``[low, high]``."""

    name: str
    type: Literal["real"] = "real"
    low: float
    high: float


class IntegerAttribute(_Request):
    """An integer attribute: ``low``, ``low + 1``, ..., ``high``."""

    name: str
    type: Literal["integer"] = "integer"
    low: int
    high: int


class CategoricalAttribute(_Request):
    """A categorical attribute: a list of distinct values."""

    name: str
    type: Literal["categorical"] = "categorical"
    values: list[str | int]


Attribute = Annotated[
    RealAttribute | IntegerAttribute | CategoricalAttribute, Field(discriminator="type")
]


class Domain(_Request):
    """The values an object could take (finite when no attribute is ``real``)."""

    attributes: list[Attribute]


# ----------------------------------------------------------------------------------- queries
class Predicate(_Request):
    """``attribute op value``; ``in`` takes a list of values."""

    attribute: str
    op: Literal["==", "!=", "<", "<=", ">", ">=", "in"]
    value: Scalar | list[Scalar]


class GrrQuery(_Request):
    """Generalised randomised response on a finite attribute."""

    mechanism: Literal["grr"] = "grr"
    attribute: str
    epsilon: float


class BinaryRrQuery(_Request):
    """Binary randomised response on a predicate; outputs 1 or 0."""

    mechanism: Literal["binary_rr"] = "binary_rr"
    predicate: Predicate
    epsilon: float


class UnaryEncodingQuery(_Request):
    """Unary encoding of a finite attribute; outputs a list of bits."""

    mechanism: Literal["unary_encoding"] = "unary_encoding"
    attribute: str
    epsilon: float
    variant: Literal["optimized", "symmetric"] = "optimized"


class MatrixQuery(_Request):
    """Any mechanism on a finite domain: one row of probabilities per domain point."""

    mechanism: Literal["matrix"] = "matrix"
    outputs: list[Any]
    probabilities: list[list[float]]
    epsilon: float | None = None


class LinearQuery(_Request):
    """A linear query ``Σ w·x + c`` on numeric attributes, answered ``a`` or ``b``."""

    mechanism: Literal["linear"] = "linear"
    weights: dict[str, float]
    intercept: float = 0.0
    range: tuple[float, float]
    truncate: bool = False
    epsilon: float


class LogisticQuery(_Request):
    """A logistic query ``sigmoid(Σ w·x + c)``, answered 0 or 1."""

    mechanism: Literal["logistic"] = "logistic"
    weights: dict[str, float]
    intercept: float = 0.0
    epsilon: float


class OlhQuery(_Request):
    """Optimized local hashing of a finite attribute; outputs ``{"seed", "bucket"}``.

    ``ldp_gatekeeper_client.oracles`` decodes the outputs.
    """

    mechanism: Literal["olh"] = "olh"
    attribute: str
    epsilon: float
    g: int | None = None


class HadamardQuery(_Request):
    """Hadamard response on a finite attribute; outputs a column number."""

    mechanism: Literal["hadamard"] = "hadamard"
    attribute: str
    epsilon: float


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


# ---------------------------------------------------------------------------------- requests
class BudgetBody(_Request):
    """An object's budget ε_g (and δ_g for the ``approx_bayesian`` filter)."""

    epsilon: float
    delta: float | None = None


class LifetimeBody(_Request):
    """A lifetime budget ε_L over every data version of an object (at least ``budget.epsilon``)."""

    epsilon: float


class RegisterRequest(_Request):
    """``POST /v1/objects``: a protected object with its private value (never returned)."""

    id: str
    domain: Domain
    value: dict[str, Scalar]
    budget: BudgetBody
    filter: Filter = "bayesian"
    labels: dict[str, str] | None = None
    #: ε_L: the realized loss summed over the object's data versions stays within it.
    lifetime: LifetimeBody | None = None


class ImportRequest(_Request):
    """``POST /v1/imports``: up to 10,000 registrations, stored all or nothing."""

    objects: list[RegisterRequest]


class VersionRequest(_Request):
    """``POST /v1/objects/{id}/versions``: the object's new value (never returned)."""

    value: dict[str, Scalar]


class VersionItem(_Request):
    """One object's new value in a bulk request."""

    id: str
    value: dict[str, Scalar]


class VersionsRequest(_Request):
    """``POST /v1/versions``: up to 10,000 new values, stored all or nothing."""

    versions: list[VersionItem]


class LabelsCohort(_Request):
    """Every object carrying all these labels (membership fixed at creation)."""

    labels: dict[str, str]


class IdsCohort(_Request):
    """These objects."""

    ids: list[str]


Cohort = LabelsCohort | IdsCohort


class SurveyRequest(_Request):
    """``POST /v1/surveys`` (and its dry-run): one query to every member of a cohort."""

    name: str
    query: Query
    cohort: Cohort
    #: Members answer from a stored identical answer of their current version where they can.
    reuse: bool = False


class QueryRequest(_Request):
    """Dry-run and submit: the query to decide."""

    query: Query
    #: Return a stored identical answer of the current version (nothing charged), if any.
    reuse: bool = False


class HistoryEntry(_Request):
    """One past query and the output it gave (for the calculator)."""

    query: Query
    output: Any


class LossOptions(_Request):
    """Calculator options."""

    tolerance: float = 1e-4
    time_limit: float | None = None
    max_nodes: int | None = None
    grouping: int | None = None
    fast: bool = False


class LossRequest(_Request):
    """``POST /v1/loss``: the stateless calculator."""

    domain: Domain
    history: list[HistoryEntry]
    budget: float | None = None
    candidate: Query | None = None
    options: LossOptions | None = None
    #: δ_g: also decide the candidate with ``approx_bayesian`` (Algorithm 4).
    delta: float | None = None


class KeyRequest(_Request):
    """``POST /v1/keys``: a key, optionally in a project (analyst or viewer keys only)."""

    role: Role
    label: str | None = None
    #: The project's name: the key inherits its scope and quota.
    project: str | None = None


class ProjectScope(_Request):
    """A project's scope: the labels an object must all carry to be seen by its keys."""

    labels: dict[str, str]


class Quota(_Request):
    """A project's quota: the ε bound on the realized loss of its own sub-history."""

    epsilon: float


class ProjectRequest(_Request):
    """``POST /v1/projects``."""

    name: str
    scope: ProjectScope
    quota: Quota


class ProjectPatch(_Request):
    """``PATCH /v1/projects/{name}``: a new quota (the scope is fixed)."""

    quota: Quota


# --------------------------------------------------------------------------------- responses
class LossBounds(_Response):
    """Bounds of a realized loss: certified ``lower <= loss <= upper``, or the exact loss."""

    lower: float
    upper: float
    #: True: the loss is exact (randomized response, every ε and the budget as written) and
    #: ``lower`` and ``upper`` are both its nearest double. False: certified bounds.
    exact: bool = False


class LifetimeOdometer(_Response):
    """The lifetime budget's account: the realized loss summed over every data version."""

    budget: float
    realized_loss: LossBounds
    versions: int
    remaining: float


class ProjectLoss(_Response):
    """One project's sub-history of an object (an admin's odometer)."""

    project: str
    quota: float
    realized_loss: LossBounds
    accepted: int
    basic_composition: float


class QuotaDecision(_Response):
    """The project's quota on its own sub-history of the object (a project key's dry-run)."""

    project: str
    quota: float
    decision: Literal["accept", "reject"]
    reason: str
    realized_loss: LossBounds
    worst_case_after: float


class Odometer(_Response):
    """An object's accounting: budget, certified loss, remaining, basic composition, counts.

    All of the current data version (``version``), except ``lifetime``.
    """

    budget: float
    realized_loss: LossBounds
    remaining: float
    basic_composition: float
    accepted: int
    rejected: int
    updated_at: datetime | None
    #: δ_g and Algorithm 4's phase (``approx_bayesian`` objects only).
    delta: float | None = None
    phase: Phase | None = None
    #: The current data version (1 at registration).
    version: int
    #: Objects registered with a lifetime budget only.
    lifetime: LifetimeOdometer | None = None
    #: Admins only: each project's sub-history loss against its quota.
    projects: list[ProjectLoss] | None = None


class ObjectBudget(_Response):
    """The budget of an object."""

    epsilon: float
    delta: float | None = None


class ObjectView(_Response):
    """An object's metadata (never its value) with its odometer."""

    id: str
    domain: dict[str, Any]
    budget: ObjectBudget
    filter: Filter
    finite: bool
    labels: dict[str, str]
    #: ε_L, when registered with a lifetime budget.
    lifetime: ObjectBudget | None = None
    #: The current data version (1 at registration).
    version: int
    status: Literal["active", "retired"]
    created_at: datetime | None
    retired_at: datetime | None
    odometer: Odometer


class OutputLoss(_Response):
    """The loss bounds after one possible output of a candidate query."""

    output: Any
    lower: float
    upper: float
    #: As :attr:`LossBounds.exact`.
    exact: bool = False


class Decision(_Response):
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
    #: δ_g and Algorithm 4's phase after this decision (``approx_bayesian`` objects only).
    delta: float | None = None
    phase: Phase | None = None
    #: Which check refused (a rejection only): the version's filter, the lifetime budget after
    #: it, or a project key's quota (reported only when the object's own checks would accept).
    refusal: Literal["budget-exhausted", "lifetime-exhausted", "quota-exhausted"] | None = None
    #: A project key's dry-run: its quota's filter on the project's own sub-history.
    quota: QuotaDecision | None = None
    #: With ``reuse``: a submit would return a stored identical answer (charging nothing).
    would_reuse: bool = False

    @property
    def accepted(self) -> bool:
        """True when the filter would accept the query now."""
        return self.decision == "accept"


class SubmitResult(_Replayable):
    """An accepted submit: the sampled output and the odometer after it (or a reused answer)."""

    #: The accepted query's id; None for a reused answer a survey gave (``survey_id``).
    query_id: int | None
    object_id: str
    #: The answer's number in the history (a reused answer's own).
    seq: int
    #: The data version the query read.
    version: int
    output: Any
    epsilon: float
    odometer: Odometer
    #: ``reuse=True`` returned a stored identical answer: nothing charged or recorded.
    reused: bool = False
    #: A reused answer a survey gave: that survey.
    survey_id: int | None = None


class HistoryItem(_Response):
    """One accepted query of an object's history: a single submit or a survey's answer."""

    #: The submit's query id; None for a survey's answer (``survey_id`` names the survey).
    query_id: int | None
    #: The survey that asked it (None: a single submit).
    survey_id: int | None = None
    seq: int
    #: The data version the query read.
    version: int
    query: dict[str, Any]
    output: Any
    epsilon: float
    realized_loss_after: LossBounds
    basic_composition_after: float
    created_at: datetime | None


class HistoryPage(_Response):
    """A page of history; ``next_after`` is the ``after`` of the next page (None: last)."""

    items: list[HistoryItem]
    next_after: int | None


class OdometerPoint(_Response):
    """The loss after one accepted query."""

    accepted: int
    realized_loss: LossBounds
    basic_composition: float
    epsilon: float
    at: datetime | None


class Rejection(_Response):
    """A rejected submit: ``after_accepted`` queries had been accepted when it came."""

    after_accepted: int
    at: datetime | None


class OdometerHistory(_Response):
    """The loss over time of one object, and the rejections between its accepted queries."""

    object_id: str
    budget: float
    #: The data version of these points.
    version: int
    #: When this data version began: the registration for version 1, the new version's
    #: creation otherwise.
    created_at: datetime | None = None
    points: list[OdometerPoint]
    rejections: list[Rejection]
    next_after: int | None


class OdometerSummary(Odometer):
    """One object in the odometers list: its odometer with its id, filter and status."""

    id: str
    filter: str
    labels: dict[str, str]
    status: Literal["active", "retired"]


class OdometerPage(_Response):
    """A page of odometers."""

    items: list[OdometerSummary]
    total: int
    limit: int
    offset: int


class OdometerTotals(_Response):
    """Counts of the objects a filter covers, by status (``GET /v1/odometers/totals``).

    ``exhausted``: active, less left than the smallest ε a query may declare;
    ``near_exhaustion``: active, less than 0.1 of the budget left (the exhausted included).
    """

    #: The objects listed: active ones, and retired ones if included.
    objects: int
    active: int
    retired: int
    exhausted: int
    near_exhaustion: int
    #: Rejected submits, summed over ``objects``.
    rejected: int


class CandidateAcceptance(_Response):
    """Whether each filter would accept the candidate."""

    bayesian: bool
    simplified: bool
    basic: bool
    #: With the request's ``delta`` only.
    approx_bayesian: bool | None = None


class CandidateLoss(_Response):
    """The calculator's evaluation of a candidate query."""

    per_output: list[OutputLoss]
    per_output_complete: bool
    worst_case_upper: float
    epsilon: float
    accepted: CandidateAcceptance


class ApproxState(_Response):
    """With the request's ``delta``: Algorithm 4's state of the history (F₀'s account, phase)."""

    delta: float
    f0_account: float
    f0_threshold: float
    phase: Phase


class LossResult(_Response):
    """The calculator's answer."""

    realized_loss: LossBounds
    basic_composition: float
    status: Literal["ok", "limit"]
    #: With ``status: limit`` only: which limit kept ``upper - lower`` above the tolerance.
    reason: str | None = None
    candidate: CandidateLoss | None = None
    approx: ApproxState | None = None


class ImportResult(_Replayable):
    """Objects created by an import, and those already registered identically."""

    created: int
    existing: int


class VersionCreated(_Response):
    """The object's new data version."""

    object_id: str
    version: int


class CreatedVersion(_Response):
    """One object's new data version in a bulk answer."""

    id: str
    version: int


class VersionsResult(_Replayable):
    """The versions a bulk request created, in the request's order."""

    created: int
    versions: list[CreatedVersion]


class VersionsImported(_Response):
    """What :meth:`Versions.import_ndjson` did: versions created, and replayed batches' ones."""

    created: int
    already: int


class CreatedKey(_Response):
    """A new API key: ``key`` is the secret, shown this once."""

    id: int
    role: Role
    label: str | None
    key: str
    #: The key's project (None: unscoped).
    project: str | None = None


class KeyInfo(_Response):
    """An API key's public facts (never its secret)."""

    id: int
    role: Role
    label: str | None
    created_at: datetime | None
    revoked_at: datetime | None
    #: The key's project (None: unscoped).
    project: str | None = None


class KeyPage(_Response):
    """A page of API keys."""

    items: list[KeyInfo]
    next_after: int | None


class RevokedKey(_Response):
    """A revoked key."""

    id: int
    revoked: bool


class AuditEvent(_Response):
    """One entry of the audit log: public facts only."""

    id: int
    at: datetime
    kind: str
    actor_key_id: int | None
    object_id: str | None
    detail: dict[str, Any]


class AuditPage(_Response):
    """A page of the audit log."""

    events: list[AuditEvent]
    next_after: int | None


class WhoAmI(_Response):
    """The calling key."""

    key_id: int
    role: Role
    #: The key's project (None: unscoped).
    project: str | None = None


class ScopeView(_Response):
    """A project's scope: its keys see only objects carrying all these labels."""

    labels: dict[str, str]


class QuotaView(_Response):
    """A project's quota: the bound on its own sub-history's realized loss, per object."""

    epsilon: float


class ProjectView(_Response):
    """A project: its unique name, scope and quota."""

    name: str
    scope: ScopeView
    quota: QuotaView
    created_at: datetime
    updated_at: datetime


class ProjectPage(_Response):
    """A page of projects."""

    items: list[ProjectView]
    next_after: int | None


class Health(_Response):
    """The process is up."""

    status: Literal["ok"]


class Ready(_Response):
    """Ready to serve: the database (and Redis and the broker, when configured) answered."""

    status: Literal["ok"]
    database: Literal["ok"]
    redis: Literal["ok"] | None = None
    broker: Literal["ok"] | None = None
    #: Live ``gatekeeper worker`` nodes (with ``BROKER_URL``).
    workers: int | None = None


class SurveyRefusals(_Response):
    """Members refused, by reason (the JSON names are ``budget-exhausted`` and so on)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    budget_exhausted: int = Field(alias="budget-exhausted")
    invalid_for_domain: int = Field(alias="invalid-for-domain")
    retired: int
    #: The version's filter accepted but the object's lifetime budget did not.
    lifetime_exhausted: int = Field(default=0, alias="lifetime-exhausted")
    #: The object's filters accepted but the quota of the survey's project did not.
    quota_exhausted: int = Field(default=0, alias="quota-exhausted")


class SurveyProgress(_Response):
    """How far a survey got."""

    total: int
    decided: int
    #: Members answered, reused answers included.
    accepted: int
    #: Accepted members answered by a stored identical answer.
    reused: int = 0
    refused: SurveyRefusals


class ScalarEstimate(_Response):
    """A proportion (``binary_rr``) or a mean (``linear``, ``logistic``) over ``n`` members."""

    kind: Literal["proportion", "mean"]
    value: float
    n: int
    stderr: float
    #: The 95% interval ``[low, high]``.
    ci95: Annotated[list[float], Field(min_length=2, max_length=2)]


class HistogramEstimate(_Response):
    """The share of each value (``grr``, ``unary_encoding``), with its error, per value."""

    kind: Literal["histogram"]
    values: dict[str, float]
    n: int
    stderr: dict[str, float]
    ci95: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]]


#: A survey's estimate, by ``kind`` (``None`` with ``estimate_unavailable`` saying why).
Estimate = Annotated[ScalarEstimate | HistogramEstimate, Field(discriminator="kind")]


class SurveyView(_Replayable):
    """A survey: status, progress and the estimate over its accepted members."""

    id: int
    name: str
    status: SurveyStatus
    query: dict[str, Any]
    cohort: dict[str, Any]
    #: Members answer from stored identical answers where they can.
    reuse: bool = False
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    progress: SurveyProgress
    groups: int
    estimate: Estimate | None
    estimate_unavailable: str | None = None
    outputs: dict[str, int] | None = None
    #: Members are left to decide and no ``gatekeeper worker`` runs surveys (``BROKER_URL`` set,
    #: no live surveys node): the survey waits until one starts.
    waiting_for_workers: bool

    @property
    def finished(self) -> bool:
        """True once the survey changes no more (done, cancelled or failed)."""
        return self.status in FINISHED


class SurveyPage(_Response):
    """Surveys, newest first; ``next_before`` is the ``before`` of the next page."""

    items: list[SurveyView]
    next_before: int | None


class SurveyResponse(_Response):
    """One member's decision (``output``: for the survey's analyst and admins).

    ``pending``: not decided yet; ``cancelled``: never to be decided, the survey was cancelled
    first.
    """

    object_id: str
    decision: Literal["pending", "accepted", "refused", "cancelled"]
    reason: str | None
    #: The data version an accepted member answered from.
    version: int | None = None
    output: Any = None


class SurveyResponsePage(_Response):
    """A page of members' decisions in object-id order."""

    items: list[SurveyResponse]
    next_after: str | None


class SurveyDryRun(_Response):
    """What a survey would do now, spending nothing."""

    members: int
    would_accept: int
    would_refuse: SurveyRefusals
    groups: int
    #: With ``reuse``: members a stored identical answer would answer (in ``would_accept``).
    would_reuse: int = 0


class FieldError(_Response):
    """One invalid field of a request: its path (``objects[3].budget.epsilon``) and why."""

    field: str
    message: str


class Problem(_Response):
    """An error answer (RFC 9457 ``application/problem+json``); extra members are kept."""

    type: str
    title: str
    status: Annotated[int, Field(ge=400, le=599)]
    detail: str
    errors: list[FieldError] | None = None

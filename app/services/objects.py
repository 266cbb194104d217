"""Registering, reading and retiring protected objects; odometers.

Views returned here never contain the object's value.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fractions import Fraction
from functools import lru_cache
from typing import Any, Literal, Protocol

from app.engine.accountant import Odometer
from app.engine.domain import Domain, parse_domain
from app.engine.errors import InvalidInput
from app.engine.filters import FilterKind
from app.engine.jsonfields import path
from app.engine.likelihood import LossBounds
from app.engine.limits import EngineLimits
from app.engine.numerics import decimal_fraction, fraction_text
from app.engine.pipeline import f0_filter
from app.services import audit, schemas
from app.services.bodies import validated
from app.services.errors import AlreadyExists, NotFound
from app.services.history import object_history
from app.services.schemas import (
    DOMAINS_SEEN,
    ID_PATTERN,
    LABEL_NAME,
    LABEL_VALUE,
    RegisterRequest,
)
from app.services.scope import Scope, admits
from app.services.snapshots import lifetime_of
from app.store import Conflict, Database, Tx, reading, transaction
from app.store import history as history_store
from app.store import objects as store
from app.store import versions as version_store
from app.store.counts import count_objects, surveys_by_status
from app.store.domains import domain_hash, store_domains
from app.store.objects import ObjectRecord
from app.store.projects import sub_histories
from app.store.states import count_states


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    if moment.tzinfo is None:  # SQLite returns naive datetimes
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


class OdometerColumns(Protocol):
    """The columns an odometer is made of (an :class:`ObjectRecord` or a submit's row)."""

    @property
    def budget(self) -> float:
        """ε_g."""

    @property
    def loss_lower(self) -> float:
        """Certified lower bound of the realized loss."""

    @property
    def loss_upper(self) -> float:
        """Certified upper bound of the realized loss."""

    @property
    def basic_total(self) -> str:
        """Exact Σ ε_i, as a fraction string."""

    @property
    def accepted(self) -> int:
        """Accepted queries."""

    @property
    def rejected(self) -> int:
        """Rejected queries."""

    @property
    def updated_at(self) -> datetime | None:
        """Last change."""

    @property
    def filter(self) -> str:
        """The filter's name."""

    @property
    def budget_delta(self) -> float | None:
        """δ_g (``approx_bayesian`` only)."""

    @property
    def f0_account(self) -> str:
        """F₀'s account (``approx_bayesian``), as a fraction string."""

    @property
    def domain(self) -> str:
        """The domain's JSON text (F₀'s threshold depends on its size)."""

    @property
    def version_start(self) -> int:
        """Accepted queries of the closed data versions."""

    @property
    def lifetime_budget(self) -> float | None:
        """ε_L (None: no lifetime budget)."""

    @property
    def lifetime_exact(self) -> str | None:
        """Exact Σ of the closed versions' losses (None once one was inexact)."""

    @property
    def lifetime_lower(self) -> float:
        """Certified lower bound of that Σ."""

    @property
    def lifetime_upper(self) -> float:
        """Certified upper bound of that Σ."""

    @property
    def data_version(self) -> int:
        """The current data version."""


#: Stored domains were checked against the limits of their registration: read them whatever
#: the limits are now.
_STORED_DOMAINS = EngineLimits(
    max_attributes=2**31, max_points=2**63, max_values_per_attribute=2**63
)


@lru_cache(maxsize=1024)
def stored_domain(domain_text: str) -> Domain:
    """A stored domain, parsed once per text (whatever the limits are now)."""
    return parse_domain(json.loads(domain_text), limits=_STORED_DOMAINS)


def odometer_view(row: OdometerColumns) -> schemas.Odometer:
    """The odometer object of contract.md: the engine's :class:`Odometer` and a timestamp.

    ``delta``, ``phase`` and ``lifetime`` are set only for the objects that have them (absent
    from the wire otherwise, never ``null``).
    """
    return odometer_with(
        row,
        loss_lower=row.loss_lower,
        loss_upper=row.loss_upper,
        basic_total=row.basic_total,
        f0_account=row.f0_account,
        accepted=row.accepted,
        updated_at=row.updated_at,
    )


def odometer_with(
    row: OdometerColumns,
    *,
    loss_lower: float,
    loss_upper: float,
    basic_total: str,
    f0_account: str,
    accepted: int,
    updated_at: datetime | None,
) -> schemas.Odometer:
    """:func:`odometer_view` of ``row`` with the columns an accepted query changes given.

    ``odometer_view(dataclasses.replace(row, loss_lower=..., ...))``: a submit's odometer from
    the row it read and the values it writes (a copy of the whole row cost more).
    """
    delta = row.budget_delta if row.filter == FilterKind.APPROX_BAYESIAN.value else None
    phase = None
    if delta is not None:
        f0 = f0_filter(row.budget, delta, stored_domain(row.domain))
        phase = f0.phase(fraction_text(f0_account))
    current = LossBounds(loss_lower, loss_upper)
    odometer = Odometer(
        row.budget,
        current,
        float(fraction_text(basic_total)),
        accepted - row.version_start,
        row.rejected,
        delta,
        phase,
    )
    optional: dict[str, Any] = {}
    if delta is not None:
        optional.update(delta=odometer.delta, phase=odometer.phase)
    lifetime = lifetime_of(row)
    if lifetime is not None:
        if current.exact:  # an exact loss read back from the row: its upper's decimal
            current = LossBounds(current.lower, current.upper, decimal_fraction(current.upper))
        optional["lifetime"] = schemas.LifetimeOdometer(
            budget=lifetime.budget,
            realized_loss=schemas.LossBounds.of(lifetime.realized(current)),
            versions=lifetime.versions,
            remaining=lifetime.remaining(current),
        )
    return schemas.Odometer(
        budget=odometer.budget,
        realized_loss=schemas.LossBounds.of(odometer.realized_loss),
        remaining=odometer.remaining,
        basic_composition=odometer.basic_composition,
        accepted=odometer.accepted,
        rejected=odometer.rejected,
        updated_at=_iso(updated_at),
        version=row.data_version,
        **optional,
    )


def budget_view(epsilon: float, delta: float | None) -> schemas.ObjectBudget:
    """``{"epsilon"}``, with ``"delta"`` for an (ε, δ) budget."""
    if delta is None:
        return schemas.ObjectBudget(epsilon=epsilon)
    return schemas.ObjectBudget(epsilon=epsilon, delta=delta)


def _status(row: ObjectRecord) -> Literal["active", "retired"]:
    return "retired" if row.retired_at is not None else "active"


def object_view(row: ObjectRecord) -> schemas.ObjectView:
    """Metadata of an object — never its value."""
    lifetime = (
        {} if row.lifetime_budget is None else {"lifetime": budget_view(row.lifetime_budget, None)}
    )
    return schemas.ObjectView(
        id=row.id,
        domain=json.loads(row.domain),
        budget=budget_view(row.budget, row.budget_delta),
        filter=row.filter,  # type: ignore[arg-type]  # a stored FilterKind value
        finite=row.finite,
        labels=row.labels or {},
        version=row.data_version,
        status=_status(row),
        created_at=_iso(row.created_at),
        retired_at=_iso(row.retired_at),
        odometer=odometer_view(row),
        **lifetime,
    )


@dataclass
class DomainCache:
    """The domains of one bulk request, each handled once.

    ``models``: validated by :class:`~app.services.schemas.RegisterRequest`, by the ``repr`` of
    their JSON (its validation context, :attr:`context`): every item that repeats a domain holds
    the same model. ``parsed``: parsed by the engine (:func:`parse_registration`'s ``domains``)
    — the domain, its stored text and the text's hash — by that model's identity, the model
    kept beside it (alive for the request: its ``id`` is never another's). Items validated
    without :attr:`context` each have a model of their own: each is then parsed, correct, only
    slower.
    """

    models: dict[str, schemas.Domain] = field(default_factory=dict)
    parsed: dict[int, tuple[schemas.Domain, tuple[Domain, str, str]]] = field(default_factory=dict)
    #: The validation context of the request's models (one dict for the whole request).
    context: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.context = {DOMAINS_SEEN: self.models}


@dataclass(frozen=True)
class Registration:
    """A validated registration body, as stored (the value still in plaintext JSON)."""

    id: str
    domain_text: str
    #: :func:`app.store.domains.domain_hash` of ``domain_text`` (the stored column).
    domain_hash: str
    value_text: str
    budget: float
    filter: str
    finite: bool
    labels: dict[str, str] | None
    #: The value already encrypted (``app.crypto``), when a worker process sealed it.
    sealed: str | None = None
    #: δ_g of an ``approx_bayesian`` object.
    budget_delta: float | None = None
    #: ε_L, the lifetime budget over every data version (None: none).
    lifetime_budget: float | None = None

    def row(self) -> dict[str, Any]:
        """The columns of a new object's row that are its own (the value in plaintext)."""
        return {
            "id": self.id,
            "domain_hash": self.domain_hash,
            "value": self.value_text,
            "budget": self.budget,
            "budget_delta": self.budget_delta,
            "filter": self.filter,
            "finite": self.finite,
            "labels": self.labels,
            "lifetime_budget": self.lifetime_budget,
        }


def new_object_columns(now: datetime) -> dict[str, Any]:
    """The columns every new object starts with: no history, no loss, version 0."""
    return {
        "state_hash": None,
        "state_pending": 0,
        "history_hash": None,
        "loss_lower": 0.0,
        "loss_upper": 0.0,
        "basic_total": "0",
        "f0_account": "0",
        "accepted": 0,
        "rejected": 0,
        "version": 0,
        "data_version": 1,
        "version_start": 0,
        "lifetime_exact": "0",
        "lifetime_lower": 0.0,
        "lifetime_upper": 0.0,
        "created_at": now,
        "updated_at": now,
    }


def parse_registration(
    body: Any,
    field: str,
    limits: EngineLimits,
    domains: DomainCache | None = None,
) -> Registration:
    """Validate a registration body (``field`` names it in errors: ``""`` or ``objects[i]``).

    The structure is :class:`~app.services.schemas.RegisterRequest`'s; the domain and the value
    are then parsed by the engine from the JSON as written. ``domains`` caches parsed domains by
    the ``repr`` of their JSON (a bulk import parses each once).
    """
    context = domains.context if domains is not None else None
    return registration_of(validated(RegisterRequest, body, field, context), field, limits, domains)


def registration_of(
    request: RegisterRequest,
    field: str,
    limits: EngineLimits,
    domains: DomainCache | None = None,
) -> Registration:
    """A validated registration: its domain and value parsed by the engine, as written."""
    domain, domain_text, stored_hash = _parse_domain_cached(
        request, path(field, "domain"), limits, domains
    )
    value = domain.parse_value(request.written("value"), path(field, "value"))
    lifetime = None
    if request.lifetime is not None:
        lifetime = request.lifetime.epsilon
        if decimal_fraction(lifetime) < decimal_fraction(request.budget.epsilon):
            raise InvalidInput(
                path(field, "lifetime.epsilon"),
                "must be at least the per-version budget (budget.epsilon)",
            )
    return Registration(
        id=request.id,
        domain_text=domain_text,
        domain_hash=stored_hash,
        value_text=json.dumps(value),
        budget=request.budget.epsilon,
        filter=request.filter,
        finite=domain.is_finite,
        labels=request.labels or None,
        budget_delta=request.budget.delta,
        lifetime_budget=lifetime,
    )


def _parse_domain_cached(
    request: RegisterRequest, field: str, limits: EngineLimits, cache: DomainCache | None
) -> tuple[Domain, str, str]:
    """The parsed domain, its stored text and that text's hash; ``cache`` keeps them per model.

    The engine parses the JSON as written (``request.written("domain")``). In a bulk request
    validated with ``cache``'s context, the items that repeat a domain's JSON (equal ``repr``:
    :meth:`~app.services.schemas.RegisterRequest._domain_once`) share one model, so the model's
    identity names the JSON without computing its ``repr`` again (the sorted ``json.dumps``
    this once was cost 12% of an import worker's time in a py-spy profile).
    """
    model = request.domain
    if cache is not None and (found := cache.parsed.get(id(model))) is not None:
        return found[1]
    domain = parse_domain(request.written("domain"), field, limits=limits)
    text = json.dumps(domain.to_json())
    parsed = (domain, text, domain_hash(text))
    if cache is not None:  # a domain that failed to parse raised above: never cached
        cache.parsed[id(model)] = (model, parsed)  # the model kept: its id stays its own
    return parsed


def register_object(
    *,
    engine: Database,
    body: Any,
    limits: EngineLimits,
    actor_key_id: int | None = None,
) -> schemas.ObjectView:
    """Validate and store a new object; returns its view.

    Raises ``InvalidInput`` naming the field, or :class:`~app.services.errors.AlreadyExists`.
    """
    registration = parse_registration(body, "", limits)
    columns = {**registration.row(), **new_object_columns(datetime.now(UTC))}
    try:
        with transaction(engine) as conn:
            store_domains(conn, [registration.domain_text])
            row = store.insert_object(conn, columns=columns, domain=registration.domain_text)
            audit.record(
                conn,
                kind=audit.AuditKind.OBJECT_REGISTERED,
                actor_key_id=actor_key_id,
                object_id=registration.id,
                detail={
                    "budget": registration.budget,
                    **(
                        {"delta": registration.budget_delta}
                        if registration.budget_delta is not None
                        else {}
                    ),
                    "filter": registration.filter,
                    "attributes": [
                        a["name"] for a in json.loads(registration.domain_text)["attributes"]
                    ],
                },
            )
    except Conflict:
        raise AlreadyExists(f"an object with id {registration.id!r} already exists") from None
    return object_view(row)


def load_object(conn: Tx, object_id: str, scope: Scope | None = None) -> ObjectRecord:
    """The object's public columns, or :class:`~app.services.errors.NotFound`.

    An object outside ``scope`` is not found, exactly as a missing one: the one ``SELECT``
    finds no row either way, after the same work (:func:`app.store.objects.get_object`).
    """
    # an id that could never have been registered (e.g. a NUL byte, which PostgreSQL rejects)
    labels = None if scope is None else scope.labels
    row = (
        store.get_object(conn, object_id=object_id, scope=labels)
        if ID_PATTERN.fullmatch(object_id)
        else None
    )
    if row is None or not admits(scope, row.labels):
        raise NotFound("no object with that id")
    return row


def get_object(
    *, engine: Database, object_id: str, scope: Scope | None = None
) -> schemas.ObjectView:
    """An object's view."""
    with reading(engine) as conn:
        return object_view(load_object(conn, object_id, scope))


def retire_object(
    *, engine: Database, object_id: str, actor_key_id: int | None = None
) -> schemas.ObjectView:
    """Retire an object: it answers no more queries; its history is kept."""
    with transaction(engine) as conn:
        row = load_object(conn, object_id)
        if row.retired_at is None:
            now = datetime.now(UTC)
            if store.retire(conn, object_id=object_id, at=now):
                row = replace(row, retired_at=now, version=row.version + 1)
                audit.record(
                    conn,
                    kind=audit.AuditKind.OBJECT_RETIRED,
                    actor_key_id=actor_key_id,
                    object_id=object_id,
                    detail={"accepted": row.accepted, "rejected": row.rejected},
                )
            else:  # another request retired it since it was read: show it as that one left it
                row = load_object(conn, object_id)
        return object_view(row)


def get_odometer(
    *,
    engine: Database,
    object_id: str,
    scope: Scope | None = None,
    projects: bool = False,
) -> schemas.Odometer:
    """An object's odometer (``projects``: with each project's sub-history, for admins)."""
    with reading(engine) as conn:
        view = odometer_view(load_object(conn, object_id, scope))
        if projects:
            view.projects = projects_view(conn, object_id)  # set: on the wire, even empty
        return view


def version_span(conn: Tx, row: ObjectRecord, version: int | None) -> tuple[int, int, int | None]:
    """The data version asked (the current one by default) and its ``seq`` range.

    Its queries are those with ``start < seq <= end`` (``end`` None: the current version,
    still open). :class:`NotFound` for a version the object never had.
    """
    if version is None or version == row.data_version:
        return row.data_version, row.version_start, None
    span = version_store.version_range(conn, object_id=row.id, data_version=version)
    if span is None:
        raise NotFound(f"the object has no data version {version}")
    return version, span[0], span[1]


def odometer_history(
    *,
    engine: Database,
    object_id: str,
    limit: int,
    after: int,
    version: int | None = None,
    scope: Scope | None = None,
) -> schemas.OdometerHistory:
    """Realized-loss bounds and basic composition after each accepted query, for charts.

    Of one data version (the current one by default); ``accepted`` counts within it.
    """
    with reading(engine) as conn:
        row = load_object(conn, object_id, scope)
        number, start, end = version_span(conn, row, version)
        records = [
            r
            for r in object_history(conn, object_id, after=max(after, start), limit=limit)
            if end is None or r.seq <= end
        ]
        points = [
            schemas.OdometerPoint(
                accepted=r.seq - start,
                realized_loss=schemas.LossBounds.of(LossBounds(r.loss_lower, r.loss_upper)),
                basic_composition=r.basic_after,
                epsilon=r.epsilon,
                at=_iso(r.created_at),
            )
            for r in records
        ]
        next_after = records[-1].seq if len(records) == limit else None
        if end is not None and next_after is not None and next_after >= end:
            next_after = None
        return schemas.OdometerHistory(
            object_id=object_id,
            budget=row.budget,
            version=number,
            created_at=_iso(_version_created(conn, row, number)),
            points=points,
            rejections=[
                schemas.Rejection(after_accepted=accepted - start, at=at)
                for accepted, at in _rejections(
                    conn, object_id, after=max(after, start), before=next_after, version=number
                )
            ],
            next_after=next_after,
        )


def _version_created(conn: Tx, row: ObjectRecord, number: int) -> datetime | None:
    """When data version ``number`` began: registration, or its predecessor's closing."""
    if number == 1:
        return row.created_at
    return version_store.closed_at(conn, object_id=row.id, data_version=number - 1)


#: Rejections listed with one page of odometer history, at most.
MAX_REJECTIONS_LISTED = 1000


def _rejections(
    conn: Tx, object_id: str, *, after: int, before: int | None, version: int = 1
) -> list[tuple[int, str | None]]:
    """Rejected submits that happened after accepted query ``after`` (and before ``before``).

    Each is ``(after_accepted, at)``: how many queries had been accepted when the submit was
    rejected, and when. The count comes from
    the audit event (which records it since issue #11), or for older events by comparing times
    with the accepted queries'. Only the first :data:`MAX_REJECTIONS_LISTED` are listed.
    """
    times: list[datetime] | None = None
    found: list[tuple[int, str | None]] = []
    for event in history_store.rejections(conn, object_id=object_id):
        accepted = event.accepted
        if accepted is None:
            if times is None:  # events written before the count was recorded
                times = [
                    r.created_at
                    for r in object_history(conn, object_id)
                    if r.created_at is not None
                ]
            accepted = bisect.bisect_right(times, event.at)
        if event.version != version:
            continue
        if accepted >= after and (before is None or accepted < before):
            found.append((accepted, _iso(event.at)))
            if len(found) >= MAX_REJECTIONS_LISTED:
                break
    return found


def _summary(r: ObjectRecord) -> schemas.OdometerSummary:
    odometer = odometer_view(r)
    return schemas.OdometerSummary(
        id=r.id,
        filter=r.filter,
        labels=r.labels or {},
        status=_status(r),
        **{name: getattr(odometer, name) for name in odometer.model_fields_set},
    )


def projects_view(conn: Tx, object_id: str) -> list[schemas.ProjectLoss]:
    """An admin odometer's ``projects``: each project's sub-history loss on the object."""
    return [
        schemas.ProjectLoss(
            project=project.name,
            quota=project.quota,
            realized_loss=schemas.LossBounds.of(LossBounds(state.loss_lower, state.loss_upper)),
            accepted=state.accepted,
            basic_composition=float(Fraction(state.basic_total)),
        )
        for state, project in sub_histories(conn, object_id=object_id)
    ]


def list_odometers(
    *,
    engine: Database,
    limit: int,
    offset: int,
    remaining_lt: float | None,
    remaining_gt: float | None,
    include_retired: bool,
    labels: list[tuple[str, str]] | None = None,
    id_prefix: str | None = None,
    status: str | None = None,
    after: str | None = None,
    scope: Scope | None = None,
) -> schemas.OdometerPage:
    """A page of odometers across objects, filtered.

    By id prefix, status, remaining budget and labels, in id order from after the id ``after``
    (keyset) then ``offset``. A project key's page and ``total`` count only the objects in its
    scope.
    """
    where = store.ObjectFilter(
        labels=tuple(labels or ()),
        id_prefix=id_prefix,
        status=status,
        include_retired=include_retired,
        remaining_lt=remaining_lt,
        remaining_gt=remaining_gt,
        scope=None if scope is None else tuple(scope.labels),
    )
    with reading(engine) as conn:
        total, rows = store.page_objects(conn, where=where, limit=limit, offset=offset, after=after)
        items = [_summary(r) for r in rows]
    assert total is not None  # noqa: S101 - counted (page_objects counts by default)
    return schemas.OdometerPage(items=items, total=total, limit=limit, offset=offset)


def odometer_totals(
    *,
    engine: Database,
    labels: list[tuple[str, str]] | None = None,
    id_prefix: str | None = None,
    include_retired: bool = False,
    scope: Scope | None = None,
) -> schemas.OdometerTotals:
    """Counts of the objects carrying ``labels`` (and ``id_prefix``) by status.

    The statuses are the ones ``GET /v1/odometers?status=`` lists and the Prometheus gauges
    count (one definition each, :mod:`app.store.objects`); ``objects`` and ``rejected`` cover
    the objects the list shows (retired ones with ``include_retired``). Without labels, id
    prefix or scope they are the counts kept in ``object_counts``; else counted over the rows.
    """
    where = store.ObjectFilter(
        labels=tuple(labels or ()),
        id_prefix=id_prefix,
        include_retired=include_retired,
        scope=None if scope is None else tuple(scope.labels),
    )
    with reading(engine) as conn:
        found = store.totals(conn, where)
    return schemas.OdometerTotals(
        objects=found.objects,
        active=found.active,
        retired=found.retired,
        exhausted=found.exhausted,
        near_exhaustion=found.near_exhaustion,
        rejected=found.rejected,
    )


def parse_label_filters(raw: list[str], field: str = "label") -> list[tuple[str, str]]:
    """``["study:flu", "site:berlin"]`` (query parameters) as ``(name, value)`` pairs.

    All must hold: two values for one name match nothing (no object has both).
    """
    found: list[tuple[str, str]] = []
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep or not LABEL_NAME.fullmatch(name) or not LABEL_VALUE.fullmatch(value):
            raise InvalidInput(field, "must be name:value (a label name, a colon, its value)")
        found.append((name, value))
    return found


@dataclass(frozen=True)
class ObjectCounts:
    """What the ``/metrics`` scrape counts (:func:`object_counts`)."""

    active: int
    retired: int
    exhausted: int
    near_exhaustion: int
    #: Likelihood arrays stored.
    states: int
    #: Surveys by status, every status present.
    surveys: dict[str, int]


def object_counts(*, engine: Database) -> ObjectCounts:
    """Objects by status (the statuses of the odometers list), stored states, surveys.

    Run at each ``/metrics`` scrape: the object counts are ``object_counts``'s (kept by the
    writers' statements, migration 0014), not a scan of the objects.
    """
    with reading(engine) as conn:
        objects = count_objects(conn)
        states = count_states(conn)
        by_status = surveys_by_status(conn)
    surveys = dict.fromkeys(("queued", "running", "done", "cancelled", "failed"), 0)
    surveys.update(by_status)
    return ObjectCounts(
        active=objects.active,
        retired=objects.retired,
        exhausted=objects.exhausted,
        near_exhaustion=objects.near_exhaustion,
        states=states,
        surveys=surveys,
    )


def fold_object_counts(*, engine: Database) -> int:
    """Fold ``object_counts``'s rows into one (slot 0), in one transaction; answer how many.

    On PostgreSQL each server process that ever changed an object owns a row, and nothing else
    removes them: ``gatekeeper serve`` folds them at start-up and ``gatekeeper verify`` before
    it checks (:func:`app.store.objects.fold_counts`: safe while writers run, the sums exact).
    """
    with transaction(engine) as conn:
        return store.fold_counts(conn)

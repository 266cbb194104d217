"""Population surveys: requests, membership, views, cancel and dry-run.

Creation (``POST /v1/surveys``) validates the request, fixes the membership (the ids a labels
cohort selects, or an ids cohort's — which must name registered objects — sorted and cut into
chunks: :mod:`app.store.chunks`) and stores the survey ``queued``;
:mod:`app.services.survey_runs` then decides its members off the request path. A dry-run
groups the cohort by public state in SQL and decides each group once, as the run will, spending
nothing.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter

from app.engine.domain import parse_domain
from app.engine.errors import InvalidInput, Unsupported
from app.engine.estimates import estimate, output_histogram
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query
from app.services import audit, schemas
from app.services.bodies import validated
from app.services.errors import Busy, Forbidden, IdempotencyMismatch, NotFound, ServiceError
from app.services.reuse import query_hash, reusable_members
from app.services.scope import Scope
from app.services.survey_groups import (
    GroupAccepted,
    ParsedQuery,
    QuotaGroups,
    Refusal,
    StateMissing,
    decide_group,
    decision_key,
    load_survey,
    survey_totals,
)
from app.store import Conflict, Database, Tx, reading, transaction
from app.store import chunks as chunk_store
from app.store import projects as project_store
from app.store import surveys as survey_store
from app.store import versions as version_store
from app.store.chunks import MemberDecision
from app.store.states import load_states
from app.store.surveys import ACTIVE, GroupKey, SurveyRow, SurveyStatus
from app.worker.pool import BoundWorker


class InvalidCohort(ServiceError):
    """A cohort that selects nothing, names unknown objects, or is too large (422)."""

    status, type, title = 422, "invalid-cohort", "Invalid cohort"


# ------------------------------------------------------------------------------ the request
@dataclass(frozen=True)
class SurveyRequest:
    """A validated survey body (the query is checked against each member's domain later)."""

    name: str
    query: dict[str, Any]
    labels: dict[str, str] | None
    ids: list[str] | None
    #: ``"reuse": true``: members answer from stored identical answers where they can.
    reuse: bool = False

    @property
    def query_text(self) -> str:
        """The query as stored (canonical JSON)."""
        return json.dumps(self.query, sort_keys=True)

    @property
    def cohort(self) -> dict[str, Any]:
        """The cohort as given."""
        return {"labels": self.labels} if self.labels is not None else {"ids": self.ids}


def parse_request(body: Any, *, max_members: int) -> SurveyRequest:
    """Validate ``{"name", "query", "cohort": {"labels": {...}} | {"ids": [...]}}``."""
    return survey_request(validated(schemas.SurveyRequest, body), max_members=max_members)


def survey_request(body: schemas.SurveyRequest, *, max_members: int) -> SurveyRequest:
    """A validated survey body, its query as written; an ids cohort within ``max_members``."""
    query = dict(body.written("query"))
    if isinstance(body.cohort, schemas.LabelsCohort):
        return SurveyRequest(body.name, query, dict(body.cohort.labels), None, body.reuse)
    ids = body.cohort.ids
    if len(ids) > max_members:
        raise InvalidCohort(
            f"the cohort has {len(ids)} members, above the maximum of {max_members} "
            "(SURVEY_MAX_MEMBERS)",
            errors=[{"field": "cohort.ids", "message": f"at most {max_members} ids"}],
        )
    return SurveyRequest(body.name, query, None, list(ids), body.reuse)


def _labels_of(scope: Scope | None) -> tuple[tuple[str, str], ...] | None:
    return None if scope is None else scope.labels


def _refuse_unknown(conn: Tx, request: SurveyRequest, scope: Scope | None = None) -> None:
    """422 listing the ids that name no object — or one out of ``scope``, exactly alike."""
    assert request.ids is not None  # noqa: S101 - an ids cohort
    unknown = survey_store.unknown_ids(conn, request.ids, _labels_of(scope))
    if unknown:
        shown = ", ".join(repr(i) for i in unknown[:20])
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise InvalidCohort(
            f"{len(unknown)} id(s) of the cohort name no object: {shown}{more}",
            errors=[{"field": "cohort.ids", "message": "names objects that do not exist"}],
            unknown_ids=unknown[:1000],
        )


def _refuse_empty_or_large(count: int, max_members: int) -> None:
    if count == 0:
        raise InvalidCohort(
            "the cohort matches no object",
            errors=[{"field": "cohort.labels", "message": "matches no object"}],
        )
    if count > max_members:
        raise InvalidCohort(
            f"the cohort has {count} members, above the maximum of {max_members} "
            "(SURVEY_MAX_MEMBERS)",
            errors=[{"field": "cohort", "message": f"at most {max_members} members"}],
        )


def _refuse_query_fitting_no_member(
    domain_texts: Iterable[str], query: dict[str, Any], limits: EngineLimits
) -> None:
    """422 naming the field when the query is invalid for every member's domain.

    A query invalid for some domains only is asked of the others (those members are refused
    ``invalid-for-domain``); one that no member could answer is a bad request.
    """
    parsed = ParsedQuery(limits, query)
    first_error: InvalidInput | Unsupported | None = None
    for text in domain_texts:
        try:
            parse_query(query, parsed.domain(text), "query", limits=limits)
            return
        except (InvalidInput, Unsupported) as exc:
            first_error = first_error or exc
    if first_error is not None:
        raise first_error


# ------------------------------------------------------------------------------ creation
def create_survey(
    *,
    engine: Database,
    request: SurveyRequest,
    fingerprint: str,
    idempotency_key: str | None,
    analyst_key_id: int | None,
    max_members: int,
    limits: EngineLimits,
    chunk_size: int,
    scope: Scope | None = None,
) -> tuple[schemas.SurveyView, bool]:
    """Store a survey and its membership; returns its view and whether it is a replay.

    The members are stored in chunks of ``chunk_size`` (the unit a run decides in one
    transaction). Raises :class:`InvalidCohort` (422: no member, unknown ids, too many members)
    and :class:`IdempotencyMismatch` (the key was used with another body). A project key's
    cohort holds only objects in its ``scope``: a labels cohort selects within it, an ids
    cohort naming an object outside it is refused as naming an unknown id.
    """
    for _ in range(3):
        try:
            return _create_once(
                engine,
                request,
                fingerprint,
                idempotency_key,
                _Cohort(analyst_key_id, max_members, limits, chunk_size, scope),
            )
        except Conflict:  # a concurrent request with the same key stored it first
            continue
    raise ServiceError("could not store the survey")  # pragma: no cover - three lost races


@dataclass(frozen=True)
class _Cohort:
    """Who creates a survey and the limits its membership is stored under."""

    analyst_key_id: int | None
    max_members: int
    limits: EngineLimits
    chunk_size: int
    scope: Scope | None = None


def _member_ids(conn: Tx, request: SurveyRequest, scope: Scope | None) -> Iterator[str]:
    """The cohort's ids in increasing bytewise order, streamed (an ids cohort's, sorted)."""
    if request.labels is not None:
        return survey_store.labelled_ids(conn, request.labels, _labels_of(scope))
    assert request.ids is not None  # noqa: S101 - an ids cohort
    return iter(sorted(request.ids))


def _cohort_domains(conn: Tx, request: SurveyRequest, scope: Scope | None) -> set[str]:
    """The distinct domain texts of the cohort's objects (in ``scope``)."""
    return survey_store.cohort_domains(
        conn, labels=request.labels, ids=request.ids or (), scope=_labels_of(scope)
    )


def _create_once(
    engine: Database,
    request: SurveyRequest,
    fingerprint: str,
    key: str | None,
    cohort: _Cohort,
) -> tuple[schemas.SurveyView, bool]:
    analyst_key_id, max_members, limits = cohort.analyst_key_id, cohort.max_members, cohort.limits
    with transaction(engine) as conn:
        if key is not None:
            found = survey_store.find_by_key(
                conn, analyst_key_id=analyst_key_id, idempotency_key=key
            )
            if found is not None:
                if found.fingerprint != fingerprint:
                    raise IdempotencyMismatch(
                        "this Idempotency-Key was used with a different request body"
                    )
                return survey_view(found, show_outputs=True), True
        if request.ids is not None:
            _refuse_unknown(conn, request, cohort.scope)
        survey_id = survey_store.insert_survey(
            conn,
            name=request.name,
            query=request.query_text,
            cohort=json.dumps(request.cohort),
            analyst_key_id=analyst_key_id,
            idempotency_key=key,
            fingerprint=fingerprint,
            created_at=datetime.now(UTC),
            query_hash=query_hash(request.query),
            reuse=request.reuse,
        )
        count = chunk_store.store_members(
            conn,
            survey_id=survey_id,
            ids=_member_ids(conn, request, cohort.scope),
            size=cohort.chunk_size,
            max_members=max_members,
        )
        _refuse_empty_or_large(count, max_members)
        _refuse_query_fitting_no_member(
            _cohort_domains(conn, request, cohort.scope), request.query, limits
        )
        survey_store.set_total(conn, survey_id=survey_id, total=count)
        audit.record(
            conn,
            kind=audit.AuditKind.SURVEY_CREATED,
            actor_key_id=analyst_key_id,
            object_id=None,
            detail={
                "survey_id": survey_id,
                "name": request.name,
                "mechanism": request.query["mechanism"],
                "epsilon": request.query.get("epsilon"),
                "members": count,
                "cohort": "labels" if request.labels is not None else "ids",
            },
        )
        row = load_survey(conn, survey_id)
    return survey_view(row, show_outputs=True), False


# ------------------------------------------------------------------------------ views
def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


#: A survey's estimate read from the engine's JSON (:func:`app.engine.estimates.estimate`).
_ESTIMATE: TypeAdapter[schemas.ScalarEstimate | schemas.HistogramEstimate] = TypeAdapter(
    schemas.Estimate
)


@dataclass(frozen=True)
class _EstimateFields:
    """A survey's estimate (None: unavailable) and the fields explaining it (None: absent)."""

    estimate: schemas.ScalarEstimate | schemas.HistogramEstimate | None = None
    estimate_unavailable: str | None = None
    outputs: dict[str, int] | None = None

    def present(self) -> dict[str, Any]:
        """The optional fields the view carries (``estimate`` always, maybe ``null``)."""
        found: dict[str, Any] = {"estimate": self.estimate}
        if self.estimate_unavailable is not None:
            found["estimate_unavailable"] = self.estimate_unavailable
        if self.outputs is not None:
            found["outputs"] = self.outputs
        return found


def _estimate_of(row: Any, show_outputs: bool) -> _EstimateFields:
    """The survey's estimate (or None) and the fields explaining it."""
    tally = {k: int(v) for k, v in json.loads(row.tally).items()}
    if row.accepted == 0 or not row.domain:
        if row.domain == "":
            return _EstimateFields(
                estimate_unavailable="the accepted members have different domains"
            )
        if row.accepted == 0:
            return _EstimateFields(estimate_unavailable="no accepted members")
        return _EstimateFields()
    domain = parse_domain(json.loads(row.domain))
    mech = parse_query(json.loads(row.query), domain)
    found = estimate(mech, row.accepted, tally)
    return _EstimateFields(
        estimate=None if found.value is None else _ESTIMATE.validate_python(found.value),
        estimate_unavailable=found.reason if found.value is None else None,
        outputs=output_histogram(mech, tally) if show_outputs else None,
    )


def survey_view(row: Any, *, show_outputs: bool) -> schemas.SurveyView:
    """A survey resource (contract.md "Population surveys").

    ``waiting_for_workers`` is false here: whether a worker runs surveys is the job runner's to
    say, and the routes set it with :func:`with_workers`.
    """
    refused = {reason.value: 0 for reason in Refusal}
    refused.update(json.loads(row.refused))
    return schemas.SurveyView(
        id=row.id,
        name=row.name,
        status=row.status,
        query=json.loads(row.query),
        cohort=json.loads(row.cohort),
        reuse=bool(row.reuse),
        created_at=_iso(row.created_at),
        started_at=_iso(row.started_at),
        finished_at=_iso(row.finished_at),
        progress=schemas.SurveyProgress(
            total=row.total,
            decided=row.decided,
            accepted=row.accepted,
            reused=row.reused,
            refused=schemas.SurveyRefusals.model_validate(refused),
        ),
        groups=row.groups,
        waiting_for_workers=False,
        **_estimate_of(row, show_outputs).present(),
        **({"error": row.error} if row.error else {}),
    )


def waits_on_workers(view: schemas.SurveyView) -> bool:
    """Whether the survey has members left to decide (queued or running, some pending)."""
    progress = view.progress
    return view.status in ("queued", "running") and progress.decided < progress.total


def with_workers(view: schemas.SurveyView, *, no_workers: bool) -> schemas.SurveyView:
    """``view`` with ``waiting_for_workers``: members left to decide and no worker to run them.

    ``no_workers`` is what the job runner says (``SurveyJobs.waiting_for_workers``): with
    ``BROKER_URL`` set, no ``gatekeeper worker`` surveys node has a live heartbeat; always
    False when the web process runs surveys itself.
    """
    waiting = no_workers and waits_on_workers(view)
    return view.model_copy(update={"waiting_for_workers": waiting})


def _may_see_outputs(row: SurveyRow, caller_key_id: int | None, is_admin: bool) -> bool:
    return is_admin or (caller_key_id is not None and row.analyst_key_id == caller_key_id)


def _visible_survey(conn: Tx, survey_id: int, scope: Scope | None) -> SurveyRow:
    """The survey, or :class:`NotFound` — also for a project key, another project's survey."""
    row = load_survey(conn, survey_id)
    if scope is not None and survey_store.project_of_key(conn, row.analyst_key_id) != (
        scope.project_id
    ):
        raise NotFound("no survey with that id")
    return row


def get_survey(
    *,
    engine: Database,
    survey_id: int,
    caller_key_id: int | None,
    is_admin: bool,
    scope: Scope | None = None,
) -> schemas.SurveyView:
    """A survey's status, progress and estimate (the output histogram to its analyst/admins)."""
    with reading(engine) as conn:
        row = _visible_survey(conn, survey_id, scope)
    return survey_view(row, show_outputs=_may_see_outputs(row, caller_key_id, is_admin))


def list_surveys(
    *,
    engine: Database,
    limit: int,
    before: int | None,
    caller_key_id: int | None,
    is_admin: bool,
    scope: Scope | None = None,
) -> schemas.SurveyPage:
    """Surveys, newest first; ``before`` is the previous page's ``next_before``.

    A project key lists only its project's surveys.
    """
    project_id = None if scope is None else scope.project_id
    with reading(engine) as conn:
        rows = survey_store.list_page(conn, limit=limit, before=before, project_id=project_id)
    items = [
        survey_view(r, show_outputs=_may_see_outputs(r, caller_key_id, is_admin)) for r in rows
    ]
    return schemas.SurveyPage(items=items, next_after=rows[-1].id if len(rows) == limit else None)


def list_responses(
    *,
    engine: Database,
    survey_id: int,
    limit: int,
    after: str | None,
    caller_key_id: int | None,
    is_admin: bool,
    scope: Scope | None = None,
) -> schemas.SurveyResponsePage:
    """Members' decisions in object-id order (outputs only for the survey's analyst, admins).

    ``after`` is the previous page's last object id: the page starts in the first chunk whose
    last member comes after it.
    """
    with reading(engine) as conn:
        survey = _visible_survey(conn, survey_id, scope)
        ends = chunk_store.chunk_ends(conn, survey_id=survey_id)
        # chunks hold consecutive runs of the sorted ids: the first ending past ``after``
        numbers = [number for number, last in ends if after is None or last > after]
        decisions: list[MemberDecision] = []
        for number in numbers:
            chunk = chunk_store.load_chunks(conn, [(survey_id, number)])[(survey_id, number)]
            start = 0 if after is None else bisect.bisect_right(chunk.members, after)
            stop = min(len(chunk.members), start + limit - len(decisions))
            decisions.extend(chunk.decision(at) for at in range(start, stop))
            if len(decisions) >= limit:
                break
        answered = [(d.object_id, d.seq) for d in decisions if d.status == "accepted"]
        versions = version_store.versions_answered(conn, answered)
    outputs = _may_see_outputs(survey, caller_key_id, is_admin)
    # a cancelled survey never decides its undecided members: they are not "pending" forever
    cancelled = survey.status == SurveyStatus.CANCELLED.value
    items = []
    for d in decisions:
        status = "cancelled" if cancelled and d.status == "pending" else d.status
        item: dict[str, Any] = {"object_id": d.object_id, "decision": status, "reason": d.reason}
        if d.object_id in versions and status == "accepted":
            item["version"] = versions[d.object_id]
        if outputs:
            item["output"] = json.loads(d.variant.output) if d.variant is not None else None
        items.append(item)
    full = len(items) == limit
    # a page of up to 1,000 members: validated at once (one call into pydantic-core), its
    # members as validated dicts (SurveyResponse), cheaper than a model per member
    # (docs/benchmarks.md, "Response validation: the survey responses page")
    return schemas.SurveyResponsePage.model_validate(
        {"items": items, "next_after": items[-1]["object_id"] if full else None}
    )


def cancel_survey(
    *,
    engine: Database,
    survey_id: int,
    caller_key_id: int | None,
    is_admin: bool,
    scope: Scope | None = None,
) -> schemas.SurveyView:
    """Cancel a queued or running survey: undecided members are not queried (403 for others)."""
    with transaction(engine) as conn:
        row = _visible_survey(conn, survey_id, scope)
        if not _may_see_outputs(row, caller_key_id, is_admin):
            raise Forbidden("only the survey's analyst or an admin may cancel it")
        if row.status in ACTIVE:
            survey_store.cancel(conn, survey_id=survey_id, finished_at=datetime.now(UTC))
            audit.record(
                conn,
                kind=audit.AuditKind.SURVEY_CANCELLED,
                actor_key_id=caller_key_id,
                object_id=None,
                detail=survey_totals(row),
            )
            row = load_survey(conn, survey_id)
    return survey_view(row, show_outputs=True)


# ------------------------------------------------------------------------------ dry-run
def dry_run_survey(
    *,
    engine: Database,
    worker: BoundWorker,
    request: SurveyRequest,
    limits: EngineLimits,
    max_members: int,
    attempts: int = 5,
    scope: Scope | None = None,
    reuse_owner: int | None = None,
) -> schemas.SurveyDryRun:
    """Members, how many would be accepted, refusals by reason, decision groups. Spends nothing.

    With ``"reuse": true``, ``would_reuse`` counts the members a stored identical answer would
    answer (``reuse_owner``: that key's answers only); they are counted as accepted.

    Read again when a group's state vanished under it (a concurrent submit moved its users).
    A project key's cohort is read within its ``scope``, as :func:`create_survey` reads it.
    """
    for _ in range(attempts):
        try:
            return _dry_run_once(engine, worker, request, limits, max_members, scope, reuse_owner)
        except StateMissing:
            continue
    raise Busy("the cohort's objects keep changing under the dry-run; retry", retry_after=1)


def _dry_run_once(
    engine: Database,
    worker: BoundWorker,
    request: SurveyRequest,
    limits: EngineLimits,
    max_members: int,
    scope: Scope | None = None,
    reuse_owner: int | None = None,
) -> schemas.SurveyDryRun:
    parsed = ParsedQuery(limits, request.query)
    reused = 0
    members = accepted = 0
    refused: Counter[str] = Counter()
    groups: set[GroupKey] = set()
    with reading(engine) as conn:
        if request.ids is not None:
            _refuse_unknown(conn, request, scope)
        # a project key's survey also passes its quota: members split by their sub-history
        project = None if scope is None else project_store.by_id(conn, project_id=scope.project_id)
        quotas = None if project is None else QuotaGroups(project, limits)
        collected: dict[tuple[GroupKey, bool, str | None], tuple[int, str]] = {}
        groups_read = survey_store.cohort_groups(
            conn,
            labels=request.labels,
            ids=request.ids or (),
            scope=_labels_of(scope),
            project_id=None if project is None else project.id,
        )
        for key, retired, count, first, sub in groups_read:
            previous = collected.get((key, retired, sub))
            if previous is not None:
                count, first = previous[0] + count, min(previous[1], first)
            collected[(key, retired, sub)] = (count, first)
        members = sum(count for count, _ in collected.values())
        _refuse_empty_or_large(members, max_members)
        _refuse_query_fitting_no_member(
            {key.domain for key, _, _ in collected}, request.query, limits
        )
        versions = survey_store.versions(conn, [first for _, first in collected.values()])
        # the groups' stored arrays in a few statements, not one per group
        parsed.states.update(
            load_states(conn, {k.state_hash for k, _, _ in collected if k.state_hash is not None})
        )
        decided: dict[GroupKey, GroupAccepted | Refusal] = {}
        # each (group, sub-history)'s refusal, None when it would accept (for reused members)
        outcome: dict[tuple[GroupKey, str | None], Refusal | None] = {}
        for (key, retired, sub), (count, first) in collected.items():
            if retired:
                refused[Refusal.RETIRED.value] += count
                continue
            same = decision_key(key, parsed)  # what the run decides once (issue 27)
            groups.add(same)
            version, start = versions[first]
            group = decided.get(same)
            if group is None:
                group = decide_group(conn, same, (first, version, start), parsed, worker)
                decided[same] = group
            if isinstance(group, Refusal):
                refused[group.value] += count
                outcome[(key, sub)] = group
            elif quotas is not None and not (
                quotas.decide(conn, group, (key.domain, sub), (first, start), worker)[1].accepted
            ):
                refused[Refusal.QUOTA.value] += count
                outcome[(key, sub)] = Refusal.QUOTA
            else:
                accepted += count
                outcome[(key, sub)] = None
        if request.reuse:
            found = list(
                reusable_members(
                    conn,
                    list(_member_ids(conn, request, scope)),
                    parsed,
                    request.query,
                    reuse_owner,
                )
            )
            subs = (
                {}
                if project is None
                else project_store.sub_hashes(
                    conn, project_id=project.id, object_ids=[member for member, _ in found]
                )
            )
            for member, key in found:
                reused += 1
                refusal = outcome.get((key, subs.get(member)))
                if refusal is not None:  # its group would refuse: the reuse answers it
                    refused[refusal.value] -= 1
                    accepted += 1
    return schemas.SurveyDryRun(
        members=members,
        would_accept=accepted,
        would_refuse=schemas.SurveyRefusals.model_validate(
            {reason.value: refused.get(reason.value, 0) for reason in Refusal}
        ),
        groups=len(groups),
        would_reuse=reused,
    )

"""Dry-runs, submits and query history.

Submit protocol (one accepted query per object at a time, nothing double-spent):

1. hold the object's lock (in-process; plus Redis across replicas when configured) — only to
   avoid wasted work;
2. in one transaction (:func:`app.store.submitting`: on PostgreSQL the reads run before ``BEGIN``,
   which goes out with the first write — under READ COMMITTED each statement reads its own
   snapshot either way, and step 3's compare-and-set is what protects the write): read the
   object and its version ``v``; decide with the filter (never
   reading the value); on rejection (or an error) first replay a stored response if the
   ``Idempotency-Key`` was seen (422 if the body differs), else count the rejection, store its
   answer under the key (when one was sent: a retry replays it and counts nothing) and answer
   409 ``budget-exhausted``;
3. sample the output with the value, compute the new state, insert the query record with its
   response (unique on ``(object, seq)`` and ``(object, idempotency key)``) and ``UPDATE objects
   SET version = v + 1 ... WHERE id = :id AND version = v``; commit only if that compare-and-set
   hit one row.

If another writer won (the update hits no row, or a unique constraint fires — also the one on the
idempotency key, when the key was used before), the transaction rolls back — the unused sample is
discarded unseen — and the submit starts again at step 2, now looking the key up *first*, so a
retry of the same key finds the stored response. A key thus costs no lookup of its own: one
``SELECT`` reads the object with the answer stored under the key (accepted or rejected, if any;
run on psycopg directly: :mod:`app.store.compiled`), and the accepted submit's writes —
compare-and-set, query row, audit event and the likelihood array it names — go to PostgreSQL
as one statement that is its own transaction (autocommit)
(:mod:`app.store.submits`; the statements are built once from :mod:`app.store.objects`',
:mod:`app.store.queries`', :mod:`app.store.states`' and :mod:`app.store.audit`' constructs):
two round trips to PostgreSQL per accepted submit, the load and the write. A rejection writes its
count, stored answer and audit event as one statement: two round trips too.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app import metrics
from app.engine.domain import Domain, parse_domain
from app.engine.errors import InvalidInput, Unsupported
from app.engine.filters import Decision
from app.engine.likelihood import LossBounds
from app.engine.limits import EngineLimits
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.pipeline import (
    ObjectSnapshot,
)
from app.services import audit
from app.services.decisions import decide, recorded
from app.services.errors import (
    BudgetExhausted,
    Busy,
    IdempotencyMismatch,
    NotFound,
    Retired,
    ServiceError,
    refusal_error,
)
from app.services.history import object_history
from app.services.locks import ObjectLocks
from app.services.objects import load_object, odometer_view, odometer_with, version_span
from app.services.quota import (
    Answer,
    ProjectQuota,
    load_quota,
    quota_decision,
    quota_view,
    record_output,
    reported,
)
from app.services.reuse import find_reusable, query_hash, reused_body
from app.services.schemas import ID_PATTERN, HistoryItem, HistoryPage, SubmitResult
from app.services.schemas import Decision as DecisionView
from app.services.schemas import LossBounds as LossView
from app.services.scope import Scope, admits
from app.services.snapshots import (
    advance,
    lifetime_of,
    remember,
    snapshot_of,
)
from app.store import (
    Conflict,
    Database,
    Tx,
    Unavailable,
    reading,
    submitting,
)
from app.store import objects as object_store
from app.store import queries as query_store
from app.store import submits as submit_store
from app.store.objects import ObjectState
from app.store.queries import StoredAnswer
from app.worker.pool import BoundWorker

log = logging.getLogger(__name__)


def fingerprint(query: Any) -> str:
    """SHA-256 of the canonical JSON of a submitted query (the idempotency fingerprint).

    The same hash finds an identical answer to reuse (:func:`app.services.reuse.query_hash`).
    """
    return query_hash(query)


@dataclass(frozen=True)
class SubmitOutcome:
    """The response body of an accepted submit and whether it is a replay."""

    body: SubmitResult
    replayed: bool
    filter: str | None = None
    #: A stored identical answer returned by ``"reuse": true`` (nothing charged or recorded).
    reused: bool = False


@dataclass(frozen=True)
class _Accepted:
    """An accepted submit's response body and the snapshot it committed (for the cache)."""

    outcome: SubmitOutcome
    version: int
    snapshot: ObjectSnapshot


@dataclass(frozen=True)
class _Rejected:
    """A rejection counted under the compare-and-set: the decision and the version it left."""

    decision: Decision
    version: int
    snapshot: ObjectSnapshot


@dataclass(frozen=True)
class _StoredRejection:
    """The stored 409 answer of a rejected submit that carried the same Idempotency-Key."""

    detail: str
    extra: dict[str, Any]
    #: The problem's type: budget-exhausted, lifetime-exhausted or quota-exhausted.
    refusal: str = "budget-exhausted"


@functools.lru_cache(maxsize=1024)
def _domain_of(text: str, limits: EngineLimits) -> Domain:
    """The parsed domain of a stored domain text (immutable, so shared by threads)."""
    return parse_domain(json.loads(text), "domain", limits=limits)


#: Query kinds whose parsed mechanism is kept (:func:`_mechanism_of`): small objects, made
#: of their JSON and the domain alone.
_KEPT_KINDS = frozenset({"grr", "binary_rr"})


def _mechanism_of(query: Any, domain_text: str, limits: EngineLimits) -> Mechanism:
    """``parse_query(query)`` on the stored domain; a randomized-response query's, parsed once.

    A query and a domain are public, and a mechanism is read-only (what it computes of itself
    is computed once, the same whoever asks): one parsed mechanism serves every submit of the
    same query text — its JSON as sent, key order and number types included — on the same
    domain text under the same limits. Other kinds (tables, weights) are parsed every time.
    """
    return _mechanism_and_text(query, domain_text, limits)[0]


def _mechanism_and_text(
    query: Any, domain_text: str, limits: EngineLimits
) -> tuple[Mechanism, str | None]:
    """:func:`_mechanism_of` and, for a kept mechanism, its stored query text.

    The text is ``json.dumps(mech.to_json())``, what an accepted submit stores as the query
    (computed once with the mechanism, which is read-only); None for a mechanism parsed here.
    """
    if isinstance(query, dict) and query.get("mechanism") in _KEPT_KINDS:
        try:
            text = json.dumps(query)
        except (TypeError, ValueError):  # not JSON (a caller's own object): parsed below
            pass
        else:
            return _parsed(text, domain_text, limits)
    return parse_query(query, _domain_of(domain_text, limits), "query", limits=limits), None


@functools.lru_cache(maxsize=1024)
def _parsed(text: str, domain_text: str, limits: EngineLimits) -> tuple[Mechanism, str]:
    """The mechanism of the query whose JSON is ``text`` and its stored query text.

    Errors are raised, never kept.
    """
    domain = _domain_of(domain_text, limits)
    mech = parse_query(json.loads(text), domain, "query", limits=limits)
    return mech, json.dumps(mech.to_json())


def dry_run(
    *,
    engine: Database,
    worker: BoundWorker,
    object_id: str,
    query: Any,
    limits: EngineLimits,
    scope: Scope | None = None,
    reuse: bool = False,
    reuse_owner: int | None = None,
) -> DecisionView:
    """Would the object's filter accept ``query`` now? Changes nothing.

    ``would_reuse``: whether a submit with ``"reuse": true`` (as this dry-run says) would
    return a stored identical answer of the current version (``reuse_owner``: only that key's).
    """
    with reading(engine) as conn:
        row = _load_active(conn, object_id, scope)
        domain = _domain_of(row.domain, limits)
        mech = _mechanism_of(query, row.domain, limits)
        snapshot = snapshot_of(conn, row, domain, limits, lifetime_of(row))
        quota = load_quota(conn, scope, object_id, domain, limits, version_start=row.version_start)
        reusable = reuse and find_reusable(conn, row, query_hash(query), reuse_owner) is not None
    decision = decide(snapshot, mech, worker, tight=True)
    by_quota = None if quota is None else quota_decision(quota, mech, worker, tight=True)
    answer = reported(decision, by_quota).to_json()
    answer["would_reuse"] = reusable
    if quota is not None and by_quota is not None:
        answer["quota"] = quota_view(quota, by_quota)
    return DecisionView(**answer)


class _LostRace(Exception):
    """Another writer advanced the object first."""


def _check_owner(record: StoredAnswer, print_: str, owner: int | None) -> None:
    """A stored answer is replayed only to the client that stored it, for the same body."""
    if record.analyst_key_id != owner:
        # another client's key: never replay its output to us
        raise IdempotencyMismatch("this Idempotency-Key was already used by another client")
    if record.fingerprint != print_:
        raise IdempotencyMismatch("this Idempotency-Key was used with a different request body")


def _replay_rejection(
    conn: Tx, object_id: str, key: str | None, print_: str, owner: int | None
) -> _StoredRejection | None:
    """The stored rejection for ``key``, if a rejected submit stored one."""
    if key is None:
        return None
    record = query_store.find_rejection(conn, object_id=object_id, key=key)
    return None if record is None else _stored_rejection(record, print_, owner)


def _stored_rejection(record: StoredAnswer, print_: str, owner: int | None) -> _StoredRejection:
    """A stored rejection's answer, for its owner and body only (422 otherwise)."""
    _check_owner(record, print_, owner)
    stored = json.loads(record.response)
    refusal = stored.get("type", BudgetExhausted.type)
    return _StoredRejection(stored["detail"], stored["extra"], refusal)


def _replay(
    conn: Tx, object_id: str, key: str | None, print_: str, owner: int | None
) -> SubmitOutcome | _StoredRejection | None:
    """The stored answer for ``key``: an accepted submit's body or a rejection's problem."""
    if key is None:
        return None
    record = query_store.find_accepted(conn, object_id=object_id, key=key)
    if record is None:
        return _replay_rejection(conn, object_id, key, print_, owner)
    return _stored_answer(record, print_, owner)


def _stored_answer(
    record: StoredAnswer, print_: str, owner: int | None
) -> SubmitOutcome | _StoredRejection:
    """A stored answer (accepted: ``query_id`` set; else a rejection), for its owner and body."""
    if record.query_id is None:
        return _stored_rejection(record, print_, owner)
    _check_owner(record, print_, owner)
    # the stored response lacks the query id, which the INSERT that stored it produced
    stored = {"query_id": record.query_id, **json.loads(record.response)}
    return SubmitOutcome(SubmitResult.model_validate(stored), True)


def _load_active(conn: Tx, object_id: str, scope: Scope | None = None) -> ObjectState:
    """The object as a decision reads it; an object outside ``scope`` is missing (404)."""
    row = (
        object_store.load_state(
            conn, object_id=object_id, scope=None if scope is None else scope.labels
        )
        if ID_PATTERN.fullmatch(object_id)
        else None
    )
    return _active(row, scope)


def _active(row: ObjectState | None, scope: Scope | None) -> ObjectState:
    """``row`` if it is there, in ``scope`` and not retired (else 404 or 410)."""
    if row is None or not admits(scope, row.labels):
        raise NotFound("no object with that id")
    if row.retired_at is not None:
        raise Retired("the object is retired and answers no queries")
    return row


def _load_for_submit(
    conn: Tx, object_id: str, key: str | None, scope: Scope | None
) -> tuple[ObjectState, StoredAnswer | None]:
    """:func:`_load_active` and the answer stored under ``key``, in one statement."""
    found = (
        object_store.load_for_submit(
            conn, object_id=object_id, key=key, scope=None if scope is None else scope.labels
        )
        if ID_PATTERN.fullmatch(object_id)
        else None
    )
    row, answer = (None, None) if found is None else found
    return _active(row, scope), answer


def submit(
    *,
    engine: Database,
    worker: BoundWorker,
    locks: ObjectLocks,
    object_id: str,
    query: Any,
    idempotency_key: str | None,
    analyst_key_id: int | None,
    limits: EngineLimits,
    attempts: int,
    scope: Scope | None = None,
    reuse: bool = False,
    reuse_owner: int | None = None,
) -> SubmitOutcome:
    """Decide, sample, record; see the module docstring for the protocol.

    ``reuse``: first return a stored identical answer of the current version, if there is one
    (:mod:`app.services.reuse`; ``reuse_owner``: only that key's answers) — after a stored
    answer of the ``Idempotency-Key``, which is always replayed first.

    Raises :class:`BudgetExhausted` (409) when the filter rejects, :class:`IdempotencyMismatch`
    (422), :class:`Retired`, ``NotFound``, ``InvalidInput`` and :class:`Busy` (503) after
    ``attempts`` lost races.
    """
    print_ = fingerprint(query)
    # A fresh key is the common case, so the first attempt does not look the key up: the
    # INSERT's unique constraint on (object, key) catches a used one, and every later attempt
    # (and every answer other than an accepted submit) looks it up first.
    replay_first = False
    with locks.hold(object_id):
        for _ in range(attempts):
            try:
                outcome = _attempt(
                    engine,
                    worker,
                    object_id,
                    query,
                    idempotency_key,
                    analyst_key_id,
                    limits,
                    print_,
                    replay_first,
                    scope,
                    (reuse, reuse_owner),
                )
            except (_LostRace, Conflict):
                replay_first = True
                continue
            except Unavailable as exc:  # serialization failures, deadlocks, busy SQLite
                log.warning("submit retried after a database conflict: %s", type(exc).__name__)
                replay_first = True
                continue
            if isinstance(outcome, _StoredRejection):
                error = refusal_error(outcome.refusal)
                raise error(outcome.detail, replayed=True, **outcome.extra)
            if isinstance(outcome, _Rejected):  # the state is unchanged, at the next version
                remember(engine, object_id, outcome.version, outcome.snapshot)
                rejected = outcome.decision
                _decisions(rejected.filter.value, "reject").inc()
                error = refusal_error(rejected.refusal)
                raise error(rejected.reason, **_rejection_extra(rejected))
            if isinstance(outcome, _Accepted):  # committed: the next decision starts from it
                remember(engine, object_id, outcome.version, outcome.snapshot)
                outcome = outcome.outcome
            if outcome.reused:
                metrics.REUSED.labels("submit").inc()
            elif not outcome.replayed:
                _decisions(outcome.filter or "unknown", "accept").inc()
            return outcome
    raise Busy("too many concurrent writers on this object; retry later", retry_after=1)


@functools.lru_cache(maxsize=64)
def _decisions(filter_: str, outcome: str) -> Any:
    """``metrics.DECISIONS.labels(filter_, outcome)``, looked up once per pair.

    ``labels`` takes the metric's lock, checks and converts the values and finds the child on
    every call (≈ 1% of a submit's Python CPU in a profile: docs/benchmarks.md, "h/submit4");
    a child stays the metric's for the life of the process.
    """
    return metrics.DECISIONS.labels(filter_, outcome)


def _rejection_extra(decision: Decision) -> dict[str, Any]:
    """The fields of a ``budget-exhausted`` problem beyond its detail."""
    return {
        "realized_loss": decision.realized_loss.to_json(),
        "worst_case_after": decision.worst_case_after,
        "per_output": [o.to_json() for o in decision.candidate.per_output],
    }


def _attempt(
    engine: Database,
    worker: BoundWorker,
    object_id: str,
    query: Any,
    key: str | None,
    analyst_key_id: int | None,
    limits: EngineLimits,
    print_: str,
    replay_first: bool,
    scope: Scope | None = None,
    reuse: tuple[bool, int | None] = (False, None),
) -> SubmitOutcome | _Accepted | _StoredRejection | _Rejected:
    """One transaction of :func:`submit`: replay, or decide and record the outcome.

    On a first attempt (``replay_first`` false) the answer stored under the key comes with the
    object's row; if the row cannot be read (the object retired, say) the key is looked up on its
    own: a retry of a stored submit gets the stored answer, whatever changed since.
    """
    # PostgreSQL: the reads run in autocommit, and the writes are one round trip that is its own
    # transaction; the compare-and-set decides, as in a transaction
    with submitting(engine) as conn:
        loaded = False  # whether the row was read, with the answer stored under the key

        def stored_answer() -> SubmitOutcome | _StoredRejection | None:
            if replay_first or loaded:  # looked up already in this transaction: none stored
                return None
            return _replay(conn, object_id, key, print_, analyst_key_id)

        if replay_first:
            if scope is not None:  # never answer a stored key's 422 for an object out of scope
                load_object(conn, object_id, scope)
            replay = _replay(conn, object_id, key, print_, analyst_key_id)
            if replay is not None:
                return replay
        try:
            # the answer stored under the key comes with the row (one round trip): replayed
            # first, whatever changed since (the budget spent by later queries, say)
            row, answer = _load_for_submit(conn, object_id, key, scope)
            loaded = True
            if answer is not None:  # (a 422 for another body or client: not looked up again)
                return _stored_answer(answer, print_, analyst_key_id)
            if reuse[0]:  # a key's stored answer first, then an identical answer: no writes
                replay = stored_answer()
                if replay is not None:
                    return replay
                found = find_reusable(conn, row, print_, reuse[1])
                if found is not None:
                    body = reused_body(row, found, odometer_view(row))
                    return SubmitOutcome(body, False, row.filter, reused=True)
            domain = _domain_of(row.domain, limits)
            mech, query_text = _mechanism_and_text(query, row.domain, limits)
            snapshot = snapshot_of(conn, row, domain, limits, lifetime_of(row))
            decision = decide(snapshot, mech, worker, tight=False)
            # a project key's quota: read only when the object's own filter accepts
            quota = (
                load_quota(conn, scope, object_id, domain, limits, version_start=row.version_start)
                if decision.accepted
                else None
            )
            by_quota = None if quota is None else quota_decision(quota, mech, worker, tight=False)
            decision = reported(decision, by_quota)
        except NotFound:
            # missing or out of scope: no key was stored for it by this caller, and looking one
            # up could answer another client's "key used" (a 422 telling the object exists)
            raise
        except (ServiceError, InvalidInput, Unsupported):
            replay = stored_answer()
            if replay is not None:
                return replay
            raise
        if not decision.accepted:  # budget-, lifetime- or quota-exhausted
            replay = stored_answer()
            if replay is not None:
                return replay
            _record_rejection(conn, row, mech, decision, analyst_key_id, key, print_)
            return _Rejected(decision, row.version + 1, snapshot)
        body, after = _record_acceptance(
            conn,
            row,
            snapshot,
            decision,
            mech,
            worker,
            key,
            print_,
            analyst_key_id,
            None if quota is None or by_quota is None else (quota, by_quota),
            query_text,
        )
    return _Accepted(SubmitOutcome(body, False, row.filter), row.version + 1, after)


def _record_rejection(
    conn: Tx,
    row: ObjectState,
    mech: Mechanism,
    decision: Decision,
    analyst_key_id: int | None,
    key: str | None,
    print_: str,
) -> None:
    """Count a rejected submit on the object, store its answer for ``key``, audit it.

    The count is a compare-and-set on the version the decision read, like an accepted query's
    (:class:`_LostRace` if another writer advanced the object first — a new data version, say:
    the rejection is then decided again against it, never counted in a version it did not see).

    The problem's type is the decision's refusal (``budget-exhausted``, ``lifetime-exhausted``
    or ``quota-exhausted``).

    With a key, the answer is stored under the unique ``(object, key)``: a concurrent retry of
    the same key that also got here fails that constraint, rolls back and replays this answer,
    so a rejection is counted once whatever the retries.
    """
    refusal = decision.refusal
    stored = None
    if key is not None:
        extra = _rejection_extra(decision)
        stored = submit_store.StoredRejection(
            idempotency_key=key,
            analyst_key_id=analyst_key_id,
            fingerprint=print_,
            response=json.dumps({"detail": decision.reason, "extra": extra, "type": refusal}),
            created_at=datetime.now(UTC),
        )
    event = audit.new_event(
        kind=audit.AuditKind.DECISION_REJECTED,
        actor_key_id=analyst_key_id,
        object_id=row.id,
        detail={
            "mechanism": mech.kind,
            "epsilon": mech.epsilon,
            "filter": row.filter,
            "reason": decision.reason,
            "refusal": refusal,
            "version": row.data_version,
            "accepted": row.accepted,  # where the rejection sits in the history (dashboard)
            "realized_loss": decision.realized_loss.to_json(),
            "worst_case_after": decision.worst_case_after,
        },
    )
    # the count, the stored answer and the event: one statement (one round trip) on PostgreSQL
    if not submit_store.record_rejected(
        conn, object_id=row.id, version=row.version, stored=stored, event=event
    ):
        raise _LostRace


def _record_acceptance(
    conn: Tx,
    row: ObjectState,
    snapshot: ObjectSnapshot,
    decision: Decision,
    mech: Mechanism,
    worker: BoundWorker,
    key: str | None,
    print_: str,
    analyst_key_id: int | None,
    quota: tuple[ProjectQuota, Decision] | None = None,
    query_text: str | None = None,
) -> tuple[SubmitResult, ObjectSnapshot]:
    """Sample the output, store it and the object's new state; the response body and snapshot.

    The object's row is updated by a compare-and-set on its version (:class:`_LostRace` if
    another writer got there first); the audit event is written in the same transaction. This
    is the only place that reads the private value, and only after the decision.
    ``query_text``: ``json.dumps(mech.to_json())`` when known (:func:`_mechanism_and_text`).
    """
    output = mech.sample(json.loads(row.value.reveal()))  # decrypted here, not before
    after = recorded(snapshot, decision, mech, output, worker)
    output_json = mech.output_json(output)
    if query_text is None:
        query_text = json.dumps(mech.to_json())
    output_text = json.dumps(output_json)
    change = advance(
        after,
        domain_text=row.domain,
        history_hash=row.history_hash,
        query_text=query_text,
        output_text=output_text,
    )
    columns = change.columns
    now = datetime.now(UTC)
    seq = row.accepted + 1
    odometer = odometer_with(
        row,
        loss_lower=columns["loss_lower"],
        loss_upper=columns["loss_upper"],
        basic_total=columns["basic_total"],
        f0_account=columns["f0_account"],
        accepted=seq,
        updated_at=now,
    )
    # stored without the query id, which only the INSERT produces; _replay adds it back
    stored = {
        "object_id": row.id,
        "seq": seq,
        "version": row.data_version,
        "output": output_json,
        "epsilon": mech.epsilon,
        "odometer": odometer.model_dump(mode="json", exclude_unset=True),
    }
    event = audit.query_event(
        kind=audit.AuditKind.DECISION_ACCEPTED,
        actor_key_id=analyst_key_id,
        object_id=row.id,
        seq=seq,
        detail={
            "seq": seq,
            "mechanism": mech.kind,
            "epsilon": mech.epsilon,
            "filter": row.filter,
            "version": row.data_version,
            "realized_loss": stored["odometer"]["realized_loss"],
        },
    )
    # the query row, the compare-and-set, the state references and the audit event (its
    # detail gets the row's id): one round trip on PostgreSQL
    query_id = submit_store.record_accepted(
        conn,
        query=submit_store.AcceptedQuery(
            object_id=row.id,
            seq=seq,
            query=query_text,
            output=output_text,
            epsilon=mech.epsilon,
            epsilon_exact=str(mech.epsilon_exact),
            loss_lower=columns["loss_lower"],
            loss_upper=columns["loss_upper"],
            basic_after=float(after.basic_total),  # columns["basic_total"] is its str
            analyst_key_id=analyst_key_id,
            idempotency_key=key,
            fingerprint=print_,
            response=json.dumps(stored),
            created_at=now,
        ),
        version=row.version,
        columns={**columns, "accepted": seq, "updated_at": now},
        new_state=None
        if change.stored is None
        else submit_store.NewState(change.stored.key, change.stored.state, change.stored.err),
        event=event,
        # with a project's sub-history still to write, the block commits after it
        commit=quota is None,
    )
    if query_id is None:
        raise _LostRace
    if quota is not None:  # the project's sub-history, behind the same compare-and-set
        answer = Answer(mech, output, query_text, output_text)
        record_output(conn, quota[0], quota[1], answer, worker, object_id=row.id)
    # "reused": false set here (the route sets it on a body without it: a replayed one)
    body = SubmitResult(query_id=query_id, **{**stored, "odometer": odometer}, reused=False)
    return body, after


def list_queries(
    *,
    engine: Database,
    object_id: str,
    analyst_key_id: int | None,
    limit: int,
    after: int,
    version: int | None = None,
    scope: Scope | None = None,
) -> HistoryPage:
    """Accepted queries of one data version of an object (an analyst sees only its own).

    ``version`` None: the current one.
    """
    with reading(engine) as conn:
        row = load_object(conn, object_id, scope)
        number, start, end = version_span(conn, row, version)
        records = [
            r
            for r in object_history(
                conn,
                object_id,
                after=max(after, start),
                limit=limit,
                analyst_key_id=analyst_key_id,
            )
            if end is None or r.seq <= end
        ]
        items = [
            HistoryItem(
                query_id=r.query_id,
                survey_id=r.survey_id,
                seq=r.seq,
                version=number,
                query=json.loads(r.query),
                output=json.loads(r.output),
                epsilon=r.epsilon,
                realized_loss_after=LossView.of(LossBounds(r.loss_lower, r.loss_upper)),
                basic_composition_after=r.basic_after,
                created_at=r.created_at.isoformat() if r.created_at else None,
            )
            for r in records
        ]
    next_after = items[-1].seq if len(items) == limit else None
    if end is not None and next_after is not None and next_after >= end:
        next_after = None
    return HistoryPage(items=items, next_after=next_after)

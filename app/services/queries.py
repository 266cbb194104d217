"""Dry-runs, submits and query history.

Submit protocol (one accepted query per object at a time, nothing double-spent):

1. hold the object's lock (in-process; plus Redis across replicas when configured) — only to
   avoid wasted work;
2. in one transaction: read the object and its version ``v``; decide with the filter (never
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
retry of the same key finds the stored response. A fresh key, the common case, thus costs no
lookup: one ``SELECT``, one ``INSERT`` and one ``UPDATE`` (the statements are
:mod:`app.store.objects`' and :mod:`app.store.queries`', built once).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
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
from app.services.objects import load_object, odometer_view, version_span
from app.services.quota import (
    Answer,
    ProjectQuota,
    load_quota,
    quota_decision,
    quota_view,
    record_output,
    reported,
)
from app.services.schemas import ID_PATTERN
from app.services.scope import Scope, admits
from app.services.snapshots import (
    advance,
    lifetime_of,
    move_state_refs,
    remember,
    snapshot_of,
)
from app.store import Conflict, Database, Tx, Unavailable, reading, transaction
from app.store import objects as object_store
from app.store import queries as query_store
from app.store.objects import ObjectState
from app.store.queries import StoredAnswer
from app.worker.pool import BoundWorker

log = logging.getLogger(__name__)


def fingerprint(query: Any) -> str:
    """SHA-256 of the canonical JSON of a submitted query (the idempotency fingerprint)."""
    # allow_nan: a NaN query must reach validation (422), not crash the fingerprint
    text = json.dumps(query, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class SubmitOutcome:
    """The response body of an accepted submit and whether it is a replay."""

    body: dict[str, Any]
    replayed: bool
    filter: str | None = None


@dataclass(frozen=True)
class _Accepted:
    """An accepted submit's response body and the snapshot it committed (for the cache)."""

    outcome: SubmitOutcome
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


def dry_run(
    *,
    engine: Database,
    worker: BoundWorker,
    object_id: str,
    query: Any,
    limits: EngineLimits,
    scope: Scope | None = None,
) -> dict[str, Any]:
    """Would the object's filter accept ``query`` now? Changes nothing."""
    with reading(engine) as conn:
        row = _load_active(conn, object_id, scope)
        domain = _domain_of(row.domain, limits)
        mech = parse_query(query, domain, "query", limits=limits)
        snapshot = snapshot_of(conn, row, domain, limits, lifetime_of(row))
        quota = load_quota(conn, scope, object_id, domain, limits, version_start=row.version_start)
    decision = decide(snapshot, mech, worker, tight=True)
    by_quota = None if quota is None else quota_decision(quota, mech, worker, tight=True)
    answer = reported(decision, by_quota).to_json()
    if quota is not None and by_quota is not None:
        answer["quota"] = quota_view(quota, by_quota)
    return answer


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
    if record is None:
        return None
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
    _check_owner(record, print_, owner)
    # the stored response lacks the query id, which the INSERT that stored it produced
    return SubmitOutcome({"query_id": record.query_id, **json.loads(record.response)}, True)


def _load_active(conn: Tx, object_id: str, scope: Scope | None = None) -> ObjectState:
    """The object as a decision reads it; an object outside ``scope`` is missing (404)."""
    row = (
        object_store.load_state(
            conn, object_id=object_id, scope=None if scope is None else scope.labels
        )
        if ID_PATTERN.fullmatch(object_id)
        else None
    )
    if row is None or not admits(scope, row.labels):
        raise NotFound("no object with that id")
    if row.retired_at is not None:
        raise Retired("the object is retired and answers no queries")
    return row


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
) -> SubmitOutcome:
    """Decide, sample, record; see the module docstring for the protocol.

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
            if isinstance(outcome, Decision):
                metrics.DECISIONS.labels(outcome.filter.value, "reject").inc()
                error = refusal_error(outcome.refusal)
                raise error(outcome.reason, **_rejection_extra(outcome))
            if isinstance(outcome, _Accepted):  # committed: the next decision starts from it
                remember(engine, object_id, outcome.version, outcome.snapshot)
                outcome = outcome.outcome
            if not outcome.replayed:
                metrics.DECISIONS.labels(outcome.filter or "unknown", "accept").inc()
            return outcome
    raise Busy("too many concurrent writers on this object; retry later", retry_after=1)


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
) -> SubmitOutcome | _Accepted | _StoredRejection | Decision:
    """One transaction of :func:`submit`: replay, or decide and record the outcome.

    On a first attempt (``replay_first`` false) the key is looked up only when the answer would
    not be an accepted submit: a retry of a stored submit gets the stored answer, whatever
    changed since (the object retired, the budget spent by later queries).
    """
    with transaction(engine) as conn:

        def stored_answer() -> SubmitOutcome | _StoredRejection | None:
            if replay_first:  # already looked up at the start of this transaction
                return None
            return _replay(conn, object_id, key, print_, analyst_key_id)

        if replay_first:
            if scope is not None:  # never answer a stored key's 422 for an object out of scope
                load_object(conn, object_id, scope)
            replay = _replay(conn, object_id, key, print_, analyst_key_id)
            if replay is not None:
                return replay
        try:
            row = _load_active(conn, object_id, scope)
            domain = _domain_of(row.domain, limits)
            mech = parse_query(query, domain, "query", limits=limits)
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
            return decision
        if not replay_first:
            # a key whose submit was rejected before answers that rejection again (a later
            # history may accept the same query: it needs a new key); accepted keys are caught
            # by the unique constraint of the INSERT below
            rejected_before = _replay_rejection(conn, object_id, key, print_, analyst_key_id)
            if rejected_before is not None:
                return rejected_before
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

    The problem's type is the decision's refusal (``budget-exhausted``, ``lifetime-exhausted``
    or ``quota-exhausted``).

    With a key, the answer is stored under the unique ``(object, key)``: a concurrent retry of
    the same key that also got here fails that constraint, rolls back and replays this answer,
    so a rejection is counted once whatever the retries.
    """
    refusal = decision.refusal
    if key is not None:
        query_store.insert_rejection(
            conn,
            object_id=row.id,
            idempotency_key=key,
            analyst_key_id=analyst_key_id,
            fingerprint=print_,
            response=json.dumps(
                {"detail": decision.reason, "extra": _rejection_extra(decision), "type": refusal}
            ),
            created_at=datetime.now(UTC),
        )
    object_store.count_rejection(conn, object_id=row.id)
    audit.record(
        conn,
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
) -> tuple[dict[str, Any], ObjectSnapshot]:
    """Sample the output, store it and the object's new state; the response body and snapshot.

    The object's row is updated by a compare-and-set on its version (:class:`_LostRace` if
    another writer got there first); the audit event is written in the same transaction. This
    is the only place that reads the private value, and only after the decision.
    """
    output = mech.sample(json.loads(row.value))
    after = recorded(snapshot, decision, mech, output, worker)
    output_json = mech.output_json(output)
    query_text, output_text = json.dumps(mech.to_json()), json.dumps(output_json)
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
    odometer = odometer_view(
        replace(
            row,
            loss_lower=columns["loss_lower"],
            loss_upper=columns["loss_upper"],
            basic_total=columns["basic_total"],
            f0_account=columns["f0_account"],
            accepted=seq,
            updated_at=now,
        )
    )
    # stored without the query id, which only the INSERT produces; _replay adds it back
    stored = {
        "object_id": row.id,
        "seq": seq,
        "version": row.data_version,
        "output": output_json,
        "epsilon": mech.epsilon,
        "odometer": odometer,
    }
    query_id = query_store.insert_query(
        conn,
        object_id=row.id,
        seq=seq,
        query=query_text,
        output=output_text,
        epsilon=mech.epsilon,
        epsilon_exact=str(mech.epsilon_exact),
        loss_lower=columns["loss_lower"],
        loss_upper=columns["loss_upper"],
        basic_after=float(Fraction(columns["basic_total"])),
        analyst_key_id=analyst_key_id,
        idempotency_key=key,
        fingerprint=print_,
        response=json.dumps(stored),
        created_at=now,
    )
    if not object_store.compare_and_set(
        conn,
        object_id=row.id,
        version=row.version,
        accepted=seq,
        updated_at=now,
        columns=columns,
    ):
        raise _LostRace
    move_state_refs(
        conn,
        gained={change.stored.key: (change.stored, 1)} if change.stored else {},
        lost={row.state_hash: 1} if row.state_hash else {},
    )
    if quota is not None:  # the project's sub-history, behind the same compare-and-set
        answer = Answer(mech, output, query_text, output_text)
        record_output(conn, quota[0], quota[1], answer, worker, object_id=row.id)
    body = {"query_id": query_id, **stored}
    audit.record(
        conn,
        kind=audit.AuditKind.DECISION_ACCEPTED,
        actor_key_id=analyst_key_id,
        object_id=row.id,
        detail={
            "query_id": body["query_id"],
            "seq": seq,
            "mechanism": mech.kind,
            "epsilon": mech.epsilon,
            "filter": row.filter,
            "version": row.data_version,
            "realized_loss": odometer["realized_loss"],
        },
    )
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
) -> dict[str, Any]:
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
            {
                "query_id": r.query_id,
                "survey_id": r.survey_id,
                "seq": r.seq,
                "version": number,
                "query": json.loads(r.query),
                "output": json.loads(r.output),
                "epsilon": r.epsilon,
                "realized_loss_after": LossBounds(r.loss_lower, r.loss_upper).to_json(),
                "basic_composition_after": r.basic_after,
                "created_at": r.created_at.isoformat() if r.created_at else None,
            }
            for r in records
        ]
    next_after = items[-1]["seq"] if len(items) == limit else None
    if end is not None and next_after is not None and next_after >= end:
        next_after = None
    return {"items": items, "next_after": next_after}

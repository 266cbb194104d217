"""Dry-runs, submits and query history.

Submit protocol (one accepted query per object at a time, nothing double-spent):

1. hold the object's lock (in-process; plus Redis across replicas when configured) — only to
   avoid wasted work;
2. in one transaction: replay a stored response if the ``Idempotency-Key`` was seen (422 if the
   body differs); read the object and its version ``v``; decide with the filter (never reading
   the value); on rejection count it and answer 409 ``budget-exhausted``;
3. sample the output with the value, compute the new state, insert the query record (unique on
   ``(object, seq)`` and ``(object, idempotency key)``) and ``UPDATE objects SET version = v + 1
   ... WHERE id = :id AND version = v``; commit only if that compare-and-set hit one row.

If another writer won (the update hits no row, or a unique constraint fires), the transaction
rolls back — the unused sample is discarded unseen — and the submit starts again from step 2,
where a concurrent retry of the same key now finds the stored response.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app import metrics
from app.db.models import ProtectedObject, QueryRecord
from app.engine.accountant import Accountant
from app.engine.domain import Domain, parse_domain
from app.engine.errors import InvalidInput, Unsupported
from app.engine.filters import (
    CandidateEvaluation,
    Decision,
    FilterKind,
    OutputLoss,
    decide,
)
from app.engine.likelihood import LikelihoodState, LossBounds
from app.engine.limits import EngineLimits
from app.engine.mechanisms import Mechanism, Output, parse_query
from app.services.errors import BudgetExhausted, Busy, IdempotencyMismatch, Retired
from app.services.locks import ObjectLocks
from app.services.objects import load_object, odometer_view
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


@dataclass
class _Evaluated:
    decision: Decision
    accountant: Accountant | None  # finite objects: the restored accountant, ready to record


def _history(session: Session, object_id: str) -> list[dict[str, Any]]:
    records = session.scalars(
        select(QueryRecord).where(QueryRecord.object_id == object_id).order_by(QueryRecord.seq)
    ).all()
    return [{"query": json.loads(r.query), "output": json.loads(r.output)} for r in records]


def _restore(row: ProtectedObject, domain: Domain, limits: EngineLimits) -> Accountant:
    acc = Accountant(domain, row.budget, FilterKind(row.filter), limits)
    if row.state is not None:
        acc = Accountant.restore(
            domain=domain,
            budget=row.budget,
            filter=FilterKind(row.filter),
            logp=row.state,
            err=row.state_err,
            basic_total=Fraction(row.basic_total),
            accepted=row.accepted,
            rejected=row.rejected,
            limits=limits,
        )
    acc.basic_total, acc.accepted, acc.rejected = (
        Fraction(row.basic_total),
        row.accepted,
        row.rejected,
    )
    return acc


def _evaluate(
    session: Session,
    row: ProtectedObject,
    domain: Domain,
    mech: Mechanism,
    query: Any,
    worker: BoundWorker,
    limits: EngineLimits,
) -> _Evaluated:
    kind = FilterKind(row.filter)
    basic = Fraction(row.basic_total)
    if row.finite:
        acc = _restore(row, domain, limits)
        return _Evaluated(acc.dry_run(mech), acc)
    answer = _as_query_errors(
        worker.compute,
        {
            "domain": json.loads(row.domain),
            "history": _history(session, row.id),
            "budget": row.budget,
            "candidate": query,
            "options": {"fast": True},
        },
    )
    cand = answer["candidate"]
    evaluation = CandidateEvaluation(
        mech.epsilon,
        mech.epsilon_exact,
        tuple(OutputLoss(o["output"], o["lower"], o["upper"]) for o in cand["per_output"]),
        cand["worst_case_upper"],
        cand["per_output_complete"],
    )
    loss = LossBounds(**answer["realized_loss"])
    return _Evaluated(
        decide(
            kind=kind, budget=row.budget, loss_now=loss, basic_total=basic, candidate=evaluation
        ),
        None,
    )


def _as_query_errors(compute: Any, request: dict[str, Any]) -> dict[str, Any]:
    """Run a calculator request whose ``candidate`` is the client's ``query``, naming it so."""
    try:
        answer: dict[str, Any] = compute(request)
    except InvalidInput as exc:
        raise InvalidInput(_rename(exc.field), exc.message) from None
    except Unsupported as exc:
        raise Unsupported(_rename(exc.field), exc.message) from None
    return answer


def _rename(field_path: str) -> str:
    return (
        "query" + field_path[len("candidate") :]
        if field_path.startswith("candidate")
        else field_path
    )


def _active(session: Session, object_id: str) -> ProtectedObject:
    row = load_object(session, object_id)
    if row.retired_at is not None:
        raise Retired("the object is retired and answers no queries")
    return row


def dry_run(
    *,
    session_factory: sessionmaker[Session],
    worker: BoundWorker,
    object_id: str,
    query: Any,
    limits: EngineLimits,
) -> dict[str, Any]:
    """Would the object's filter accept ``query`` now? Changes nothing."""
    with session_factory() as session:
        row = _active(session, object_id)
        domain = parse_domain(json.loads(row.domain), "domain", limits=limits)
        mech = parse_query(query, domain, "query", limits=limits)
        return _evaluate(session, row, domain, mech, query, worker, limits).decision.to_json()


class _LostRace(Exception):
    """Another writer advanced the object first."""


def _replay(
    session: Session, object_id: str, key: str | None, print_: str, owner: int | None
) -> SubmitOutcome | None:
    if key is None:
        return None
    record = session.scalar(
        select(QueryRecord).where(
            QueryRecord.object_id == object_id, QueryRecord.idempotency_key == key
        )
    )
    if record is None:
        return None
    if record.analyst_key_id != owner:
        # another client's key: never replay its output to us
        raise IdempotencyMismatch("this Idempotency-Key was already used by another client")
    if record.fingerprint != print_:
        raise IdempotencyMismatch("this Idempotency-Key was used with a different request body")
    return SubmitOutcome(json.loads(record.response), True)


def _new_state(
    row: ProtectedObject,
    evaluated: _Evaluated,
    mech: Mechanism,
    output: Output,
    query: Any,
    session: Session,
    worker: BoundWorker,
) -> dict[str, Any]:
    """Columns of the object after recording ``output``."""
    basic_after = Fraction(row.basic_total) + mech.epsilon_exact
    if evaluated.accountant is not None:
        acc = evaluated.accountant
        acc.record(mech, output)
        loss = acc.loss()
        state = acc.state
        if not isinstance(state, LikelihoodState):  # pragma: no cover - finite objects only
            raise TypeError("a finite object must have a likelihood array")
        return {
            "state": state.to_bytes(),
            "state_err": state.err,
            "loss_lower": loss.lower,
            "loss_upper": loss.upper,
            "basic_total": str(basic_after),
        }
    history = [*_history(session, row.id), {"query": query, "output": mech.output_json(output)}]
    answer = worker.compute({"domain": json.loads(row.domain), "history": history})
    bounds = answer["realized_loss"]
    return {
        "state": None,
        "state_err": 0.0,
        "loss_lower": bounds["lower"],
        "loss_upper": bounds["upper"],
        "basic_total": str(basic_after),
    }


def submit(
    *,
    session_factory: sessionmaker[Session],
    worker: BoundWorker,
    locks: ObjectLocks,
    object_id: str,
    query: Any,
    idempotency_key: str | None,
    analyst_key_id: int | None,
    limits: EngineLimits,
    attempts: int,
) -> SubmitOutcome:
    """Decide, sample, record; see the module docstring for the protocol.

    Raises :class:`BudgetExhausted` (409) when the filter rejects, :class:`IdempotencyMismatch`
    (422), :class:`Retired`, ``NotFound``, ``InvalidInput`` and :class:`Busy` (503) after
    ``attempts`` lost races.
    """
    print_ = fingerprint(query)
    with locks.hold(object_id):
        for _ in range(attempts):
            try:
                outcome = _attempt(
                    session_factory,
                    worker,
                    object_id,
                    query,
                    idempotency_key,
                    analyst_key_id,
                    limits,
                    print_,
                )
            except (_LostRace, IntegrityError):
                continue
            except OperationalError as exc:  # serialization failures, deadlocks, busy SQLite
                log.warning("submit retried after a database conflict: %s", type(exc).__name__)
                continue
            if isinstance(outcome, Decision):
                metrics.DECISIONS.labels(outcome.filter.value, "reject").inc()
                raise BudgetExhausted(
                    outcome.reason,
                    realized_loss=outcome.realized_loss.to_json(),
                    worst_case_after=outcome.worst_case_after,
                    per_output=[o.to_json() for o in outcome.candidate.per_output],
                )
            if not outcome.replayed:
                metrics.DECISIONS.labels(outcome.filter or "unknown", "accept").inc()
            return outcome
    raise Busy("too many concurrent writers on this object; retry later", retry_after=1)


def _attempt(
    session_factory: sessionmaker[Session],
    worker: BoundWorker,
    object_id: str,
    query: Any,
    idempotency_key: str | None,
    analyst_key_id: int | None,
    limits: EngineLimits,
    print_: str,
) -> SubmitOutcome | Decision:
    with session_factory() as session, session.begin():
        replay = _replay(session, object_id, idempotency_key, print_, analyst_key_id)
        if replay is not None:
            return replay
        row = _active(session, object_id)
        version = row.version
        domain = parse_domain(json.loads(row.domain), "domain", limits=limits)
        mech = parse_query(query, domain, "query", limits=limits)
        evaluated = _evaluate(session, row, domain, mech, query, worker, limits)
        if not evaluated.decision.accepted:
            session.execute(
                update(ProtectedObject)
                .where(ProtectedObject.id == object_id)
                .values(rejected=ProtectedObject.rejected + 1)
            )
            return evaluated.decision
        value = json.loads(row.value)
        output = mech.sample(value)
        columns = _new_state(row, evaluated, mech, output, query, session, worker)
        now = datetime.now(UTC)
        record = QueryRecord(
            object_id=object_id,
            seq=row.accepted + 1,
            query=json.dumps(mech.to_json()),
            output=json.dumps(mech.output_json(output)),
            epsilon=mech.epsilon,
            epsilon_exact=str(mech.epsilon_exact),
            loss_lower=columns["loss_lower"],
            loss_upper=columns["loss_upper"],
            basic_after=float(Fraction(columns["basic_total"])),
            analyst_key_id=analyst_key_id,
            idempotency_key=idempotency_key,
            fingerprint=print_,
            response="{}",
            created_at=now,
        )
        session.add(record)
        session.flush()
        result = session.execute(
            update(ProtectedObject)
            .where(ProtectedObject.id == object_id, ProtectedObject.version == version)
            .values(version=version + 1, accepted=row.accepted + 1, updated_at=now, **columns)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            raise _LostRace
        # the ORM-enabled UPDATE above synchronised ``row`` with the values just written
        odometer = odometer_view(row)
        body = {
            "query_id": record.id,
            "object_id": object_id,
            "seq": record.seq,
            "output": mech.output_json(output),
            "epsilon": mech.epsilon,
            "odometer": odometer,
        }
        record.response = json.dumps(body)
        return SubmitOutcome(body, False, row.filter)


def list_queries(
    *,
    session_factory: sessionmaker[Session],
    object_id: str,
    analyst_key_id: int | None,
    limit: int,
    after: int,
) -> dict[str, Any]:
    """Accepted queries of an object (an analyst sees only its own)."""
    with session_factory() as session:
        load_object(session, object_id)
        query = select(QueryRecord).where(
            QueryRecord.object_id == object_id, QueryRecord.seq > after
        )
        if analyst_key_id is not None:
            query = query.where(QueryRecord.analyst_key_id == analyst_key_id)
        records = session.scalars(query.order_by(QueryRecord.seq).limit(limit)).all()
        items = [
            {
                "query_id": r.id,
                "seq": r.seq,
                "query": json.loads(r.query),
                "output": json.loads(r.output),
                "epsilon": r.epsilon,
                "realized_loss_after": {"lower": r.loss_lower, "upper": r.loss_upper},
                "basic_composition_after": r.basic_after,
                "created_at": r.created_at.isoformat() if r.created_at else None,
            }
            for r in records
        ]
    next_after = items[-1]["seq"] if len(items) == limit else None
    return {"items": items, "next_after": next_after}

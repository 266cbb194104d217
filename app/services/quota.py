"""Project quotas (issue 25): a second Bayesian filter on the project's own sub-history.

A project key's query is accepted only if the object's own filter accepts it on the whole
history **and** the realized loss of the project's sub-history (the outputs its keys have seen
of this object) stays within the project's quota for every output. The sub-history is a second
:class:`~app.engine.pipeline.ObjectSnapshot` — folded from the stored history with the same
function as any history (:func:`app.engine.pipeline.fold_history`) and decided with the same
:func:`app.services.decisions.decide` — so there is no second copy of a rule. When both filters
refuse, the object's own refusal is the one reported. Its summary per (object, project) is
stored compactly in ``project_states`` (count, hash chain, loss bounds, exact Σε) within the
submit's transaction, behind the object's compare-and-set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import NamedTuple

from app.engine.continuous.state import ContinuousState
from app.engine.domain import Domain
from app.engine.filters import Decision, FilterKind
from app.engine.likelihood import LossBounds
from app.engine.limits import EngineLimits
from app.engine.mechanisms import Mechanism, Output
from app.engine.numerics import float_up
from app.engine.pipeline import ObjectSnapshot, fold_history, history_entry
from app.services import schemas
from app.services.decisions import decide, recorded
from app.services.history import object_history
from app.services.scope import Scope
from app.services.snapshots import next_history_hash
from app.store import Tx
from app.store import projects as store
from app.store.projects import ProjectRow, SubHistory
from app.worker.pool import BoundWorker

#: The problem type of a query the project's quota refuses (the object's own: budget-exhausted).
QUOTA_EXHAUSTED = "quota-exhausted"


@dataclass(frozen=True)
class ProjectQuota:
    """A project's quota on one object: its sub-history as a snapshot, and what is stored."""

    project: ProjectRow
    stored: SubHistory | None
    snapshot: ObjectSnapshot
    #: Entries of the sub-history and its hash chain (None: empty), as read from the history.
    count: int = 0
    history_hash: str | None = None


@dataclass(frozen=True)
class SubSnapshot:
    """A project's sub-history of an object, folded from the stored history."""

    snapshot: ObjectSnapshot
    count: int
    history_hash: str | None


def sub_snapshot(
    conn: Tx,
    object_id: str,
    domain: Domain,
    limits: EngineLimits,
    project: ProjectRow,
    *,
    version_start: int,
) -> SubSnapshot:
    """The project's sub-history of the object as a snapshot (filter: Bayesian, budget: quota).

    Read from the stored history of the object's current data version (its entries after
    ``seq = version_start``: quotas apply per version) — single submits and survey answers of
    the project's keys — folded as any history is; with the number of its entries and their
    hash chain.
    """
    items = object_history(conn, object_id, project_id=project.id, after=version_start)
    entries = [history_entry(domain, json.loads(r.query), json.loads(r.output)) for r in items]
    chain: str | None = None
    for item in items:
        chain = next_history_hash(chain, item.query, item.output)
    state, basic = fold_history(domain, entries)
    if isinstance(state, ContinuousState) and entries:
        # certified without a search: the realized loss lies in [0, Σε] (Lemma 6.1); each
        # decision searches the candidate's outputs itself
        state = state.seeded(LossBounds(0.0, float_up(basic)))
    snapshot = ObjectSnapshot(domain, project.quota, FilterKind.BAYESIAN, basic, state, limits)
    return SubSnapshot(snapshot, len(entries), chain)


def load_quota(
    conn: Tx,
    scope: Scope | None,
    object_id: str,
    domain: Domain,
    limits: EngineLimits,
    *,
    version_start: int,
) -> ProjectQuota | None:
    """The quota a project key's query must also pass (None: an unscoped key).

    On the project's sub-history of the current data version (``version_start``: the ``seq``
    after which it begins).
    """
    if scope is None:
        return None
    project = store.by_id(conn, project_id=scope.project_id)
    if project is None:  # pragma: no cover - keys reference their project
        return None
    return project_quota(conn, project, object_id, domain, limits, version_start=version_start)


def project_quota(
    conn: Tx,
    project: ProjectRow,
    object_id: str,
    domain: Domain,
    limits: EngineLimits,
    *,
    version_start: int,
) -> ProjectQuota:
    """``project``'s quota on the object: its sub-history of the current data version."""
    sub = sub_snapshot(conn, object_id, domain, limits, project, version_start=version_start)
    stored = store.sub_history(conn, object_id=object_id, project_id=project.id)
    return ProjectQuota(project, stored, sub.snapshot, sub.count, sub.history_hash)


def quota_decision(
    quota: ProjectQuota, mech: Mechanism, worker: BoundWorker, *, tight: bool
) -> Decision:
    """The quota's filter on ``mech`` (the second Bayesian filter, the same pipeline).

    A refusal is a :class:`Decision` like the object's own, named ``quota-exhausted``.
    """
    return replace(decide(quota.snapshot, mech, worker, tight=tight), refusal=QUOTA_EXHAUSTED)


def reported(decision: Decision, by_quota: Decision | None) -> Decision:
    """The decision a query gets: the object's refusal first, else the quota's, else accepted."""
    if not decision.accepted or by_quota is None or by_quota.accepted:
        return decision
    return by_quota


def quota_view(quota: ProjectQuota, decision: Decision) -> schemas.QuotaDecision:
    """A dry-run's ``quota`` object: the project's filter on its sub-history."""
    return schemas.QuotaDecision(
        project=quota.project.name,
        quota=quota.project.quota,
        decision="accept" if decision.accepted else "reject",
        reason=decision.reason,
        realized_loss=schemas.LossBounds.of(decision.realized_loss),
        worst_case_after=decision.worst_case_after,
    )


class Answer(NamedTuple):
    """An accepted query's output, with the texts the history stores of both."""

    mech: Mechanism
    output: Output
    query_text: str
    output_text: str


def record_output(
    conn: Tx,
    quota: ProjectQuota,
    decision: Decision,
    answer: Answer,
    worker: BoundWorker,
    *,
    object_id: str,
) -> None:
    """Store the project's sub-history after an accepted query's output (same transaction)."""
    state = sub_history_after(quota, decision, answer, worker, object_id=object_id)
    store.put_sub_histories(conn, [state], new=quota.stored is None)


def sub_history_after(
    quota: ProjectQuota, decision: Decision, answer: Answer, worker: BoundWorker, *, object_id: str
) -> SubHistory:
    """The project's sub-history of the object once ``answer`` is in it (what is stored)."""
    after = recorded(quota.snapshot, decision, answer.mech, answer.output, worker)
    loss = after.loss()
    return SubHistory(
        object_id=object_id,
        project_id=quota.project.id,
        accepted=quota.count + 1,
        history_hash=next_history_hash(quota.history_hash, answer.query_text, answer.output_text),
        loss_lower=loss.lower,
        loss_upper=loss.upper,
        basic_total=str(after.basic_total),
    )

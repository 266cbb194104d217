"""What every survey operation shares: refusals, the survey row, and decision groups.

A **decision group** is the set of members whose public state is identical — domain, budget,
filter, exact ``Σ ε``, stored state (an exact finite history's named by its content, so any
order of the same outputs; issue 27), the history hash where the decision reads the history
itself (continuous objects, pending entries), and the stored loss bounds, which a continuous
snapshot is seeded with. Such members get the same decision from the filter, so it is
computed once, on a snapshot built from one representative, through
:mod:`app.services.decisions` — the road every single submit takes. Nothing here reads a value.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any, NamedTuple

from app.engine.domain import Domain, parse_domain
from app.engine.errors import InvalidInput, Unsupported
from app.engine.filters import Decision
from app.engine.lifetime import Lifetime
from app.engine.likelihood import LossBounds, exact_bounds
from app.engine.limits import EngineLimits
from app.engine.mechanisms import Mechanism, Output, parse_query
from app.engine.pipeline import ObjectSnapshot
from app.services.decisions import decide, decide_many
from app.services.errors import NotFound
from app.services.quota import (
    Answer,
    ProjectQuota,
    project_quota,
    quota_decision,
    sub_history_after,
)
from app.services.snapshots import snapshot_of
from app.store import Tx
from app.store.history import HistoryItem
from app.store.projects import ProjectRow, SubHistory
from app.store.states import load_states
from app.store.surveys import GroupKey, SurveyRow, get_survey
from app.worker.pool import BoundWorker


class Refusal(StrEnum):
    """Why a member was not queried."""

    BUDGET = "budget-exhausted"
    INVALID = "invalid-for-domain"
    RETIRED = "retired"
    #: The version's filter accepted, the object's lifetime budget did not.
    LIFETIME = "lifetime-exhausted"
    #: The object's filters accepted, the quota of the survey's project did not.
    QUOTA = "quota-exhausted"


class StateMissing(LookupError):
    """A group's stored state was deleted after its members were read: read them again."""


def load_survey(conn: Tx, survey_id: int) -> SurveyRow:
    """The survey's row, or :class:`NotFound`."""
    row = get_survey(conn, survey_id)
    if row is None:
        raise NotFound("no survey with that id")
    return row


def survey_totals(row: SurveyRow) -> dict[str, Any]:
    """A survey's counts, as its audit events record them."""
    return {
        "survey_id": row.id,
        "total": row.total,
        "decided": row.decided,
        "accepted": row.accepted,
        "refused": json.loads(row.refused),
        "groups": row.groups,
    }


class GroupAccepted(NamedTuple):
    """A group's accepting decision, with the query and snapshot it was made on."""

    mech: Mechanism
    snapshot: ObjectSnapshot
    decision: Decision


@dataclass
class ParsedQuery:
    """Per-run caches: parsed domains, the query per domain, stored states by key."""

    limits: EngineLimits
    query: dict[str, Any]
    domains: dict[str, Domain] = field(default_factory=dict)
    mechs: dict[str, Mechanism | None] = field(default_factory=dict)
    states: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    #: Whether a domain text's domain is finite (:func:`decision_key` asks it per member).
    finite: dict[str, bool] = field(default_factory=dict)

    def domain(self, text: str) -> Domain:
        """The parsed domain of a stored domain text."""
        found = self.domains.get(text)
        if found is None:
            found = self.domains[text] = parse_domain(json.loads(text), limits=self.limits)
        return found

    def mech(self, domain_text: str) -> Mechanism | None:
        """The query parsed for a domain; None when it is invalid there."""
        if domain_text not in self.mechs:
            try:
                found: Mechanism | None = parse_query(
                    self.query, self.domain(domain_text), "query", limits=self.limits
                )
            except (InvalidInput, Unsupported):
                found = None
            self.mechs[domain_text] = found
        return self.mechs[domain_text]


class _SnapshotRow(NamedTuple):
    """What :func:`snapshot_of` reads of a representative member."""

    id: str
    version: int
    budget: float
    filter: str
    state: bytes | None
    state_err: float
    state_pending: int
    loss_lower: float
    loss_upper: float
    basic_total: str
    budget_delta: float | None
    f0_account: str
    version_start: int


#: ``history_hash``'s position in :class:`GroupKey`.
_HISTORY = GroupKey._fields.index("history_hash")
_NO_HISTORY = (None,)


def decision_key(key: GroupKey, parsed: ParsedQuery) -> GroupKey:
    """The part of a member's public state its decision reads (issue 27: canonical groups).

    A finite object's decision reads its stored array (named by content when exact:
    :func:`~app.services.snapshots.content_key`), never its history hash — so members whose
    histories hold the same outputs in another order are one decision group. A continuous
    object's history, and the entries a finite array lacks (``state_pending``), are read from
    the representative's own history: those keep their history hash.
    """
    if key.state_pending:
        return key
    finite = parsed.finite.get(key.domain)
    if finite is None:
        finite = parsed.finite[key.domain] = parsed.domain(key.domain).is_finite
    if not finite:
        return key
    # ``key._replace(history_hash=None)``, built directly (a chunk asks it per member): two
    # slices joined around the None (unpacking them into a display cost 1.5x as much)
    return tuple.__new__(GroupKey, key[:_HISTORY] + _NO_HISTORY + key[_HISTORY + 1 :])


def decide_group(
    conn: Tx,
    key: GroupKey,
    representative: tuple[str, int, int],
    parsed: ParsedQuery,
    worker: BoundWorker,
) -> GroupAccepted | Refusal:
    """The decision every member with public state ``key`` gets (a single submit's).

    ``representative``: one member's id, row version and ``version_start`` (a continuous
    history is read from its current data version's rows).
    """
    mech = parsed.mech(key.domain)
    if mech is None:
        return Refusal.INVALID
    return decide_snapshot(mech, group_snapshot(conn, key, representative, parsed), worker)


def decide_snapshot(
    mech: Mechanism, snapshot: ObjectSnapshot, worker: BoundWorker
) -> GroupAccepted | Refusal:
    """:func:`decide_group`'s decision on a snapshot already built (:func:`group_snapshot`)."""
    decision = decide(snapshot, mech, worker, tight=False)
    if not decision.accepted:
        return Refusal.LIFETIME if decision.refusal == Refusal.LIFETIME.value else Refusal.BUDGET
    return GroupAccepted(mech, snapshot, decision)


def decide_snapshots(
    mech: Mechanism, snapshots: Sequence[ObjectSnapshot], worker: BoundWorker
) -> list[GroupAccepted | Refusal]:
    """:func:`decide_snapshot` of every snapshot.

    Finite ones are decided together (:func:`~app.services.decisions.decide_many`).
    """
    found: list[GroupAccepted | Refusal] = []
    for snapshot, decision in zip(snapshots, decide_many(snapshots, mech, worker), strict=True):
        if decision.accepted:
            found.append(GroupAccepted(mech, snapshot, decision))
        elif decision.refusal == Refusal.LIFETIME.value:
            found.append(Refusal.LIFETIME)
        else:
            found.append(Refusal.BUDGET)
    return found


def group_snapshot(
    conn: Tx,
    key: GroupKey,
    representative: tuple[str, int, int],
    parsed: ParsedQuery,
    *,
    history: Sequence[HistoryItem] | None = None,
) -> ObjectSnapshot:
    """The snapshot :func:`decide_group` decides on (``history``: the representative's, read).

    Its exact form is parsed from the stored bytes, not looked up nor kept in the process's
    :data:`~app.services.snapshots.EXACT_FORMS`: a run decodes each group's state once (its
    decision is kept for the run), a diverged survey meets ~20,000 new ones, and a single
    submit after the survey reads the state the survey stored after its answer, not this one.
    """
    domain = parsed.domain(key.domain)
    state, err = None, 0.0
    if key.state_hash is not None:
        if key.state_hash not in parsed.states:
            parsed.states.update(load_states(conn, {key.state_hash}))
        if key.state_hash not in parsed.states:
            # read after the object row, by another statement: a submit moved every user of
            # this state on meanwhile (and it was deleted) — the group must be read again
            raise StateMissing(key.state_hash)
        state, err = parsed.states[key.state_hash]
    row = _SnapshotRow(
        representative[0],
        representative[1],
        key.budget,
        key.filter,
        state,
        err,
        key.state_pending,
        key.loss_lower,
        key.loss_upper,
        key.basic_total,
        key.budget_delta,
        key.f0_account,
        representative[2],
    )
    lifetime = None
    if key.lifetime_budget is not None:
        closed = (
            exact_bounds(Fraction(key.lifetime_exact))
            if key.lifetime_exact is not None
            else LossBounds(key.lifetime_lower, key.lifetime_upper)
        )
        lifetime = Lifetime(key.lifetime_budget, closed)
    return snapshot_of(conn, row, domain, parsed.limits, lifetime, history=history, forms=None)


@dataclass
class QuotaGroups:
    """A project survey's quota (issue 25): the project's filter on each member's sub-history.

    Exactly a single submit's check (:func:`app.services.quota.project_quota` and
    :func:`~app.services.quota.quota_decision`), applied after the object's own filter accepted.
    Members whose sub-histories are equal — the same domain and stored hash chain of the
    project's outputs in the current data version (``project_states``; none: empty) — get one
    decision, made on a representative's sub-history as read from its stored history; and one
    sub-history after each output (:func:`~app.services.quota.sub_history_after`).
    """

    project: ProjectRow
    limits: EngineLimits
    decided: dict[tuple[str, str | None], tuple[ProjectQuota, Decision]] = field(
        default_factory=dict
    )
    after: dict[tuple[str, str | None, Output], SubHistory] = field(default_factory=dict)

    def decide(
        self,
        conn: Tx,
        group: GroupAccepted,
        sub: tuple[str, str | None],
        member: tuple[str, int],
        worker: BoundWorker,
    ) -> tuple[ProjectQuota, Decision]:
        """The quota's decision for members of sub-group ``sub`` (domain text, stored hash).

        ``member``: a representative's id and the ``seq`` its current data version starts after.
        """
        found = self.decided.get(sub)
        if found is None:
            quota = project_quota(
                conn,
                self.project,
                member[0],
                group.snapshot.domain,
                self.limits,
                version_start=member[1],
            )
            found = (quota, quota_decision(quota, group.mech, worker, tight=False))
            self.decided[sub] = found
        return found

    def sub_history(
        self, sub: tuple[str, str | None], answer: Answer, worker: BoundWorker, *, object_id: str
    ) -> SubHistory:
        """A member's sub-history once ``answer`` (accepted by :meth:`decide`) is in it."""
        found = self.after.get((*sub, answer.output))
        if found is None:
            quota, decision = self.decided[sub]
            found = sub_history_after(quota, decision, answer, worker, object_id=object_id)
            self.after[(*sub, answer.output)] = found
        return replace(found, object_id=object_id)

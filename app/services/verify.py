"""``gatekeeper verify``: recompute every object's state from its stored history.

For each object the accepted queries are replayed in sequence order and compared with what is
stored: sequence numbers ``1..n`` with no gaps, ``accepted == n``, the exact basic-composition
total, the history hash chain, and the realized-loss bounds (finite domains: the whole ``log P``
array too, found under the key the history names). Shared likelihood states must be counted by
exactly the objects that use them. Surveys: every answer an object's history names
(``objects.answered``) is an accepted member of that survey's chunk, and every accepted member
of a chunk is named by its object exactly once; refused and pending members are named by none.
A mismatch means the stored state does not follow from the stored history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import LikelihoodStateRecord, ProtectedObject, SurveyChunk
from app.engine.calculator import DEFAULT_TOLERANCE
from app.engine.domain import parse_domain
from app.engine.likelihood import LikelihoodState
from app.engine.pipeline import fold_history, history_account, history_entry
from app.services.history import object_history
from app.services.snapshots import next_history_hash, state_key
from app.services.survey_chunks import ChunkCache, decode, parse_answered

#: Absolute tolerance when comparing recomputed floats with stored ones.
TOLERANCE = 1e-9
#: Continuous objects: two searches to the default tolerance agree within twice that.
CONTINUOUS_TOLERANCE = 2 * DEFAULT_TOLERANCE


@dataclass
class Report:
    """Objects checked and the problems found."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing mismatched."""
        return not self.problems


def verify_object(
    session: Session, row: ProtectedObject, report: Report, chunks: ChunkCache | None = None
) -> None:
    """Replay one object's history and record any mismatch in ``report``.

    The history (single submits and survey answers, :mod:`app.services.history`) is folded by
    the engine's own replay (:func:`app.engine.pipeline.fold_history`, the one every decision
    uses); a continuous history's loss is searched afresh.
    """
    try:
        records = object_history(session.connection(), row.id, row.answered, chunks=chunks)
    except LookupError as exc:
        report.problems.append(f"{row.id}: {exc}")
        return
    seqs = [r.seq for r in records]
    if seqs != list(range(1, len(records) + 1)):
        report.problems.append(f"{row.id}: sequence numbers are not 1..{len(records)}")
    if row.accepted != len(records):
        report.problems.append(
            f"{row.id}: accepted={row.accepted} but {len(records)} queries are stored"
        )
    domain = parse_domain(json.loads(row.domain))
    entries = []
    chain: str | None = None
    for r in records:
        entries.append(history_entry(domain, json.loads(r.query), json.loads(r.output)))
        chain = next_history_hash(chain, r.query, r.output)
        if Fraction(r.epsilon_exact) != entries[-1].mechanism.epsilon_exact:
            report.problems.append(f"{row.id}: query {r.seq} has a stored epsilon that differs")
    state, basic = fold_history(domain, entries)
    if Fraction(row.basic_total) != basic:
        report.problems.append(f"{row.id}: basic composition differs from the history's")
    if Fraction(row.f0_account) != history_account(entries, row.budget, row.budget_delta):
        report.problems.append(f"{row.id}: F0's account differs from the history's")
    if row.history_hash != chain:
        report.problems.append(f"{row.id}: history hash differs from the history's")
    loss = state.loss(basic)
    report.checked += 1
    if isinstance(state, LikelihoodState):
        expected_key = state_key(row.domain, chain) if chain is not None else None
        if row.state_hash != expected_key:
            report.problems.append(f"{row.id}: likelihood state key differs from the history's")
        if row.state_hash is not None or records:
            found = session.get(LikelihoodStateRecord, row.state_hash) if row.state_hash else None
            data = found.state if found else b""
            stored = np.frombuffer(data[: 8 * state.logp.size], dtype="<f8")
            if stored.size != state.logp.size or not np.allclose(
                stored, state.logp.ravel(), rtol=0, atol=TOLERANCE
            ):
                report.problems.append(f"{row.id}: likelihood array differs from the history's")
            elif found is not None and state.exact is not None:
                # an array stored before exact forms existed has none (decided by floats)
                exact = LikelihoodState.from_bytes(domain, data, found.err).exact
                if exact is not None and not state.exact.same_as(exact):
                    report.problems.append(f"{row.id}: exact loss differs from the history's")
        lower_off = abs(loss.lower - row.loss_lower) > TOLERANCE
        if lower_off or abs(loss.upper - row.loss_upper) > TOLERANCE:
            report.problems.append(f"{row.id}: stored loss bounds differ from the history's")
        return
    # two certified intervals of the same loss must overlap ...
    if loss.lower > row.loss_upper + TOLERANCE or row.loss_lower > loss.upper + TOLERANCE:
        report.problems.append(f"{row.id}: stored loss bounds contradict the history's")
    # ... and, when the recomputation closed its gap, agree within the search tolerance
    elif loss.upper - loss.lower <= DEFAULT_TOLERANCE and (
        abs(loss.lower - row.loss_lower) > CONTINUOUS_TOLERANCE
        or abs(loss.upper - row.loss_upper) > CONTINUOUS_TOLERANCE
    ):
        report.problems.append(f"{row.id}: stored loss bounds differ from the history's")
    if row.loss_upper > float(basic) + TOLERANCE:
        report.problems.append(f"{row.id}: stored loss exceeds basic composition")


def verify_state_refs(session: Session, report: Report) -> None:
    """Every stored likelihood state is counted by exactly the objects that name it."""
    using = dict(
        session.execute(
            select(ProtectedObject.state_hash, func.count())
            .where(ProtectedObject.state_hash.is_not(None))
            .group_by(ProtectedObject.state_hash)
        ).all()
    )
    stored = dict(
        session.execute(select(LikelihoodStateRecord.hash, LikelihoodStateRecord.refs)).all()
    )
    for key, count in using.items():
        if key not in stored:
            report.problems.append(f"likelihood state {key}: named by {count} objects, not stored")
        elif stored[key] != count:
            report.problems.append(
                f"likelihood state {key}: counts {stored[key]} users, {count} objects name it"
            )
    for key, refs in stored.items():
        if key not in using:
            report.problems.append(f"likelihood state {key}: stored ({refs} users) but unused")


def verify_surveys(session: Session, report: Report) -> None:
    """Each answer an object names is an accepted member of that chunk, named exactly once."""
    named: dict[tuple[int, int], dict[str, int]] = {}
    for object_id, answered in session.execute(
        select(ProtectedObject.id, ProtectedObject.answered).where(
            ProtectedObject.answered.is_not(None)
        )
    ):
        for pair in parse_answered(answered):
            by_object = named.setdefault(pair, {})
            by_object[object_id] = by_object.get(object_id, 0) + 1
    for row in session.execute(select(SurveyChunk.__table__)):
        chunk = decode(row)
        names = named.pop((chunk.survey_id, chunk.chunk), {})
        label = f"survey {chunk.survey_id}, chunk {chunk.chunk}"
        if chunk.members != sorted(set(chunk.members)):
            report.problems.append(f"{label}: members are not sorted and distinct")
        for at, member in enumerate(chunk.members):
            decision = chunk.decision(at)
            times = names.pop(member, 0)
            if decision.status == "accepted" and times != 1:
                report.problems.append(
                    f"{label}, member {member}: accepted, named by its object {times} times"
                )
            elif decision.status != "accepted" and times:
                report.problems.append(f"{label}, member {member}: {decision.status}, but named")
        for member in names:
            report.problems.append(f"{label}: named by {member}, which is not a member")
    for (survey_id, number), names in named.items():
        for member in names:
            report.problems.append(f"{member}: names survey {survey_id} chunk {number}, not stored")


def verify_all(session_factory: sessionmaker[Session]) -> Report:
    """Check every object, the shared likelihood states and the surveys' members."""
    report = Report()
    with session_factory() as session:
        chunks = ChunkCache()
        for row in session.scalars(select(ProtectedObject).order_by(ProtectedObject.id)):
            verify_object(session, row, report, chunks)
        verify_state_refs(session, report)
        verify_surveys(session, report)
    return report

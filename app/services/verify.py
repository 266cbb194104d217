"""``gatekeeper verify``: recompute every object's state from its stored history.

For each object the accepted queries are replayed in sequence order and compared with what is
stored: sequence numbers ``1..n`` with no gaps, ``accepted == n``, the exact basic-composition
total, and the realized-loss bounds (finite domains: the whole ``log P`` array too). A mismatch
means the stored state does not follow from the stored history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import ProtectedObject, QueryRecord
from app.engine.calculator import DEFAULT_TOLERANCE
from app.engine.domain import parse_domain
from app.engine.likelihood import LikelihoodState
from app.engine.pipeline import fold_history, history_entry

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


def verify_object(session: Session, row: ProtectedObject, report: Report) -> None:
    """Replay one object's history and record any mismatch in ``report``.

    The history is folded by the engine's own replay (:func:`app.engine.pipeline.fold_history`,
    the one every decision uses); a continuous history's loss is searched afresh.
    """
    records = session.scalars(
        select(QueryRecord).where(QueryRecord.object_id == row.id).order_by(QueryRecord.seq)
    ).all()
    seqs = [r.seq for r in records]
    if seqs != list(range(1, len(records) + 1)):
        report.problems.append(f"{row.id}: sequence numbers are not 1..{len(records)}")
    if row.accepted != len(records):
        report.problems.append(
            f"{row.id}: accepted={row.accepted} but {len(records)} queries are stored"
        )
    domain = parse_domain(json.loads(row.domain))
    entries = []
    for r in records:
        entries.append(history_entry(domain, json.loads(r.query), json.loads(r.output)))
        if Fraction(r.epsilon_exact) != entries[-1].mechanism.epsilon_exact:
            report.problems.append(f"{row.id}: query {r.seq} has a stored epsilon that differs")
    state, basic = fold_history(domain, entries)
    if Fraction(row.basic_total) != basic:
        report.problems.append(f"{row.id}: basic composition differs from the history's")
    loss = state.loss(basic)
    report.checked += 1
    if isinstance(state, LikelihoodState):
        if row.state is not None or records:
            stored = np.frombuffer(row.state or b"", dtype="<f8")
            if stored.size != state.logp.size or not np.allclose(
                stored, state.logp.ravel(), rtol=0, atol=TOLERANCE
            ):
                report.problems.append(f"{row.id}: likelihood array differs from the history's")
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


def verify_all(session_factory: sessionmaker[Session]) -> Report:
    """Check every object."""
    report = Report()
    with session_factory() as session:
        for row in session.scalars(select(ProtectedObject).order_by(ProtectedObject.id)):
            verify_object(session, row, report)
    return report

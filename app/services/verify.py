"""``gatekeeper verify``: recompute every object's state from its stored history.

For each object the accepted queries are replayed in sequence order and compared with what is
stored: sequence numbers ``1..n`` with no gaps, ``accepted == n``, the exact basic-composition
total, the history hash chain, and the realized-loss bounds (finite domains: the whole ``log P``
array too, found under the key the history names — the history but its last ``state_pending``
entries, which a survey did not fold into a stored array). Shared likelihood states must be counted
by exactly the objects that use them. An object's history includes its survey answers (packed in
their chunks, :mod:`app.services.history`), so a survey answer lost, added or doubled shows as a
sequence gap or a count that differs from ``accepted``. Surveys: each chunk's members sorted and
distinct within its stated range, the chunks of a survey disjoint and in order, their decisions
well formed, and the survey's counters equal to what its chunks hold. Data versions: each
closed version's history (its ``seq`` range) replays to its stored loss and Σε, the ranges are
contiguous, the lifetime sums are the sum of the closed losses, and the object's row is the
current version's replay. Projects (issue 25): each stored sub-history (``project_states``) is
recomputed from the entries its project's keys asked — count, hash chain, exact Σε and loss
bounds. A mismatch means the stored state does not follow from the stored history.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from app.engine.calculator import DEFAULT_TOLERANCE
from app.engine.domain import Domain, parse_domain
from app.engine.lifetime import NO_CLOSED, add_losses
from app.engine.likelihood import LikelihoodState, LossBounds, exact_bounds
from app.engine.limits import DEFAULT_LIMITS
from app.engine.pipeline import fold_history, history_account, history_entry
from app.services.history import stored_entries
from app.services.objects import stored_domain
from app.services.quota import sub_snapshot
from app.services.snapshots import next_history_hash, state_key
from app.store import Database, Tx, reading
from app.store import objects as object_store
from app.store import projects as project_store
from app.store import verify as store
from app.store import versions as version_store
from app.store.chunks import REASONS, Chunk, ChunkCache, decode
from app.store.history import HistoryItem
from app.store.verify import ChunkRow, StoredObject

#: Absolute tolerance when comparing recomputed floats with stored ones.
TOLERANCE = 1e-9
#: Continuous objects: two searches to the default tolerance agree within twice that.
CONTINUOUS_TOLERANCE = 2 * DEFAULT_TOLERANCE


@dataclass
class Report:
    """Objects checked and the problems found."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)
    #: Surveys whose chunks were checked.
    surveys: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing mismatched."""
        return not self.problems


def verify_object(
    conn: Tx, row: StoredObject, report: Report, chunks: ChunkCache | None = None
) -> None:
    """Replay one object's history and record any mismatch in ``report``.

    The history (single submits and survey answers, :mod:`app.services.history`) is folded by
    the engine's own replay (:func:`app.engine.pipeline.fold_history`, the one every decision
    uses); a continuous history's loss is searched afresh.
    """
    all_records = stored_entries(conn, row.id, chunks=chunks)
    seqs = [r.seq for r in all_records]
    if seqs != list(range(1, len(all_records) + 1)):
        report.problems.append(f"{row.id}: sequence numbers are not 1..{len(all_records)}")
    if row.accepted != len(all_records):
        report.problems.append(
            f"{row.id}: accepted={row.accepted} but {len(all_records)} queries are stored"
        )
    domain = parse_domain(json.loads(row.domain))
    _verify_versions(conn, row, domain, all_records, report)
    records = [r for r in all_records if r.seq > row.version_start]
    entries = []
    chain: str | None = None
    held = len(records) - row.state_pending  # entries the stored array holds
    held_chain: str | None = None
    if not 0 <= row.state_pending <= len(records) or (row.state_pending and not domain.is_finite):
        report.problems.append(f"{row.id}: state_pending={row.state_pending} is impossible")
        held = len(records)
    for r in records:
        entries.append(history_entry(domain, json.loads(r.query), json.loads(r.output)))
        chain = next_history_hash(chain, r.query, r.output)
        if len(entries) == held:
            held_chain = chain
        if Fraction(r.epsilon_exact) != entries[-1].mechanism.epsilon_exact:
            report.problems.append(f"{row.id}: query {r.seq} has a stored epsilon that differs")
    state, basic = fold_history(domain, entries)
    if Fraction(row.basic_total) != basic:
        report.problems.append(f"{row.id}: basic composition differs from the history's")
    account = history_account(entries, row.budget, row.budget_delta, domain)
    if Fraction(row.f0_account) != account:
        report.problems.append(f"{row.id}: F0's account differs from the history's")
    if row.history_hash != chain:
        report.problems.append(f"{row.id}: history hash differs from the history's")
    loss = state.loss(basic)
    report.checked += 1
    if isinstance(state, LikelihoodState):
        if held < len(records):
            state, _ = fold_history(domain, entries[:held])  # what the stored array holds
            assert isinstance(state, LikelihoodState)  # noqa: S101 - a finite domain
        expected_key = state_key(row.domain, held_chain) if held_chain is not None else None
        if row.state_hash != expected_key:
            report.problems.append(f"{row.id}: likelihood state key differs from the history's")
        if row.state_hash is not None or held:
            found = store.likelihood_state(conn, key=row.state_hash) if row.state_hash else None
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


def _verify_versions(
    conn: Tx, row: StoredObject, domain: Domain, records: list[HistoryItem], report: Report
) -> None:
    """Check the closed data versions of an object.

    Their ``seq`` ranges are contiguous, each one's loss and Σε replay from its own history,
    and the lifetime sums are the sum of the stored closed losses.
    """
    closed = version_store.closed_versions(conn, object_id=row.id)
    end = 0
    total = NO_CLOSED
    for number, version in enumerate(closed, start=1):
        label = f"{row.id}: version {version.data_version}"
        if version.data_version != number or version.seq_start != end:
            report.problems.append(f"{label}: versions are not contiguous from 1")
        end = version.seq_end
        entries = [
            history_entry(domain, json.loads(r.query), json.loads(r.output))
            for r in records
            if version.seq_start < r.seq <= version.seq_end
        ]
        if len(entries) != version.seq_end - version.seq_start:
            report.problems.append(f"{label}: its history is not seq {version.seq_start + 1}..")
        state, basic = fold_history(domain, entries)
        if Fraction(version.basic_total) != basic:
            report.problems.append(f"{label}: basic composition differs from its history's")
        loss = state.loss(basic) if entries else exact_bounds(Fraction(0))
        if version.loss_exact is not None:
            if loss.value is None or Fraction(version.loss_exact) != loss.value:
                report.problems.append(f"{label}: exact loss differs from its history's")
        elif loss.lower > version.loss_upper + CONTINUOUS_TOLERANCE or (
            version.loss_lower > loss.upper + CONTINUOUS_TOLERANCE
        ):
            report.problems.append(f"{label}: stored loss bounds contradict its history's")
        stored = (
            exact_bounds(Fraction(version.loss_exact))
            if version.loss_exact is not None
            else LossBounds(version.loss_lower, version.loss_upper)
        )
        total = add_losses(total, stored)
    if row.data_version != len(closed) + 1 or row.version_start != end:
        report.problems.append(f"{row.id}: current version does not follow its closed versions")
    exact = None if total.value is None else str(total.value)
    if (row.lifetime_exact, row.lifetime_lower, row.lifetime_upper) != (
        exact,
        total.lower,
        total.upper,
    ):
        report.problems.append(f"{row.id}: lifetime sums differ from its closed versions'")


def verify_state_refs(conn: Tx, report: Report) -> None:
    """Every stored likelihood state is counted by exactly the objects that name it."""
    using = store.state_users(conn)
    stored = store.state_refs(conn)
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


def verify_surveys(conn: Tx, report: Report) -> None:
    """Chunks well formed and in order; each survey's counters equal what its chunks hold."""
    surveys = store.survey_counters(conn)
    previous: Chunk | None = None
    totals: dict[int, list[int]] = {}  # survey -> [members, decided, accepted]
    for row in store.chunks(conn):
        chunk = decode(row)
        label = f"survey {chunk.survey_id}, chunk {chunk.chunk}"
        _check_chunk(chunk, row, label, report)
        if previous is not None and previous.survey_id == chunk.survey_id:
            if previous.chunk + 1 != chunk.chunk or previous.members[-1] >= chunk.members[0]:
                report.problems.append(f"{label}: not after chunk {previous.chunk} in id order")
        elif chunk.chunk != 0:
            report.problems.append(f"{label}: the survey's first chunk is not 0")
        previous = chunk
        counts = totals.setdefault(chunk.survey_id, [0, 0, 0])
        counts[0] += len(chunk.members)
        if chunk.picks is not None:
            counts[1] += len(chunk.members)
            counts[2] += sum(1 for pick in chunk.picks if pick >= 0)
    for survey_id, survey in surveys.items():
        members, decided, accepted = totals.get(survey_id, [0, 0, 0])
        if (members, decided, accepted) != (survey.total, survey.decided, survey.accepted):
            report.problems.append(
                f"survey {survey_id}: total/decided/accepted {survey.total}/{survey.decided}/"
                f"{survey.accepted}, its chunks hold {members}/{decided}/{accepted}"
            )
    for survey_id in totals.keys() - surveys.keys():
        report.problems.append(f"survey {survey_id}: chunks stored without the survey")
    report.surveys = len(surveys)


def _check_chunk(chunk: Chunk, row: ChunkRow, label: str, report: Report) -> None:
    """One chunk's own consistency: members, range, and (decided) picks and sequence numbers."""
    members = chunk.members
    if members != sorted(set(members)) or row.size != len(members):
        report.problems.append(f"{label}: members are not {row.size} sorted distinct ids")
    elif (row.first_id, row.last_id) != (members[0], members[-1]):
        report.problems.append(f"{label}: first_id/last_id differ from its members")
    if chunk.picks is None or chunk.seqs is None:
        if chunk.picks is not None or chunk.seqs is not None or chunk.decided_at is not None:
            report.problems.append(f"{label}: partly decided")
        return
    if len(chunk.picks) != len(members) or len(chunk.seqs) != len(members):
        report.problems.append(f"{label}: picks or seqs do not match its members")
        return
    for member, pick, seq in zip(members, chunk.picks, chunk.seqs, strict=True):
        # a reused answer is stored as -seq of the answer it repeats (not a history entry)
        accepted = 0 <= pick < len(chunk.variants) and seq != 0
        refused = pick in REASONS and seq == 0
        if not (accepted or refused):
            report.problems.append(f"{label}, member {member}: pick {pick} / seq {seq} is invalid")


def count_objects(engine: Database) -> int:
    """How many objects :func:`verify_all` will check (for a progress bar's total)."""
    with reading(engine) as conn:
        return store.object_count(conn)


def verify_all(engine: Database, progress: Callable[[int], object] | None = None) -> Report:
    """Check every object, the shared likelihood states and the surveys' members.

    ``progress(1)`` is called after each object (``gatekeeper verify``'s progress bar).
    """
    report = Report()
    with reading(engine) as conn:
        chunks = ChunkCache()
        for row in store.objects(conn):
            verify_object(conn, row, report, chunks)
            if progress is not None:
                progress(1)
        verify_state_refs(conn, report)
        verify_surveys(conn, report)
        verify_project_states(conn, report)
        verify_object_counts(conn, report)
    return report


def verify_object_counts(conn: Tx, report: Report) -> None:
    """The counts ``object_counts`` keeps (the dashboard's summary, the gauges) equal a count.

    They differ only if the triggers of migration 0014 were dropped or disabled, or a status's
    definition changed without recreating them.
    """
    kept, counted = object_store.kept_and_counted(conn)
    if kept != counted:
        names = list(object_store.ROW_COUNTS)
        differ = ", ".join(
            f"{name}={k} (counted {c})"
            for name, k, c in zip(names, kept, counted, strict=True)
            if k != c
        )
        report.problems.append(f"object counts kept differ from the rows: {differ}")


def verify_project_states(conn: Tx, report: Report) -> None:
    """Recompute each project's stored sub-history of an object from the stored history.

    A stored sub-history is the current data version's (a new version deletes them).
    """
    for stored in project_store.all_sub_histories(conn):
        label = f"object {stored.object_id}, project {stored.project_id}"
        project = project_store.by_id(conn, project_id=stored.project_id)
        record = object_store.get_object(conn, object_id=stored.object_id)
        if project is None or record is None:
            report.problems.append(f"{label}: sub-history of a missing object or project")
            continue
        domain = stored_domain(record.domain)
        sub = sub_snapshot(
            conn,
            stored.object_id,
            domain,
            DEFAULT_LIMITS,
            project,
            version_start=record.version_start,
        )
        if sub.count != stored.accepted:
            report.problems.append(f"{label}: {sub.count} entries, stored {stored.accepted}")
        if sub.history_hash != stored.history_hash:
            report.problems.append(f"{label}: history hash differs from the stored one")
        if str(sub.snapshot.basic_total) != stored.basic_total:
            report.problems.append(f"{label}: basic composition differs")
        if domain.is_finite:
            loss = sub.snapshot.loss()
            if (
                abs(loss.lower - stored.loss_lower) > TOLERANCE
                or abs(loss.upper - stored.loss_upper) > TOLERANCE
            ):
                report.problems.append(f"{label}: realized loss differs from the stored one")

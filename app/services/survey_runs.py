"""Running a survey: its members decided chunk by chunk, each chunk one transaction.

A survey's members are cut into chunks at creation (:mod:`app.store.chunks`). A
chunk:

1. takes its ``survey_chunks`` row if still pending, and its members' object rows — both locked
   ``FOR UPDATE`` on PostgreSQL, so a concurrent single submit waits, then loses its
   compare-and-set and decides again on the committed history, and a second worker on the same
   chunk waits, then finds it decided;
2. groups them by what their decision reads (:func:`decision_key`: the public state without
   a finite history's hash — an exact array is named by its content, so histories holding the
   same outputs in another order are one group, issue 27) and decides each group once (through
   :mod:`app.services.survey_groups`) — remembered for the rest of the run (:class:`RunCache`),
   since equal public state means an equal decision;
3. decrypts and samples each accepted member (the only read of a value); the next snapshot is
   computed once per (decision group, output), also remembered, so a million members with ten
   histories compute twenty states, and store each once (:mod:`app.services.snapshots`); each
   history's own hash follows (:func:`~app.services.snapshots.advance_from`);
4. writes in a handful of statements (:mod:`app.store.bulk`): a compare-and-set on every
   accepted object's version, the members' decisions and answers packed in the chunk's row
   (only from pending: a member is decided at most once; the answers are in the objects'
   histories from then on, :mod:`app.services.history`), refusals counted on their objects,
   the new shared states (inserted, or the stored rows locked against the collection of
   unnamed states: :mod:`app.store.states`), and the survey's counters and output tally — whose
   row is locked last, and whose status is checked there: a survey cancelled
   meanwhile rolls the chunk back.

Anything failing in a chunk (a lost race, a crash, a cancel) rolls it back — the samples drawn
are discarded unseen — and it is decided again from what committed. A process claims a survey
with a lease renewed after every chunk; a crashed process's surveys are taken over when its
lease expires (:func:`resumable_surveys`) and resume at the first pending chunk.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import secrets
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from app import crypto, metrics
from app.engine.estimates import tally_outputs
from app.engine.exact import MAGIC, ExactLoss
from app.engine.likelihood import (
    LikelihoodState,
    LossBounds,
    Term,
    exact_after,
    exact_bounds,
    fold_many,
)
from app.engine.limits import DEFAULT_LIMITS, EngineLimits, for_history
from app.engine.mechanisms import Mechanism, Output, parse_query
from app.engine.mechanisms.base import output_index
from app.engine.pipeline import ObjectSnapshot, accounts_after, losses_after
from app.services import audit
from app.services.decisions import recorded
from app.services.history import HistoryMismatch, object_histories
from app.services.quota import Answer
from app.services.reuse import chunk_reusables, survey_reuse_owner
from app.services.snapshots import (
    Advance,
    StateGone,
    StoredState,
    advance,
    advance_from,
    canonical_content_keys,
    collect_states,
    history_hashes_after,
    keep_states,
    pending_columns,
)
from app.services.survey_groups import (
    GroupAccepted,
    ParsedQuery,
    QuotaGroups,
    Refusal,
    StateMissing,
    decide_snapshots,
    decision_key,
    group_snapshot,
    load_survey,
    survey_totals,
)
from app.store import Conflict, Database, Tx, Unavailable, reading, transaction
from app.store import chunks as chunk_store
from app.store import projects as project_store
from app.store import surveys as survey_store
from app.store.chunks import REFUSAL_CODES, Variant
from app.store.domains import domain_texts
from app.store.history import HistoryItem
from app.store.projects import SubHistory
from app.store.reuse import member_bounds
from app.store.states import load_states
from app.store.surveys import ACTIVE, Advanced, GroupKey, MemberRow, SurveyRow
from app.worker.children import ChildPool
from app.worker.pool import BoundWorker

log = logging.getLogger(__name__)

_K = TypeVar("_K")
_V = TypeVar("_V")


# ------------------------------------------------------------------------------ one chunk
class _LostRace(Exception):
    """An object of the chunk changed under us, or a member was decided elsewhere."""


class _Stopped(Exception):
    """The survey is no longer active (cancelled, finished or failed)."""


@dataclass(frozen=True)
class ChunkOutcome:
    """What one chunk did: its number and counts (``decided`` 0: it was decided already).

    Plain data: a survey child process hands it back to the process running the survey.
    """

    chunk: int
    decided: int
    accepted: int
    groups: int
    reused: int = 0
    #: The decision groups the chunk counted (``groups`` of them: new to its process's run).
    keys: frozenset[GroupKey] = frozenset()


@dataclass
class RunCache:
    """What a run remembers across its chunks (all of it public, none of it a value).

    ``decisions``: per decision key (:func:`decision_key`), the filter's decision;
    ``advances``: per (decision group's number, :meth:`number`; output), the object columns
    and state row after it;
    ``stored``: state keys this run has stored (later chunks only lock them, without bytes);
    ``seen``: decision groups of committed chunks (the survey's ``groups``). Emptied when it
    grows past ``max_entries``.
    """

    parsed: ParsedQuery
    decisions: dict[GroupKey, GroupAccepted | Refusal] = field(default_factory=dict)
    advances: dict[tuple[int, Output], Advance] = field(default_factory=dict)
    stored: set[str] = field(default_factory=set)
    seen: set[GroupKey] = field(default_factory=set)
    max_entries: int = 1_000_000
    #: Guards ``seen``: a group is counted by the one chunk that commits it first.
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The stored JSON texts of the query (output None) and its outputs, per domain text.
    texts: dict[tuple[str, Output | None], str] = field(default_factory=dict)
    #: :func:`~app.services.snapshots.history_hashes_after` per domain text and output.
    steps: dict[tuple[str, Output], Callable[[str | None], str]] = field(default_factory=dict)
    #: Exact states met by this run, by content key (:func:`_exact_advance`): the array's
    #: bytes until a chunk storing it committed, then none (``b""``: it is in ``stored``).
    contents: dict[str, StoredState] = field(default_factory=dict)
    #: The states of :attr:`contents` that hold their bytes, the same objects: what every
    #: answer naming a state looks up (:func:`_answer_group`) — the few chunks' worth of states
    #: not stored yet, where :attr:`contents` holds every state of the run (at 10^6 a lookup
    #: there misses the processor's caches, once per answer of a diverged chunk).
    unstored: dict[str, StoredState] = field(default_factory=dict)
    #: Per accepted exact decision group, what all its outputs share (:class:`_GroupAfter`).
    after: dict[int, _GroupAfter] = field(default_factory=dict)
    #: Each decision key's number in the run (:meth:`number`).
    numbers: dict[GroupKey, int] = field(default_factory=dict)
    #: ``decisions`` by the groups' numbers (what a chunk looks up: an int, not a 15-field key).
    decided: dict[int, GroupAccepted | Refusal] = field(default_factory=dict)
    #: The next number (``next`` is atomic: two threads never draw the same one).
    counter: Iterator[int] = field(default_factory=itertools.count)
    #: ``exact_bounds(Fraction(units, denominator))`` by the two integers, not in lowest terms
    #: (a survey's losses take few values: :func:`_losses_ahead`).
    unit_bounds: dict[tuple[int, int], LossBounds] = field(default_factory=dict)
    #: What an exact advance needs of each output, per domain text and output
    #: (:meth:`exact_step`).
    exact_steps: dict[tuple[str, Output], _ExactStep] = field(default_factory=dict)
    #: The query's term per domain text and output.
    terms: dict[tuple[str, Output], Term] = field(default_factory=dict)
    magnitudes: dict[tuple[str, int], float] = field(default_factory=dict)
    #: ``"reuse": true``: per domain hash, its text and the query parsed there (None: invalid).
    reuse_mechs: dict[str, tuple[str, Mechanism | None]] = field(default_factory=dict)
    #: The queries of members' pending entries, per (domain text, stored query text).
    history_mechs: dict[tuple[str, str], Mechanism] = field(default_factory=dict)
    #: :func:`~app.services.snapshots.canonical_content_keys` per domain text.
    content_keys: dict[str, Callable[[bytes], str]] = field(default_factory=dict)
    #: :func:`~app.engine.likelihood.exact_bounds` of an exact loss, by its two integers.
    bounds: dict[tuple[int, int], LossBounds] = field(default_factory=dict)
    #: The history hash after each output of an empty history (``history_step(...)(None)``,
    #: a finite decision group's: :func:`decision_key` drops its history hash), per domain text.
    first_hashes: dict[tuple[str, Output], str] = field(default_factory=dict)

    def query_text(self, domain: str, mech: Mechanism) -> str:
        """``json.dumps(mech.to_json())``, once per domain."""
        found = self.texts.get((domain, None))
        if found is None:
            found = self.texts[(domain, None)] = json.dumps(mech.to_json())
        return found

    def history_step(
        self, domain: str, mech: Mechanism, output: Output
    ) -> Callable[[str | None], str]:
        """The history hash after ``output`` as a function of the one before, once per output."""
        found = self.steps.get((domain, output))
        if found is None:
            found = self.steps[(domain, output)] = history_hashes_after(
                self.query_text(domain, mech), self.output_text(domain, mech, output)
            )
        return found

    def first_hash(self, domain: str, mech: Mechanism, output: Output) -> str:
        """``history_step(domain, mech, output)(None)``, once per domain and output."""
        found = self.first_hashes.get((domain, output))
        if found is None:
            found = self.first_hashes[(domain, output)] = self.history_step(domain, mech, output)(
                None
            )
        return found

    def content_key(self, domain: str) -> Callable[[bytes], str]:
        """:func:`~app.services.snapshots.canonical_content_keys` of a domain text, once."""
        found = self.content_keys.get(domain)
        if found is None:
            found = self.content_keys[domain] = canonical_content_keys(domain)
        return found

    def exact_bounds(self, loss: Fraction) -> LossBounds:
        """:func:`~app.engine.likelihood.exact_bounds` of ``loss``, once per value."""
        pair = (loss.numerator, loss.denominator)
        found = self.bounds.get(pair)
        if found is None:
            found = self.bounds[pair] = exact_bounds(loss)
        return found

    def output_text(self, domain: str, mech: Mechanism, output: Output) -> str:
        """``mech.output_text(output)``, once per domain and output."""
        found = self.texts.get((domain, output))
        if found is None:
            found = self.texts[(domain, output)] = mech.output_text(output)
        return found

    def number(self, key: GroupKey) -> int:
        """The decision group's number in this run: the per-(group, output) caches' key.

        Looked up once per group and chunk (a ``GroupKey`` hashes 15 fields); numbers are
        never reused, even after :meth:`trim`.
        """
        found = self.numbers.get(key)
        if found is None:
            found = self.numbers.setdefault(key, next(self.counter))
        return found

    def term(self, domain: str, mech: Mechanism, output: Output) -> Term:
        """``mech.term(output)``, once per domain and output."""
        found = self.terms.get((domain, output))
        if found is None:
            found = self.terms[(domain, output)] = mech.term(output)
        return found

    def exact_step(self, domain: str, mech: Mechanism, output: Output) -> _ExactStep:
        """:meth:`term`, its magnitude, :meth:`first_hash` and :meth:`history_step`, at once.

        Once per domain and output (:attr:`exact_steps`): :func:`_exact_advance` looks them up
        per (decision group, output), one lookup rather than three or four.
        """
        found = self.exact_steps.get((domain, output))
        if found is None:
            term = self.term(domain, mech, output)
            found = self.exact_steps[(domain, output)] = _ExactStep(
                term,
                self.magnitude(domain, term),
                self.first_hash(domain, mech, output),
                self.history_step(domain, mech, output),
            )
        return found

    def magnitude(self, domain: str, term: Term) -> float:
        """``term.magnitude`` of a term of :meth:`term`, once per domain and term."""
        found = self.magnitudes.get((domain, id(term)))
        if found is None:
            found = self.magnitudes[(domain, id(term))] = term.magnitude
        return found

    def forget_states(self) -> None:
        """Forget every state this run stored or computed (one may have been deleted since)."""
        self.stored.clear()
        self.contents.clear()
        self.unstored.clear()
        self.advances.clear()

    def stored_committed(self, gained: dict[str, tuple[StoredState, int]]) -> None:
        """A chunk storing ``gained`` committed: keep their keys, drop the arrays' bytes.

        Only a state the chunk held bytes of is looked up, in :attr:`unstored`: one it named
        without them was byte-less in :attr:`contents` when named (stored by a committed chunk),
        and a lookup in that dict (every state of the run) misses the processor's caches — a
        diverged survey's chunk names thousands. (Should another chunk have put bytes there
        since, they stay until its own commit drops them; a later chunk naming the state only
        locks it, the key being in :attr:`stored`.)
        """
        self.stored.update(gained)  # no set of the keys built first
        contents, unstored = self.contents, self.unstored
        for key, (state, _) in gained.items():
            if state.state:
                found = unstored.pop(key, None)
                if found is not None:
                    contents[key] = tuple.__new__(StoredState, (key, b"", found.err))

    def history_mech(self, domain: str, text: str) -> Mechanism:
        """A stored history query parsed as :func:`~app.engine.pipeline.history_entry` does.

        With its limits (:data:`~app.engine.limits.DEFAULT_LIMITS` for a history), as a single
        submit folds the entries (:func:`~app.services.snapshots.pending_entries`).
        """
        found = self.history_mechs.get((domain, text))
        if found is None:
            found = parse_query(
                json.loads(text),
                self.parsed.domain(domain),
                "history.query",
                limits=for_history(DEFAULT_LIMITS),
            )
            self.history_mechs[(domain, text)] = found
        return found

    def claim_groups(self, keys: set[GroupKey]) -> set[GroupKey]:
        """The groups of ``keys`` not counted yet, now reserved for the caller's chunk."""
        with self.lock:
            new = keys - self.seen
            self.seen |= new
        return new

    def release_groups(self, keys: set[GroupKey]) -> None:
        """Give back groups reserved by a chunk that did not commit."""
        with self.lock:
            self.seen -= keys

    def trim(self) -> None:
        """Forget everything once too large (it is only a cache)."""
        if len(self.advances) + len(self.decisions) > self.max_entries:
            self.decisions.clear()
            self.advances.clear()
            self.parsed.states.clear()
            self.texts.clear()
            self.steps.clear()
            self.contents.clear()
            self.unstored.clear()
            self.after.clear()
            self.numbers.clear()
            self.decided.clear()
            self.terms.clear()
            self.magnitudes.clear()
            self.history_mechs.clear()
            self.unit_bounds.clear()
            self.exact_steps.clear()
            self.content_keys.clear()
            self.bounds.clear()
            self.first_hashes.clear()


@dataclass
class _Chunk:
    """What a chunk will write."""

    survey_id: int
    chunk: int
    now: datetime
    picks: dict[str, int] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)
    variants: list[Variant] = field(default_factory=list)
    #: New exact states named in this chunk, their arrays to compute (:func:`_build_states`).
    building: dict[str, _Build] = field(default_factory=dict)
    #: Answers naming one of those, shared with the run once the arrays are built.
    advances_built: dict[tuple[int, Output], Advance] = field(default_factory=dict)
    #: The variants' numbers by what they hold (:func:`_answer`).
    entries: dict[tuple[Any, ...], int] = field(default_factory=dict)
    advances: list[Advanced] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    #: A project survey's members' sub-histories after their answers: (state, its first).
    sub_histories: list[tuple[SubHistory, bool]] = field(default_factory=list)
    gained: dict[str, tuple[StoredState, int]] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    tally: Counter[str] = field(default_factory=Counter)
    domains: set[str] = field(default_factory=set)
    keys: set[GroupKey] = field(default_factory=set)
    groups: int = 0
    #: Members answered by reuse (``"reuse": true``): accepted, but no history entry.
    reused: int = 0
    #: Their picks and (negative) seqs, by position in the chunk's ids.
    reuse: _Reused | None = None


@dataclass(frozen=True)
class _Reused:
    """A chunk's members answered by reuse, as arrays by position in the chunk's ids."""

    hit: npt.NDArray[np.bool_]
    #: Per member, its variant's index in the chunk (meaningful where ``hit``).
    picks: npt.NDArray[np.int64]
    #: Per member, ``-seq`` of the stored answer it repeats (meaningful where ``hit``).
    seqs: npt.NDArray[np.int64]


def new_run_cache(query: dict[str, Any], limits: EngineLimits) -> RunCache:
    """An empty cache for a run of the survey asking ``query``."""
    return RunCache(ParsedQuery(limits, query))


def run_chunk(
    *,
    engine: Database,
    worker: BoundWorker,
    survey_id: int,
    chunk: int,
    limits: EngineLimits,
    cache: RunCache | None = None,
) -> ChunkOutcome:
    """Decide chunk ``chunk`` of the survey's members, in one transaction.

    ``cache`` carries decisions and states from earlier chunks of the same run (a fresh one
    when None). A chunk decided already is left alone (``decided`` 0). Raises
    :class:`_Stopped` when the survey is no longer active and :class:`_LostRace` when an object
    changed under the chunk (nothing was written).
    """
    new_groups: set[GroupKey] = set()
    try:
        with transaction(engine) as conn:
            survey = load_survey(conn, survey_id)
            if survey.status not in ACTIVE:
                raise _Stopped
            if cache is None:
                cache = new_run_cache(json.loads(survey.query), limits)
            ids = chunk_store.take_pending(conn, survey_id=survey_id, chunk=chunk)
            if ids is None:
                return ChunkOutcome(chunk, 0, 0, 0)
            work = _Chunk(survey_id, chunk, datetime.now(UTC))
            rest = reuse_in_chunk(conn, survey, ids, cache, work) if survey.reuse else ids
            rows = survey_store.member_rows(conn, rest)
            work = _decide_rows(
                conn, rows, cache, worker, work, _quota_groups(conn, survey.analyst_key_id, limits)
            )
            new_groups = cache.claim_groups(work.keys)
            work.groups = len(new_groups)
            _write(conn, ids, work, cache)
            accepted = len(work.advances) + work.reused
    except BaseException as exc:  # not committed: the groups were not counted
        if cache is not None:
            cache.release_groups(new_groups)
            if isinstance(exc, (_LostRace, StateGone, StateMissing)):
                cache.forget_states()  # a state this run stored may have been dropped meanwhile
        raise
    cache.stored_committed(work.gained)
    cache.trim()
    return ChunkOutcome(chunk, len(ids), accepted, work.groups, work.reused, frozenset(new_groups))


def count_chunk(outcome: ChunkOutcome) -> None:
    """Count a committed chunk in this process's metrics.

    Called by the process that runs the survey, wherever the chunk was decided: a survey child
    process hands its outcome back (its own counters would be lost, or counted twice in
    multiprocess mode).
    """
    metrics.SURVEY_MEMBERS.labels("accepted").inc(outcome.accepted)
    metrics.SURVEY_MEMBERS.labels("refused").inc(outcome.decided - outcome.accepted)
    metrics.SURVEY_GROUPS.inc(outcome.groups)
    metrics.REUSED.labels("survey").inc(outcome.reused)


def _quota_groups(conn: Tx, key_id: int | None, limits: EngineLimits) -> QuotaGroups | None:
    """The quota of the project whose key created the survey (None: an unscoped key).

    Read per chunk, so a quota changed during a run applies from the next chunk on.
    """
    project_id = survey_store.project_of_key(conn, key_id)
    project = None if project_id is None else project_store.by_id(conn, project_id=project_id)
    return None if project is None else QuotaGroups(project, limits)


def _within_quota(
    conn: Tx,
    group: GroupAccepted,
    members: list[MemberRow],
    quotas: QuotaGroups,
    subs: dict[str, str],
    worker: BoundWorker,
    work: _Chunk,
) -> dict[str, tuple[str, str | None]]:
    """The members of an accepted group the project's quota accepts, with their sub-group.

    The others are refused ``quota-exhausted`` (the object's filters accepted them).
    """
    passed: dict[str, tuple[str, str | None]] = {}
    for row in members:
        sub = (row.key.domain, subs.get(row.id))
        decision = quotas.decide(conn, group, sub, (row.id, row.version_start), worker)[1]
        if decision.accepted:
            passed[row.id] = sub
        else:
            _refuse(work, row, Refusal.QUOTA)
    return passed


def _decide_groups(
    conn: Tx,
    by_group: dict[GroupKey, list[MemberRow]],
    cache: RunCache,
    worker: BoundWorker,
    numbers: Sequence[int] | None = None,
) -> list[GroupAccepted | Refusal]:
    """Decide every decision group of the chunk not decided yet in this run, per domain at once.

    Each group's snapshot is built from one representative (:func:`group_snapshot`, as
    :func:`~app.services.survey_groups.decide_group` builds it) and the groups of a domain are
    decided by one engine call (:func:`~app.services.survey_groups.decide_snapshots`: the
    filter code of :func:`~app.engine.pipeline.evaluate` on the same inputs, the finite
    histories' losses computed together). Remembered for the run (:attr:`RunCache.decisions`,
    and by the groups' numbers: :attr:`RunCache.decided`).

    ``numbers``: each group's :meth:`RunCache.number`, in ``by_group``'s order (looked up here
    when not given). Returns every group's decision, in ``by_group``'s order, each looked up by
    its number (an int: a diverged survey's chunk has about one group per member, and a
    ``GroupKey`` hashes and compares 15 fields); under its key only when not found so (a group
    new to the run, or one :func:`_fold_pending` decided).
    """
    if numbers is None:
        numbers = [cache.number(key) for key in by_group]
    decisions, by_number = cache.decisions, cache.decided
    found = list(map(by_number.get, numbers))
    todo: dict[str, list[tuple[GroupKey, int]]] = defaultdict(list)
    for at, (key, number, decided) in enumerate(zip(by_group, numbers, found, strict=True)):
        if decided is None:
            decided = decisions.get(key)
            if decided is None:
                todo[key.domain].append((key, number))
            else:
                found[at] = by_number[number] = decided
    if not todo:  # every group decided by an earlier chunk
        return cast(list[GroupAccepted | Refusal], found)
    new: dict[GroupKey, GroupAccepted | Refusal] = {}
    for domain, pairs in todo.items():
        mech = cache.parsed.mech(domain)
        if mech is None:
            for key, number in pairs:
                new[key] = by_number[number] = Refusal.INVALID
            continue
        snapshots = []
        for key, _ in pairs:
            first = by_group[key][0]
            snapshot = group_snapshot(
                conn, key, (first.id, first.version, first.version_start), cache.parsed
            )
            _hand_canonical(key, snapshot, cache)
            snapshots.append(snapshot)
        for (key, number), group in zip(
            pairs, decide_snapshots(mech, snapshots, worker), strict=True
        ):
            new[key] = by_number[number] = group
    decisions.update(new)
    return [
        new[key] if decided is None else decided
        for key, decided in zip(by_group, found, strict=True)
    ]


def _hand_canonical(key: GroupKey, snapshot: ObjectSnapshot, cache: RunCache) -> None:
    """Hand a group's exact form its canonical bytes, when its stored bytes hold them.

    Each (group, output)'s next state is named by :meth:`~app.engine.exact.ExactLoss.
    canonical_after`, whose template around the moved row is then a cut of the group's
    canonical bytes instead of every axis's rows written again. The stored exact part is the
    canonical bytes without the shape when its writer was :meth:`~app.engine.exact.ExactLoss.
    to_bytes` with the groups in ε order (:meth:`~app.engine.exact.ExactLoss.
    canonical_from_stored`); an older writer's spacing, group order or numbers parse to the
    same form but are not those bytes. So the candidate is checked against the state's key:
    an exact state is stored under the content key of its canonical bytes (:func:`~app.
    services.snapshots.content_key`, BLAKE2b under its own ``person``), so a candidate whose
    content key is the state's key is those canonical bytes (else two contents would share one
    key, which naming states by content already excludes). Any other candidate (not in ε
    order, another writer's, a state named by its history) is dropped: the form writes its
    template as before. Only for a snapshot that is the stored state itself (no pending entry
    folded on: its form would be another).
    """
    state = snapshot.state
    if (
        key.state_hash is None
        or key.state_pending
        or not isinstance(state, LikelihoodState)
        or state.exact is None
        or state.exact.kept.canonical is not None
    ):
        return
    stored = cache.parsed.states.get(key.state_hash)
    tail = None if stored is None else LikelihoodState.exact_part(state.domain, stored[0])
    if tail is None:
        return
    candidate = state.exact.canonical_from_stored(tail)
    if cache.content_key(key.domain)(candidate) == key.state_hash:
        state.exact.kept.canonical = candidate


def _advance_of(
    decided: GroupKey,
    number: int,
    group: GroupAccepted,
    output: Output,
    cache: RunCache,
    worker: BoundWorker,
    work: _Chunk | None = None,
) -> Advance:
    """The columns and state after ``output`` for the members of decision group ``decided``.

    ``number``: the group's in the run (:meth:`RunCache.number`). Computed once per decision
    group and output (its history hash: ``decided``'s; each
    member's own follows, :func:`~app.services.snapshots.advance_from`): called when
    :attr:`RunCache.advances` has none for ``(number, output)`` (the caller looked). An exact
    history's next state is named by its content first (:func:`_exact_advance`): its array is
    computed only for a content this run has not met yet (with ``work``, with the chunk's other
    new arrays: :func:`_build_states`).
    """
    mech = group.mech
    found = None if work is None else work.advances_built.get((number, output))
    if found is None:
        found = _exact_advance(decided, group, output, cache, worker, work, number)
        if found is None:
            after = recorded(group.snapshot, group.decision, mech, output, worker)
            found = advance(
                after,
                domain_text=decided.domain,
                history_hash=decided.history_hash,
                query_text=cache.query_text(decided.domain, mech),
                output_text=cache.output_text(decided.domain, mech, output),
            )
        if work is not None and found.stored is not None and found.stored.key in work.building:
            # shared once its array is built: another thread's chunk would find no bytes
            work.advances_built[(number, output)] = found
        else:
            cache.advances[(number, output)] = found
    return found


@dataclass(slots=True)
class _GroupAfter:
    """What every output of an accepted exact decision group shares (:func:`_exact_advance`).

    Kept per group for the run (:attr:`RunCache.after`): a diverged survey's group has one or
    two members in most chunks that meet it, so what its outputs share is looked up once per
    run, not once per chunk nor per output.
    """

    #: The bounds of the exact loss after each output (by output index; :func:`~app.engine.
    #: likelihood.exact_bounds`, the only use of the loss) computed ahead, for the chunk's
    #: drawn outputs at once (:func:`_losses_ahead`); an output missing here is computed alone.
    losses: dict[int, LossBounds]
    basic_total: str
    f0_account: str
    #: The group's state (``group.snapshot.state``) and its exact form (``state.exact``).
    state: LikelihoodState
    exact: ExactLoss
    #: The content key of the group's domain (:meth:`RunCache.content_key`).
    named: Callable[[bytes], str]
    #: ``losses`` holds every output's (the later chunks meeting the group have nothing to do).
    complete: bool = False


def _group_after(
    number: int, group: GroupAccepted, state: LikelihoodState, domain: str, cache: RunCache
) -> _GroupAfter:
    """The :class:`_GroupAfter` of accepted decision group ``number``, once per run.

    ``state``: the group's (``group.snapshot.state``), with an exact form; ``domain``: its
    domain text.
    """
    shared = cache.after.get(number)
    if shared is None:
        assert state.exact is not None  # noqa: S101 - the callers' condition
        basic, account = accounts_after(group.snapshot, group.mech)
        shared = cache.after[number] = _GroupAfter(
            {}, str(basic), str(account), state, state.exact, cache.content_key(domain)
        )
    return shared


def _losses_ahead(
    domain: str, groups: Sequence[tuple[int, GroupAccepted, Iterable[Output]]], cache: RunCache
) -> None:
    """The exact loss after each (exact decision group, output) of ``domain``, in one engine call.

    What :func:`_exact_advance` brackets for a new state (its exact form's
    :meth:`~app.engine.exact.ExactLoss.loss`). For ``grr`` and table queries every output's
    loss of a group is learnt by the first chunk meeting it
    (:meth:`~app.engine.mechanisms.base.Mechanism.exact_units_after`: kept on the history by
    its decision, or the histories stacked once; the same exact rationals), so the later
    chunks — a diverged survey meets each group in most of its chunks — skip it
    (:attr:`_GroupAfter.complete`). Otherwise (a history past ``int64``), for every pair of the
    chunk not met yet at once: :meth:`~app.engine.mechanisms.base.Mechanism.exact_losses_after`.
    Kept in each group's :attr:`_GroupAfter.losses`; nothing when the mechanism has no such
    shortcut (each pair's loss is then computed alone).
    """
    needs: list[tuple[ExactLoss, _GroupAfter, list[tuple[int, Output]]]] = []
    after = cache.after
    for number, group, drawn in groups:
        shared = after.get(number)
        if shared is not None and shared.complete:
            continue  # met in an earlier chunk: every output's loss is known
        state = group.snapshot.state
        if not isinstance(state, LikelihoodState) or state.exact is None:
            continue
        shared = shared or _group_after(number, group, state, domain, cache)
        losses = shared.losses
        need = [
            (at, output)
            for at, output in ((output_index(y), y) for y in drawn)
            if at not in losses and (number, output) not in cache.advances
        ]  # not computed, nor its state named already
        if need:
            needs.append((state.exact, shared, need))
    if not needs:
        return
    mech = groups[0][1].mech
    # every output's loss of each history, computed once per run (or kept by its decision)
    units = mech.exact_units_after([history for history, _, _ in needs])
    histories: list[ExactLoss] = []
    outputs: list[Output] = []
    owners: list[int] = []
    targets: list[tuple[dict[int, LossBounds], int]] = []
    unit_bounds = cache.unit_bounds
    for n, (history, shared, need) in enumerate(needs):
        losses = shared.losses
        found_units = None if units is None else units[n]
        if found_units is not None:  # every output's loss, once for the run
            row, denominator = found_units
            for at, units_at in enumerate(row):
                bounds = unit_bounds.get((units_at, denominator))
                if bounds is None:
                    bounds = unit_bounds[(units_at, denominator)] = cache.exact_bounds(
                        Fraction(units_at, denominator)
                    )
                losses[at] = bounds
            shared.complete = True
            continue
        owner = len(histories)
        histories.append(history)
        for at, output in need:
            outputs.append(output)
            owners.append(owner)
            targets.append((losses, at))
    if not targets:
        return
    found = mech.exact_losses_after(histories, outputs, owners)
    if found is None:
        return
    bounds_of = cache.exact_bounds
    for (losses, at), loss in zip(targets, found, strict=True):
        losses[at] = bounds_of(loss)


def _exact_advance(
    decided: GroupKey,
    group: GroupAccepted,
    output: Output,
    cache: RunCache,
    worker: BoundWorker,
    work: _Chunk | None,
    number: int,
) -> Advance | None:
    """:func:`advance` of :func:`recorded`, for an exact history: the same columns and key.

    The state after the output is named by its exact form's content
    (:func:`~app.engine.likelihood.exact_after`, :func:`~app.services.snapshots.content_key`),
    its loss is that form's exact loss (computed ahead for the chunk: :func:`_losses_ahead`), its
    accounts are the group's (:func:`~app.engine.pipeline.accounts_after`). Only a content
    this run has not met is recorded (:func:`~app.services.decisions.recorded`: its array and
    bytes, :attr:`RunCache.contents`) — with ``work``, later, with the chunk's other new
    arrays in one pass (:func:`_build_states`). None: not an exact history (or its exact form
    would not survive the output), left to :func:`advance` of :func:`recorded`.
    """
    domain, mech = decided.domain, group.mech
    shared = cache.after.get(number)  # the group's part, once per run: its form is exact
    if shared is None:
        state = group.snapshot.state
        if not isinstance(state, LikelihoodState) or state.exact is None:
            return None
        shared = _group_after(number, group, state, domain, cache)
    state, form = shared.state, shared.exact
    step = cache.exact_steps.get((domain, output))
    if step is None:
        step = cache.exact_step(domain, mech, output)
    term = step.term
    # the next form's canonical bytes from the group's (one count row moved), the form itself
    # built only for a content not met yet or a loss not computed ahead
    canonical = None if term.exact is None else form.canonical_after(term.exact)
    exact = None
    if canonical is None:
        exact = exact_after(form, term)
        if exact is None:
            return None
        canonical = exact.canonical_bytes()
    key = shared.named(canonical)
    stored = cache.contents.get(key)
    if stored is None and work is not None:
        build = work.building.get(key)
        if build is None:
            # the new form's stored bytes: from its canonical ones when this form's groups are
            # in ε order (the output's group among them), else the form's own (built here)
            exact_bytes = None if exact is not None else form.to_bytes_after(canonical)
            if exact_bytes is None:
                exact = exact or _exact_with(form, term, canonical)
                exact_bytes = exact.to_bytes()
            err = state.error_after(step.magnitude, term.extra_error)
            # the advance's state (no bytes) built once per new state, kept on its build: a
            # named tuple by ``tuple.__new__`` (its ``__new__`` is a Python call)
            stored = tuple.__new__(StoredState, (key, b"", err))
            work.building[key] = tuple.__new__(_Build, (state, term, exact_bytes, stored))
        else:
            stored = build.stored
    elif stored is None:
        after = recorded(group.snapshot, group.decision, mech, output, worker)
        assert isinstance(after.state, LikelihoodState)  # noqa: S101 - a finite snapshot
        stored = StoredState(key, after.state.to_bytes(), after.state.err)
        cache.contents[key] = cache.unstored[key] = stored
    loss = shared.losses.get(output_index(output))
    if loss is None:
        loss = cache.exact_bounds((exact or _exact_with(form, term, canonical)).loss())
    history_hash = decided.history_hash
    columns = {
        "state_hash": key,
        "state_pending": 0,
        "history_hash": step.first if history_hash is None else step.after(history_hash),
        "loss_lower": loss.lower,
        "loss_upper": loss.upper,
        "basic_total": shared.basic_total,
        "f0_account": shared.f0_account,
    }
    if stored.state:  # the advance names the state; its bytes stay in the chunk's gained ones
        stored = tuple.__new__(StoredState, (key, b"", stored.err))
    return tuple.__new__(Advance, (columns, stored, True))  # Advance(columns, stored, True)


def _exact_with(exact: ExactLoss, term: Term, canonical: bytes) -> ExactLoss:
    """:func:`exact_after` of a form whose result's canonical bytes are known (kept on it)."""
    after = exact_after(exact, term)
    assert after is not None  # noqa: S101 - canonical_after answered: the group is the form's
    if after.kept.canonical is None:
        after.kept.canonical = canonical
    return after


def _decide_rows(
    conn: Tx,
    rows: Sequence[MemberRow],
    cache: RunCache,
    worker: BoundWorker,
    work: _Chunk,
    quotas: QuotaGroups | None = None,
) -> _Chunk:
    """Group the chunk's members, decide each group once, sample each accepted member.

    Members are grouped by their decision key (:func:`decision_key`) in one pass — a diverged
    survey's members have histories of their own, so keying them by their whole public state
    first made a group of one per member. The groups new to the run are decided together
    (:func:`_decide_groups`). Each (group, output) computes its next state once; each member's
    own history hash follows (:func:`_answer_group`).

    With ``quotas`` (a project's survey), a member the object's filters accept must also pass
    the project's quota on its sub-history, whose state after the answer is then stored.
    """
    parsed = cache.parsed
    live = [row for row in rows if not row.retired]
    if len(live) != len(rows):
        for row in rows:
            if row.retired:
                _refuse(work, row, Refusal.RETIRED)
    # the public states' dict pays when they repeat (an early survey's chunk); in a diverged
    # chunk every member's is its own (its history hash): two hashes of a 15-field key per
    # member for nothing. Given up when none of the first _MEMO_TRIAL repeated; then the keys
    # are built by ``map`` and paired by ``zip`` (no generator resumed per member).
    keys: dict[GroupKey, GroupKey] = {}
    found: list[GroupKey] = []
    if _memo_keys(live[:_MEMO_TRIAL], keys, found, parsed):
        _memo_keys(live[_MEMO_TRIAL:], keys, found, parsed)
    else:
        rest = [row.key for row in live[_MEMO_TRIAL:]]
        found += map(decision_key, rest, itertools.repeat(parsed))
    by_group = _grouped(zip(found, live, strict=True))
    states = parsed.states
    missing = {k.state_hash for k in by_group if k.state_hash and k.state_hash not in states}
    states.update(load_states(conn, {k for k in missing if k is not None}))
    by_group = _fold_pending(conn, by_group, cache, worker)
    work.keys = set(by_group)
    # each group's number looked up once, in place (``RunCache.number`` only for one new to
    # the run); its decision, answers and states are found by it from here on
    known, number_of = cache.numbers.get, cache.number
    group_numbers = [number_of(key) if (n := known(key)) is None else n for key in by_group]
    decided = _decide_groups(conn, by_group, cache, worker, group_numbers)
    cipher = crypto.active()
    reports: dict[str, tuple[Mechanism, list[Output], list[int]]] = {}
    pending: dict[str, list[tuple[GroupKey, GroupAccepted, dict[Output, list[MemberRow]]]]] = {}
    subs = (
        {}
        if quotas is None
        else project_store.sub_hashes(
            conn, project_id=quotas.project.id, object_ids=[r.id for r in rows]
        )
    )
    accepted: list[_Sampling] = []
    numbers: list[int] = []
    for (key, members), number, group in zip(by_group.items(), group_numbers, decided, strict=True):
        if isinstance(group, Refusal):
            for row in members:
                _refuse(work, row, group)
            continue
        passed = None
        if quotas is not None:
            passed = _within_quota(conn, group, members, quotas, subs, worker, work)
            members = [row for row in members if row.id in passed]
            if not members:
                continue
        # built by ``tuple.__new__``: a named tuple's ``__new__`` is a Python call, and a
        # diverged chunk has a group per member
        accepted.append(tuple.__new__(_Sampling, (key, group, members, passed)))
        numbers.append(number)
    sampled = _sample_groups(accepted, cipher, rows)
    pendings = _pendings(accepted)
    ahead: dict[str, list[tuple[int, GroupAccepted, Iterable[Output]]]] = defaultdict(list)
    for (key, group, _, _), number, by_output, pends in zip(
        accepted, numbers, sampled, pendings, strict=True
    ):
        if not pends:
            ahead[key.domain].append((number, group, by_output))
    for domain, drawn in ahead.items():
        _losses_ahead(domain, drawn, cache)
    advances = cache.advances
    # per domain and output: the answer's query and output texts and its history step, once
    # per chunk (a diverged chunk's (group, output) pairs are nearly one per member)
    said: dict[str, dict[Output, tuple[str, str, Callable[[str | None], str]]]] = {}
    for (key, group, _, passed), number, by_output, pends in zip(
        accepted, numbers, sampled, pendings, strict=True
    ):
        mech = group.mech
        if quotas is not None and passed is not None:
            query_text = cache.query_text(key.domain, mech)
            for output, answered in by_output.items():
                output_text = cache.output_text(key.domain, mech, output)
                answer = Answer(mech, output, query_text, output_text)
                for row in answered:
                    sub = passed[row.id]
                    state = quotas.sub_history(sub, answer, worker, object_id=row.id)
                    work.sub_histories.append((state, sub[1] is None))
        report = reports.get(key.domain)
        if report is None:
            report = reports[key.domain] = (mech, [], [])
            work.domains.add(key.domain)
        outputs, counts = report[1], report[2]
        outputs.extend(by_output)
        counts.extend(map(len, by_output.values()))
        if pends:
            pending.setdefault(key.domain, []).append((key, group, by_output))
            continue
        per_output = said.get(key.domain)
        if per_output is None:
            per_output = said[key.domain] = {}
        for output, answered in by_output.items():
            change = advances.get((number, output))  # _advance_of's first look
            if change is None:
                change = _advance_of(key, number, group, output, cache, worker, work)
            texts = per_output.get(output)
            if texts is None:
                texts = per_output[output] = _texts(key.domain, mech, output, cache)
            _answer_group(work, key, mech, output, change, answered, cache, texts)
    _build_states(work, cache)
    for groups in pending.values():
        _record_pending(groups, work)
    # the chunk's tally in one batch per domain: olh and hadamard decode all its reports at
    # once (a decode costs k passes whatever the number of reports: not once per group)
    for mech, outputs, counts in reports.values():
        work.tally.update(tally_outputs(mech, outputs, counts))
    return work


#: Members of a chunk looked up in its public states' dict before it is given up when none
#: repeated (:func:`_decide_rows`).
_MEMO_TRIAL = 256


def _memo_keys(
    rows: Sequence[MemberRow],
    keys: dict[GroupKey, GroupKey],
    found: list[GroupKey],
    parsed: ParsedQuery,
) -> int:
    """Append each row's :func:`decision_key` to ``found``; returns how many ``keys`` held.

    Memoised by the row's public state in ``keys`` (one loop per call, no call per member).
    """
    hits = 0
    for row in rows:
        key = keys.get(row.key)
        if key is None:
            key = keys[row.key] = decision_key(row.key, parsed)
        else:
            hits += 1
        found.append(key)
    return hits


def _answer_group(
    work: _Chunk,
    key: GroupKey,
    mech: Mechanism,
    output: Output,
    change: Advance,
    answered: list[MemberRow],
    cache: RunCache,
    texts: tuple[str, str, Callable[[str | None], str]] | None = None,
) -> None:
    """Accept the members of decision group ``key`` who drew ``output`` (``change``: its state).

    ``texts``: :func:`_texts` of the group's domain and ``output``, when the caller has them.

    Members whose history hash is the group's take ``change`` as it is; the others, per
    distinct history hash, :func:`~app.services.snapshots.advance_from` (their new hash, and
    the state's key when it is named by history). The states gained are counted per key, the
    answer's variant is found once.
    """
    if texts is None:
        texts = _texts(key.domain, mech, output, cache)
    query_text, output_text, after = texts
    stored = change.stored
    if stored is not None and not change.by_content:
        by_hash = _grouped((row.key.history_hash, row) for row in answered)
        _answer_by_history(work, key, mech, change, by_hash, query_text, output_text)
        return
    # the state is the group's whatever the member's history (named by its content, or none):
    # only the history hash differs, :func:`advance_from`'s columns without its other work —
    # every member names the group's columns and its own new hash (``Advanced.history_hash``)
    if stored is not None:  # named by content: its bytes, unless a committed chunk stored it
        stored = cache.unstored.get(stored.key, stored)
        counted = work.gained.get(stored.key)
        work.gained[stored.key] = (
            stored,
            len(answered) if counted is None else counted[1] + len(answered),
        )
    group_hash = key.history_hash
    if len(answered) == 1:  # a diverged survey's usual case
        own = answered[0].key.history_hash
        mine = None if own == group_hash else after(own)
        _answer(work, mech, query_text, output_text, change.columns, answered, None, None, mine)
        return
    pick = None
    for own, rows in _grouped((row.key.history_hash, row) for row in answered).items():
        mine = None if own == group_hash else after(own)
        pick = _answer(
            work, mech, query_text, output_text, change.columns, rows, pick=pick, own=mine
        )


def _texts(
    domain: str, mech: Mechanism, output: Output, cache: RunCache
) -> tuple[str, str, Callable[[str | None], str]]:
    """An answer's query and output texts and its history step (:meth:`RunCache.history_step`)."""
    return (
        cache.query_text(domain, mech),
        cache.output_text(domain, mech, output),
        cache.history_step(domain, mech, output),
    )


def _answer_by_history(
    work: _Chunk,
    key: GroupKey,
    mech: Mechanism,
    change: Advance,
    by_hash: dict[str | None, list[MemberRow]],
    query_text: str,
    output_text: str,
) -> None:
    """:func:`_answer_group` of a state named by its history: one state per history hash."""
    pick = None
    for own, rows in by_hash.items():
        mine = change
        if own != key.history_hash:
            mine = advance_from(
                change,
                domain_text=key.domain,
                history_hash=own,
                query_text=query_text,
                output_text=output_text,
            )
        stored = mine.stored
        if stored is not None:
            work.gained[stored.key] = (
                stored,
                work.gained.get(stored.key, (stored, 0))[1] + len(rows),
            )
        pick = _answer(work, mech, query_text, output_text, mine.columns, rows, pick=pick)


class _ExactStep(NamedTuple):
    """What an exact advance needs of one output of a domain (:meth:`RunCache.exact_step`)."""

    term: Term
    #: ``term.magnitude`` (:meth:`RunCache.magnitude`).
    magnitude: float
    #: The history hash after the output of an empty history (:meth:`RunCache.first_hash`).
    first: str
    #: The history hash after the output, of the one before (:meth:`RunCache.history_step`).
    after: Callable[[str | None], str]


class _Build(NamedTuple):
    """A new exact state of a chunk whose array is still to compute (:func:`_build_states`)."""

    #: The decision group's state, and the output's term recorded on it.
    state: LikelihoodState
    term: Term
    #: The new state's exact form's bytes (:meth:`ExactLoss.to_bytes`).
    exact: bytes
    #: The state without its bytes (what the advances name): its key and error bound
    #: (:meth:`LikelihoodState.applied`'s).
    stored: StoredState


def _build_states(work: _Chunk, cache: RunCache) -> None:
    """Compute the arrays of the chunk's new exact states, those with one term axis at once.

    Each is :meth:`LikelihoodState.applied` of its group's state and the output's term: the
    sum, shifted by its maximum (``max`` does not round, so the batch's row maxima are
    ``applied``'s, and every array is the same, bit for bit — tested against the per-pair
    path). Its bytes (:meth:`LikelihoodState.to_bytes`) join :attr:`RunCache.contents` and
    the chunk's gained states.
    """
    if not work.building:
        return
    batches: dict[tuple[tuple[int, ...], tuple[int, ...]], list[_Build]] = defaultdict(list)
    for build in work.building.values():
        batches[(build.state.logp.shape, build.term.axes)].append(build)
    contents, unstored, gained, new = cache.contents, cache.unstored, work.gained, tuple.__new__
    for (shape, axes), builds in batches.items():
        count = len(builds)
        # ``np.stack`` of equal shapes is their concatenation along a new first axis: the same
        # array, without stack's per-array view (one of each state and term per new state)
        logp = _stacked([b.state.logp for b in builds])
        spread = [count] + [1] * len(shape)
        for axis in axes:
            spread[axis + 1] = shape[axis]
        terms = _stacked([b.term.values for b in builds])
        logp += terms.reshape(spread)
        logp -= logp.reshape(count, -1).max(axis=1).reshape([count] + [1] * len(shape))
        if logp.dtype != _LITTLE_F8:  # to_bytes's little-endian float64 (native here: no copy)
            logp = logp.astype(_LITTLE_F8)
        for build, array in zip(builds, logp, strict=True):
            # the row's bytes, the marker and the exact part copied once (``tobytes`` and two
            # concatenations copied the array's three times)
            stored = build.stored
            key = stored.key
            full = contents[key] = unstored[key] = new(
                StoredState, (key, b"".join((array, MAGIC, build.exact)), stored.err)
            )
            counted = gained.get(key)
            if counted is not None and not counted[0].state:  # named by the chunk's answers
                gained[key] = (full, counted[1])
    work.building.clear()
    cache.advances.update(work.advances_built)
    work.advances_built.clear()


_LITTLE_F8 = np.dtype("<f8")


def _stacked(arrays: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """``np.stack(arrays)`` of arrays of one shape (a new array, C order)."""
    shape = arrays[0].shape
    if not shape:  # zero-dimensional: nothing to concatenate along
        return np.stack(arrays)
    return np.concatenate(arrays).reshape((len(arrays), *shape))


#: Marks a decision group of pending members keyed by their folded state (:func:`_fold_pending`).
FOLDED = "folded:"


def _fold_pending(
    conn: Tx,
    by_group: dict[GroupKey, list[MemberRow]],
    cache: RunCache,
    worker: BoundWorker,
) -> dict[GroupKey, list[MemberRow]]:
    """The chunk's groups, members with pending entries regrouped by their folded state.

    A member with pending entries (``objects.state_pending``, since an ``olh`` answer) has a
    history of its own, so its public state key is its own: it used to be a group of one that
    read its history with four statements. Here the histories of all such members of the
    chunk are read at once (:func:`~app.services.history.object_histories`), each member's
    state is folded (its stored array plus its pending entries, as a single submit would
    fold it), and members whose folded states are equal — same array and exact form, same
    budget, filter, totals and lifetime: every input of a decision — form one group, decided
    once (and remembered for the run under that key). Its key is the members' own with the
    history and state columns replaced by a digest of the folded state; each member's own
    columns are still what its answer writes (:func:`_record_pending`).
    """
    folding = [k for k in by_group if k.state_pending and cache.parsed.mech(k.domain) is not None]
    if not folding:
        return by_group
    rows = [row for key in folding for row in by_group[key]]
    histories = object_histories(conn, {row.id: row.accepted for row in rows})
    folded_keys = set(folding)
    regrouped = {k: v for k, v in by_group.items() if k not in folded_keys}
    # members alike but for their pending outputs: one stored array, folded and decided together
    classes: dict[GroupKey, list[MemberRow]] = defaultdict(list)
    for key in folding:
        classes[key._replace(history_hash=None)].extend(by_group[key])
    for shared, members in classes.items():
        mech = cache.parsed.mech(shared.domain)
        assert mech is not None  # noqa: S101 - filtered above
        snapshots = _folded(conn, shared, members, histories, cache)
        keys = [
            row.key._replace(
                history_hash=FOLDED + _state_digest(snapshot),
                state_hash=None,
                state_pending=max(1, row.key.state_pending),
            )
            for row, snapshot in zip(members, snapshots, strict=True)
        ]
        todo: dict[GroupKey, ObjectSnapshot] = {}
        for folded, snapshot in zip(keys, snapshots, strict=True):
            if folded not in cache.decisions and folded not in todo:
                todo[folded] = snapshot
        decided = decide_snapshots(mech, list(todo.values()), worker)
        cache.decisions.update(zip(todo, decided, strict=True))
        for folded, row in zip(keys, members, strict=True):
            regrouped.setdefault(folded, []).append(row)
    return regrouped


def _folded(
    conn: Tx,
    shared: GroupKey,
    members: list[MemberRow],
    histories: dict[str, list[HistoryItem]],
    cache: RunCache,
) -> list[ObjectSnapshot]:
    """Each member's snapshot: the shared stored array with the member's pending entries.

    ``shared``: the members' public state but their history (one stored array, the same
    number of pending entries, budget, totals ...). As a single submit folds them
    (:func:`~app.services.snapshots.snapshot_of`), bit for bit, but members whose pending
    entries ask the same queries are folded at once (:func:`~app.engine.likelihood.fold_many`).
    """
    first = members[0]
    base = group_snapshot(
        conn,
        shared._replace(state_pending=0),
        (first.id, first.version, first.version_start),
        cache.parsed,
    )
    state = base.state
    if not isinstance(state, LikelihoodState):  # pending entries: a finite domain
        raise TypeError("pending entries on an object without a likelihood array")
    pending = shared.state_pending
    tails: dict[tuple[str, ...], list[tuple[int, list[HistoryItem]]]] = defaultdict(list)
    for n, row in enumerate(members):
        items = histories[row.id]
        if len(items) < pending:
            raise HistoryMismatch(f"{row.id}: {pending} pending entries, {len(items)} stored")
        tail = items[len(items) - pending :]
        tails[tuple(item.query for item in tail)].append((n, tail))
    found: list[ObjectSnapshot | None] = [None] * len(members)
    for queries, batch in tails.items():
        mechs = [cache.history_mech(shared.domain, text) for text in queries]
        steps = [
            mech.terms_many(
                [mech.parse_output(json.loads(t[i].output), "history.output") for _, t in batch]
            )
            for i, mech in enumerate(mechs)
        ]
        for (n, _), folded in zip(batch, fold_many(state, steps), strict=True):
            found[n] = replace(base, state=folded)
    return [snapshot for snapshot in found if snapshot is not None]


def _state_digest(snapshot: ObjectSnapshot) -> str:
    """A digest of a finite snapshot's likelihood state: its array, exact form and error.

    What :meth:`LikelihoodState.to_bytes` stores (the array's float64 bytes; the exact form's
    groups and integer counts per attribute) plus the error, each part framed by its length:
    equal digests, equal states (128 bits of SHA-256). Hashed from the arrays' bytes where they
    lie (the stored form's JSON of the counts cost a millisecond a member).
    """
    state = snapshot.state
    assert isinstance(state, LikelihoodState)  # noqa: S101 - pending entries: a finite domain
    # the arrays' bytes are hashed where they lie (no copy unless not little-endian/contiguous)
    parts: list[Any] = [_bytes_of(state.logp, "<f8"), float(state.err).hex().encode()]
    exact = state.exact
    if exact is not None:
        groups = [(g.epsilon.numerator, g.epsilon.denominator) for g in exact.groups]
        parts.append(repr((exact.shape, groups, sorted(exact.counts))).encode())
        parts.extend(_bytes_of(exact.counts[a], "<i8") for a in sorted(exact.counts))
    hasher = hashlib.sha256()  # SHA-256 (hardware on x86): 35% less time than BLAKE2b here
    for part in parts:
        hasher.update(len(part).to_bytes(8, "little"))
        hasher.update(part)
    return hasher.hexdigest()[:32]


def _bytes_of(array: npt.NDArray[Any], dtype: str) -> memoryview:
    """The array's bytes as ``dtype`` in C order, as ``astype(dtype).tobytes()`` gives them."""
    return np.ascontiguousarray(array, dtype=dtype).data.cast("B")


class _Sampling(NamedTuple):
    """An accepted group's members to sample (with their quota sub-groups, if any)."""

    key: GroupKey
    group: GroupAccepted
    members: list[MemberRow]
    passed: dict[str, tuple[str, str | None]] | None


def _sample_groups(
    accepted: Sequence[_Sampling], cipher: crypto.ValueCipher, rows: Sequence[MemberRow]
) -> list[dict[Output, list[MemberRow]]]:
    """Each accepted group's members by the output drawn for them (aligned with ``accepted``).

    ``rows``: the chunk's members, in its order (the order of the draws).

    The values are decrypted here (the only read of a value, all of a domain's at once:
    :meth:`~app.crypto.ValueCipher.decrypt_many`) and sampled with one
    :meth:`~app.engine.mechanisms.base.Mechanism.sample_many` per domain: every member of the
    chunk asked the same query there, whatever its group (an ``olh`` chunk draws its 5,000
    seeds in one generator call instead of in 1,000 groups of five).
    """
    slot: dict[str, int] = {}
    for n, item in enumerate(accepted):
        for row in item.members:
            slot[row.id] = n
    # drawn in the chunk's order, whatever the grouping: the grouping decides nothing about a
    # member's draw, and a replayed stream draws the same per member. Per domain, its members'
    # places in ``accepted`` and their rows, as two lists (no pair built per member); a chunk
    # of one domain (the usual case) keeps its accepted rows in one pass
    batches: dict[str, tuple[list[int], list[MemberRow]]] = {}
    domains = [item.key.domain for item in accepted]
    if domains and domains.count(domains[0]) == len(domains):
        picked = [row for row in rows if row.id in slot]
        batches[domains[0]] = ([slot[row.id] for row in picked], picked)
    else:
        for row in rows:
            at = slot.get(row.id)
            if at is not None:
                places, members = batches.setdefault(domains[at], ([], []))
                places.append(at)
                members.append(row)
    # plain dicts (a diverged chunk has a group per member: a ``defaultdict`` each cost a call)
    found: list[dict[Output, list[MemberRow]]] = [{} for _ in accepted]
    for places, members in batches.values():
        mech = accepted[places[0]].group.mech
        # a population holds few distinct values: each plaintext parsed once (the mechanisms
        # only read them), every member still sampled on its own; the lookups by ``map``
        texts = cipher.decrypt_many([r.sealed for r in members])
        parsed: dict[str, Any] = dict.fromkeys(texts)
        for text in parsed:
            parsed[text] = json.loads(text)
        values = list(map(parsed.__getitem__, texts))
        for n, row, output in zip(places, members, mech.sample_many(values), strict=True):
            drawn = found[n]
            same = drawn.get(output)
            if same is None:
                drawn[output] = [row]
            else:
                same.append(row)
    return found


def _pendings(accepted: Sequence[_Sampling]) -> list[bool]:
    """Whether each group's answers keep their arrays unstored (``objects.state_pending``).

    When each answer's array would be its member's alone: the mechanism's outputs never
    coincide (``olh``), or the members already have pending entries (their histories are
    their own since an earlier such answer, so each is a group of one). One call per chunk
    (a diverged chunk has a group per member). The snapshot's state is read last: for a
    ``grr`` member without pending entries the two checks before it answer, without reaching
    into each group's snapshot (a diverged chunk's thousands are spread over the heap).
    """
    return [
        (key.state_pending > 0 or group.mech.distinct_outputs)
        and isinstance(group.snapshot.state, LikelihoodState)
        for key, group, _, _ in accepted
    ]


def _record_pending(
    groups: list[tuple[GroupKey, GroupAccepted, dict[Output, list[MemberRow]]]], work: _Chunk
) -> None:
    """Accept the members of a chunk's pending groups (one domain) without storing arrays.

    Each member keeps naming its group's stored array (no state row locked, none
    written) and counts one more pending entry; the losses after the answers come from
    :func:`~app.engine.pipeline.losses_after` — for ``olh`` on exact histories, every member of
    every group in one vectorised pass.
    """
    mech = groups[0][1].mech
    outputs = [output for _, _, by_output in groups for output in by_output]
    owners = [n for n, (_, _, by_output) in enumerate(groups) for _ in by_output]
    losses = iter(
        losses_after(
            mech,
            [group.snapshot for _, group, _ in groups],
            outputs,
            owners,
            [group.decision for _, group, _ in groups],
        )
    )
    query_text = json.dumps(mech.to_json())
    for _, group, by_output in groups:
        basic, account = accounts_after(group.snapshot, mech)
        totals = (str(basic), str(account), float(basic))  # the group's, not one a member
        for output, answered in by_output.items():
            output_text = mech.output_text(output)
            loss = next(losses)
            pick = None
            # each member's own columns (a group of folded states holds several histories)
            for own, rows in _by_key(answered).items():
                columns = pending_columns(
                    state_hash=own.state_hash,
                    pending=own.state_pending,
                    history_hash=own.history_hash,
                    query_text=query_text,
                    output_text=output_text,
                    loss=loss,
                    basic_total=totals[0],
                    f0_account=totals[1],
                )
                pick = _answer(
                    work,
                    mech,
                    query_text,
                    output_text,
                    columns,
                    rows,
                    basic_after=totals[2],
                    pick=pick,
                )


def _by_key(rows: list[MemberRow]) -> dict[GroupKey, list[MemberRow]]:
    """``rows`` by their own public state key, in order."""
    if len(rows) == 1:
        return {rows[0].key: rows}
    return _grouped((row.key, row) for row in rows)


def _grouped(pairs: Iterable[tuple[_K, _V]]) -> dict[_K, list[_V]]:
    """The values of ``pairs`` by their keys, keys in order of first appearance, values in order.

    A plain dict (no ``defaultdict``: a missing key looked up later raises, not adds).
    """
    found: dict[_K, list[_V]] = {}
    setdefault = found.setdefault
    for key, value in pairs:
        # one lookup (one hash of the key: a ``GroupKey`` hashes 15 fields), a list per value
        new = [value]
        values = setdefault(key, new)
        if values is not new:
            values.append(value)
    return found


def _answer(
    work: _Chunk,
    mech: Mechanism,
    query_text: str,
    output_text: str,
    columns: dict[str, Any],
    answered: list[MemberRow],
    basic_after: float | None = None,
    pick: int | None = None,
    own: str | None = None,
) -> int:
    """One distinct answer of the chunk (a variant) and the members who drew it; its number.

    ``basic_after``: ``float(Fraction(columns["basic_total"]))`` when the caller has it;
    ``pick``: the variant, when stored already for other members (with other columns);
    ``own``: the members' new history hash when not ``columns["history_hash"]``
    (:attr:`~app.store.surveys.Advanced.history_hash`).
    Answers whose entries are equal — the same query and output, loss bounds and ``Σ ε`` after
    it, from any decision group — share one variant (a diverged survey's chunk otherwise
    stored one per history and output, nearly one per member).
    """
    if pick is None:
        entry = (
            query_text,
            output_text,
            mech.epsilon,
            columns["loss_lower"],
            columns["loss_upper"],
            columns["basic_total"],
            basic_after,
        )
        found = work.entries.get(entry)
        if found is None:
            found = work.entries[entry] = len(work.variants)
            work.variants.append(
                Variant(
                    query=query_text,
                    output=output_text,
                    epsilon=mech.epsilon,
                    epsilon_exact=str(mech.epsilon_exact),
                    loss_lower=columns["loss_lower"],
                    loss_upper=columns["loss_upper"],
                    basic_after=float(Fraction(columns["basic_total"]))
                    if basic_after is None
                    else basic_after,
                )
            )
        pick = found
    # ``Advanced`` built by ``tuple.__new__`` (its ``__new__`` is a Python call: 2.4% of the
    # GIL's samples of surveys 6-7, one per accepted member; docs/benchmarks.md, "h/states")
    new, picks, seqs, advances = tuple.__new__, work.picks, work.seqs, work.advances
    for row in answered:
        seq = row.accepted + 1
        picks[row.id] = pick
        seqs[row.id] = seq
        advances.append(new(Advanced, (row.id, row.version, seq, columns, own)))
    return pick


def reuse_in_chunk(
    conn: Tx, survey: SurveyRow, ids: list[str], cache: RunCache, work: _Chunk
) -> list[str]:
    """Answer the members that have a stored identical answer; the ids left to decide.

    A reused member gets the stored answer's output (a variant of the chunk, its number stored
    as ``-seq``): accepted and tallied, but its object, history and state are untouched, so its
    row is read without a lock: the answer is the earliest of the version current when the row
    was read (entries up to its ``accepted`` had committed; a version created later lands
    after, as for a single submit's reuse). Nothing of a reused member's value is read (no
    decryption) and no filter decides it. Retired members and members whose domain does not
    parse the query are left to the usual decision (which refuses them), their rows locked.
    The members are matched as arrays (:func:`~app.services.reuse.chunk_reusables`), kept on
    ``work`` as such (:class:`_Reused`), never one object per member.
    """
    if survey.query_hash is None:
        return ids
    bounds = member_bounds(conn, ids)
    missing = [h for h in bounds.domain_hashes if h not in cache.reuse_mechs]
    for domain_hash, text in domain_texts(conn, set(missing)).items():
        cache.reuse_mechs[domain_hash] = (text, cache.parsed.mech(text))
    domains = [cache.reuse_mechs[h] for h in bounds.domain_hashes]
    parses = np.array([mech is not None for _, mech in domains] + [False], np.bool_)
    # a domain the query does not parse for is decided (refused) as usual, as are the retired
    # and members without a row (the decision names them)
    live = bounds.found & ~bounds.retired & parses[np.where(bounds.found, bounds.domain, -1)]
    if not live.any():
        return ids
    found = chunk_reusables(
        conn,
        ids=ids,
        after=np.where(live, bounds.version_start, 0),
        upto=np.where(live, bounds.accepted, 0),
        qhash=survey.query_hash,
        owner=survey_reuse_owner(conn, survey.analyst_key_id),
        exclude_survey=survey.id,
    )
    hit = found.hit
    reused = int(hit.sum())
    if not reused:
        return ids
    offset = len(work.variants)
    work.variants.extend(found.variants)
    work.reuse = _Reused(hit, found.picks + offset, -found.seqs)
    work.reused = reused
    # the tally in one batch per domain, one parsed output per distinct answer
    pairs, counts = np.unique(
        bounds.domain[hit] * len(found.variants) + found.picks[hit], return_counts=True
    )
    reports: dict[int, tuple[Mechanism, list[Output], list[int]]] = {}
    for pair, count in zip(pairs.tolist(), counts.tolist(), strict=True):
        domain, pick = divmod(pair, len(found.variants))
        text, mech = domains[domain]
        assert mech is not None  # noqa: S101 - a live member's domain parses the query
        work.domains.add(text)
        _, outputs, tallied = reports.setdefault(domain, (mech, [], []))
        outputs.append(mech.parse_output(json.loads(found.variants[pick].output), "output"))
        tallied.append(count)
    for mech, outputs, tallied in reports.values():
        work.tally.update(tally_outputs(mech, outputs, tallied))
    return [ids[at] for at in np.flatnonzero(~hit).tolist()]


def _refuse(work: _Chunk, row: MemberRow, reason: Refusal) -> None:
    work.refused[reason.value] += 1
    work.picks[row.id] = REFUSAL_CODES[reason.value]
    work.seqs[row.id] = 0
    if reason in (Refusal.BUDGET, Refusal.LIFETIME, Refusal.QUOTA):
        work.refusals.append(row.id)


def _decided(ids: list[str], work: _Chunk) -> dict[str, list[int]]:
    """Every member's pick and seq, in the chunk's order (reused members' from the arrays)."""
    if work.reuse is None:  # ``map`` of the dicts' lookups: no bytecode per member
        return {
            "picks": list(map(work.picks.__getitem__, ids)),
            "seqs": list(map(work.seqs.__getitem__, ids)),
        }
    picks, seqs = work.reuse.picks.tolist(), work.reuse.seqs.tolist()
    for at in np.flatnonzero(~work.reuse.hit).tolist():
        picks[at], seqs[at] = work.picks[ids[at]], work.seqs[ids[at]]
    return {"picks": picks, "seqs": seqs}


def _write(conn: Tx, ids: list[str], work: _Chunk, cache: RunCache) -> None:
    """Store a chunk's decisions; :class:`_LostRace` if an object or the chunk moved meanwhile."""
    if work.advances:
        updated = survey_store.advance_members(conn, work.advances, updated_at=work.now)
        if updated != len(work.advances):
            raise _LostRace
        keep_states(conn, work.gained, cache.stored)
        for new in (True, False):  # behind the members' compare-and-set, as a single submit's
            states = [state for state, first in work.sub_histories if first is new]
            project_store.put_sub_histories(conn, states, new=new)
    survey_store.count_refusals(conn, work.refusals)
    if not chunk_store.mark_decided(
        conn,
        survey_id=work.survey_id,
        chunk=work.chunk,
        decided_at=work.now,
        **_decided(ids, work),
        variants=work.variants,
    ):
        raise _LostRace
    # the survey's row last: it serialises chunks of one survey for the shortest time
    survey = survey_store.lock_counters(conn, survey_id=work.survey_id)
    if survey.status not in ACTIVE:
        raise _Stopped  # cancelled while deciding: roll back, the members stay unqueried
    refused = Counter(survey.refused)
    refused.update(work.refused)
    tally = Counter(survey.tally)
    tally.update(work.tally)
    domain = survey.domain
    for text in work.domains:
        domain = text if domain is None or domain == text else ""
    survey_store.add_counts(
        conn,
        survey_id=work.survey_id,
        decided=len(ids),
        accepted=len(work.advances) + work.reused,
        reused=work.reused,
        groups=work.groups,
        refused=refused,
        tally=tally,
        domain=domain,
    )


# ------------------------------------------------------------------------------ the run
def claim(*, engine: Database, survey_id: int, owner: str, lease_seconds: float) -> bool:
    """Take (or renew) the lease on an active survey; False if another process holds it."""
    now = datetime.now(UTC)
    with transaction(engine) as conn:
        return survey_store.claim(
            conn,
            survey_id=survey_id,
            owner=owner,
            now=now,
            lease_until=now + timedelta(seconds=lease_seconds),
        )


def resumable_surveys(*, engine: Database) -> list[int]:
    """Active surveys nobody holds (queued, or whose lease expired), oldest first."""
    with reading(engine) as conn:
        return survey_store.unclaimed(conn, now=datetime.now(UTC))


def pending_chunks(*, engine: Database, survey_id: int) -> list[int]:
    """The numbers of the survey's chunks not decided yet, in order.

    Each is an independent unit of work — for this process's threads, or a distributed
    worker's tasks.
    """
    with reading(engine) as conn:
        return chunk_store.pending_chunks(conn, survey_id=survey_id)


class _Run:
    """One process's run of a survey: its chunks decided by ``threads`` threads."""

    def __init__(
        self,
        *,
        engine: Database,
        worker: BoundWorker,
        survey_id: int,
        owner: str,
        limits: EngineLimits,
        lease_seconds: float,
        attempts: int,
        cache: RunCache,
        counted: _GroupsCounted | None = None,
    ) -> None:
        self.engine, self.worker, self.survey_id, self.owner = engine, worker, survey_id, owner
        self.limits, self.lease_seconds = limits, lease_seconds
        self.attempts, self.cache, self.counted = attempts, cache, counted
        self.stop = threading.Event()
        self.outcome: str | None = None  # set when the run must end early (why)
        self._guard = threading.Lock()

    def end(self, outcome: str) -> None:
        with self._guard:
            if self.outcome is None:
                self.outcome = outcome
        self.stop.set()

    def chunk(self, chunk: int) -> None:
        """Decide one chunk (:func:`decide_chunk`), then renew the lease.

        A stop or an error ends the run.
        """
        outcome, done = decide_chunk(
            engine=self.engine,
            worker=self.worker,
            survey_id=self.survey_id,
            chunk=chunk,
            limits=self.limits,
            cache=self.cache,
            attempts=self.attempts,
            stopped=self.stop.is_set,
        )
        if done is not None:
            count_chunk(done if self.counted is None else self.counted.once(done))
        if outcome == SKIPPED:
            return
        if outcome != DECIDED:
            self.end(outcome)
            return
        self.renew()

    def renew(self) -> None:
        """Renew the lease after a chunk; ends the run when another process took it over."""
        if not claim(
            engine=self.engine,
            survey_id=self.survey_id,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
        ):
            self.end("not-claimed")


#: :func:`decide_chunk`'s outcome when the chunk is decided (by this call or earlier).
DECIDED = "decided"
#: :func:`decide_chunk`'s outcome when the run stopped before the chunk was tried again.
SKIPPED = "skipped"


def decide_chunk(
    *,
    engine: Database,
    worker: BoundWorker,
    survey_id: int,
    chunk: int,
    limits: EngineLimits,
    cache: RunCache,
    attempts: int,
    stopped: Callable[[], bool] = lambda: False,
) -> tuple[str, ChunkOutcome | None]:
    """Decide one chunk, retrying lost races: the retry rules of every road.

    Returns :data:`DECIDED` and what the chunk did (not counted in the metrics yet:
    :func:`count_chunk`); :data:`SKIPPED` when ``stopped()`` said so before a try; or why the
    run must end: ``"stopped"`` (the survey is no longer active), ``"gave up after ..."``
    (``attempts`` conflicts in a row) or an unexpected error's type name (logged here: a bug or
    an unreadable value, never retried). The lease is the caller's to renew. Plain data out: a
    survey child process (:class:`ChildRuns`) runs it as a thread of the survey's process does.
    """
    failures = 0
    while not stopped():
        try:
            done = run_chunk(
                engine=engine,
                worker=worker,
                survey_id=survey_id,
                chunk=chunk,
                limits=limits,
                cache=cache,
            )
        except _Stopped:
            return "stopped", None
        except (_LostRace, StateGone, StateMissing, Conflict, Unavailable) as exc:
            failures += 1
            if failures >= attempts:
                return f"gave up after {attempts} conflicts: {exc!r}"[:500], None
            time.sleep(min(0.05 * failures, 1.0))
            continue
        except Exception as exc:  # a bug or an unreadable value: say so, do not spin
            log.exception("survey %d failed", survey_id)
            return type(exc).__name__, None
        return DECIDED, done
    return SKIPPED, None


@dataclass
class ChildRuns:
    """A survey child process's side (:class:`app.worker.children.ChildPool`).

    Its own engine and bound worker, and the run cache of the run it serves (a new run, or
    another survey, starts a new one: at most one is held). :meth:`decide` is what the
    process that runs the survey asks of it, in plain data.
    """

    engine: Database
    worker: BoundWorker
    limits: EngineLimits
    run: tuple[int, str] | None = None
    cache: RunCache | None = None

    def decide(
        self, survey_id: int, run: str, chunk: int, attempts: int
    ) -> tuple[str, ChunkOutcome | None]:
        """:func:`decide_chunk` of chunk ``chunk`` of run ``run`` of the survey."""
        if self.cache is None or self.run != (survey_id, run):
            self.cache = None  # the last run's cache goes first: never two held at once
            with reading(self.engine) as conn:
                query = json.loads(load_survey(conn, survey_id).query)
            self.cache, self.run = new_run_cache(query, self.limits), (survey_id, run)
        return decide_chunk(
            engine=self.engine,
            worker=self.worker,
            survey_id=survey_id,
            chunk=chunk,
            limits=self.limits,
            cache=self.cache,
            attempts=attempts,
        )


#: Survey child processes: their target is :meth:`ChildRuns.decide` (in :mod:`app.bootstrap`).
Children = ChildPool[tuple[str, ChunkOutcome | None]]


def run_survey(
    *,
    engine: Database,
    worker: BoundWorker,
    survey_id: int,
    owner: str,
    limits: EngineLimits,
    lease_seconds: float,
    threads: int = 1,
    attempts: int = 20,
    children: Children | None = None,
) -> str:
    """Decide every pending chunk, then mark the survey done.

    ``threads`` chunks are decided at once (while one thread's chunk is in the database,
    another samples) — or, given ``children`` (a pool of processes whose target is
    :meth:`ChildRuns.decide`), each chunk in a child process, a few more in flight than there
    are children (:func:`_run_children`). Returns the survey's final status (or
    ``"not-claimed"`` when another process holds it). A chunk that loses a race is decided
    again (up to ``attempts`` times in a row); any other error marks the survey ``failed``
    with the error's type.
    """
    if not claim(engine=engine, survey_id=survey_id, owner=owner, lease_seconds=lease_seconds):
        status = _status(engine, survey_id)
        return "not-claimed" if status in ACTIVE else status
    log.info("survey %d: started by %s", survey_id, owner)
    started = time.monotonic()
    with reading(engine) as conn:
        cache = new_run_cache(json.loads(load_survey(conn, survey_id).query), limits)
    run = _Run(
        engine=engine,
        worker=worker,
        survey_id=survey_id,
        owner=owner,
        limits=limits,
        lease_seconds=lease_seconds,
        attempts=attempts,
        cache=cache,
    )
    token = secrets.token_hex(8)  # the children's caches are this run's
    while True:
        chunks = pending_chunks(engine=engine, survey_id=survey_id)
        if not chunks:
            return _finish(engine, survey_id, started)
        if children is not None:
            _run_children(run, children, token, chunks)
        else:
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="survey") as pool:
                for _ in pool.map(run.chunk, chunks):
                    pass
        if run.outcome == "stopped":
            log.info("survey %d: stopped (no longer active)", survey_id)
            return _status(engine, survey_id)
        if run.outcome == "not-claimed":
            log.warning("survey %d: lease lost to another process", survey_id)
            return "not-claimed"
        if run.outcome is not None:
            return _fail(engine, survey_id, run.outcome)


class _GroupsCounted:
    """The decision groups a run's chunks counted, each counted once in the survey.

    A chunk counts the groups new to its process's run cache, so two processes deciding
    members of one group both count it (survey child processes; distributed chunk tasks, each
    with a run cache of its own). A committed chunk hands its groups' keys back, ``before``
    says how many of them a chunk counted already (and records them), and those are taken
    back here (in the survey's row and the metrics) — the survey's ``groups`` end as one
    process's threads' (and the dry-run's).
    """

    def __init__(
        self, engine: Database, survey_id: int, before: Callable[[frozenset[GroupKey]], int]
    ) -> None:
        self.engine, self.survey_id, self.before = engine, survey_id, before

    def once(self, outcome: ChunkOutcome) -> ChunkOutcome:
        """``outcome`` with its groups counted before by another chunk taken back."""
        if not outcome.keys:
            return outcome
        twice = min(self.before(outcome.keys), outcome.groups)
        if not twice:
            return outcome
        with transaction(self.engine) as conn:
            survey_store.uncount_groups(conn, survey_id=self.survey_id, groups=twice)
        return replace(outcome, groups=outcome.groups - twice)


def _seen_in(seen: set[GroupKey]) -> Callable[[frozenset[GroupKey]], int]:
    """:class:`_GroupsCounted`'s ``before`` on this process's ``seen`` (a run's children)."""

    def before(keys: frozenset[GroupKey]) -> int:
        twice = len(keys & seen)
        seen.update(keys)
        return twice

    return before


def group_digest(key: GroupKey) -> bytes:
    """A decision group's key in 16 bytes, the same in every process and machine."""
    return hashlib.blake2b(repr(tuple(key)).encode(), digest_size=16).digest()


def _seen_by(
    survey_id: int, counted_before: Callable[[int, list[bytes]], int]
) -> Callable[[frozenset[GroupKey]], int]:
    """:class:`_GroupsCounted`'s ``before`` on a deployment's ledger (distributed chunk tasks).

    ``counted_before(survey_id, digests)``: how many of the groups (:func:`group_digest`) a
    chunk of the survey counted already, recording them. When it fails the chunk's count
    stands: a group may then be counted twice, never not at all.
    """

    def before(keys: frozenset[GroupKey]) -> int:
        try:
            return counted_before(survey_id, [group_digest(key) for key in keys])
        except Exception as exc:
            log.warning("survey %d: groups not checked (%s)", survey_id, type(exc).__name__)
            return 0

    return before


#: Times a run rebuilds its child processes after one died (killed, out of memory) before the
#: survey fails: a chunk that kills its process every time must not be tried forever.
CHILD_RESTARTS = 3


def _run_children(run: _Run, children: Children, token: str, chunks: list[int]) -> None:
    """Decide ``chunks`` in the child processes, renewing the lease after each one here.

    One chunk per child at a time plus one queued each, so a child never waits for this
    process between two chunks. The first outcome other than :data:`DECIDED` ends the run
    (``run.outcome``): nothing more is dispatched, the chunks in flight finish (or roll back).
    A child that dies takes every chunk in flight with it (the pool's other children are
    stopped too, their transactions rolled back by the database): the pool is rebuilt and
    those chunks dispatched again — a chunk that had committed is found decided and counted
    once — up to :data:`CHILD_RESTARTS` times, then the run ends with that error.
    """
    todo = deque(chunks)
    flying: dict[Future[tuple[str, ChunkOutcome | None]], int] = {}
    deaths = 0
    counted = _GroupsCounted(run.engine, run.survey_id, _seen_in(run.cache.seen))

    def settle(future: Future[tuple[str, ChunkOutcome | None]], *, renew: bool) -> bool:
        """Count a finished chunk and end the run on its error; True if its child died."""
        chunk = flying.pop(future)
        try:
            outcome, counts = future.result()
        except BrokenProcessPool:
            todo.appendleft(chunk)
            return True
        if counts is not None:
            count_chunk(counted.once(counts))
        if outcome != DECIDED:
            run.end(outcome)
        elif renew and not run.stop.is_set():
            run.renew()
        return False

    while flying or (todo and not run.stop.is_set()):
        broken = False
        while todo and not run.stop.is_set() and len(flying) < 2 * children.processes:
            chunk = todo.popleft()
            try:
                flying[children.submit(run.survey_id, token, chunk, run.attempts)] = chunk
            except BrokenProcessPool:  # a child died since the last look
                todo.appendleft(chunk)
                broken = True
                break
        done, _ = wait(flying, return_when=FIRST_COMPLETED) if not broken else (set(), None)
        for future in done:
            broken = settle(future, renew=True) or broken
        if not broken:
            continue
        # every chunk still in flight is lost with the pool: wait for their futures to say so
        for future in list(flying):
            settle(future, renew=False)
        deaths += 1
        log.warning("survey %d: a child process died (%d so far)", run.survey_id, deaths)
        if deaths > CHILD_RESTARTS:
            run.end(f"a survey child process died {deaths} times (killed or out of memory)")
            return
        children.restart()


# ------------------------------------------------------------------------------ distributed
#: Errors that interrupt a chunk without failing the survey: a distributed worker's time
#: limit (Celery raises ``SoftTimeLimitExceeded`` inside the chunk, which then rolls back).
INTERRUPTIONS = frozenset({"SoftTimeLimitExceeded"})


def plan_survey(
    *, engine: Database, survey_id: int, owner: str, lease_seconds: float
) -> list[int] | None:
    """Claim a survey for a distributed run and list its pending chunks.

    Each chunk is then decided by :func:`run_survey_range` on any worker, under ``owner``'s
    lease. Returns None when there is nothing to dispatch: another run holds the lease (or took
    it over while the chunks were listed: planning must end within ``lease_seconds``) or the
    survey is no longer active; an empty list when no chunk is pending (the survey is then
    marked done here).
    """
    if not claim(engine=engine, survey_id=survey_id, owner=owner, lease_seconds=lease_seconds):
        return None
    chunks = pending_chunks(engine=engine, survey_id=survey_id)
    if not chunks:
        _finish(engine, survey_id, time.monotonic())
        return chunks
    # renewed before dispatching: a plan whose lease expired while it listed (another plan
    # took over) must not send a second set of tasks
    if not claim(engine=engine, survey_id=survey_id, owner=owner, lease_seconds=lease_seconds):
        return None
    return chunks


def run_survey_range(
    *,
    engine: Database,
    worker: BoundWorker,
    survey_id: int,
    owner: str,
    chunk: int,
    limits: EngineLimits,
    lease_seconds: float,
    attempts: int = 20,
    counted_before: Callable[[int, list[bytes]], int] | None = None,
) -> str:
    """Decide chunk ``chunk`` (one task of :func:`plan_survey`).

    The same chunk code and retry rules as :func:`run_survey`; the lease is renewed under
    ``owner`` afterwards. The chunk that leaves no member pending marks the survey done.
    Returns the survey's status (``"not-claimed"`` when another run took the lease over).
    Each call starts a run cache of its own, so it counts every decision group it meets:
    ``counted_before`` (the deployment's ledger of the survey's counted groups, see
    :func:`_seen_by`) takes back those another chunk counted; without it a group met by k
    chunks is counted k times in the survey's ``groups``.
    """
    started = time.monotonic()
    with reading(engine) as conn:
        survey = load_survey(conn, survey_id)
    if survey.status not in ACTIVE:
        return str(survey.status)
    run = _Run(
        engine=engine,
        worker=worker,
        survey_id=survey_id,
        owner=owner,
        limits=limits,
        lease_seconds=lease_seconds,
        attempts=attempts,
        cache=new_run_cache(json.loads(survey.query), limits),
        counted=None
        if counted_before is None
        else _GroupsCounted(engine, survey_id, _seen_by(survey_id, counted_before)),
    )
    run.chunk(chunk)
    if run.outcome == "stopped":
        return _status(engine, survey_id)
    if run.outcome == "not-claimed":
        return "not-claimed"
    if run.outcome in INTERRUPTIONS:
        return "interrupted"  # rolled back; the lease expires and the survey is re-planned
    if run.outcome is not None:
        return _fail(engine, survey_id, run.outcome)
    with reading(engine) as conn:
        survey = load_survey(conn, survey_id)
    if survey.status in ACTIVE and survey.decided >= survey.total:
        return _finish(engine, survey_id, started)
    return str(survey.status)


def _status(engine: Database, survey_id: int) -> str:
    with reading(engine) as conn:
        return str(load_survey(conn, survey_id).status)


def _fail(engine: Database, survey_id: int, error: str) -> str:
    with transaction(engine) as conn:
        survey_store.fail(conn, survey_id=survey_id, error=error, finished_at=datetime.now(UTC))
    return _status(engine, survey_id)


def _finish(engine: Database, survey_id: int, started: float) -> str:
    # the states the members named before their answers, now named by none (most of them),
    # deleted before the survey shows as done; garbage left by a failed collection is harmless
    # (the next one deletes it), so it does not stop the survey from finishing
    collecting = time.monotonic()
    try:
        collected = collect_states(engine)
    except Exception as exc:
        log.warning("survey %d: unnamed states not collected (%s)", survey_id, type(exc).__name__)
        collected = 0
    collecting = time.monotonic() - collecting
    with transaction(engine) as conn:
        finished = survey_store.finish(conn, survey_id=survey_id, finished_at=datetime.now(UTC))
        row = load_survey(conn, survey_id)
        if finished:
            audit.record(
                conn,
                kind=audit.AuditKind.SURVEY_FINISHED,
                actor_key_id=row.analyst_key_id,
                object_id=None,
                detail=survey_totals(row),
            )
    seconds = time.monotonic() - started
    log.info(
        "survey %d: %s, %d members in %.1f s (%.0f/s), %d groups, %d unnamed states deleted "
        "in %.2f s",
        survey_id,
        row.status,
        row.decided,
        seconds,
        row.decided / seconds if seconds > 0 else math.inf,
        row.groups,
        collected,
        collecting,
    )
    return str(row.status)

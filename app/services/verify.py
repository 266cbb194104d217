"""``gatekeeper verify``: recompute every object's state from its stored history.

For each object the accepted queries are replayed in sequence order and compared with what is
stored: sequence numbers ``1..n`` with no gaps, ``accepted == n``, the exact basic-composition
total, the history hash chain, and the realized-loss bounds (finite domains: the whole ``log P``
array too, found under the key the history names (an exact history's: its content's key, or
the history's for arrays stored before issue 27) — the history but its last ``state_pending``
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

A whole run (:func:`verify_all`) reads objects in pages with their submits, closed versions,
arrays and covering chunks in a few statements per page, and folds each distinct history once
(:class:`Replays`): every object is still compared, field by field, with its own history's
replay (:func:`check_object`, which :func:`verify_object` also runs for one object).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from itertools import pairwise
from operator import itemgetter

import numpy as np

from app.engine.calculator import DEFAULT_TOLERANCE
from app.engine.continuous.state import ContinuousState
from app.engine.domain import Domain, parse_domain
from app.engine.lifetime import NO_CLOSED, add_losses
from app.engine.likelihood import LikelihoodState, LossBounds, exact_bounds
from app.engine.limits import DEFAULT_LIMITS
from app.engine.pipeline import (
    HistoryEntry,
    empty_state,
    fold_history,
    fold_step,
    history_account,
    history_entry,
)
from app.services.history import stored_entries
from app.services.objects import stored_domain
from app.services.quota import sub_snapshot
from app.services.snapshots import content_key, next_history_hash, state_key
from app.store import Database, Tx, reading
from app.store import objects as object_store
from app.store import projects as project_store
from app.store import verify as store
from app.store import versions as version_store
from app.store.chunks import REASONS, Chunk, ChunkCache, decode, load_chunks
from app.store.history import HistoryItem
from app.store.verify import ChunkRange, ChunkRow, StoredObject, StoredState
from app.store.versions import ClosedVersion

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
    #: Distinct histories replayed (the other objects were checked against one of these).
    replays: int = 0
    #: Stored likelihood states no object names (not a problem: the next collection's).
    unnamed_states: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing mismatched."""
        return not self.problems


#: A stored history entry as verify compares it: the stored query's and output's JSON texts
#: and its exact ε's text. Survey answers of one chunk variant share one such tuple.
Content = tuple[str, str, str]
#: An entry's sequence number and content.
Recorded = tuple[int, Content]


def recorded(item: HistoryItem) -> Recorded:
    """A history item as verify compares it."""
    return (item.seq, (item.query, item.output, item.epsilon_exact))


@dataclass
class _Replay:
    """A current data version's history replayed: what every object with it must store."""

    domain: Domain
    finite: bool
    entries: list[HistoryEntry]
    basic: Fraction
    chain: str | None
    expected_key: str | None
    #: The key of the held array by its content (exact histories, :func:`content_key`).
    content_key: str | None
    #: Positions (in the version's history) of entries whose stored ε differs from the query's.
    bad_epsilon: list[int]
    loss: LossBounds
    #: What the stored array must hold (finite domains: the history but its pending entries).
    held_state: LikelihoodState | None
    #: Stored texts compared with it: ``("basic", Σε text)`` and ``(budget, δ_g, F₀'s account
    #: text)``, each to whether it matches (exact rationals compare slowly, a million times).
    same: dict[tuple[object, ...], bool] = field(default_factory=dict)
    #: The stored array's problems by the ``state_hash`` it was read at.
    arrays: dict[str | None, list[str]] = field(default_factory=dict)


#: A history's content: the domain's text, how many entries the array holds, each entry's
#: stored query, output and exact ε. Equal content, equal replay (the engine is deterministic).
_Key = tuple[str, int, tuple[Content, ...]]


@dataclass
class _Prefix:
    """The first entries of a history replayed: kept so that a longer one takes one more step."""

    #: Never reused: a prefix's one step longer ones are found by it (and the next content).
    token: int
    entries: tuple[HistoryEntry, ...]
    #: The history hash chain after these entries (None: no entry).
    chain: str | None
    #: Finite domains: Σε and the fold of these entries (never changed once kept); None
    #: otherwise (a continuous history is folded whole).
    basic: Fraction | None
    #: Positions of entries whose stored ε differs from the query's.
    bad_epsilon: tuple[int, ...]
    state: LikelihoodState | None


class Replays:
    """Histories replayed so far in one run, by content, the most recent ``capacity`` of them.

    Objects of a survey population share their histories (the members of a decision group that
    drew the same outputs): each distinct history is folded — and its stored array compared —
    once, and every object with it is checked against that one replay. Nothing is skipped: every
    object's own stored fields are compared with its history's replay.

    Histories that differ share their prefixes (after diverging surveys nearly every member has
    a history of its own, but a survey adds one entry to histories met before): the replay of
    ``h[:n]`` is the kept replay of ``h[:n-1]`` one step further (:func:`fold_step`, the engine's
    fold) — its entries, hash chain, Σε, likelihood state and differing ε's. Each distinct
    ``(query, output, ε)`` text is parsed once.
    """

    def __init__(self, capacity: int = 20_000, prefix_cells: int = 20_000_000) -> None:
        self.capacity = capacity
        self._held: OrderedDict[_Key, _Replay] = OrderedDict()
        self._domains: dict[str, Domain] = {}
        self._closed: OrderedDict[tuple[str, tuple[Content, ...]], tuple[Fraction, LossBounds]] = (
            OrderedDict()
        )
        #: Kept prefixes by (the one entry shorter's token, the last entry's content); the
        #: empty history's token by domain text. Bounded by their arrays' cells in all.
        self._prefixes: OrderedDict[tuple[int, Content], _Prefix] = OrderedDict()
        self._roots: dict[str, _Prefix] = {}
        self._prefix_cells = prefix_cells
        self._cells = 0
        self._tokens = itertools.count(1)
        #: Parsed entries by domain text and content (and whether the stored ε is the query's).
        self._entries: dict[tuple[str, Content], tuple[HistoryEntry, bool]] = {}
        #: Replays computed, objects checked against an earlier replay, prefixes folded.
        self.folded = 0
        self.reused = 0
        self.steps = 0

    def domain(self, text: str) -> Domain:
        """The domain of a canonical text (parsed once)."""
        found = self._domains.get(text)
        if found is None:
            found = self._domains[text] = parse_domain(json.loads(text))
        return found

    def replay(self, key: _Key) -> _Replay:
        """The replay of the history whose content is ``key``."""
        found = self._held.get(key)
        if found is not None:
            self._held.move_to_end(key)
            self.reused += 1
            return found
        found = self._replay(key[0], key[1], key[2])
        self.folded += 1
        self._held[key] = found
        if len(self._held) > self.capacity:
            self._held.popitem(last=False)
        return found

    def _entry(self, domain_text: str, content: Content) -> tuple[HistoryEntry, bool]:
        """A stored entry parsed (once per domain and content), and whether its ε is right."""
        key = (domain_text, content)
        found = self._entries.get(key)
        if found is None:
            query, output, epsilon_exact = content
            entry = history_entry(self.domain(domain_text), json.loads(query), json.loads(output))
            found = (entry, _fraction(epsilon_exact) == entry.mechanism.epsilon_exact)
            if len(self._entries) >= 4 * self.capacity:
                self._entries.clear()
            self._entries[key] = found
        return found

    def _prefixes_of(self, domain_text: str, contents: Sequence[Content]) -> list[_Prefix]:
        """The replays of ``contents[:n]`` for n = 0 .. len(contents), kept ones reused."""
        domain = self.domain(domain_text)
        node = self._roots.get(domain_text)
        if node is None:
            empty = empty_state(domain) if domain.is_finite else None
            assert empty is None or isinstance(empty, LikelihoodState)  # noqa: S101 - finite
            node = _Prefix(next(self._tokens), (), None, Fraction(0), (), empty)
            self._roots[domain_text] = node
        found = [node]
        last = len(contents) - 1
        for at, content in enumerate(contents):
            key = (node.token, content)
            child = self._prefixes.get(key)
            if child is not None:
                self._prefixes.move_to_end(key)
            else:
                child = self._step(domain_text, node, content)
                self.steps += 1
                self._prefixes[key] = child
                if at == last:
                    # a whole history is a prefix of few others (its replay is kept anyway):
                    # first to go, unless a longer history meets it before
                    self._prefixes.move_to_end(key, last=False)
                if child.state is not None:
                    self._cells += child.state.logp.size
                while self._prefixes and (
                    len(self._prefixes) > 4 * self.capacity or self._cells > self._prefix_cells
                ):
                    _, dropped = self._prefixes.popitem(last=False)
                    if dropped.state is not None:
                        self._cells -= dropped.state.logp.size
            found.append(child)
            node = child
        return found

    def _step(self, domain_text: str, before: _Prefix, content: Content) -> _Prefix:
        """``before`` one entry (``content``) longer."""
        entry, epsilon_ok = self._entry(domain_text, content)
        at = len(before.entries)
        state, basic = None, None
        if before.state is not None and before.basic is not None:
            state = before.state.copy()
            basic = fold_step(state, before.basic, entry, at)
        return _Prefix(
            token=next(self._tokens),
            entries=(*before.entries, entry),
            chain=next_history_hash(before.chain, content[0], content[1]),
            basic=basic,
            bad_epsilon=before.bad_epsilon if epsilon_ok else (*before.bad_epsilon, at),
            state=state,
        )

    def _replay(self, domain_text: str, held: int, contents: Sequence[Content]) -> _Replay:
        """Fold a current version's history with the engine (from its kept prefixes).

        :func:`fold_step` is the step of :func:`fold_history`, the one replay every decision
        uses; a continuous history is folded from its start and its loss searched afresh.
        """
        prefixes = self._prefixes_of(domain_text, contents)
        whole = prefixes[-1]
        domain = self.domain(domain_text)
        entries = list(whole.entries)
        state: LikelihoodState | ContinuousState
        if whole.state is not None and whole.basic is not None:
            state, basic = whole.state, whole.basic
        else:
            state, basic = fold_history(domain, entries)
        held_state = prefixes[held].state  # what the stored array holds (finite domains)
        held_chain = prefixes[held].chain
        return _Replay(
            domain=domain,
            finite=held_state is not None,
            entries=entries,
            basic=basic,
            chain=whole.chain,
            expected_key=state_key(domain_text, held_chain) if held_chain is not None else None,
            content_key=(
                content_key(domain_text, held_state)
                if held_state is not None and held_chain is not None
                else None
            ),
            bad_epsilon=list(whole.bad_epsilon),
            loss=state.loss(basic),
            held_state=held_state,
        )

    def closed_fold(
        self, domain_text: str, contents: Sequence[Content]
    ) -> tuple[Fraction, LossBounds]:
        """A closed version's ``Σ ε_i`` and realized loss, replayed from its history.

        ``contents``: the history's ``(query, output, ε)`` texts. Folded by the engine's replay
        (:func:`fold_history`) once per distinct history and domain in this run.
        """
        key = (domain_text, tuple(contents))
        found = self._closed.get(key)
        if found is not None:
            self._closed.move_to_end(key)
            return found
        domain = self.domain(domain_text)
        entries = [history_entry(domain, json.loads(q), json.loads(o)) for q, o, _ in contents]
        state, basic = fold_history(domain, entries)
        loss = state.loss(basic) if entries else exact_bounds(Fraction(0))
        found = self._closed[key] = (basic, loss)
        if len(self._closed) > self.capacity:
            self._closed.popitem(last=False)
        return found


@lru_cache(maxsize=4096)
def _fraction(text: str) -> Fraction:
    """A stored exact decimal or fraction's value (the same few texts recur a million times)."""
    return Fraction(text)


def verify_object(
    conn: Tx, row: StoredObject, report: Report, chunks: ChunkCache | None = None
) -> None:
    """Replay one object's history and record any mismatch in ``report``.

    Reads the object's history (single submits and survey answers,
    :mod:`app.services.history`), closed versions and likelihood array, then
    :func:`check_object`.
    """
    closed, broken = version_store.closed_versions_among(conn, [row.id])
    report.problems.extend(broken)
    check_object(
        row,
        [recorded(item) for item in stored_entries(conn, row.id, chunks=chunks)],
        closed.get(row.id, []),
        lambda key: store.likelihood_state(conn, key=key),
        report,
        Replays(capacity=1),
    )


def check_object(
    row: StoredObject,
    all_records: Sequence[Recorded],
    closed: list[ClosedVersion],
    stored_state: Callable[[str], StoredState | None],
    report: Report,
    replays: Replays,
) -> None:
    """Compare one object's stored state with its stored history; mismatches go to ``report``.

    ``all_records``: every stored entry of its history by ``seq``; ``closed``: its closed data
    versions, oldest first; ``stored_state(key)``: the likelihood array stored under ``key``.
    The history is folded by the engine's own replay (once per distinct history in ``replays``).
    """
    n = len(all_records)
    if any(r[0] != i for i, r in enumerate(all_records, start=1)):
        report.problems.append(f"{row.id}: sequence numbers are not 1..{n}")
    if row.accepted != n:
        report.problems.append(f"{row.id}: accepted={row.accepted} but {n} queries are stored")
    domain = replays.domain(row.domain)
    _verify_versions(row, all_records, closed, report, replays)
    records = (
        all_records
        if row.version_start == 0
        else [r for r in all_records if r[0] > row.version_start]
    )
    held = len(records) - row.state_pending  # entries the stored array holds
    if not 0 <= row.state_pending <= len(records) or (row.state_pending and not domain.is_finite):
        report.problems.append(f"{row.id}: state_pending={row.state_pending} is impossible")
        held = len(records)
    key = (row.domain, held, tuple(content for _, content in records))
    replay = replays.replay(key)
    for i in replay.bad_epsilon:
        report.problems.append(f"{row.id}: query {records[i][0]} has a stored epsilon that differs")
    basic = replay.basic
    same = replay.same.get(("basic", row.basic_total))
    if same is None:
        same = replay.same[("basic", row.basic_total)] = _fraction(row.basic_total) == basic
    if not same:
        report.problems.append(f"{row.id}: basic composition differs from the history's")
    budget = (row.budget, row.budget_delta, row.f0_account)
    same = replay.same.get(budget)
    if same is None:
        account = history_account(replay.entries, row.budget, row.budget_delta, domain)
        same = replay.same[budget] = _fraction(row.f0_account) == account
    if not same:
        report.problems.append(f"{row.id}: F0's account differs from the history's")
    if row.history_hash != replay.chain:
        report.problems.append(f"{row.id}: history hash differs from the history's")
    loss = replay.loss
    report.checked += 1
    if replay.held_state is not None:
        # an exact history's array is stored by content (before issue 27, by history)
        if row.state_hash != replay.expected_key and (
            replay.content_key is None or row.state_hash != replay.content_key
        ):
            report.problems.append(f"{row.id}: likelihood state key differs from the history's")
        if row.state_hash is not None or held:
            found = replay.arrays.get(row.state_hash)
            if found is None:
                found = replay.arrays[row.state_hash] = _array_problems(
                    replay.held_state, stored_state(row.state_hash) if row.state_hash else None
                )
            report.problems.extend(f"{row.id}: {problem}" for problem in found)
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


def _array_problems(state: LikelihoodState, found: StoredState | None) -> list[str]:
    """How the stored array ``found`` (None: none stored) differs from ``state``."""
    data = found.state if found else b""
    stored = np.frombuffer(data[: 8 * state.logp.size], dtype="<f8")
    if stored.size != state.logp.size or not _close(stored, state.logp.ravel()):
        return ["likelihood array differs from the history's"]
    if found is not None and state.exact is not None:
        # an array stored before exact forms existed has none (decided by floats)
        exact = LikelihoodState.from_bytes(state.domain, data, found.err).exact
        if exact is not None and not state.exact.same_as(exact):
            return ["exact loss differs from the history's"]
    return []


def _close(stored: np.ndarray, computed: np.ndarray) -> bool:
    """``np.allclose(stored, computed, rtol=0, atol=TOLERANCE)``, its common case first.

    Every difference within the tolerance (no NaN, no infinity: their differences are NaN or
    infinite) is what ``allclose`` accepts too, in one pass instead of its several; anything
    else is ``allclose``'s to decide.
    """
    with np.errstate(invalid="ignore"):
        if float(np.max(np.abs(stored - computed))) <= TOLERANCE:
            return True
    return bool(np.allclose(stored, computed, rtol=0, atol=TOLERANCE))


def _verify_versions(
    row: StoredObject,
    records: Sequence[Recorded],
    closed: list[ClosedVersion],
    report: Report,
    replays: Replays,
) -> None:
    """Check the closed data versions of an object.

    Their ``seq`` ranges are contiguous, each one's loss and Σε replay from its own history,
    and the lifetime sums are the sum of the stored closed losses.
    """
    end = 0
    total = NO_CLOSED
    for number, version in enumerate(closed, start=1):
        label = f"{row.id}: version {version.data_version}"
        if version.data_version != number or version.seq_start != end:
            report.problems.append(f"{label}: versions are not contiguous from 1")
        end = version.seq_end
        contents = [
            content for seq, content in records if version.seq_start < seq <= version.seq_end
        ]
        if len(contents) != version.seq_end - version.seq_start:
            report.problems.append(f"{label}: its history is not seq {version.seq_start + 1}..")
        basic, loss = replays.closed_fold(row.domain, contents)
        if Fraction(version.basic_total) != basic:
            report.problems.append(f"{label}: basic composition differs from its history's")
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
    sums = _lifetime_sums(total) if closed else _NO_CLOSED_SUMS
    if (row.lifetime_exact, row.lifetime_lower, row.lifetime_upper) != sums:
        report.problems.append(f"{row.id}: lifetime sums differ from its closed versions'")


def _lifetime_sums(total: LossBounds) -> tuple[str | None, float, float]:
    """The lifetime columns an object with closed versions summing to ``total`` stores."""
    return (None if total.value is None else str(total.value), total.lower, total.upper)


#: An object with no closed version (most of them): its lifetime columns, computed once.
_NO_CLOSED_SUMS = _lifetime_sums(NO_CLOSED)


def verify_states(conn: Tx, report: Report) -> None:
    """Every likelihood state an object names is stored.

    A stored state no object names is not a problem: it waits for the next collection
    (:func:`app.store.states.collect_unnamed`); :attr:`Report.unnamed_states` counts them.
    """
    using = store.state_users(conn)
    stored = store.stored_state_keys(conn)
    for key, count in using.items():
        if key not in stored:
            report.problems.append(f"likelihood state {key}: named by {count} objects, not stored")
    report.unnamed_states = len(stored - using.keys())


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
    picks = np.asarray(chunk.picks, dtype=np.int64)
    seqs = np.asarray(chunk.seqs, dtype=np.int64)
    # a reused answer is stored as -seq of the answer it repeats (not a history entry)
    accepted = (picks >= 0) & (picks < len(chunk.variants)) & (seqs != 0)
    refused = np.isin(picks, list(REASONS)) & (seqs == 0)
    for at in np.flatnonzero(~(accepted | refused)):
        member, pick, seq = members[at], chunk.picks[at], chunk.seqs[at]
        report.problems.append(f"{label}, member {member}: pick {pick} / seq {seq} is invalid")


def count_objects(engine: Database) -> int:
    """How many objects :func:`verify_all` will check (for a progress bar's total)."""
    with reading(engine) as conn:
        return store.object_count(conn)


#: Objects read and checked per page (one statement each for their rows, single submits, closed
#: versions and new likelihood arrays; chunks are read once for all the pages they cover).
PAGE_SIZE = 2000


def verify_all(
    engine: Database,
    progress: Callable[[int], object] | None = None,
    *,
    page_size: int = PAGE_SIZE,
) -> Report:
    """Check every object, the shared likelihood states and the surveys' members.

    :func:`verify_objects` over every id, then :func:`verify_shared`. ``progress(n)`` is called
    after each page of ``n`` objects (``gatekeeper verify``'s progress bar).
    """
    report = verify_objects(engine, progress, page_size=page_size)
    verify_shared(engine, report)
    return report


def verify_shared(engine: Database, report: Report) -> None:
    """What is not an object's own: shared states stored, surveys' chunks, projects' states."""
    with reading(engine) as conn:
        verify_states(conn, report)
        verify_surveys(conn, report)
        verify_project_states(conn, report)
        verify_object_counts(conn, report)


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


def split_ids(engine: Database, parts: int) -> list[tuple[str | None, str | None]]:
    """``parts`` ranges ``(after, upto]`` of about as many objects each, covering every id.

    For verifying in parallel (``gatekeeper verify --jobs``): :func:`verify_objects` per range.
    """
    with reading(engine) as conn:
        count = store.object_count(conn)
        cuts = store.ids_at(conn, [count * i // parts for i in range(1, parts)])
    bounds: list[str | None] = [None, *dict.fromkeys(cuts), None]
    return list(pairwise(bounds))


def verify_objects(
    engine: Database,
    progress: Callable[[int], object] | None = None,
    *,
    after: str | None = None,
    upto: str | None = None,
    page_size: int = PAGE_SIZE,
) -> Report:
    """Check every object with an id in ``(after, upto]`` (None: unbounded), in id order.

    Objects are read in pages (:mod:`app.store.verify`) and each checked by
    :func:`check_object` against the replay of its history — folded once per distinct history
    (:class:`Replays`).
    """
    report = Report()
    replays = Replays()
    with reading(engine) as conn, _full_collections_every(FULL_COLLECTION_PAGES) as page_done:
        domain_texts = store.domains(conn)
        answers = _SurveyAnswers(store.chunk_ranges(conn))
        states = _StoredStates(conn)
        batches = version_store.BatchCache()  # packed closed versions, met page after page
        while page := store.object_page(
            conn, after=after, upto=upto, size=page_size, domain_texts=domain_texts
        ):
            after = page[-1].id
            ids = [row.id for row in page]
            submits = store.submits_of(conn, ids)
            closed, broken = version_store.closed_versions_among(conn, ids, batches)
            report.problems.extend(broken)
            surveyed = answers.of_page(conn, ids)
            states.read({row.state_hash for row in page if row.state_hash})
            for row in page:
                records = surveyed.get(row.id) or []
                single = submits.get(row.id)
                if single:
                    records[:0] = [recorded(item) for item in single]
                if len(records) > 1:
                    records.sort(key=_SEQ)
                check_object(row, records, closed.get(row.id, []), states.get, report, replays)
            page_done()
            if progress is not None:
                progress(len(page))
    report.replays = replays.folded
    return report


_SEQ = itemgetter(0)

#: Pages between two full garbage collections in :func:`verify_objects`.
FULL_COLLECTION_PAGES = 50


@contextmanager
def _full_collections_every(pages: int) -> Iterator[Callable[[], None]]:
    """No automatic full garbage collection inside; one every ``pages`` calls of what it yields.

    The caller calls it once per page. A run keeps millions of objects (replays, prefixes,
    arrays, chunks): each automatic full collection walks them all, again and again as the
    caches turn over — a quarter of a diverged population's run (py-spy). Young objects are
    still collected as usual.
    """
    done = itertools.count(1)

    def page_done() -> None:
        if next(done) % pages == 0:
            gc.collect()

    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], 1 << 30)
    try:
        yield page_done
    finally:
        gc.set_threshold(*before)


class _StoredStates:
    """Stored likelihood arrays read so far in a run, by key, the most recent of them.

    After diverging surveys the objects of a page name arrays that objects of earlier pages
    named too (an array is shared by every history with its content, whatever their order):
    each page's keys not held are read in one statement, and the arrays read are kept up to
    ``capacity`` bytes in all (the current page's always).
    """

    def __init__(self, conn: Tx, capacity: int = 128 * 2**20) -> None:
        self._conn = conn
        self._capacity = capacity
        self._held: OrderedDict[str, StoredState | None] = OrderedDict()
        self._bytes = 0

    def read(self, keys: set[str]) -> None:
        """Hold the arrays stored under ``keys`` (None for a key with none stored)."""
        missing = []
        for key in keys:
            if key in self._held:
                self._held.move_to_end(key)
            else:
                missing.append(key)
        if missing:
            found = store.likelihood_states(self._conn, sorted(missing))
            for key in missing:
                state = self._held[key] = found.get(key)
                self._bytes += len(state.state) if state is not None else 0
        while self._bytes > self._capacity and len(self._held) > len(keys):
            _, dropped = self._held.popitem(last=False)
            self._bytes -= len(dropped.state) if dropped is not None else 0

    def get(self, key: str) -> StoredState | None:
        """The array stored under ``key`` (read now if not held), None if none is."""
        if key in self._held:
            return self._held[key]
        return store.likelihood_state(self._conn, key=key)


class _SurveyAnswers:
    """The survey answers of a page of objects, from the decided chunks that cover them.

    An object's answer in a survey is in the chunk :func:`app.store.chunks.chunks_covering`
    finds — per survey, the last chunk starting at or before its id, when decided and ending at
    or after it — and there only if the object is a member with an accepted pick. Here the
    chunks are read once for every page they cover (their ranges first, members never twice).
    """

    def __init__(self, ranges: list[ChunkRange], capacity: int = 256) -> None:
        self._surveys: dict[int, list[ChunkRange]] = {}
        for r in ranges:  # by survey and first id
            self._surveys.setdefault(r.survey_id, []).append(r)
        self._firsts = {s: [r.first_id for r in rs] for s, rs in self._surveys.items()}
        self._capacity = max(capacity, 4 * len(self._surveys))
        self._chunks: OrderedDict[tuple[int, int], tuple[Chunk, list[Content], bool]] = (
            OrderedDict()
        )

    def of_page(self, conn: Tx, ids: list[str]) -> dict[str, list[Recorded]]:
        """The answers of the objects ``ids``, by object (unordered)."""
        if not self._surveys:
            return {}
        low, high = min(ids), max(ids)  # bytewise, as the chunks' ranges compare
        members = set(ids)
        plan: list[tuple[ChunkRange, str | None]] = []
        for survey_id, ranges in self._surveys.items():
            firsts = self._firsts[survey_id]
            # ids in [low, high] are covered by the chunk starting last at or before low, and
            # by those starting in (low, high]
            start = max(bisect.bisect_right(firsts, low) - 1, 0)
            stop = bisect.bisect_right(firsts, high)
            for at in range(start, stop):
                if ranges[at].decided:
                    plan.append((ranges[at], firsts[at + 1] if at + 1 < len(firsts) else None))
        self._load(conn, [(r.survey_id, r.chunk) for r, _ in plan])
        found: dict[str, list[Recorded]] = {}
        for r, next_first in plan:
            chunk, variants, ordered = self._chunks[(r.survey_id, r.chunk)]
            picks, seqs = chunk.picks, chunk.seqs
            if picks is None or seqs is None:
                continue  # pending: no answers
            top = r.last_id if r.last_id < high else high
            lo = r.first_id if r.first_id > low else low
            if ordered:
                begin = bisect.bisect_left(chunk.members, lo)
                end = bisect.bisect_right(chunk.members, top)
            else:
                begin, end = 0, len(chunk.members)
            usable = min(len(picks), len(seqs), end)
            for at in range(begin, usable):
                member = chunk.members[at]
                if member not in members or not lo <= member <= top:
                    continue
                if next_first is not None and member >= next_first:
                    continue  # a later chunk of the survey starts at or before it
                pick = picks[at]
                # a reused answer (negative seq) repeats an entry: no entry of its own
                if 0 <= pick < len(variants) and seqs[at] > 0:
                    found.setdefault(member, []).append((seqs[at], variants[pick]))
        return found

    def _load(self, conn: Tx, keys: list[tuple[int, int]]) -> None:
        missing = [k for k in keys if k not in self._chunks]
        for key in keys:
            if key in self._chunks:
                self._chunks.move_to_end(key)
        if missing:
            for key, chunk in load_chunks(conn, missing).items():
                variants = [(v["query"], v["output"], v["epsilon_exact"]) for v in chunk.variants]
                ordered = chunk.members == sorted(chunk.members)
                self._chunks[key] = (chunk, variants, ordered)
            for key in missing:
                if key not in self._chunks:
                    raise LookupError(f"survey {key[0]} has no chunk {key[1]}")
        while len(self._chunks) > max(self._capacity, len(keys)):  # keep this page's
            self._chunks.popitem(last=False)


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

"""An object's row as the engine's :class:`~app.engine.pipeline.ObjectSnapshot`, and back.

Finite objects: the stored likelihood array, kept once per content in ``likelihood_states``:
an exact (randomized-response) history's array is named by :func:`content_key`, so histories
with the same outputs in any order share it; any other by its history (:func:`state_key`);
plus the last ``state_pending`` entries of the history when a survey did not store the array its
answers made (:func:`pending_columns`: an ``olh`` answer's array would be its member's alone).
Continuous objects: the stored history's parsed terms, seeded with the certified bounds stored
on the row (a decision needs no search for the history's own loss). Parsing costs about 0.4 ms a
query, so parsed continuous histories are kept in a process-wide LRU keyed by ``(object id,
version)`` — every accepted query advances the version, and objects are never deleted — and a
submit puts the snapshot it committed there for the next one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple, Protocol

from app.engine.continuous.state import ContinuousState
from app.engine.domain import Domain
from app.engine.exact import ExactLoss
from app.engine.filters import FilterKind
from app.engine.lifetime import Lifetime
from app.engine.likelihood import ExactForms, LikelihoodState, LossBounds, exact_bounds
from app.engine.limits import EngineLimits
from app.engine.numerics import fraction_text
from app.engine.pipeline import (
    HistoryEntry,
    ObjectSnapshot,
    empty_state,
    fold_history,
    history_entry,
)
from app.services.history import HistoryMismatch, object_history
from app.store import Database, Tx, transaction
from app.store.history import HistoryItem
from app.store.states import collect_unnamed, name_states

log = logging.getLogger(__name__)

#: Continuous history terms kept in the cache, all objects together (a term is a few hundred
#: bytes: the default holds about 100 MB).
CACHED_TERMS = 250_000


class SnapshotRow(Protocol):
    """The columns of an object a snapshot is built from (read only)."""

    @property
    def id(self) -> str: ...  # noqa: D102

    @property
    def budget(self) -> float: ...  # noqa: D102

    @property
    def filter(self) -> str: ...  # noqa: D102

    @property
    def state(self) -> bytes | None: ...  # noqa: D102

    @property
    def state_err(self) -> float: ...  # noqa: D102

    @property
    def state_pending(self) -> int: ...  # noqa: D102

    @property
    def loss_lower(self) -> float: ...  # noqa: D102

    @property
    def loss_upper(self) -> float: ...  # noqa: D102

    @property
    def basic_total(self) -> str: ...  # noqa: D102

    @property
    def version(self) -> int: ...  # noqa: D102

    @property
    def budget_delta(self) -> float | None: ...  # noqa: D102

    @property
    def f0_account(self) -> str: ...  # noqa: D102

    @property
    def version_start(self) -> int: ...  # noqa: D102


class LifetimeColumns(Protocol):
    """The columns of an object's lifetime budget and its closed versions' losses."""

    @property
    def lifetime_budget(self) -> float | None: ...  # noqa: D102

    @property
    def lifetime_exact(self) -> str | None: ...  # noqa: D102

    @property
    def lifetime_lower(self) -> float: ...  # noqa: D102

    @property
    def lifetime_upper(self) -> float: ...  # noqa: D102

    @property
    def data_version(self) -> int: ...  # noqa: D102


def closed_losses(row: LifetimeColumns) -> LossBounds:
    """Σ of the closed versions' realized losses as stored: exact while every one was."""
    if row.lifetime_exact is not None:
        return exact_bounds(Fraction(row.lifetime_exact))
    return LossBounds(row.lifetime_lower, row.lifetime_upper)


def lifetime_of(row: LifetimeColumns) -> Lifetime | None:
    """The object's lifetime budget and closed losses (None without a lifetime budget)."""
    if row.lifetime_budget is None:
        return None
    return Lifetime(row.lifetime_budget, closed_losses(row), row.data_version)


class HistoryCache:
    """Parsed continuous histories by ``(object id, version)``, bounded by their total terms."""

    def __init__(self, max_terms: int = CACHED_TERMS) -> None:
        self.max_terms = max_terms
        self._entries: OrderedDict[tuple[str, str, int], ContinuousState] = OrderedDict()
        self._terms = 0
        self._guard = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, database: str, object_id: str, version: int) -> ContinuousState | None:
        """The state stored for this version, if any (and mark it recently used)."""
        key = (database, object_id, version)
        with self._guard:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(key)
            return found

    def put(self, database: str, object_id: str, version: int, state: ContinuousState) -> None:
        """Keep ``state`` as the history of ``object_id`` at ``version`` (only committed ones)."""
        weight = state.size + 1
        if weight > self.max_terms:
            return
        key = (database, object_id, version)
        with self._guard:
            old = self._entries.pop(key, None)
            if old is not None:
                self._terms -= old.size + 1
            self._entries[key] = state
            self._terms += weight
            while self._terms > self.max_terms:
                _, evicted = self._entries.popitem(last=False)
                self._terms -= evicted.size + 1

    def clear(self) -> None:
        """Forget every history."""
        with self._guard:
            self._entries.clear()
            self._terms = 0


#: The process's cache of parsed continuous histories.
HISTORIES = HistoryCache()
#: Finite states' exact forms by their stored bytes (:func:`snapshot_of` reads an object's array
#: with them; :func:`remember` keeps a committed submit's new one, so the object's next decision
#: finds it parsed, its loss computed). Content only: keyed by the bytes, whatever the object.
EXACT_FORMS = ExactForms()


def stored_history(
    conn: Tx, object_id: str, domain: Domain, *, after: int = 0
) -> list[HistoryEntry]:
    """The object's accepted queries and outputs (submits and survey answers), parsed, in order.

    ``after``: only those with ``seq > after`` (the current data version's: ``version_start``).
    """
    items = object_history(conn, object_id, after=after)
    return [history_entry(domain, json.loads(r.query), json.loads(r.output)) for r in items]


def snapshot_of(
    conn: Tx,
    row: SnapshotRow,
    domain: Domain,
    limits: EngineLimits,
    lifetime: Lifetime | None = None,
    *,
    history: Sequence[HistoryItem] | None = None,
    forms: ExactForms | None = EXACT_FORMS,
) -> ObjectSnapshot:
    """The object's public state as the engine decides on it. Never reads the value.

    The state is the current data version's; ``lifetime`` (:func:`lifetime_of` the row) adds
    the object's lifetime budget. ``history``: the object's whole history when the caller read
    it already (a survey chunk reads its members' at once,
    :func:`~app.services.history.object_histories`): the pending entries are its tail.
    ``forms``: where exact forms are looked up and kept by their bytes (None: parsed, not
    kept — a survey decodes each group's state once per run, and its members' next
    decisions read the states it stores after them, not these).
    """
    state: LikelihoodState | ContinuousState
    if domain.is_finite:
        if row.state is None:  # no accepted query yet (or none the stored array holds)
            state = empty_state(domain)
        else:
            state = LikelihoodState.from_bytes(domain, row.state, row.state_err, forms)
        if row.state_pending:
            assert isinstance(state, LikelihoodState)  # noqa: S101 - a finite domain
            for entry in pending_entries(conn, row.id, row.state_pending, domain, history):
                state.apply(entry.mechanism.term(entry.output))
    else:
        database = database_of(conn.engine)
        cached = HISTORIES.get(database, row.id, row.version)
        if cached is None:
            current = stored_history(conn, row.id, domain, after=row.version_start)
            folded, _ = fold_history(domain, current)
            assert isinstance(folded, ContinuousState)  # noqa: S101 - a continuous domain
            cached = folded.seeded(LossBounds(row.loss_lower, row.loss_upper))
            HISTORIES.put(database, row.id, row.version, cached)
        state = cached
    return ObjectSnapshot(
        domain,
        row.budget,
        FilterKind(row.filter),
        fraction_text(row.basic_total),
        state,
        limits,
        row.budget_delta,
        fraction_text(row.f0_account),
        lifetime,
    )


def pending_entries(
    conn: Tx,
    object_id: str,
    pending: int,
    domain: Domain,
    history: Sequence[HistoryItem] | None = None,
) -> list[HistoryEntry]:
    """The last ``pending`` entries of the object's history, parsed (the array lacks them).

    Folded onto the stored array in order, they give the array of the whole history bit for
    bit: :meth:`LikelihoodState.apply` is what :func:`~app.engine.pipeline.record` computes.
    ``history``: the whole history, already read (else read here).
    """
    items = object_history(conn, object_id) if history is None else history
    if len(items) < pending:
        raise HistoryMismatch(f"{object_id}: {pending} pending entries, {len(items)} stored")
    tail = items[len(items) - pending :]
    return [history_entry(domain, json.loads(r.query), json.loads(r.output)) for r in tail]


def database_of(engine: Database) -> str:
    """The cache's name for a database: its URL without the password."""
    return engine.url.render_as_string(hide_password=True)


def remember(engine: Database, object_id: str, version: int, snapshot: ObjectSnapshot) -> None:
    """Keep a committed snapshot for the object's next decision.

    A continuous snapshot's history (:data:`HISTORIES`); a finite one's exact form, by its
    bytes (:data:`EXACT_FORMS`: found again only if the object's stored array has these bytes).
    """
    if isinstance(snapshot.state, ContinuousState) and snapshot.state.loss_known:
        HISTORIES.put(database_of(engine), object_id, version, snapshot.state)
    elif isinstance(snapshot.state, LikelihoodState):
        EXACT_FORMS.remember(snapshot.state)


def _framed(*parts: str) -> bytes:
    """The bytes a history hash or state key digests: each part, then the unit separator.

    ``_framed(a, *rest) == a.encode() + _framed("", *rest)``: a caller may frame the parts it
    knows ahead once (:func:`history_hashes_after`) and prepend the first per call. UTF-8
    encodes a concatenation as the concatenation of the encodings, so the text is encoded once.
    """
    return ("\x1f".join(parts) + "\x1f").encode()


#: An empty BLAKE2b-128, only ever copied (never updated): a copy and ``update`` cost ≈ 0.65 of
#: ``hashlib.blake2b(data, digest_size=16)``, whose keyword parsing and set-up are the most of a
#: short message's hash (docs/benchmarks.md, "h/small"). Copying an object nobody updates is
#: safe from any thread.
_BLAKE2B_128 = hashlib.blake2b(digest_size=16)


def _digest(*parts: str) -> str:
    hasher = _BLAKE2B_128.copy()
    hasher.update(_framed(*parts))
    return hasher.hexdigest()


def next_history_hash(previous: str | None, query_text: str, output_text: str) -> str:
    """The history hash after one more accepted ``(query, output)`` (stored JSON texts).

    A hash chain: equal histories have equal hashes, so a survey can group objects by it.
    """
    return _digest(previous or "", query_text, output_text)


def history_hashes_after(query_text: str, output_text: str) -> Callable[[str | None], str]:
    """``lambda previous: next_history_hash(previous, query_text, output_text)``, faster.

    The same BLAKE2b over the same bytes, the query's and output's part encoded once: a
    diverged survey's members each have a history hash of their own, one such call each.
    """
    rest = _framed("", query_text, output_text)  # all but the previous hash's own bytes
    empty = _BLAKE2B_128

    def after(previous: str | None) -> str:
        hasher = empty.copy()
        hasher.update((previous or "").encode())  # two updates hash what one of both would
        hasher.update(rest)
        return hasher.hexdigest()

    return after


def state_key(domain_text: str, history_hash: str) -> str:
    """The key of a finite history's likelihood array in ``likelihood_states`` by its history.

    The key of arrays without an exact form (a history with a query that is not randomized
    response), and of every array stored before :func:`content_key` existed.
    """
    return _digest(domain_text, history_hash)


def content_key(domain_text: str, state: LikelihoodState) -> str | None:
    """The key of an exact history's array by its content (None: the state has no exact form).

    The domain and the exact form's canonical bytes (:meth:`ExactLoss.canonical_bytes
    <app.engine.exact.ExactLoss.canonical_bytes>`): histories with the same multiset of
    randomized-response outputs — in any order — share one stored array and get one decision.
    Their float arrays differ only by rounding (certified by each one's ``err`` for the same
    real log-likelihood), and an exact history's decisions read the exact form alone.
    """
    if state.exact is None:
        return None
    return exact_content_key(domain_text, state.exact)


def exact_content_key(domain_text: str, exact: ExactLoss) -> str:
    """:func:`content_key` of a state whose exact form is ``exact`` (the array not needed)."""
    return canonical_content_key(domain_text, exact.canonical_bytes())


def canonical_content_key(domain_text: str, canonical: bytes) -> str:
    """:func:`content_key` of a state whose exact form's canonical bytes are ``canonical``."""
    hasher = _content_hasher(domain_text)
    hasher.update(canonical)
    return hasher.hexdigest()


def _content_hasher(domain_text: str) -> hashlib.blake2b:
    """The content key's BLAKE2b with the domain's part hashed (the canonical bytes follow)."""
    hasher = hashlib.blake2b(digest_size=16, person=b"exact-state")
    hasher.update(domain_text.encode())
    hasher.update(b"\x1f")
    return hasher


def canonical_content_keys(domain_text: str) -> Callable[[bytes], str]:
    """``lambda canonical: canonical_content_key(domain_text, canonical)``, faster.

    The same BLAKE2b over the same bytes, the domain's part hashed once into a hasher that is
    only ever copied (a copy and one ``update`` instead of the keyword set-up, the domain's
    encoding and three updates): a survey names every new (group, output) state by it.
    """
    prefix = _content_hasher(domain_text)

    def key(canonical: bytes) -> str:
        hasher = prefix.copy()
        hasher.update(canonical)
        return hasher.hexdigest()

    return key


class StoredState(NamedTuple):
    """A likelihood array to keep in ``likelihood_states`` under ``key``.

    A named tuple, not a frozen dataclass: a diverged survey builds two or three per new state
    (the advance's, the one with the array's bytes, the one once they are stored), and a frozen
    dataclass's ``__init__`` sets each field by ``object.__setattr__`` (≈ 0.5 µs a build against
    ≈ 0.2 µs for ``tuple.__new__``, which ``survey_runs`` calls).
    """

    key: str
    state: bytes
    err: float


class Advance(NamedTuple):
    """What an accepted query changes: the object's accounting columns and its state row.

    A named tuple (built once per (decision group, output) of a survey: ``survey_runs``
    calls ``tuple.__new__``), as :class:`StoredState`.
    """

    columns: dict[str, Any]
    stored: StoredState | None
    #: ``stored`` is named by its content (:func:`content_key`), whatever the history.
    by_content: bool = False


def advance(
    after: ObjectSnapshot,
    *,
    domain_text: str,
    history_hash: str | None,
    query_text: str,
    output_text: str,
) -> Advance:
    """The ``objects`` columns of ``after`` (the snapshot past one more accepted query).

    ``history_hash`` is the row's hash before the query. The finite state is named by its
    content when exact (:func:`content_key`: objects whose histories hold the same outputs, in
    any order, share one stored array), else by the new history hash (:func:`state_key`).
    """
    loss = after.loss()
    new_history = next_history_hash(history_hash, query_text, output_text)
    stored = None
    by_content = False
    if isinstance(after.state, LikelihoodState):
        key = content_key(domain_text, after.state)
        by_content = key is not None
        if key is None:
            key = state_key(domain_text, new_history)
        stored = StoredState(key, after.state.to_bytes(), after.state.err)
    columns = {
        "state_hash": stored.key if stored else None,
        "state_pending": 0,
        "history_hash": new_history,
        "loss_lower": loss.lower,
        "loss_upper": loss.upper,
        "basic_total": str(after.basic_total),
        "f0_account": str(after.f0_account),
    }
    return Advance(columns, stored, by_content)


def advance_from(
    change: Advance,
    *,
    domain_text: str,
    history_hash: str | None,
    query_text: str,
    output_text: str,
) -> Advance:
    """:func:`advance` for another history whose snapshot is the one ``change`` was made on.

    A survey decides the members whose states are equal once (their histories may differ in
    order): the state after the answer, its loss and accounts are the same for all of them,
    only the history hash differs — and with it the key of an array stored by history.
    """
    new_history = next_history_hash(history_hash, query_text, output_text)
    columns = {**change.columns, "history_hash": new_history}
    stored = change.stored
    if stored is not None and not change.by_content:
        stored = StoredState(state_key(domain_text, new_history), stored.state, stored.err)
        columns["state_hash"] = stored.key
    return Advance(columns, stored, change.by_content)


def pending_columns(
    *,
    state_hash: str | None,
    pending: int,
    history_hash: str | None,
    query_text: str,
    output_text: str,
    loss: LossBounds,
    basic_total: Fraction | str,
    f0_account: Fraction | str,
) -> dict[str, Any]:
    """The ``objects`` columns after one more accepted query whose array is not stored.

    The object keeps naming the array ``state_hash`` (no state row written) and counts one more
    history entry it lacks; the other columns are :func:`advance`'s (``loss`` from
    :func:`~app.engine.pipeline.losses_after`).
    """
    return {
        "state_hash": state_hash,
        "state_pending": pending + 1,
        "history_hash": next_history_hash(history_hash, query_text, output_text),
        "loss_lower": loss.lower,
        "loss_upper": loss.upper,
        "basic_total": str(basic_total),
        "f0_account": str(f0_account),
    }


class StateGone(Exception):
    """A state this run stored was deleted meanwhile (no object named it any more): retry."""


def keep_states(
    conn: Tx,
    gained: Mapping[str, tuple[StoredState, int]],
    stored: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Make sure every state of ``gained`` stays stored for the objects about to name it.

    A state whose bytes ``gained`` holds is inserted or its row locked; one ``stored`` says is
    there already (a committed chunk of the run stored it, its bytes dropped since) is locked,
    :class:`StateGone` if it is not there after all. Nothing is counted and nothing deleted: a
    state no object names any more waits for :func:`collect_states`
    (:mod:`app.store.states`: why a state being named is never collected).
    """
    # each key asked once (another thread may add to the caller's set meanwhile), not the whole
    # set copied: a run's set grows to every state it stored, a chunk gains a few thousand
    known = [key in stored for key in gained]
    rows = [
        (key, state.state, state.err)
        for (key, (state, _)), there in zip(gained.items(), known, strict=True)
        if not there
    ]
    if any(not state for _, state, _ in rows):
        raise StateGone  # its bytes were dropped when stored, and it was forgotten since
    if name_states(conn, rows, [key for key, there in zip(gained, known, strict=True) if there]):
        raise StateGone


def collect_states(engine: Database) -> int:
    """Delete the stored states no object names, in a transaction of its own; how many."""
    with transaction(engine) as conn:
        return collect_unnamed(conn)


#: The Redis key a periodic collection sets (``NX``, expiring after the interval): one process
#: of a deployment collects per interval, not every web worker of every machine.
COLLECTED_KEY = "gatekeeper:states:collected"


def collect_states_periodically(engine: Database, *, redis: Any | None, seconds: float) -> int:
    """A web process's periodic :func:`collect_states`; how many it deleted (0: skipped).

    Without it a service taking only single submits would keep every state its objects named
    before their latest answer until a survey ended or the service restarted. With Redis, a
    process collects only if no process of the deployment did in the last ``seconds`` (a key
    set ``NX`` with that expiry); two collections at once would be safe anyway (each skips the
    rows the other has locked), only wasted. Without Redis each process collects on its own.
    """
    if redis is not None and not redis.set(
        COLLECTED_KEY, b"1", nx=True, px=max(1, int(seconds * 1000))
    ):
        return 0
    collected = collect_states(engine)
    if collected:
        log.info("deleted %d likelihood state(s) no object names", collected)
    return collected

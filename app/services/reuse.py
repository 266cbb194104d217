"""Reuse of identical answers (``"reuse": true``; DESIGN "Data versions and lifetime budgets").

**Identity.** Two queries are identical when their *canonical JSON* is: the query as the client
wrote it, keys sorted at every level, no whitespace (:func:`canonical_query`). Numbers keep the
form the request's JSON reader gave them, which is the contract's "decimals as written": ``0.1``,
``0.10`` and ``1e-1`` are one number (the engine reads each as the decimal 1/10), while ``1`` and
``1.0`` differ (an integer attribute takes the first and refuses the second), as they differ for
the engine. The hash of that text (:func:`query_hash`) is also a submit's idempotency
fingerprint, so one definition serves both. Queries that mean the same mechanism but are
written differently (a default spelt out, ``"in"`` values in another order) are not identical:
such a miss only costs a fresh, charged answer, never soundness.

**What is reused.** The earliest stored answer of the identical query in the object's *current*
data version — a single submit's row (``seq`` in ``(version_start, accepted]``) or a survey
member's answer — never one of a closed version. A caller reuses only answers it could read in
the history: an analyst (and any key of a project) only answers its own key asked; an unscoped
admin any answer. For a project key this keeps its quota's accounting exact without charging
anything: the reused output is already in the project's own sub-history (the quota filter's
input), so re-reading it adds nothing that filter has not counted — whereas another project's
output would be information from a sub-history the quota never saw.

**Nothing new recorded.** A reuse writes no history row, no object state, no version and no
audit event: the history holds no new information, and ``gatekeeper verify`` replays exactly
what was charged. It is counted in Prometheus (``gatekeeper_reused_answers_total``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from app.services.schemas import Odometer, SubmitResult
from app.store import Tx
from app.store import reuse as store
from app.store.chunks import Variant, chunks_covering, load_chunks
from app.store.history import HistoryItem
from app.store.objects import ObjectState
from app.store.surveys import GroupKey, member_rows

if TYPE_CHECKING:
    from app.services.survey_groups import ParsedQuery

#: Members read per batch by :func:`reusable_members` (a survey chunk's size).
_BATCH = 5000


#: The canonical form's encoder, made once: ``json.dumps`` with any keyword builds a new
#: ``JSONEncoder`` per call (≈ 1.4 µs of a submit's fingerprint); ``encode`` keeps no state
#: between calls, so one serves every thread. allow_nan: a NaN query must reach validation
#: (422), not crash the canonical form.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=True)


def canonical_query(query: Any) -> str:
    """The canonical JSON of a query as written: keys sorted, no whitespace.

    ``json.dumps(query, sort_keys=True, separators=(",", ":"), allow_nan=True)``.
    """
    return _CANONICAL.encode(query)


def query_hash(query: Any) -> str:
    """SHA-256 (hex) of :func:`canonical_query`: the reuse key and idempotency fingerprint."""
    return hashlib.sha256(canonical_query(query).encode()).hexdigest()


@dataclass(frozen=True)
class Reusable:
    """A stored answer an identical query may return: where it is and what it said."""

    seq: int
    variant: Variant
    #: The single submit's query id (None: a survey's answer).
    query_id: int | None
    #: The survey that asked it (None: a single submit).
    survey_id: int | None


def find_reusable(conn: Tx, row: ObjectState, qhash: str, owner: int | None) -> Reusable | None:
    """The earliest answer of the query hashed ``qhash`` in ``row``'s current data version.

    ``row`` is the object as read in this transaction: its history up to ``row.accepted`` has
    committed, and ``row.version_start`` separates the closed versions' entries, so an answer
    found here is of the version ``row.data_version`` whatever commits meanwhile.
    ``owner``: only answers that key asked (None: anyone's).
    """
    after, upto = row.version_start, row.accepted
    if upto <= after:
        return None
    best: Reusable | None = None
    submit = store.first_submit(
        conn, object_id=row.id, fingerprint=qhash, after=after, upto=upto, owner=owner
    )
    if submit is not None:
        best = Reusable(submit.seq, _variant(submit), submit.query_id, None)
    surveys = store.surveys_asking(conn, query_hash=qhash, owner=owner)
    if surveys:
        pairs = [pair for pair in chunks_covering(conn, row.id) if pair[0] in surveys]
        for chunk in load_chunks(conn, pairs).values():
            decision = chunk.answer(row.id)
            if decision is None or decision.variant is None or decision.reused:
                continue
            if after < decision.seq <= upto and (best is None or decision.seq < best.seq):
                best = Reusable(decision.seq, decision.variant, None, chunk.survey_id)
    return best


def _variant(submit: HistoryItem) -> Variant:
    return Variant(
        query=submit.query,
        output=submit.output,
        epsilon=submit.epsilon,
        epsilon_exact=submit.epsilon_exact,
        loss_lower=submit.loss_lower,
        loss_upper=submit.loss_upper,
        basic_after=submit.basic_after,
    )


def reused_body(row: ObjectState, found: Reusable, odometer: Odometer) -> SubmitResult:
    """The 200 answer of a reused submit: the stored output, the odometer as it is."""
    answer = SubmitResult(
        query_id=found.query_id,
        object_id=row.id,
        seq=found.seq,
        version=row.data_version,
        output=json.loads(found.variant.output),
        epsilon=found.variant.epsilon,
        odometer=odometer,
        reused=True,
    )
    if found.survey_id is None:  # a single submit's answer: no survey_id on the wire
        return answer
    return answer.model_copy(update={"survey_id": found.survey_id})


@dataclass(frozen=True)
class ChunkReuse:
    """The earliest reusable answer of each member of a chunk, by position in its ids.

    Arrays, not a pair per member: a chunk has 5,000 members and a survey up to millions.
    """

    #: The member has a reusable answer.
    hit: npt.NDArray[np.bool_]
    #: The answer's number in the member's history (0: none).
    seqs: npt.NDArray[np.int64]
    #: The answer's entry, an index into ``variants`` (-1: none).
    picks: npt.NDArray[np.int64]
    #: The distinct entries the answers are.
    variants: list[Variant]


def chunk_reusables(
    conn: Tx,
    *,
    ids: list[str],
    after: npt.NDArray[np.int64],
    upto: npt.NDArray[np.int64],
    qhash: str,
    owner: int | None,
    exclude_survey: int,
) -> ChunkReuse:
    """For a survey chunk's members (sorted ``ids``): the earliest reusable answer of each.

    ``after`` and ``upto``: per member (by position), its current version's entries are
    numbered ``(after, upto]`` (an empty range for a member that may not reuse). Reads the
    single submits by ``ix_queries_reuse`` and, per earlier survey of the same query, its chunks
    overlapping the chunk's id range — a few rows, not one lookup per member — and matches each
    such chunk against the members in one pass over its arrays.
    """
    n = len(ids)
    best = np.zeros(n, np.int64)  # the earliest answer's seq so far (0: none; seqs start at 1)
    source = np.full(n, -1, np.int64)  # its entry, an index into ``candidates``
    candidates: list[Variant] = []

    def offer(
        at: npt.NDArray[np.int64], seqs: npt.NDArray[np.int64], picks: npt.NDArray[np.int64]
    ) -> None:
        """Answers numbered ``seqs`` of the members at ``at``, entries ``candidates[picks]``."""
        keep = (after[at] < seqs) & (seqs <= upto[at])  # of the member's current version
        at, seqs, picks = at[keep], seqs[keep], picks[keep]
        # the earliest per member first, then only what beats what it holds
        order = np.lexsort((seqs, at))
        at, seqs, picks = at[order], seqs[order], picks[order]
        first = np.ones(len(at), np.bool_)
        first[1:] = at[1:] != at[:-1]
        at, seqs, picks = at[first], seqs[first], picks[first]
        better = (best[at] == 0) | (seqs < best[at])
        best[at[better]] = seqs[better]
        source[at[better]] = picks[better]

    submits = store.submits_of(conn, ids=ids, fingerprint=qhash, owner=owner)
    if submits:
        items = [(object_id, item) for object_id, found in submits.items() for item in found]
        offer(
            store.positions(ids, [object_id for object_id, _ in items]),
            np.array([item.seq for _, item in items], np.int64),
            np.arange(len(items), dtype=np.int64) + len(candidates),
        )
        candidates.extend(_variant(item) for _, item in items)
    surveys = store.surveys_asking(conn, query_hash=qhash, owner=owner) - {exclude_survey}
    ours: npt.NDArray[np.str_] | None = None
    for survey_id in sorted(surveys):
        for chunk in store.chunks_overlapping(
            conn, survey_id=survey_id, first=ids[0], last=ids[-1]
        ):
            if chunk.picks is None or chunk.seqs is None:
                continue
            size = min(len(chunk.members), len(chunk.picks), len(chunk.seqs))  # damaged: less
            picks = np.asarray(chunk.picks[:size], np.int64)
            seqs = np.asarray(chunk.seqs[:size], np.int64)
            # refused (pick < 0), itself a reuse (seq < 0), or damaged (no such entry)
            answered = (picks >= 0) & (seqs > 0) & (picks < len(chunk.variants))
            if chunk.members[:size] == ids:  # the same cohort cut the same way: position = index
                at = np.arange(size, dtype=np.int64)
            else:  # where each of its members is among ours (not every one need be)
                if ours is None:
                    ours = np.asarray(ids)
                theirs = np.asarray(chunk.members[:size])
                at = np.minimum(np.searchsorted(ours, theirs), n - 1).astype(np.int64)
                answered &= ours[at] == theirs
            offer(at[answered], seqs[answered], picks[answered] + len(candidates))
            candidates.extend(Variant(**variant) for variant in chunk.variants)
    hit = best > 0
    picks_out = np.full(n, -1, np.int64)
    variants: list[Variant] = []
    if hit.any():
        used, inverse = np.unique(source[hit], return_inverse=True)
        index: dict[Variant, int] = {}  # equal entries of different sources: one variant
        renumber = np.array(
            [index.setdefault(candidates[c], len(index)) for c in used.tolist()], np.int64
        )
        picks_out[hit] = renumber[inverse]
        variants = list(index)
    return ChunkReuse(hit, best, picks_out, variants)


def reuse_owner(key_id: int | None, *, admin: bool, scoped: bool) -> int | None:
    """Whose answers a caller may reuse: its own key's (None: anyone's, an unscoped admin)."""
    return None if admin and not scoped else key_id


def survey_reuse_owner(conn: Tx, key_id: int | None) -> int | None:
    """Whose answers a survey created by ``key_id`` may reuse (the rule of :func:`reuse_owner`).

    A survey made without a key (the command line) reuses anyone's, as an unscoped admin.
    """
    if key_id is None:
        return None
    role, project = store.key_reach(conn, key_id)
    return reuse_owner(key_id, admin=role == "admin", scoped=project is not None)


def reusable_members(
    conn: Tx,
    ids: Iterable[str],
    parsed: ParsedQuery,
    query: Any,
    owner: int | None,
) -> Iterator[tuple[str, GroupKey]]:
    """For a survey dry-run: each member (of sorted ``ids``) it would reuse, with its group key.

    Reads the members' rows without locking them, in batches, as a run's chunks would.
    """
    qhash = query_hash(query)
    batch: list[str] = []

    def flush() -> Iterator[tuple[str, GroupKey]]:
        rows = {row.id: row for row in member_rows(conn, batch, lock=False) if not row.retired}
        if not rows:
            return
        held = [rows.get(object_id) for object_id in batch]
        found = chunk_reusables(
            conn,
            ids=batch,
            after=np.array([0 if r is None else r.version_start for r in held], np.int64),
            upto=np.array([0 if r is None else r.accepted for r in held], np.int64),
            qhash=qhash,
            owner=owner,
            exclude_survey=0,
        )
        for at in np.flatnonzero(found.hit).tolist():
            row = rows[batch[at]]
            if parsed.mech(row.key.domain) is not None:
                yield row.id, row.key

    for object_id in ids:
        batch.append(object_id)
        if len(batch) == _BATCH:
            yield from flush()
            batch = []
    if batch:
        yield from flush()

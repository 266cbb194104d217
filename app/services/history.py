"""An object's accepted history: its single-submit rows and its survey answers, in order.

Single submits are rows of ``queries``; survey answers are packed in their survey's chunks
(:mod:`app.store.chunks`), found through the decided chunks whose id range covers the
object. Every reader of a history — continuous snapshots, ``gatekeeper verify``,
``GET /v1/objects/{id}/queries`` and the odometer history — goes through :func:`object_history`,
so both kinds are always seen together, ordered by their sequence numbers.

Consistency without a lock: the object's ``accepted`` count ``n`` is read first. Every entry of
its history has a sequence number, given as ``accepted + 1`` in the transaction that commits
it, so entries ``1..n`` had all committed when ``n`` was read, and anything committed later has
a larger number. The history is the entries numbered ``<= n`` — read in any order afterwards
— and there must be exactly ``n`` of them (:class:`HistoryMismatch` otherwise).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from app.store import Tx
from app.store import history as store
from app.store.chunks import Chunk, ChunkCache, chunks_covering, chunks_overlapping, shared_cache
from app.store.history import HistoryItem
from app.store.objects import accepted_count


class HistoryMismatch(LookupError):
    """The stored entries of an object's history are not exactly ``1..accepted``."""


def object_history(
    conn: Tx,
    object_id: str,
    *,
    after: int = 0,
    limit: int | None = None,
    analyst_key_id: int | None = None,
    chunks: ChunkCache | None = None,
    project_id: int | None = None,
) -> list[HistoryItem]:
    """The object's accepted queries with ``seq > after``, in order, at most ``limit``.

    ``analyst_key_id``: only the queries that analyst asked (its submits and its surveys');
    ``project_id``: only those its project's keys asked (the project's sub-history).
    Raises :class:`HistoryMismatch` when the stored entries are not ``1..accepted``.
    """
    accepted = accepted_count(conn, object_id=object_id)
    if not accepted:
        return []
    singles = store.count_submits(conn, object_id=object_id, upto=accepted)
    items = store.submits(
        conn,
        object_id=object_id,
        upto=accepted,
        after=after,
        analyst_key_id=analyst_key_id,
        limit=limit,
        project_id=project_id,
    )
    if singles < accepted:
        answers = _survey_answers(conn, object_id, accepted, chunks)
        if len(answers) + singles != accepted or len({r.seq for r in answers}) != len(answers):
            raise HistoryMismatch(
                f"{object_id}: accepted={accepted}, but {singles} submits and "
                f"{len(answers)} survey answers are stored"
            )
        if analyst_key_id is not None or project_id is not None:
            own = store.surveys_of(
                conn,
                analyst_key_id=analyst_key_id,
                among={r.survey_id for r in answers},
                project_id=project_id,
            )
            answers = [r for r in answers if r.survey_id in own]
        items.extend(r for r in answers if r.seq > after)
        items.sort(key=lambda item: item.seq)
    elif singles > accepted:  # pragma: no cover - seq <= accepted and unique (object, seq)
        raise HistoryMismatch(f"{object_id}: more submits stored than accepted")
    return items if limit is None else items[:limit]


def stored_entries(
    conn: Tx, object_id: str, *, chunks: ChunkCache | None = None
) -> list[HistoryItem]:
    """Every stored entry of the object's history, whatever ``accepted`` says, by ``seq``.

    For ``gatekeeper verify``, which compares them with the object's row; a decision reads
    :func:`object_history`.
    """
    items = store.submits(conn, object_id=object_id)
    items.extend(_survey_answers(conn, object_id, None, chunks))
    items.sort(key=lambda item: item.seq)
    return items


def object_histories(
    conn: Tx, accepted: Mapping[str, int], *, chunks: ChunkCache | None = None
) -> dict[str, list[HistoryItem]]:
    """:func:`object_history` (whole) of many objects in a few statements, whatever their number.

    ``accepted``: each object's ``accepted`` count as the caller read it, in this transaction
    (a survey chunk's members, whose rows it holds locked): the consistency argument above
    holds for each. One statement reads every single submit of the objects, one finds the
    decided chunks whose id range meets theirs, and the chunks not in ``chunks`` are loaded
    (100 a statement) — instead of four statements an object. Raises
    :class:`HistoryMismatch` as :func:`object_history` does.
    """
    ids = sorted(i for i, n in accepted.items() if n)
    found: dict[str, list[HistoryItem]] = {i: [] for i in accepted}
    submitted = store.submits_of(conn, ids)
    for object_id in ids:
        found[object_id] = [r for r in submitted.get(object_id, []) if r.seq <= accepted[object_id]]
    need = [i for i in ids if len(found[i]) < accepted[i]]
    answers: dict[str, list[HistoryItem]] = {i: [] for i in need}
    if need:
        spans = chunks_overlapping(conn, need[0], need[-1])
        loaded = (chunks or shared_cache(conn)).get_many(
            conn, [(s.survey_id, s.chunk) for s in spans]
        )
        for span, chunk in zip(spans, loaded, strict=True):
            start = bisect.bisect_left(need, span.first_id)
            stop = bisect.bisect_right(need, span.last_id)
            for object_id in need[start:stop]:
                item = _answer_item(chunk, object_id, accepted[object_id])
                if item is not None:
                    answers[object_id].append(item)
    for object_id in ids:
        singles, more = len(found[object_id]), answers.get(object_id, [])
        if len(more) + singles != accepted[object_id] or len({r.seq for r in more}) != len(more):
            raise HistoryMismatch(
                f"{object_id}: accepted={accepted[object_id]}, but {singles} submits and "
                f"{len(more)} survey answers are stored"
            )
        if more:
            found[object_id].extend(more)
            found[object_id].sort(key=lambda item: item.seq)
    return found


def _survey_answers(
    conn: Tx, object_id: str, upto: int | None, chunks: ChunkCache | None
) -> list[HistoryItem]:
    """The object's survey answers (numbered ``<= upto``), from the chunks covering it."""
    pairs = chunks_covering(conn, object_id)
    found = []
    for chunk in (chunks or shared_cache(conn)).get_many(conn, pairs):
        item = _answer_item(chunk, object_id, upto)
        if item is not None:
            found.append(item)
    return found


def _answer_item(chunk: Chunk, object_id: str, upto: int | None) -> HistoryItem | None:
    """The object's answer in ``chunk`` as a history entry (numbered ``<= upto``), if any."""
    decision = chunk.answer(object_id)
    if decision is None or decision.variant is None or decision.reused:
        return None  # not a member (the range only covers it), refused, or a reused answer
    if upto is not None and decision.seq > upto:
        return None  # committed after the count was read
    v = decision.variant
    return HistoryItem(
        seq=decision.seq,
        query=v.query,
        output=v.output,
        epsilon=v.epsilon,
        epsilon_exact=v.epsilon_exact,
        loss_lower=v.loss_lower,
        loss_upper=v.loss_upper,
        basic_after=v.basic_after,
        created_at=chunk.decided_at,
        query_id=None,
        survey_id=chunk.survey_id,
    )

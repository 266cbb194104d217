"""The filter's decision on an object's snapshot, and the snapshot after an output.

The one road into the engine for the service: a single submit, a dry-run and each decision
group of a survey call these two functions, which call :func:`app.engine.pipeline.evaluate` and
:func:`app.engine.pipeline.record`. Finite objects are computed in the calling thread;
continuous ones by the bound worker, with basic composition as the sound fallback past its
deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app import metrics
from app.engine.continuous.state import ContinuousState
from app.engine.filters import Decision
from app.engine.likelihood import LikelihoodState
from app.engine.mechanisms import Mechanism, Output
from app.engine.pipeline import (
    ObjectSnapshot,
    basic_decision,
    evaluate,
    evaluate_many,
    loss_without_search,
    record,
    with_lifetime,
)
from app.worker.pool import BoundWorker

#: Finite objects' bounds are computed by the accountant in the calling thread (the worker pool
#: times its own computations: ``engine="calculator"``).
_ACCOUNTANT_SECONDS = metrics.BOUND_SECONDS.labels("accountant")


def decide(
    snapshot: ObjectSnapshot, mech: Mechanism, worker: BoundWorker, *, tight: bool
) -> Decision:
    """The filter's decision through :func:`app.engine.pipeline.evaluate`.

    Finite objects are decided in the calling thread; continuous ones by the bound worker
    (unless basic composition certifies the query, which costs nothing), with basic
    composition's decision as the fallback past its deadline.
    """
    if isinstance(snapshot.state, LikelihoodState):
        with _ACCOUNTANT_SECONDS.time():
            return evaluate(snapshot, mech, tight=tight)
    if not tight:
        quick = basic_decision(snapshot, mech)
        if quick.accepted:
            return quick
    # the worker decides the version's filter (snapshots travel without their lifetime)
    decision = worker.evaluate(snapshot, mech, fallback=lambda: basic_decision(snapshot, mech))
    return with_lifetime(snapshot, decision)


def decide_many(
    snapshots: Sequence[ObjectSnapshot], mech: Mechanism, worker: BoundWorker
) -> list[Decision]:
    """:func:`decide` (not ``tight``) of every snapshot; finite ones together.

    A survey chunk's members that decide alone: :func:`app.engine.pipeline.evaluate_many`
    for the finite snapshots (the same filter code on the same inputs, their arrays computed
    together), :func:`decide` for the others.
    """
    finite = [n for n, s in enumerate(snapshots) if isinstance(s.state, LikelihoodState)]
    found: list[Decision | None] = [None] * len(snapshots)
    if finite:
        with _ACCOUNTANT_SECONDS.time():
            decided = evaluate_many([snapshots[n] for n in finite], mech)
        for n, decision in zip(finite, decided, strict=True):
            found[n] = decision
    return [
        decision if decision is not None else decide(snapshot, mech, worker, tight=False)
        for snapshot, decision in zip(snapshots, found, strict=True)
    ]


def recorded(
    snapshot: ObjectSnapshot,
    decision: Decision,
    mech: Mechanism,
    output: Output,
    worker: BoundWorker,
) -> ObjectSnapshot:
    """The snapshot after ``output`` (:func:`app.engine.pipeline.record`), its loss bounded.

    A continuous history whose new loss the decision did not search is bounded by the worker
    (two searches); past its deadline, by basic composition within the decision's bounds.
    """
    if isinstance(snapshot.state, LikelihoodState):
        with _ACCOUNTANT_SECONDS.time():
            return record(snapshot, mech, output, decision)
    after = record(snapshot, mech, output, decision)
    state = after.state
    if isinstance(state, ContinuousState) and not state.loss_known:
        bounds = worker.realized_loss(after, fallback=lambda: loss_without_search(after))
        after = replace(after, state=state.seeded(bounds))
    return after

"""One road into the engine: an object's public snapshot in, a decision and the next snapshot out.

Every decision — dry-run, submit, the loss calculator, ``verify``, the basic-composition fallback
and, next, each member of a population survey — goes through the functions of this module:

* :class:`ObjectSnapshot` holds everything public about an object: its domain, budget, filter,
  the exact ``Σ ε_i`` and the history's state — the finite likelihood array, or the continuous
  history's parsed terms seeded with the certified bounds stored for it. Never the value.
* :func:`evaluate` gives the filter's :class:`~app.engine.filters.Decision` on a candidate query
  with certified per-output bounds (marked ``tight`` when computed, not only Lemma 6.1's).
* :func:`record` gives the snapshot after an accepted query's output, reusing what the decision
  computed for that output (no second search).

Both are pure: the snapshot they are given is never changed, so one snapshot can be shared by
many objects with the same history (a survey) and cached by object version (the service). The
bound worker runs these same calls in its processes, on continuous snapshots sent as JSON
(:meth:`~app.engine.continuous.state.ContinuousState.to_json`).

>>> from app.engine.domain import parse_domain
>>> from app.engine.mechanisms import parse_query
>>> domain = parse_domain({"attributes": [{"name": "d", "type": "categorical",
...                                        "values": ["a", "b", "c"]}]})
>>> snap = ObjectSnapshot.empty(domain, budget=1.0, filter=FilterKind.BAYESIAN)
>>> grr = parse_query({"mechanism": "grr", "attribute": "d", "epsilon": 0.8}, domain)
>>> first = evaluate(snap, grr)
>>> first.accepted, first.candidate.tight   # basic composition certifies it: nothing computed
(True, False)
>>> snap = record(snap, grr, 0, first)
>>> second = evaluate(snap, grr)            # 0.8 + 0.8 > 1: the per-output bounds decide
>>> second.accepted, second.candidate.tight
(False, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from app.engine.approx import OutputIndependentFilter
from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.continuous.candidate import evaluate_continuous
from app.engine.continuous.state import ContinuousState
from app.engine.domain import Domain
from app.engine.exact import fractions_of, keep_moved_units, losses_many, moved_losses_many
from app.engine.filters import (
    CandidateEvaluation,
    Decision,
    FilterKind,
    OutputLoss,
    basic_evaluation,
    decide,
    evaluate_candidate,
)
from app.engine.jsonfields import as_list, as_object, check_keys, path
from app.engine.lifetime import Lifetime
from app.engine.likelihood import LikelihoodState, LossBounds, exact_bounds
from app.engine.limits import DEFAULT_LIMITS, EngineLimits, for_history
from app.engine.mechanisms import Mechanism, Output, parse_query
from app.engine.mechanisms.base import output_index
from app.engine.numerics import DECISION_MARGIN, float_up


@dataclass(frozen=True)
class BasicState:
    """A history known only by its ``Σ ε_i``: its loss lies in ``[0, Σ ε_i]`` (Lemma 6.1).

    The state of last resort — when a search cannot finish in time, every bound still holds.
    """

    def loss(self, cap: Fraction | None = None) -> LossBounds:
        """``[0, Σ ε_i]`` (``cap`` is the exact ``Σ ε_i``)."""
        return LossBounds(0.0, math.inf if cap is None else float_up(cap))


State = LikelihoodState | ContinuousState | BasicState


@dataclass(frozen=True)
class HistoryEntry:
    """One accepted query of a history and the output it gave."""

    mechanism: Mechanism
    output: Output


@dataclass(frozen=True)
class ObjectSnapshot:
    """Everything public about one object at one version: what a decision may read.

    ``state`` is the finite likelihood array (:class:`LikelihoodState`) or the continuous
    history's terms (:class:`ContinuousState`); ``basic_total`` the exact ``Σ ε_i``;
    ``f0_account`` F₀'s account and ``delta`` δ_g (``approx_bayesian``, Algorithm 4);
    ``lifetime`` the object's lifetime budget and its closed versions' losses (None: no
    lifetime budget), checked after the version's own filter (:func:`with_lifetime`).
    """

    domain: Domain
    budget: float
    filter: FilterKind
    basic_total: Fraction
    state: State
    limits: EngineLimits = DEFAULT_LIMITS
    delta: float | None = None
    f0_account: Fraction = Fraction(0)
    lifetime: Lifetime | None = None

    @classmethod
    def empty(
        cls,
        domain: Domain,
        *,
        budget: float,
        filter: FilterKind,
        limits: EngineLimits = DEFAULT_LIMITS,
        bnb: BnBSettings | None = None,
        delta: float | None = None,
    ) -> ObjectSnapshot:
        """An object without history (``delta``: δ_g of an ``approx_bayesian`` object)."""
        state = empty_state(domain, bnb)
        return cls(domain, budget, filter, Fraction(0), state, limits, delta)

    @property
    def phase(self) -> str | None:
        """Algorithm 4's phase (``approx_bayesian`` objects only, else None)."""
        f0 = self.f0
        if self.filter is not FilterKind.APPROX_BAYESIAN or f0 is None:
            return None
        return f0.phase(self.f0_account)

    @property
    def f0(self) -> OutputIndependentFilter | None:
        """F₀ for the snapshot's budget, δ_g and domain size (None without a δ_g)."""
        if self.delta is None:
            return None
        return f0_filter(self.budget, self.delta, self.domain)

    def loss(self) -> LossBounds:
        """Certified bounds on the realized loss of the history (capped by exact Σε)."""
        return self.state.loss(self.basic_total)

    @property
    def bnb(self) -> BnBSettings:
        """The settings of this snapshot's searches (defaults for a finite or basic state)."""
        if isinstance(self.state, ContinuousState):
            return self.state.settings
        return BnBSettings()

    def with_bnb(self, settings: BnBSettings) -> ObjectSnapshot:
        """The same snapshot whose continuous searches run with ``settings``."""
        if isinstance(self.state, ContinuousState):
            return replace(self, state=self.state.with_settings(settings))
        return self


def empty_state(
    domain: Domain, bnb: BnBSettings | None = None
) -> LikelihoodState | ContinuousState:
    """The state of an empty history: ``log P = 0`` everywhere, or no terms."""
    if domain.is_finite:
        return LikelihoodState(domain)
    return ContinuousState(domain, bnb or BnBSettings())


def history_entry(
    domain: Domain,
    raw_query: Any,
    raw_output: Any,
    field: str = "history",
    *,
    limits: EngineLimits = DEFAULT_LIMITS,
) -> HistoryEntry:
    """One recorded ``(query, output)`` parsed; ``field`` names the entry in errors.

    A history records what happened: any ε > 0 in it is replayed (:func:`for_history`).
    """
    query_field = path(field, "query")
    mechanism = parse_query(raw_query, domain, query_field, limits=for_history(limits))
    return HistoryEntry(mechanism, mechanism.parse_output(raw_output, path(field, "output")))


def parse_history(
    domain: Domain, raw: Any, field: str = "history", *, limits: EngineLimits = DEFAULT_LIMITS
) -> list[HistoryEntry]:
    """Validate a JSON history (``[{"query", "output"}, ...]``), naming any bad field."""
    items = as_list(raw, field, max_len=limits.max_history)
    entries = []
    for i, item in enumerate(items):
        item_field = path(field, i)
        obj = as_object(item, item_field)
        check_keys(obj, item_field, required=("query", "output"))
        entry = history_entry(domain, obj["query"], obj["output"], item_field, limits=limits)
        entries.append(entry)
    return entries


def fold_history(
    domain: Domain,
    entries: Sequence[HistoryEntry],
    *,
    bnb: BnBSettings | None = None,
    field: str = "history",
) -> tuple[LikelihoodState | ContinuousState, Fraction]:
    """The state of a history and its exact ``Σ ε_i`` (the one place a history is replayed).

    F₀'s account of it is :func:`history_account`.
    """
    state = empty_state(domain, bnb)
    basic = Fraction(0)
    for i, entry in enumerate(entries):
        basic = fold_step(state, basic, entry, i, field=field)
    return state, basic


def fold_step(
    state: LikelihoodState | ContinuousState,
    basic: Fraction,
    entry: HistoryEntry,
    index: int,
    *,
    field: str = "history",
) -> Fraction:
    """One step of :func:`fold_history`: ``entry`` folded into ``state`` (changed in place).

    ``entry`` is the history's ``index``-th (from 0); returns ``Σ ε_i`` after it, ``basic``
    before. A replay that keeps a prefix's state (``gatekeeper verify``) takes the next step
    from a copy of it: the same state, bit for bit, as folding the longer history from the start.
    """
    if isinstance(state, LikelihoodState):
        state.apply(entry.mechanism.term(entry.output))
    else:
        state.record(entry.mechanism, entry.output, path(path(field, index), "query"))
    return basic + entry.mechanism.epsilon_exact


def domain_points(domain: Domain) -> int | None:
    """The number of points of a finite domain, None for a continuous one."""
    return domain.size if domain.is_finite else None


def f0_filter(budget: float, delta: float, domain: Domain) -> OutputIndependentFilter:
    """F₀ (:mod:`app.engine.approx`) for ``(budget, delta)`` on ``domain``.

    Its order and threshold depend on the domain's size; it is unavailable on a continuous one.
    """
    return OutputIndependentFilter.for_points(budget, delta, domain_points(domain))


def history_account(
    entries: Sequence[HistoryEntry], budget: float, delta: float | None, domain: Domain
) -> Fraction:
    """F₀'s account of a history under ``(budget, delta)`` on ``domain`` (0 without a δ_g)."""
    if delta is None:
        return Fraction(0)
    f0 = f0_filter(budget, delta, domain)
    return sum((f0.charge(e.mechanism.epsilon_exact) for e in entries), Fraction(0))


def candidate_bounds(
    snapshot: ObjectSnapshot,
    mechanism: Mechanism,
    *,
    target: float | None = None,
    field_path: str = "query",
) -> CandidateEvaluation:
    """Certified bounds on the realized loss after each output of ``mechanism``.

    Finite domains: exact per output (Algorithm 2's inner loop). Continuous domains: a cheap
    bound first, which is kept when every output's upper bound is within ``target``; otherwise
    two branch-and-bound searches per output (kept in ``searched`` for :func:`record`).
    """
    if isinstance(snapshot.state, LikelihoodState):
        return evaluate_candidate(
            snapshot.state,
            mechanism,
            max_listed=snapshot.limits.max_listed_outputs,
            basic_total=snapshot.basic_total,
        )
    if isinstance(snapshot.state, BasicState):
        return basic_evaluation(mechanism, snapshot.basic_total, snapshot.limits.max_listed_outputs)
    return evaluate_continuous(
        snapshot.state,
        mechanism,
        basic_total=snapshot.basic_total,
        target=target,
        field_path=field_path,
    )


def _decide(
    snapshot: ObjectSnapshot, candidate: CandidateEvaluation, kind: FilterKind | None = None
) -> Decision:
    """Filter ``kind`` (the snapshot's own by default) on ``candidate`` against the history."""
    return decide(
        kind=kind or snapshot.filter,
        budget=snapshot.budget,
        loss_now=snapshot.loss(),
        basic_total=snapshot.basic_total,
        candidate=candidate,
        f0_account=snapshot.f0_account,
        f0=snapshot.f0,
    )


def basic_decision(snapshot: ObjectSnapshot, mechanism: Mechanism) -> Decision:
    """The filter applied to bounds of basic composition alone (Lemma 6.1): free, sound.

    Every bound in it is certified, so an acceptance here is the acceptance the full evaluation
    gives; a rejection may not be (the per-output bounds can be far below ``Σ ε_i + ε``).
    """
    listed = snapshot.limits.max_listed_outputs
    decision = _decide(snapshot, basic_evaluation(mechanism, snapshot.basic_total, listed))
    return with_lifetime(snapshot, decision)


def with_lifetime(snapshot: ObjectSnapshot, decision: Decision) -> Decision:
    """The decision refused ``lifetime-exhausted`` when the lifetime budget does not admit it.

    Checked only after the version's own filter accepted (its refusal stays
    ``budget-exhausted``): every output must keep ``Σ_{u≠v} L_u + L_v ≤ ε_L``
    (:class:`~app.engine.lifetime.Lifetime`). Applying it twice changes nothing.
    """
    lifetime = snapshot.lifetime
    if lifetime is None or not decision.accepted or lifetime.admits(decision.candidate):
        return decision
    worst = lifetime.worst_after(decision.candidate)
    reason = (
        f"an output of the query would raise the realized loss over the object's life to "
        f"{worst:.6g}, above its lifetime budget ({lifetime.budget:g})"
    )
    phase = snapshot.phase if decision.phase is not None else None
    return replace(
        decision, accepted=False, reason=reason, refusal="lifetime-exhausted", phase=phase
    )


def evaluate(snapshot: ObjectSnapshot, mechanism: Mechanism, *, tight: bool = False) -> Decision:
    """The filter's decision on ``mechanism`` for this snapshot. Never reads a value.

    Basic composition is tried first: when it certifies the query (and, for ``simplified``,
    whenever the stored loss plus ε fits) nothing is computed, and the decision says its bounds
    are not tight. Otherwise — or always, with ``tight`` (a dry-run shows per-output bounds) —
    the per-output bounds are computed (:func:`candidate_bounds`) and decide. Continuous searches
    stop early once they certify the budget minus the decision margin. A snapshot with a
    lifetime budget is then checked against it (:func:`with_lifetime`).
    """
    if not tight:
        quick = basic_decision(snapshot, mechanism)
        if quick.accepted:
            return quick
    return _evaluated(snapshot, mechanism)


def _evaluated(
    snapshot: ObjectSnapshot, mechanism: Mechanism, candidate: CandidateEvaluation | None = None
) -> Decision:
    """The filter on the per-output bounds (``candidate``, computed here when None)."""
    if candidate is None:
        target = snapshot.budget - DECISION_MARGIN
        if (lifetime := snapshot.lifetime) is not None:  # searches certify the lifetime's room
            target = min(target, lifetime.budget - lifetime.closed.upper - DECISION_MARGIN)
        candidate = candidate_bounds(snapshot, mechanism, target=target)
    return with_lifetime(snapshot, _decide(snapshot, candidate))


def evaluate_many(snapshots: Sequence[ObjectSnapshot], mechanism: Mechanism) -> list[Decision]:
    """:func:`evaluate` (not ``tight``) of every snapshot, finite histories computed together.

    A survey chunk's members that decide alone (each history its own since an ``olh``
    answer) were each decided by :func:`evaluate`. Here, with the same filter code
    (:func:`_decide`, :func:`with_lifetime`) on the same inputs:

    * the realized losses of exact histories are computed at once
      (:func:`~app.engine.exact.losses_many`);
    * basic composition's evaluation is built once per ``Σ ε_i`` (it depends on nothing
      else) and decides every snapshot it certifies;
    * for the others, on exact histories and a ``grr`` or table (``binary_rr``) query, the
      exact loss after every output of every history is one array (members × outputs,
      :func:`~app.engine.exact.moved_losses_many`: the top two and bottom two per member for
      ``grr``). The evaluation lists the worst output only (the first in output order): the
      decision, its reason, the worst case and the exact charge are :func:`evaluate`'s, but
      not its list of per-output bounds, which a survey never shows. Every other snapshot is
      evaluated alone (:func:`candidate_bounds`).
    """
    exact = [
        s.state.exact
        for s in snapshots
        if isinstance(s.state, LikelihoodState) and s.state.exact is not None
    ]
    if exact:
        losses_many(exact)
    found: list[Decision | None] = [None] * len(snapshots)
    basic: dict[tuple[Fraction, int], CandidateEvaluation] = {}
    quicks: dict[tuple[Any, ...], Decision] = {}
    rest: list[int] = []
    for n, snapshot in enumerate(snapshots):
        listed = snapshot.limits.max_listed_outputs
        evaluation = basic.get((snapshot.basic_total, listed))
        if evaluation is None:
            evaluation = basic_evaluation(mechanism, snapshot.basic_total, listed)
            basic[(snapshot.basic_total, listed)] = evaluation
        # every input of basic composition's decision: equal inputs, the same (frozen) decision
        key = _decision_inputs(snapshot, evaluation)
        quick = quicks.get(key)
        if quick is None:
            quick = quicks[key] = with_lifetime(snapshot, _decide(snapshot, evaluation))
        if quick.accepted:
            found[n] = quick
        else:
            rest.append(n)
    candidates = _exact_candidates([snapshots[n] for n in rest], mechanism)
    for n, candidate in zip(rest, candidates, strict=True):
        found[n] = _evaluated(snapshots[n], mechanism, candidate)
    return [decision for decision in found if decision is not None]


def _decision_inputs(snapshot: ObjectSnapshot, candidate: CandidateEvaluation) -> tuple[Any, ...]:
    """What :func:`_decide` and :func:`with_lifetime` read of a snapshot, with the candidate.

    The filter, budget, δ_g and domain (F₀'s size), the exact ``Σ ε_i`` and F₀'s account, the
    realized loss's bounds and exact value (:class:`LossBounds` compares only the bounds), the
    lifetime budget and its closed losses (exact value too), and the candidate (by identity).
    """
    loss = snapshot.loss()
    lifetime = snapshot.lifetime
    closed = None if lifetime is None else (lifetime, lifetime.closed.value)
    return (
        snapshot.filter,
        snapshot.budget,
        snapshot.delta,
        id(snapshot.domain),
        snapshot.basic_total,
        snapshot.f0_account,
        loss.lower,
        loss.upper,
        loss.value,
        closed,
        id(candidate),
    )


def _exact_candidates(
    snapshots: Sequence[ObjectSnapshot], mechanism: Mechanism
) -> list[CandidateEvaluation | None]:
    """The worst output's exact bounds of each exact history, for ``grr``/table queries.

    None for a snapshot whose state is not exact (or past ``int64``), or for every one when
    the query has no vectorised exact form.
    """
    found: list[CandidateEvaluation | None] = [None] * len(snapshots)
    query = mechanism.exact_query()
    picked = [
        n
        for n, s in enumerate(snapshots)
        if isinstance(s.state, LikelihoodState) and s.state.exact is not None
    ]
    if query is None or not picked:
        return found
    histories = [snapshots[n].state.exact for n in picked]  # type: ignore[union-attr]
    exact = [h for h in histories if h is not None]
    batches = moved_losses_many(exact, query)
    if batches is None:
        return found
    keep_moved_units(exact, query, batches)  # every output's loss: a survey's next states'
    cache: dict[tuple[int, int], Fraction] = {}
    for members, units, denominator in batches:
        if units is None:
            continue
        worst_at = units.argmax(axis=1)
        worst = fractions_of(units[np.arange(len(members)), worst_at], denominator, cache)
        for row, m in enumerate(members):
            history = histories[m]
            assert history is not None  # noqa: S101 - picked above
            loss = worst[row]
            bounds = exact_bounds(loss)
            output = OutputLoss(
                mechanism.output_json(int(worst_at[row])), bounds.lower, bounds.upper
            )
            found[picked[m]] = CandidateEvaluation(
                mechanism.epsilon,
                mechanism.epsilon_exact,
                (output,),
                float(loss),
                False,
                exact_worst=loss,
                exact_charged=history.loss() + mechanism.epsilon_exact,
            )
    return found


def record(
    snapshot: ObjectSnapshot, mechanism: Mechanism, output: Output, decision: Decision | None
) -> ObjectSnapshot:
    """The snapshot after ``output`` of an accepted ``mechanism``; ``snapshot`` is unchanged.

    Finite domains: the likelihood array plus the output's term, renormalised (a new array).
    Continuous domains: the history plus one term. The bounds ``decision`` computed for this
    output are reused — a search's result for the extended history is its loss; any bounds it
    listed cap it (both are certified, and a later search stopped by a limit could come back
    looser than what accepted the query). Without a search result the new loss is searched for
    when first read (:meth:`ObjectSnapshot.loss`).
    """
    basic, account = accounts_after(snapshot, mechanism)
    state = snapshot.state
    if isinstance(state, LikelihoodState):  # one replace (a submit's hot path)
        applied = state.applied(mechanism.term(output), _known_exact_loss(state, mechanism, output))
        return replace(snapshot, f0_account=account, basic_total=basic, state=applied)
    snapshot = replace(snapshot, f0_account=account)
    if isinstance(state, BasicState):
        return replace(snapshot, basic_total=basic)
    known, decided = None, None
    if decision is not None:
        candidate = decision.candidate
        known = candidate.searched.get(output_index(output))
        listed = mechanism.output_json(output)
        for entry in candidate.per_output:
            if entry.output == listed:
                decided = (entry.lower, entry.upper)
    after = state.extended(mechanism, output, known=known, decided=decided)
    return replace(snapshot, basic_total=basic, state=after)


def _known_exact_loss(
    state: LikelihoodState, mechanism: Mechanism, output: Output
) -> Fraction | None:
    """The exact loss after ``output`` if the decision already computed it, else None.

    A decision on an exact history computes the loss after every output of a randomized-
    response query (:meth:`~app.engine.exact.ExactLoss.candidate_losses`, kept on the form);
    for ``grr`` and table queries, the loss after output ``y`` is entry ``output_index(y)``
    (:meth:`~app.engine.mechanisms.base.Mechanism.exact_units_after`'s rule, which a mechanism
    with its own shortcut, ``olh``, does not follow). The new form's full loss is then not
    computed again.
    """
    exact = state.exact
    if exact is None or not exact.has_kept_candidates():  # basic composition decided: none
        return None
    if type(mechanism).exact_losses_after is not Mechanism.exact_losses_after:
        return None
    query = mechanism.exact_query()
    if query is None or query.kind not in ("grr", "table"):
        return None
    known = exact.kept_candidate_losses(query)
    if known is None:
        return None
    index = output_index(output)
    return known[index] if 0 <= index < len(known) else None


def accounts_after(snapshot: ObjectSnapshot, mechanism: Mechanism) -> tuple[Fraction, Fraction]:
    """The exact ``Σ ε_i`` and F₀'s account after one more accepted ``mechanism`` (any output)."""
    basic = snapshot.basic_total + mechanism.epsilon_exact
    account = snapshot.f0_account
    if (f0 := snapshot.f0) is not None:
        account += f0.charge(mechanism.epsilon_exact)
    return basic, account


def losses_after(
    mechanism: Mechanism,
    snapshots: Sequence[ObjectSnapshot],
    outputs: Sequence[Output],
    owners: Sequence[int],
    decisions: Sequence[Decision | None],
) -> list[LossBounds]:
    """The realized loss after each output of an accepted ``mechanism`` (finite domains).

    Output ``i`` is recorded on ``snapshots[owners[i]]`` (accepted by ``decisions[owners[i]]``):
    ``record(snapshot, mechanism, y, decision).loss()`` for every one, without keeping the
    states — a survey's ``olh`` answers each make a history of their own, whose array nobody
    shares (:attr:`~app.engine.mechanisms.base.Mechanism.distinct_outputs`). On exact
    (randomized-response) histories the mechanism's vectorised shortcut gives every exact loss
    at once (:meth:`~app.engine.mechanisms.base.Mechanism.exact_losses_after`); the outputs
    of other histories are recorded one by one.
    """
    found: list[LossBounds | None] = [None] * len(outputs)
    exact = [s.state.exact if isinstance(s.state, LikelihoodState) else None for s in snapshots]
    fast = [i for i, owner in enumerate(owners) if exact[owner] is not None]
    if fast:
        histories = [e for e in exact if e is not None]
        renumber = {o: n for n, o in enumerate(o for o, e in enumerate(exact) if e is not None)}
        losses = mechanism.exact_losses_after(
            histories, [outputs[i] for i in fast], [renumber[owners[i]] for i in fast]
        )
        if losses is not None:
            bounds: dict[Fraction, LossBounds] = {}  # few distinct losses: each bracketed once
            for i, loss in zip(fast, losses, strict=True):
                bracket = bounds.get(loss)
                if bracket is None:
                    bracket = bounds[loss] = exact_bounds(loss)
                found[i] = bracket
    return [
        bounds
        if bounds is not None
        else record(snapshots[owners[i]], mechanism, outputs[i], decisions[owners[i]]).loss()
        for i, bounds in enumerate(found)
    ]


def realized_loss(snapshot: ObjectSnapshot) -> LossBounds:
    """Certified bounds on the snapshot's loss; searches a continuous history not yet bounded.

    What the bound worker runs after :func:`record` when the decision did not search the
    recorded output (two searches: ``max`` and ``min`` of ``log P``).
    """
    return snapshot.loss()


def loss_without_search(snapshot: ObjectSnapshot) -> LossBounds:
    """Sound bounds on the snapshot's loss at no cost: ``[0, Σ ε_i]`` (Lemma 6.1).

    Within the bounds the last decision used; the fallback when a search cannot finish in time.
    """
    if isinstance(snapshot.state, ContinuousState):
        return snapshot.state.loss_without_search(snapshot.basic_total)
    return snapshot.loss()


def decisions_by_filter(
    snapshot: ObjectSnapshot, evaluation: CandidateEvaluation
) -> dict[str, bool]:
    """Whether each filter accepts, from one evaluation (the calculator's ``accepted``).

    ``approx_bayesian`` is listed when the snapshot has a δ_g.
    """
    return {
        kind.value: _decide(snapshot, evaluation, kind).accepted
        for kind in FilterKind
        if kind is not FilterKind.APPROX_BAYESIAN or snapshot.delta is not None
    }

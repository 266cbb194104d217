r"""Privacy filters: Bayesian (Algorithm 2), simplified Bayesian (Algorithm 3) and basic.

All three decide from public information only — the recorded history and the candidate query —
never from the object's value.

* **bayesian** accepts iff for *every* output ``y`` of the query the certified upper bound of the
  realized loss of ``history + (query, y)`` is at most the budget (Corollary 4.1).
* **simplified** accepts iff ``loss_upper(history) + ε ≤ ε_g`` (eq. 29), ε the tight ε.
* **basic** accepts iff ``Σ ε_i + ε ≤ ε_g``, summed exactly in rationals.

Comparison rule. Float comparisons use certified upper bounds and the budget minus
:data:`~app.engine.numerics.DECISION_MARGIN`, so rounding and ties reject. Randomized-response
histories are the exception (:mod:`app.engine.exact`): their loss is a sum of written ε's,
computed exactly and compared exactly with the budget as written, so a worst case equal to the
budget is accepted, as Algorithm 2 (and Theorem D.1) say: ten ``binary_rr`` of ε = 0.1 fit a
budget of 1.0 under every filter. Their bounds are reported as the nearest double of the exact
loss, ``"exact": true``. Basic composition is summed in exact rationals (ε as written,
``0.1 -> 1/10``), so ten queries of ``ε = 0.1`` fit a budget of exactly 1. Because
``loss ≤ Σ ε_i`` always holds (Lemma 6.1), the Bayesian and simplified filters also accept
whenever basic composition does: they never accept fewer queries than basic composition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from app.engine.approx import BAYESIAN, OUTPUT_INDEPENDENT, OutputIndependentFilter
from app.engine.exact import ExactLoss, ExactQuery
from app.engine.likelihood import LikelihoodState, LossBounds, bounds_from, exact_bounds
from app.engine.mechanisms import CandidateLosses, Mechanism
from app.engine.numerics import DECISION_MARGIN, decimal_fraction, float_up

if TYPE_CHECKING:
    from app.engine.continuous.state import ContinuousLoss


class FilterKind(StrEnum):
    """The filters an object can be protected by."""

    BAYESIAN = "bayesian"
    SIMPLIFIED = "simplified"
    BASIC = "basic"
    #: Algorithm 4: the output-independent (ε_g, δ_g) filter F₀ (:mod:`app.engine.approx`),
    #: then the Bayesian filter on the realized loss.
    APPROX_BAYESIAN = "approx_bayesian"


@dataclass(frozen=True)
class OutputLoss:
    """Bounds on the realized loss after one output of a candidate query.

    Certified bounds, or (``exact``) both the nearest double of the exact loss, as
    :class:`~app.engine.likelihood.LossBounds`.
    """

    output: Any
    lower: float
    upper: float

    @property
    def exact(self) -> bool:
        """Whether ``upper`` is the nearest double of the loss (the bounds coincide)."""
        return self.lower == self.upper

    def to_json(self) -> dict[str, Any]:
        """``{"output", "lower", "upper", "exact"}``."""
        return {
            "output": self.output,
            "lower": self.lower,
            "upper": self.upper,
            "exact": self.exact,
        }


@dataclass(frozen=True)
class CandidateEvaluation:
    """What a candidate query would do to the realized loss, output by output.

    ``per_output`` lists every output when ``complete``; otherwise the worst ones (at most the
    listing limit), and ``worst_case_upper`` still covers all outputs. ``tight`` is False when
    the bounds are basic composition's alone (:func:`basic_evaluation`, Lemma 6.1) or a cheap
    bound that already decided; ``searched`` holds, per output index, the branch-and-bound
    result for the history extended by that output (continuous domains), which recording the
    output reuses instead of searching again.
    """

    epsilon: float
    epsilon_exact: Fraction
    per_output: tuple[OutputLoss, ...]
    worst_case_upper: float
    complete: bool
    tight: bool = True
    searched: Mapping[int, ContinuousLoss] = field(default_factory=dict, compare=False, repr=False)
    #: The exact worst case over all outputs when the history and the query are randomized
    #: response (:mod:`app.engine.exact`); compared exactly with the written budget.
    exact_worst: Fraction | None = None
    #: Algorithm 3's charge computed exactly in the same case: the history's exact loss plus
    #: the query's written ε (0 for a query constant on the domain).
    exact_charged: Fraction | None = None

    def to_json(self) -> dict[str, Any]:
        """Per-output bounds and the worst case."""
        return {
            "per_output": [o.to_json() for o in self.per_output],
            "per_output_complete": self.complete,
            "worst_case_upper": self.worst_case_upper,
            "epsilon": self.epsilon,
        }


def evaluate_candidate(
    state: LikelihoodState, mechanism: Mechanism, *, max_listed: int, basic_total: Fraction
) -> CandidateEvaluation:
    """Bounds on the realized loss after each output of ``mechanism`` (inner loop of Alg. 2).

    ``basic_total`` is the exact ``Σ ε_i`` of the history; ``basic_total + ε`` caps every upper
    bound (Lemma 6.1).
    """
    cap = basic_total + mechanism.epsilon_exact
    candidate = mechanism.candidate_losses(state)
    err = state.error_after(candidate.term_magnitude, candidate.extra_error)
    losses = candidate.losses
    complete = candidate.complete and losses.size <= max_listed
    if losses.size <= max_listed:
        order = np.arange(losses.size)
    else:
        order = np.sort(np.argsort(losses)[-max_listed:])
    query = mechanism.exact_query() if state.exact is not None else None
    if state.exact is not None and query is not None:
        return _exact_evaluation(state.exact, query, mechanism, candidate, order, complete)
    # bounds_from for every listed output at once (the same float operations, vectorised)
    cap_up = float_up(cap)
    uppers = np.minimum(losses[order] + 2.0 * err, cap_up)
    lowers = np.minimum(np.maximum(0.0, losses[order] - 2.0 * err), uppers)
    per_output = tuple(
        OutputLoss(candidate.output_of(int(j)), lo, up)
        for j, lo, up in zip(order.tolist(), lowers.tolist(), uppers.tolist(), strict=True)
    )
    worst = bounds_from(float(losses.max()), err, cap).upper
    return CandidateEvaluation(
        mechanism.epsilon, mechanism.epsilon_exact, per_output, worst, complete
    )


def _exact_evaluation(
    exact: ExactLoss,
    query: ExactQuery,
    mechanism: Mechanism,
    candidate: CandidateLosses,
    order: npt.NDArray[np.intp],
    complete: bool,
) -> CandidateEvaluation:
    """Per-output losses of a randomized-response history and query, exactly.

    The same outputs as the float path are listed (its ``order``, chosen on float losses that
    are within rounding of the exact ones); each is reported as its exact loss's nearest
    double (``exact``), and the worst case is compared exactly.
    """
    exact_losses = exact.candidate_losses(query)
    per_output = []
    for j in order.tolist():
        bounds = exact_bounds(exact_losses[j])
        per_output.append(OutputLoss(candidate.output_of(int(j)), bounds.lower, bounds.upper))
    worst = max(exact_losses)
    return CandidateEvaluation(
        mechanism.epsilon,
        mechanism.epsilon_exact,
        tuple(per_output),
        float(worst),
        complete,
        exact_worst=worst,
        # the tight ε: the written ε, or 0 for a query constant on the domain
        exact_charged=exact.loss() + mechanism.epsilon_exact,
    )


def basic_evaluation(
    mech: Mechanism, basic_total: Fraction, max_listed: int
) -> CandidateEvaluation:
    """The candidate bounded by basic composition alone (sound, never tight, free to compute).

    Every output's realized loss lies in ``[0, Σ ε_i + ε]`` (Lemma 6.1: each term
    ``log Pr(M_i(x) = y_i)`` varies over the domain by at most ``ε_i``, so the range of their sum
    is at most ``Σ ε_i``). The first ``max_listed`` (at least 1) outputs are listed; all share
    the same bounds, so any of them is a worst one.
    """
    after = float_up(basic_total + mech.epsilon_exact)
    listed = min(mech.output_count, max(1, max_listed))
    return CandidateEvaluation(
        mech.epsilon,
        mech.epsilon_exact,
        tuple(OutputLoss(output, 0.0, after) for output in mech.listed_outputs(listed)),
        after,
        listed == mech.output_count and mech.output_count <= max_listed,
        tight=False,
    )


@dataclass(frozen=True)
class Decision:
    """The outcome of a filter for one candidate query."""

    filter: FilterKind
    accepted: bool
    reason: str
    budget: float
    realized_loss: LossBounds
    basic_composition: Fraction
    candidate: CandidateEvaluation
    #: ``approx_bayesian`` only: δ_g and the phase of Algorithm 4 after this decision.
    delta: float | None = None
    phase: str | None = None
    #: Which check refused a rejected query: the version's own filter (``budget-exhausted``)
    #: or the object's lifetime budget (``lifetime-exhausted``, :mod:`app.engine.lifetime`).
    refusal: str = "budget-exhausted"

    @property
    def worst_case_after(self) -> float:
        """Certified upper bound of the realized loss after the worst output."""
        return self.candidate.worst_case_upper

    def to_json(self) -> dict[str, Any]:
        """The dry-run body of contract.md (``decision``, ``reason``, ``realized_loss`` ...)."""
        return {
            "decision": "accept" if self.accepted else "reject",
            "reason": self.reason,
            "filter": self.filter.value,
            "budget": self.budget,
            "realized_loss": self.realized_loss.to_json(),
            "worst_case_after": self.worst_case_after,
            "per_output": [o.to_json() for o in self.candidate.per_output],
            "per_output_complete": self.candidate.complete,
            "epsilon": self.candidate.epsilon,
            "basic_composition": float(self.basic_composition),
            "basic_composition_after": float(self.basic_composition + self.candidate.epsilon_exact),
            **({"delta": self.delta, "phase": self.phase} if self.delta is not None else {}),
            **({} if self.accepted else {"refusal": self.refusal}),
        }


def decide(
    *,
    kind: FilterKind,
    budget: float,
    loss_now: LossBounds,
    basic_total: Fraction,
    candidate: CandidateEvaluation,
    f0_account: Fraction = Fraction(0),
    f0: OutputIndependentFilter | None = None,
) -> Decision:
    """Apply filter ``kind`` to a candidate evaluated against the current history.

    ``f0_account`` (F₀'s account of the history) and ``f0`` (F₀ for the object's budget, δ_g
    and domain size, :mod:`app.engine.approx`) serve ``approx_bayesian``.
    """
    if kind is FilterKind.APPROX_BAYESIAN:
        if f0 is None:
            raise ValueError("the approx_bayesian filter needs its F0")
        return _decide_approx(budget, f0, loss_now, basic_total, f0_account, candidate)
    budget_exact = decimal_fraction(budget)
    basic_after = basic_total + candidate.epsilon_exact
    basic_ok = basic_after <= budget_exact
    limit = budget - DECISION_MARGIN
    if basic_ok:
        accepted = True
        reason = (
            f"basic composition certifies it: the sum of epsilons after the query "
            f"({float(basic_after):.6g}) is within the budget ({budget:g})"
        )
    elif kind is FilterKind.BASIC:
        accepted = False
        reason = (
            f"basic composition: the sum of epsilons after the query "
            f"({float(basic_after):.6g}) would exceed the budget ({budget:g})"
        )
    elif kind is FilterKind.SIMPLIFIED:
        if candidate.exact_charged is not None:
            # an exact history: compared exactly with the written budget, a tie is accepted
            accepted = candidate.exact_charged <= budget_exact
            charged = float(candidate.exact_charged)
        else:
            charged = loss_now.upper + float(candidate.epsilon_exact)
            accepted = charged <= limit
        relation = "is within" if accepted else "would exceed"
        reason = (
            f"realized loss plus the query's epsilon ({charged:.6g}) {relation} "
            f"the budget ({budget:g})"
        )
    else:
        worst = candidate.worst_case_upper
        if candidate.exact_worst is not None:
            # randomized response: compared exactly with the written budget, a tie is accepted
            accepted = candidate.exact_worst <= budget_exact
        else:
            accepted = worst <= limit
        if accepted:
            reason = (
                f"for every output the realized loss after the query stays within the "
                f"budget (worst case {worst:.6g} <= {budget:g})"
            )
        else:
            bad = max(candidate.per_output, key=lambda o: o.upper)
            reason = (
                f"an output of the query would raise the realized loss to {bad.upper:.6g}, "
                f"above the budget ({budget:g})"
            )
    return Decision(kind, accepted, reason, budget, loss_now, basic_total, candidate)


def _decide_approx(
    budget: float,
    f0: OutputIndependentFilter,
    loss_now: LossBounds,
    basic_total: Fraction,
    f0_account: Fraction,
    candidate: CandidateEvaluation,
) -> Decision:
    """Algorithm 4: F₀ while it accepts, else the Bayesian filter on the realized loss.

    F₀ (:class:`~app.engine.approx.OutputIndependentFilter`) accepts while its account of the
    history with the query stays within its threshold and every accepted query so far was its own
    (``phase`` output-independent). Otherwise the query is accepted only if the realized loss
    now is within ε_g (line 14) and the Bayesian filter accepts it (every output's loss after
    within ε_g, exact ties accepted); basic composition within ε_g implies both. Without F₀
    (a continuous domain) every query is the Bayesian filter's.
    """
    delta = f0.delta
    after = f0_account + f0.charge(candidate.epsilon_exact)
    if f0.phase(f0_account) == OUTPUT_INDEPENDENT and f0.accepts(after):
        reason = (
            "the output-independent (epsilon, delta) filter accepts it: its account after the "
            f"query ({float(after):.6g}) is within its threshold ({float(f0.threshold):.6g})"
        )
        return Decision(
            FilterKind.APPROX_BAYESIAN,
            True,
            reason,
            budget,
            loss_now,
            basic_total,
            candidate,
            delta,
            OUTPUT_INDEPENDENT,
        )
    bayes = decide(
        kind=FilterKind.BAYESIAN,
        budget=budget,
        loss_now=loss_now,
        basic_total=basic_total,
        candidate=candidate,
    )
    accepted, reason = bayes.accepted, bayes.reason
    if not loss_now.within(budget) and not (
        basic_total + candidate.epsilon_exact
    ) <= decimal_fraction(budget):
        accepted = False
        reason = (
            f"the realized loss ({loss_now.upper:.6g}) already exceeds the budget ({budget:g}) "
            "after the output-independent phase"
        )
    phase = BAYESIAN if accepted or f0.phase(f0_account) == BAYESIAN else OUTPUT_INDEPENDENT
    return Decision(
        FilterKind.APPROX_BAYESIAN,
        accepted,
        reason,
        budget,
        loss_now,
        basic_total,
        candidate,
        delta,
        phase,
    )

"""Per-object privacy accounting for finite domains: filter + odometer (Definition 4.5).

An :class:`Accountant` holds everything public about one protected object — domain, budget,
filter, likelihood state, basic-composition total, counts and the loss trajectory — and *never*
the object's value. :func:`submit` is the only place where a decision and the value meet: it
decides first, without the value, and only then samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from fractions import Fraction
from typing import Any

from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.continuous.candidate import evaluate_continuous
from app.engine.continuous.state import ContinuousLoss, ContinuousState
from app.engine.domain import Domain, Scalar
from app.engine.filters import (
    CandidateEvaluation,
    Decision,
    FilterKind,
    decide,
    evaluate_candidate,
)
from app.engine.likelihood import LikelihoodState, LossBounds
from app.engine.limits import DEFAULT_LIMITS, EngineLimits
from app.engine.mechanisms import Mechanism, Output
from app.engine.numerics import DECISION_MARGIN


@dataclass(frozen=True)
class TrajectoryPoint:
    """The odometer after the ``accepted``-th accepted query."""

    accepted: int
    realized_loss: LossBounds
    basic_composition: float

    def to_json(self) -> dict[str, Any]:
        """``{"accepted", "realized_loss", "basic_composition"}``."""
        return {
            "accepted": self.accepted,
            "realized_loss": self.realized_loss.to_json(),
            "basic_composition": self.basic_composition,
        }


@dataclass(frozen=True)
class Odometer:
    """A snapshot of an object's privacy odometer (DESIGN.md, odometer object)."""

    budget: float
    realized_loss: LossBounds
    basic_composition: float
    accepted: int
    rejected: int

    @property
    def remaining(self) -> float:
        """Budget left by the certified upper bound of the realized loss (never negative)."""
        return max(0.0, self.budget - self.realized_loss.upper)

    def to_json(self) -> dict[str, Any]:
        """The odometer object without ``updated_at`` (the service adds timestamps)."""
        return {
            "budget": self.budget,
            "realized_loss": self.realized_loss.to_json(),
            "remaining": self.remaining,
            "basic_composition": self.basic_composition,
            "accepted": self.accepted,
            "rejected": self.rejected,
        }


@dataclass
class Accountant:
    """Filter and odometer of one object over a finite or continuous domain.

    Finite domains keep the exact likelihood array (:class:`LikelihoodState`); continuous ones
    keep the history's terms and bound the loss by branch-and-bound (:class:`ContinuousState`,
    settings in ``bnb``).
    """

    domain: Domain
    budget: float
    filter: FilterKind = FilterKind.BAYESIAN
    limits: EngineLimits = DEFAULT_LIMITS
    bnb: BnBSettings = field(default_factory=BnBSettings)
    state: LikelihoodState | ContinuousState = field(init=False)
    basic_total: Fraction = Fraction(0)
    accepted: int = 0
    rejected: int = 0
    trajectory: list[TrajectoryPoint] = field(default_factory=list)
    _pending: tuple[Mechanism, dict[int, ContinuousLoss], CandidateEvaluation] | None = field(
        default=None, repr=False
    )
    #: A state to start from (:meth:`restore`); by default an empty history's.
    initial_state: InitVar[LikelihoodState | ContinuousState | None] = None

    def __post_init__(self, initial_state: LikelihoodState | ContinuousState | None) -> None:
        if initial_state is not None:
            self.state = initial_state
        elif self.domain.is_finite:
            self.state = LikelihoodState(self.domain)
        else:
            self.state = ContinuousState(self.domain, self.bnb)

    @classmethod
    def restore(
        cls,
        *,
        domain: Domain,
        budget: float,
        filter: FilterKind,
        logp: bytes,
        err: float,
        basic_total: Fraction,
        accepted: int,
        rejected: int,
        limits: EngineLimits = DEFAULT_LIMITS,
    ) -> Accountant:
        """Rebuild a finite-domain accountant from persisted state (no trajectory).

        The stored array becomes the state directly: no empty state is allocated and scanned
        first (5.4 ms against 3.6 ms for ``from_bytes`` alone at 10**6 points, issue #12;
        ``bench/restore_bench.py``).
        """
        return cls(
            domain,
            budget,
            filter,
            limits,
            basic_total=basic_total,
            accepted=accepted,
            rejected=rejected,
            initial_state=LikelihoodState.from_bytes(domain, logp, err),
        )

    def evaluate(self, mechanism: Mechanism, target: float | None = None) -> CandidateEvaluation:
        """Per-output bounds of the loss after ``mechanism`` (no change to the history).

        ``target`` lets a continuous object stop at a cheap bound that already decides.
        """
        if isinstance(self.state, LikelihoodState):
            return evaluate_candidate(
                self.state,
                mechanism,
                max_listed=self.limits.max_listed_outputs,
                basic_total=self.basic_total,
            )
        evaluation, computed = evaluate_continuous(
            self.state, mechanism, basic_total=self.basic_total, target=target
        )
        self._pending = (mechanism, computed, evaluation)
        return evaluation

    def loss(self) -> LossBounds:
        """Certified bounds on the realized loss now (capped by exact basic composition)."""
        return self.state.loss(self.basic_total)

    def dry_run(self, mechanism: Mechanism) -> Decision:
        """Would the filter accept ``mechanism`` now? Changes nothing."""
        return decide(
            kind=self.filter,
            budget=self.budget,
            loss_now=self.loss(),
            basic_total=self.basic_total,
            candidate=self.evaluate(mechanism, target=self.budget - DECISION_MARGIN),
        )

    def record(self, mechanism: Mechanism, output: Output) -> None:
        """Add an accepted ``(query, output)`` to the history."""
        if isinstance(self.state, LikelihoodState):
            self.state.apply(mechanism.term(output))
        else:
            known, decided = None, None
            if self._pending is not None and self._pending[0] is mechanism:
                known = self._pending[1].get(int(output))  # type: ignore[arg-type]
                # the bounds the decision used (a search's or the cheap ones) stay valid: the
                # odometer never reads looser than what accepted the query
                entry = self._pending[2].per_output[int(output)]  # type: ignore[arg-type]
                decided = (entry.lower, entry.upper)
            self.state.record(mechanism, output, known=known, decided=decided)
        self._pending = None
        self.basic_total += mechanism.epsilon_exact
        self.accepted += 1
        self.trajectory.append(TrajectoryPoint(self.accepted, self.loss(), float(self.basic_total)))

    def record_rejection(self) -> None:
        """Count a rejected query."""
        self.rejected += 1

    def odometer(self) -> Odometer:
        """The current odometer."""
        return Odometer(
            self.budget, self.loss(), float(self.basic_total), self.accepted, self.rejected
        )


@dataclass(frozen=True)
class SubmitResult:
    """A decision and, if accepted, the sampled output (internal form and JSON)."""

    decision: Decision
    output: Output | None = None
    output_json: Any = None


def submit(
    accountant: Accountant, mechanism: Mechanism, value: Mapping[str, Scalar]
) -> SubmitResult:
    """Decide on ``mechanism`` without the value; if accepted, sample with it and record."""
    decision = accountant.dry_run(mechanism)
    if not decision.accepted:
        accountant.record_rejection()
        return SubmitResult(decision)
    output = mechanism.sample(value)
    accountant.record(mechanism, output)
    return SubmitResult(decision, output, mechanism.output_json(output))

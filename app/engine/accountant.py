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
from app.engine.continuous.state import ContinuousState
from app.engine.domain import Domain, Scalar
from app.engine.filters import CandidateEvaluation, Decision, FilterKind
from app.engine.likelihood import LikelihoodState, LossBounds
from app.engine.limits import DEFAULT_LIMITS, EngineLimits
from app.engine.mechanisms import Mechanism, Output
from app.engine.numerics import decimal_fraction
from app.engine.pipeline import (
    BasicState,
    ObjectSnapshot,
    candidate_bounds,
    empty_state,
    evaluate,
    record,
)


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
    """A snapshot of an object's privacy odometer (contract.md, odometer object)."""

    budget: float
    realized_loss: LossBounds
    basic_composition: float
    accepted: int
    rejected: int
    #: ``approx_bayesian`` objects: δ_g and Algorithm 4's phase (both None otherwise).
    delta: float | None = None
    phase: str | None = None

    @property
    def remaining(self) -> float:
        """Budget left by the upper bound of the realized loss (never negative).

        For an exact loss it is the nearest double of the written budget minus the loss (0.1
        for 1.0 − 0.9, where the doubles' difference is 0.09999999999999998), so it adds up
        with the numbers written; it is 0 exactly at a tie. An exact loss read back from a
        stored row is its ``upper``'s shortest decimal, which is the loss itself whenever that
        has at most 15 significant digits (sums of short written ε's).
        """
        loss = self.realized_loss
        if loss.exact:
            value = loss.value if loss.value is not None else decimal_fraction(loss.upper)
            return float(max(Fraction(0), decimal_fraction(self.budget) - value))
        return max(0.0, self.budget - loss.upper)

    def to_json(self) -> dict[str, Any]:
        """The odometer object without ``updated_at`` (the service adds timestamps)."""
        return {
            "budget": self.budget,
            "realized_loss": self.realized_loss.to_json(),
            "remaining": self.remaining,
            "basic_composition": self.basic_composition,
            "accepted": self.accepted,
            "rejected": self.rejected,
            **({"delta": self.delta, "phase": self.phase} if self.delta is not None else {}),
        }


@dataclass
class Accountant:
    """Filter and odometer of one object over a finite or continuous domain.

    A mutable convenience over :mod:`app.engine.pipeline` for the engine's own callers (tests,
    benchmarks, the paper's experiments): it holds the object's :class:`ObjectSnapshot`, the
    counts and the loss trajectory, and decides and records through :func:`pipeline.evaluate`
    and :func:`pipeline.record` — the same functions the service uses. Finite domains keep the
    exact likelihood array; continuous ones the history's terms, bounded by branch-and-bound
    with the settings ``bnb``.
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
    #: The last evaluation, reused when its query is recorded.
    _last: tuple[Mechanism, Decision] | None = field(default=None, repr=False)
    #: A state to start from (a stored one); by default an empty history's.
    initial_state: InitVar[LikelihoodState | ContinuousState | None] = None
    #: δ_g of an ``approx_bayesian`` object, and F₀'s account of the history.
    delta: float | None = None
    f0_account: Fraction = Fraction(0)

    def __post_init__(self, initial_state: LikelihoodState | ContinuousState | None) -> None:
        self.state = (
            initial_state if initial_state is not None else empty_state(self.domain, self.bnb)
        )

    @property
    def snapshot(self) -> ObjectSnapshot:
        """The object's public state now, as every engine decision takes it."""
        return ObjectSnapshot(
            self.domain,
            self.budget,
            self.filter,
            self.basic_total,
            self.state,
            self.limits,
            self.delta,
            self.f0_account,
        )

    def evaluate(self, mechanism: Mechanism, target: float | None = None) -> CandidateEvaluation:
        """Per-output bounds of the loss after ``mechanism`` (no change to the history).

        ``target`` lets a continuous object stop at a cheap bound that already decides.
        """
        return candidate_bounds(self.snapshot, mechanism, target=target)

    def loss(self) -> LossBounds:
        """Certified bounds on the realized loss now (capped by exact basic composition)."""
        return self.state.loss(self.basic_total)

    def dry_run(self, mechanism: Mechanism) -> Decision:
        """Would the filter accept ``mechanism`` now? Changes nothing; bounds always computed."""
        decision = evaluate(self.snapshot, mechanism, tight=True)
        self._last = (mechanism, decision)
        return decision

    def record(self, mechanism: Mechanism, output: Output) -> None:
        """Add an accepted ``(query, output)`` to the history (reusing its last evaluation)."""
        decision = None
        if self._last is not None and self._last[0] is mechanism:
            decision = self._last[1]
        after = record(self.snapshot, mechanism, output, decision)
        self._last = None
        if isinstance(after.state, BasicState):  # pragma: no cover - never from these states
            raise TypeError("an accountant keeps an exact or searched state")
        self.state, self.basic_total = after.state, after.basic_total
        self.f0_account = after.f0_account
        self.accepted += 1
        self.trajectory.append(TrajectoryPoint(self.accepted, self.loss(), float(self.basic_total)))

    def record_rejection(self) -> None:
        """Count a rejected query."""
        self.rejected += 1

    def odometer(self) -> Odometer:
        """The current odometer."""
        return Odometer(
            self.budget,
            self.loss(),
            float(self.basic_total),
            self.accepted,
            self.rejected,
            self.delta,
            self.snapshot.phase,
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

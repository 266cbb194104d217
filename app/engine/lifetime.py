r"""Lifetime budgets over an object's data versions (contract.md, "Data versions").

An object's value may change: version ``v`` holds value ``x_v``, and every query reads exactly
one version. Over the object's whole life the private value is the tuple ``(x_1, …, x_V)`` in
the product domain ``X^V``, and the likelihood of the whole history factorizes:

.. math::

    \log P(x_1, …, x_V) = \sum_v \log P_v(x_v),
    \qquad \log P_v(x_v) = \sum_{i \in v} \log \Pr(M_i(x_v) = y_i).

The realized loss of the life is ``max − min`` of that sum over the product domain; a sum of
functions of separate coordinates reaches its maximum (minimum) where every term does, so

.. math::

    L = \sum_v \bigl(\max_{x_v} \log P_v - \min_{x_v} \log P_v\bigr) = \sum_v L_v

exactly. No prior correlation between the versions changes this: the realized loss is a
max/min of the likelihood over the domain, not a posterior. For any prior on ``X^V``,
correlated or not, the posterior odds of two tuples are their prior odds times their likelihood
ratio (Bayes), and that ratio is at most ``e^L`` — so ``L`` bounds the knowledge gained about
the tuple whatever the prior believed about how versions relate.

A query on version ``v`` is accepted when its version's filter accepts it (every output keeps
``L_v ≤ ε_g``) **and** every output keeps ``Σ_{u≠v} L_u + L_v ≤ ε_L``: :class:`Lifetime` is
that second check. The closed versions' losses are kept in the form the filter compares its own
budget with: an exact rational while every closed version's loss was exact (randomized
response, :mod:`app.engine.exact`), so a worst case exactly at ``ε_L`` as written is accepted;
otherwise certified bounds, the upper ones summed rounding up and compared with ``ε_L`` minus
the decision margin (ties reject, as for ``ε_g``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from app.engine.filters import CandidateEvaluation
from app.engine.likelihood import LossBounds, exact_bounds
from app.engine.numerics import DECISION_MARGIN, decimal_fraction, float_down, float_up

#: The empty sum: no closed version yet.
NO_CLOSED = exact_bounds(Fraction(0))


def _low(bounds: LossBounds) -> Fraction:
    """A lower bound as a rational: the exact loss when known (its double may round up)."""
    return bounds.value if bounds.value is not None else Fraction(bounds.lower)


def _high(bounds: LossBounds) -> Fraction:
    """An upper bound as a rational: the exact loss when known (its double may round down)."""
    return bounds.value if bounds.value is not None else Fraction(bounds.upper)


def add_losses(a: LossBounds, b: LossBounds) -> LossBounds:
    """Bounds on ``a + b``: exact when both are, else lower rounded down and upper rounded up.

    Summed in rationals and rounded once, so the certified bounds stay certified.
    """
    if a.value is not None and b.value is not None:
        return exact_bounds(a.value + b.value)
    return LossBounds(float_down(_low(a) + _low(b)), float_up(_high(a) + _high(b)))


@dataclass(frozen=True)
class Lifetime:
    """An object's lifetime budget ``ε_L`` and the realized losses of its closed versions.

    ``closed`` bounds ``Σ_{u closed} L_u`` (``value`` the exact sum while every closed loss was
    exact); ``versions`` counts the versions, the current one included.
    """

    budget: float
    closed: LossBounds = NO_CLOSED
    versions: int = 1

    def admits(self, candidate: CandidateEvaluation) -> bool:
        """Whether every output of the candidate keeps ``Σ_{u≠v} L_u + L_v ≤ ε_L``.

        Exact (a tie accepted) when the closed sum and the candidate's worst case are both
        exact; otherwise certified upper bounds summed rounding up, within ``ε_L`` minus the
        decision margin.
        """
        if self.closed.value is not None and candidate.exact_worst is not None:
            return self.closed.value + candidate.exact_worst <= decimal_fraction(self.budget)
        return self.worst_after(candidate) <= self.budget - DECISION_MARGIN

    def worst_after(self, candidate: CandidateEvaluation) -> float:
        """The lifetime loss after the candidate's worst output (for messages and checks).

        The exact sum's nearest double, or a certified upper bound (summed in rationals,
        rounded up).
        """
        worst = candidate.exact_worst
        if worst is None:
            worst = Fraction(candidate.worst_case_upper)
        if self.closed.value is not None and candidate.exact_worst is not None:
            return float(self.closed.value + worst)
        return float_up(_high(self.closed) + worst)

    def realized(self, current: LossBounds) -> LossBounds:
        """Bounds on the life's realized loss: the closed versions' plus the current one's."""
        return add_losses(self.closed, current)

    def remaining(self, current: LossBounds) -> float:
        """``ε_L`` minus the life's loss (as written when exact), never negative."""
        total = self.realized(current)
        if total.value is not None:
            return float(max(Fraction(0), decimal_fraction(self.budget) - total.value))
        return max(0.0, self.budget - total.upper)

    def to_json(self, current: LossBounds) -> dict[str, Any]:
        """The odometer's ``lifetime`` object: budget, realized loss, versions, remaining."""
        return {
            "budget": self.budget,
            "realized_loss": self.realized(current).to_json(),
            "versions": self.versions,
            "remaining": self.remaining(current),
        }

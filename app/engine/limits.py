"""Size limits that keep every engine computation bounded in memory and time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLimits:
    """Upper limits on the sizes the engine accepts.

    Attributes
    ----------
    max_attributes:
        Attributes per domain.
    max_points:
        Points of a finite domain (its likelihood state holds one float64 per point, so the
        default of 10**7 is 80 MB).
    max_values_per_attribute:
        Values of one integer or categorical attribute.
    max_matrix_entries:
        Rows times columns of a ``matrix`` query.
    max_outputs:
        Outputs of a ``matrix`` query and bits of a ``unary_encoding`` query.
    max_history:
        Entries of a history sent to the loss calculator.
    max_epsilon:
        Largest ε accepted for a query or a budget; beyond it probabilities underflow float64.
    max_listed_outputs:
        Outputs listed one by one in a decision's ``per_output``; beyond it only the worst ones
        are listed and the decision says the list is truncated.
    """

    max_attributes: int = 64
    max_points: int = 10_000_000
    max_values_per_attribute: int = 10_000_000
    max_matrix_entries: int = 10_000_000
    max_outputs: int = 4096
    max_history: int = 100_000
    max_epsilon: float = 100.0
    max_listed_outputs: int = 256


DEFAULT_LIMITS = EngineLimits()

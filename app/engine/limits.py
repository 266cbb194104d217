"""Size limits that keep every engine computation bounded in memory and time."""

from __future__ import annotations

from dataclasses import dataclass, replace


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
    min_epsilon:
        Smallest declared ε accepted for a query and smallest budget (see :data:`MIN_EPSILON`).
    max_epsilon:
        Largest ε accepted for a query; beyond it probabilities underflow float64.
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
    min_epsilon: float = 1e-6
    max_epsilon: float = 100.0
    max_listed_outputs: int = 256


DEFAULT_LIMITS = EngineLimits()

#: Smallest declared ε of a query and smallest budget ε_g.
#:
#: Why a floor: the filter compares a worst case with the budget under a rounding margin of
#: 1e-9 (:data:`app.engine.numerics.DECISION_MARGIN`), and the certified bounds carry rounding
#: pads of that order; an ε within a few orders of magnitude of it is below the resolution of the
#: filter (its loss cannot be told apart from rounding). 1e-6 keeps three orders of magnitude
#: above the margin. It also bounds the exact basic-composition sums: a declared ε is summed as
#: the decimal the user wrote (at most 17 significant digits), so with ε >= 1e-6 every
#: denominator divides 10**23 and a sum stays under about 60 digits, where ε = 1e-200 alone
#: needed a 201-digit denominator.
MIN_EPSILON = DEFAULT_LIMITS.min_epsilon

#: An active object is "near exhaustion" when its remaining budget is below this fraction of its
#: budget (the odometers' ``near_exhaustion`` status and the Prometheus gauge of that name).
NEAR_EXHAUSTION_FRACTION = 0.1

#: Largest budget ε_g: a budget above the largest loss any useful history reaches (e**10_000
#: odds) protects nothing; the cap keeps sums and odometers finite.
MAX_BUDGET = 10_000.0

#: Exact ε that the engine computes (tight ε of a ``matrix`` query, or of a query whose declared ε
#: is loose) are rounded *up* to a multiple of ``2**-EXACT_EPSILON_BITS``: sound (never below
#: the real ε) and with a bounded denominator, so exact sums never grow with the history.
EXACT_EPSILON_BITS = 64


def for_history(limits: EngineLimits) -> EngineLimits:
    """The limits for queries of a *history*: records of outputs already given.

    The ε floor applies to queries still to be decided (dry-run, submit, a calculator's
    ``candidate``) and to budgets; a history is what happened, so any ε > 0 in it is replayed
    (histories stored before the floor existed must stay usable and verifiable).
    """
    return replace(limits, min_epsilon=0.0)


#: :data:`DEFAULT_LIMITS` for history entries (:func:`for_history`).
HISTORY_LIMITS = for_history(DEFAULT_LIMITS)

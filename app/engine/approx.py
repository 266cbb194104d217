r"""The output-independent (ε_g, δ_g) filter F₀ of Algorithm 4 (filter ``approx_bayesian``).

F₀ is the advanced-composition filter of Whitehouse, Ramdas, Rogers and Wu (2023, "Fully-adaptive
composition in differential privacy", Theorem 3.2/advanced composition filter): with the
queries' ε_i chosen adaptively, the interaction may continue while

.. math::

    \sqrt{2 \log(1/\delta_g)\, V} + V/2 \le \varepsilon_g, \qquad V = \sum_i \varepsilon_i^2

counting the query about to be accepted. The left side increases with ``V``, so this is
``V ≤ V*`` with ``V* = (\sqrt{2L + 2ε_g} − \sqrt{2L})²``, ``L = log(1/δ_g)`` (the positive root
of ``V/2 + \sqrt{2LV} = ε_g`` in ``\sqrt V``). ``V`` is summed exactly (rationals, the queries'
``epsilon_exact``) and compared with a rational certified *below* ``V*``: rounding rejects.

Why it is an (ε_g, δ_g) filter (docs/engine.md has the argument in full): for a fixed pair of
values ``x, x'`` and outputs drawn under ``x``, the privacy loss ``ℓ_i`` of query ``i`` has
conditional mean at most ``ε_i tanh(ε_i/2) <= ε_i²/2`` and lies in ``[−ε_i, ε_i]``, so
``exp(λ(S_n − V_n/2) − λ² V_n / 2)`` is a nonnegative supermartingale (Hoeffding's lemma);
with ``λ = \sqrt{2L/V*}`` Ville's inequality bounds the probability that ``S_n`` ever exceeds
``V*/2 + \sqrt{2 L V*} = ε_g`` while ``V_n <= V*`` by ``δ_g``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_number
from app.engine.numerics import exact_fraction

#: Relative amount by which the float ``V*`` is lowered before it is made rational (its
#: computation errs by a few ulp; this keeps the certified limit below the true one).
_SHRINK = 1e-12

#: The phases of Algorithm 4 as the odometer names them.
OUTPUT_INDEPENDENT = "output-independent"
BAYESIAN = "bayesian"


@dataclass(frozen=True)
class AdvancedFilter:
    """F₀ for budget ``(epsilon, delta)``: accept while ``Σ ε_i² <= limit``."""

    epsilon: float
    delta: float

    @property
    def limit(self) -> Fraction:
        """A rational certified not above ``V*`` (see the module docstring)."""
        return certified_limit(self.epsilon, self.delta)

    def accepts(self, squares_after: Fraction) -> bool:
        """Whether F₀ accepts a query that brings ``Σ ε_i²`` to ``squares_after``."""
        return squares_after <= self.limit

    def phase(self, squares: Fraction) -> str:
        """``output-independent`` while every accepted query was F₀'s, else ``bayesian``.

        F₀ accepts only while ``Σ ε_i² <= limit`` and the sum only grows, so a history whose
        sum is above the limit holds a query that the Bayesian filter accepted.
        """
        return OUTPUT_INDEPENDENT if squares <= self.limit else BAYESIAN


def squares_limit(epsilon: float, delta: float) -> float:
    """``V*`` in floats: the largest ``Σ ε_i²`` F₀ accepts under ``(epsilon, delta)``."""
    two_l = 2.0 * math.log(1.0 / delta)
    root = math.sqrt(two_l + 2.0 * epsilon) - math.sqrt(two_l)
    return root * root


_LIMITS: dict[tuple[float, float], Fraction] = {}


def certified_limit(epsilon: float, delta: float) -> Fraction:
    """``V*`` lowered by a relative ``1e-12`` and made an exact rational (cached)."""
    key = (epsilon, delta)
    found = _LIMITS.get(key)
    if found is None:
        found = exact_fraction(squares_limit(epsilon, delta) * (1.0 - _SHRINK))
        if len(_LIMITS) < 4096:
            _LIMITS[key] = found
    return found


def square(epsilon: Fraction) -> Fraction:
    """A query's contribution to ``V``: its exact ε squared."""
    return epsilon * epsilon


def parse_delta_value(raw: Any, field: str) -> float:
    """A δ_g from JSON: a number strictly between 0 and 1 (``field`` names it in errors)."""
    value = as_number(raw, field)
    if not 0.0 < value < 1.0:
        raise InvalidInput(field, "must be greater than 0 and less than 1")
    return value

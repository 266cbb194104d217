r"""The output-independent (ε_g, δ_g) filter F₀ of Algorithm 4 (filter ``approx_bayesian``).

What it bounds: Definition 4.7 of "Knowledge Gain as Privacy Loss in Local Privacy Accounting"
(Mingen Pan) — for every true value ``x``, ``P_x[∃ n accepted by F₀: L_n > ε_g] <= δ_g`` under a
fully adaptive analyst, where ``L_n = max_a log P(y_{1..n}|a) − min_b log P(y_{1..n}|b)`` is the
realized loss over **all** points of the domain. A pairwise (ε_g, δ_g) guarantee does not give
this once the domain has more than two points (docs/engine.md has the counterexample), so F₀
takes a union over the ``d(d−1)`` ordered pairs of a ``d``-point domain.

F₀ is a Rényi filter (Feldman and Zrnic 2021) at one order fixed by the budget and the domain,
charging each query randomized response's exact log-MGF. With ``L = log(d(d−1)/δ_g)`` and the
query's ``ε_i``, let

.. math::

    \psi(\lambda, \varepsilon) = \log \mathbb E\, e^{\lambda \ell}
      = \log\frac{e^{(1+\lambda)\varepsilon} + e^{-\lambda\varepsilon}}{1 + e^{\varepsilon}}
      = \log\bigl(1 + 2\sinh^2(\lambda\varepsilon/2)
                  + \tanh(\varepsilon/2)\sinh(\lambda\varepsilon)\bigr)

(the moment generating function of the privacy loss ``ℓ = ±ε`` of randomized response; the last
form has no cancellation). F₀ accepts the next query while

.. math::

    \sum_i \psi(\lambda, \varepsilon_i) \le \lambda \varepsilon_g - L,
    \qquad \lambda = \sqrt{2L / V^*},\quad V^* = (\sqrt{2L + 2\varepsilon_g} - \sqrt{2L})^2,

counting the query. The order ``λ`` is the one of the advanced-composition filter of Whitehouse,
Ramdas, Rogers and Wu (2023) at ``L`` — ``\sqrt{2 L Σε²} + Σε²/2 <= ε_g``, i.e. ``Σε² <= V*`` —
and since ``ψ(λ, ε) <= λε²/2 + λ²ε²/2`` this filter accepts every sequence that one does.

Why (docs/engine.md, "Algorithm 4", has the argument in full). Fix the true ``x`` and an ordered
pair ``(a, b)``; query ``i`` is ``ε_i``-LDP over the domain given the past (``ε_i`` its exact
tight ε rounded up, known before it runs), and ``ℓ_i = log P_i(y|a) − log P_i(y|b)`` with
``y ~ P_i(·|x)``. Then ``ℓ_i ∈ [−ε_i, ε_i]`` and ``E[ℓ_i | past] = KL(P_x‖P_b) − KL(P_x‖P_a) <=
ε_i tanh(ε_i/2)`` (an ε-LDP pair's KL is at most randomized response's: Kairouz, Oh and
Viswanath 2015, and data processing). By convexity of ``t ↦ e^{λt}`` on ``[−ε, ε]``, such a
variable has ``E e^{λℓ} <= e^{ψ(λ, ε)}`` (the two-point law on ``±ε`` with the largest mean is
randomized response's loss). So ``exp(λ S^{ab}_n − Σ_{i<=n} ψ(λ, ε_i))`` is a nonnegative
supermartingale; Ville's inequality bounds by ``δ_g/(d(d−1))`` the probability that it ever
reaches ``d(d−1)/δ_g``, which ``S^{ab}_n > ε_g`` at an accepted ``n`` requires, and a union over
the ``d(d−1)`` ordered pairs gives ``δ_g``. A continuous domain has no finite ``d``: F₀ is
unavailable there (``pairs`` None): registration refuses it, and objects stored before run the
Bayesian phase only.

Arithmetic. Each charge is ``ψ`` of the query's exact ε rounded up to a float, computed in
float64 (about ten correctly rounded operations, no cancellation), raised by a relative ``1e-12``
and kept as an exact rational; the account is their exact sum and the threshold a rational below
``λε_g − L`` (``λ`` itself need not be exact: any fixed order gives a valid filter). Rounding
rejects. The order depends on ``d``, so an account is only meaningful for its domain's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_number
from app.engine.numerics import exact_fraction, float_up

#: Relative pad of a computed float toward the safe side.
_PAD = 1e-12

#: The smallest δ_g accepted: ``log(1/δ_g)`` stays below 691 (and a smaller δ is no stronger
#: in any practical sense); the largest is any float below 1.
MIN_DELTA = 1e-300

#: The phases of Algorithm 4 as the odometer names them.
OUTPUT_INDEPENDENT = "output-independent"
BAYESIAN = "bayesian"

#: Why F₀ needs a finite domain (the text of the 422 a registration or a calculation gets).
NEEDS_FINITE_DOMAIN = (
    "needs a finite domain: the output-independent phase of approx_bayesian bounds the "
    "realized loss over every ordered pair of domain points (Definition 4.7), and a "
    "continuous domain has no finite number of them"
)


def ordered_pairs(points: int) -> int:
    """``d(d−1)``, the ordered pairs of distinct points of a ``d``-point domain (1 if none)."""
    return max(1, points * (points - 1))


def log_term(delta: float, pairs: int) -> float:
    """``L = log(pairs/δ_g)`` (floats; the threshold's pad covers their rounding)."""
    # log(1/δ_g) as the pairwise F₀ computed it, so pairs = 1 reproduces its accounts exactly
    return math.log(1.0 / delta) + math.log(pairs)


def squares_limit(epsilon: float, log_inv: float) -> float:
    """``V*``: the largest ``Σ ε_i²`` the advanced-composition filter at ``L`` accepts (floats)."""
    two_l = 2.0 * log_inv
    root = math.sqrt(two_l + 2.0 * epsilon) - math.sqrt(two_l)
    return root * root


def rr_log_mgf(order: float, epsilon: float) -> float:
    """``ψ(λ, ε)``: log-MGF at ``λ`` of randomized response's privacy loss (no cancellation)."""
    half = math.sinh(order * epsilon / 2.0)
    return math.log1p(2.0 * half * half + math.tanh(epsilon / 2.0) * math.sinh(order * epsilon))


@dataclass(frozen=True)
class OutputIndependentFilter:
    """F₀ for budget ``(epsilon, delta)`` on a domain with ``pairs`` ordered pairs of points.

    ``pairs`` is ``None`` where F₀ is unavailable (a continuous domain): it then accepts
    nothing, charges nothing, and every history is in the Bayesian phase.
    """

    epsilon: float
    delta: float
    pairs: int | None

    @classmethod
    def for_points(
        cls, epsilon: float, delta: float, points: int | None
    ) -> OutputIndependentFilter:
        """F₀ on a domain of ``points`` points (``None``: not finite)."""
        return cls(epsilon, delta, None if points is None else ordered_pairs(points))

    @property
    def available(self) -> bool:
        """Whether F₀ can accept anything (a finite domain)."""
        return self.pairs is not None

    @property
    def order(self) -> float:
        """``λ = sqrt(2L / V*)`` (Rényi order ``1 + λ``); NaN when unavailable."""
        return math.nan if self.pairs is None else _order(self.epsilon, self.delta, self.pairs)

    @property
    def threshold(self) -> Fraction:
        """A rational not above ``λ ε_g − L`` (−1 when unavailable: nothing is within it)."""
        if self.pairs is None:
            return Fraction(-1)
        return _threshold(self.epsilon, self.delta, self.pairs)

    def charge(self, epsilon: Fraction) -> Fraction:
        """A rational not below ``ψ(λ, ε)`` for a query of exact ε ``epsilon`` (0 unavailable)."""
        if self.pairs is None:
            return Fraction(0)
        return _charge(self.epsilon, self.delta, self.pairs, float_up(epsilon))

    def accepts(self, account_after: Fraction) -> bool:
        """Whether F₀ accepts a query that brings the account to ``account_after``."""
        return self.available and account_after <= self.threshold

    def phase(self, account: Fraction) -> str:
        """``output-independent`` while every accepted query was F₀'s, else ``bayesian``.

        F₀ accepts only while the account is within the threshold and the account only grows,
        so a history whose account is above it holds a query the Bayesian filter accepted.
        Without F₀ (a continuous domain) every history is the Bayesian filter's.
        """
        if not self.available:
            return BAYESIAN
        return OUTPUT_INDEPENDENT if account <= self.threshold else BAYESIAN


@lru_cache(maxsize=4096)
def _order(epsilon: float, delta: float, pairs: int) -> float:
    log_inv = log_term(delta, pairs)
    return math.sqrt(2.0 * log_inv / squares_limit(epsilon, log_inv))


@lru_cache(maxsize=4096)
def _threshold(epsilon: float, delta: float, pairs: int) -> Fraction:
    log_inv = log_term(delta, pairs)
    value = _order(epsilon, delta, pairs) * epsilon - log_inv
    # λε_g and L are both large next to their difference: pad by the larger magnitude
    return exact_fraction(value - _PAD * max(1.0, abs(value), log_inv))


@lru_cache(maxsize=65536)
def _charge(epsilon_g: float, delta: float, pairs: int, epsilon: float) -> Fraction:
    order = _order(epsilon_g, delta, pairs)
    # ψ(λ, ε) <= λε (the loss is at most ε): the bound where sinh would overflow
    value = order * epsilon if order * epsilon > 600.0 else rr_log_mgf(order, epsilon)
    return exact_fraction(math.nextafter(value * (1.0 + _PAD), math.inf))


def parse_delta_value(raw: Any, field: str) -> float:
    """A δ_g from JSON: ``MIN_DELTA <= δ_g < 1`` (``field`` names it in errors)."""
    value = as_number(raw, field)
    if not MIN_DELTA <= value < 1.0:
        raise InvalidInput(field, f"must be at least {MIN_DELTA:g} and less than 1")
    return value

"""``unary_encoding``: one bit per value of a finite attribute.

The bit of x's value is 1 with probability ``p`` and every other bit with probability ``q``,
independently. ``optimized``: ``p = 1/2``, ``q = 1/(e^ε + 1)``; ``symmetric``:
``p = e^{ε/2}/(e^{ε/2} + 1)``, ``q = 1 - p``.

For an output bit vector ``s``, ``log Pr(s | x = v) = C(s) + (A if s_v else B)`` with
``A = log(p/q)``, ``B = log((1-p)/(1-q))`` and ``C(s)`` independent of ``x``; since ``A - B = ε``
the loss after ``s`` depends only on which bits are set, and the worst case over all ``2^k``
outputs has a closed form (:meth:`UnaryEncoding.candidate_losses`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from app.engine.domain import Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.exact import ExactQuery, ExactTerm, Group
from app.engine.jsonfields import as_integer, as_list, check_keys, path
from app.engine.likelihood import LikelihoodState, Term
from app.engine.limits import EngineLimits
from app.engine.mechanisms.base import (
    CandidateLosses,
    Mechanism,
    Output,
    check_epsilon,
    finite_attribute,
    output_bits,
    subset_worst,
)
from app.engine.numerics import decimal_fraction, log1p_exp, written_epsilon_error
from app.engine.sampling import RealProbability, rr_complement, rr_probability

VARIANTS = ("optimized", "symmetric")


class UnaryEncoding(Mechanism):
    """``unary_encoding`` with the ``optimized`` (OUE) or ``symmetric`` (SUE) variant."""

    kind = "unary_encoding"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(
            raw, field, required=("mechanism", "attribute", "epsilon"), optional=("variant",)
        )
        attr_field = path(field, "attribute")
        self.axis, self.attribute = finite_attribute(raw, domain, field)
        self.k = self.attribute.size
        if self.k > limits.max_outputs:
            raise InvalidInput(attr_field, f"has more than {limits.max_outputs} values to encode")
        variant = raw.get("variant", "optimized")
        if variant not in VARIANTS:
            raise InvalidInput(path(field, "variant"), "must be optimized or symmetric")
        self.variant: str = variant
        eps = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self.eps = eps
        if variant == "optimized":
            # p = 1/2, q = 1/(e^ε+1):  A = log(p/q) = log(1+e^ε) - log 2,  B = log(1+e^-ε) - log 2
            self.log_a = log1p_exp(eps) - math.log(2.0)
            self.log_b = log1p_exp(-eps) - math.log(2.0)
        else:
            # p = e^{ε/2}/(e^{ε/2}+1), q = 1-p:  A = ε/2, B = -ε/2
            self.log_a, self.log_b = eps / 2.0, -eps / 2.0
        super().__init__(domain, eps, eps if self.k > 1 else 0.0, field)
        self.max_listed = limits.max_listed_outputs

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON."""
        return {
            "mechanism": self.kind,
            "attribute": self.attribute.name,
            "epsilon": self.eps,
            "variant": self.variant,
        }

    @property
    def output_count(self) -> int:
        """``2**k`` bit vectors."""
        return int(2**self.k)

    def parse_output(self, raw: Any, field: str) -> Output:
        """A list of k bits."""
        items = as_list(raw, field, min_len=self.k, max_len=self.k)
        bits = tuple(as_integer(b, path(field, i)) for i, b in enumerate(items))
        for i, b in enumerate(bits):
            if b not in (0, 1):
                raise InvalidInput(path(field, i), "must be 0 or 1")
        return bits

    def output_json(self, output: Output) -> Any:
        """The bit list."""
        return list(output_bits(output))

    def listed_output(self, j: int) -> Output:
        """``j``'s k bits, most significant first (binary counting order)."""
        return tuple((j >> (self.k - 1 - i)) & 1 for i in range(self.k))

    def term(self, output: Output) -> Term:
        """``A`` on values whose bit is set, ``B`` elsewhere (the common ``C(s)`` is dropped)."""
        values = np.where(np.asarray(output_bits(output), dtype=bool), self.log_a, self.log_b)
        error = written_epsilon_error(max(abs(self.log_a), abs(self.log_b)))
        return Term((self.axis,), values.astype(np.float64), error, self.exact_term(output))

    @property
    def _group(self) -> Group:
        """The written ε (both variants sample ``A − B = ε`` exactly)."""
        return Group(decimal_fraction(self.eps))

    def exact_term(self, output: Output) -> ExactTerm:
        """``ε`` on values whose bit is set (``A − B = ε`` in both variants; ``C(s)`` dropped)."""
        return ExactTerm(self.axis, self._group, np.asarray(output_bits(output), dtype=np.int64))

    def exact_query(self) -> ExactQuery:
        """Bit patterns: all of them when they are listed, else the worst one."""
        return ExactQuery(
            self.axis, self._group, "ue", enumerate=self.output_count <= self.max_listed
        )

    def candidate_losses(self, state: LikelihoodState) -> CandidateLosses:
        r"""Worst-case loss over all ``2^k`` outputs in O(|X| + k) (:func:`subset_worst`).

        With per-value extremes the loss after ``s`` is :math:`\max_v(M_v + c_v) -
        \min_w(m_w + c_w)`, :math:`c_v \in \{A, B\}`, ``A − B = ε``: a two-level output whose
        worst case is attained by ``s_v = 1`` and every other bit 0. When ``2^k`` is at most the
        listing limit every output is enumerated instead.
        """
        maxima, minima = state.extremes_over((self.axis,))
        magnitude = max(abs(self.log_a), abs(self.log_b))
        if self.output_count <= self.max_listed:
            patterns = np.array(list(itertools.product((0, 1), repeat=self.k)), dtype=bool)
            shifts = np.where(patterns, self.log_a, self.log_b)
            losses = (maxima + shifts).max(axis=1) - (minima + shifts).min(axis=1)
            rows = [tuple(int(b) for b in row) for row in patterns]
            return CandidateLosses(
                np.asarray(losses, dtype=np.float64),
                lambda j: list(rows[j]),
                magnitude,
                written_epsilon_error(magnitude),
            )
        found = subset_worst(maxima, minima, self.log_a - self.log_b)
        worst_bits = [0] * self.k
        if found.inside is not None:
            worst_bits[found.inside] = 1
        worst = found.loss
        bits = tuple(worst_bits)
        return CandidateLosses(
            np.array([worst]),
            lambda _j: list(bits),
            magnitude,
            written_epsilon_error(magnitude),
            complete=False,
        )

    @cached_property
    def _probabilities(self) -> tuple[RealProbability, RealProbability]:
        """``(p, q)`` for the written ε, drawn exactly: ``p(1-q)/(q(1-p)) = e^ε``.

        ``optimized``: ``1/2`` and ``1/(e^ε + 1)``; ``symmetric``: ``e^{ε/2}/(e^{ε/2} + 1)`` and
        ``1/(e^{ε/2} + 1)``. Bracketed once per mechanism (a survey samples a million members).
        """
        eps = decimal_fraction(self.eps)
        if self.variant == "optimized":
            return RealProbability.rational(Fraction(1, 2)), rr_complement(eps, 1)
        return rr_probability(eps / 2, 1), rr_complement(eps / 2, 1)

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Draw all k bits; bit ``v`` with ``p``, the rest with ``q``."""
        v = self.attribute.index_of(value[self.attribute.name], self.attribute.name)
        p, q = self._probabilities
        return tuple(int((p if j == v else q).draw()) for j in range(self.k))

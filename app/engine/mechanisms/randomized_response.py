"""Randomised-response mechanisms: ``grr`` (k-ary) and ``binary_rr`` (a predicate).

``grr`` on an attribute with ``k`` values outputs x's value with probability
``e^ε / (k - 1 + e^ε)`` and each other value with ``1 / (k - 1 + e^ε)``. ``binary_rr`` outputs
the predicate's truth (``1``/``0``) with probability ``e^ε / (1 + e^ε)``.

Both samplers draw these probabilities exactly for the ε the client wrote
(:func:`app.engine.sampling.rr_probability`: ``e^ε`` is irrational, the draw is still exact), so
the privacy ratio of the distribution actually sampled is exactly ``e^ε`` — the ratio that the
exact loss (:mod:`app.engine.exact`) charges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine import sampling
from app.engine.domain import Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.exact import ExactQuery, ExactTerm, Group
from app.engine.jsonfields import as_integer, check_keys, path
from app.engine.likelihood import LikelihoodState, Term, TermRows
from app.engine.limits import EngineLimits
from app.engine.mechanisms.base import (
    CandidateLosses,
    Mechanism,
    Output,
    TabulatedMechanism,
    check_epsilon,
    finite_attribute,
    output_index,
    rr_log_probs,
)
from app.engine.numerics import FloatArray, decimal_fraction, log1p_exp, written_epsilon_error
from app.engine.predicates import Predicate, parse_predicate
from app.engine.sampling import RealProbability, rr_probability


class GeneralizedRR(Mechanism):
    """``grr``: k-ary randomised response on a finite attribute."""

    kind = "grr"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(raw, field, required=("mechanism", "attribute", "epsilon"))
        self.axis, self.attribute = finite_attribute(raw, domain, field)
        eps = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self.k = self.attribute.size
        self.eps = eps
        self.log_hit, self.log_miss = rr_log_probs(eps, self.k)
        super().__init__(domain, eps, eps if self.k > 1 else 0.0, field)

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON."""
        return {"mechanism": self.kind, "attribute": self.attribute.name, "epsilon": self.eps}

    @property
    def output_count(self) -> int:
        """k: one output per attribute value."""
        return self.k

    def parse_output(self, raw: Any, field: str) -> Output:
        """An output is a value of the attribute."""
        return self.attribute.index_of(raw, field)

    def output_json(self, output: Output) -> Any:
        """The attribute value."""
        return self.attribute.value_at(output_index(output))

    def term(self, output: Output) -> Term:
        """``log_hit`` on points whose attribute equals the output, ``log_miss`` elsewhere."""
        values = np.full(self.k, self.log_miss)
        values[output_index(output)] = self.log_hit
        error = written_epsilon_error(max(abs(self.log_hit), abs(self.log_miss)))
        return Term((self.axis,), values, error, exact=self.exact_term(output))

    def terms_many(self, outputs: Sequence[Output]) -> TermRows:
        """:meth:`term` of every output at once: ``log_hit`` at each output's value."""
        count = len(outputs)
        rows = np.arange(count)
        columns = np.array([output_index(y) for y in outputs], dtype=np.int64)
        values = np.full((count, self.k), self.log_miss)
        values[rows, columns] = self.log_hit
        coeff = np.zeros((count, self.k), dtype=np.int64)
        coeff[rows, columns] = 1
        magnitudes = np.abs(values).max(axis=1, initial=0.0)
        error = written_epsilon_error(max(abs(self.log_hit), abs(self.log_miss)))
        extra = np.full(count, error)
        return TermRows((self.axis,), values, magnitudes, extra, self.axis, self._group, coeff)

    def exact_term(self, output: Output) -> ExactTerm:
        """``ε`` on the output's value, 0 elsewhere (plus a constant, dropped)."""
        coeff = np.zeros(self.k, dtype=np.int64)
        coeff[output_index(output)] = 1
        return ExactTerm(self.axis, self._group, coeff)

    def exact_query(self) -> ExactQuery:
        """Output ``v`` adds ε on value ``v`` (one object per mechanism: :attr:`_exact_query`)."""
        return self._exact_query

    @cached_property
    def _group(self) -> Group:
        """The written ε's group, made once (≈ 2 µs each: 1 per submit, 3 per tight decision)."""
        return Group(decimal_fraction(self.eps))

    @cached_property
    def _exact_query(self) -> ExactQuery:
        """:meth:`exact_query`'s answer, made once with its key (a mechanism is read-only)."""
        return ExactQuery(self.axis, self._group, "grr")

    def candidate_losses(self, state: LikelihoodState) -> CandidateLosses:
        """Loss after each of the k outputs in O(|X| + k) using the top two per-value extremes.

        After output ``v`` the cells ``w != v`` keep their extremes (plus ``log_miss``) and cell
        ``v`` gains ``log_hit``; so ``max = max(M_v + hit, max_{w != v} M_w + miss)`` and likewise
        for the minimum, where ``max_{w != v}`` is the top value unless ``v`` holds it.
        """
        maxima, minima = state.extremes_over((self.axis,))
        losses = _rr_losses(maxima, minima, self.log_hit, self.log_miss)
        magnitude = max(abs(self.log_hit), abs(self.log_miss))
        error = written_epsilon_error(magnitude)
        return CandidateLosses(losses, self.output_json, magnitude, error)

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Keep the true value with probability ``e^ε / (k - 1 + e^ε)``, else a uniform other.

        The other value is drawn every time (the same work whatever is kept).
        """
        v = self.attribute.index_of(value[self.attribute.name], self.attribute.name)
        if self.k == 1:
            return 0
        keep = self._keep.draw()
        other = sampling.randbelow(self.k - 1)
        other += other >= v
        return v if keep else other

    def sample_many(self, values: Sequence[Mapping[str, Scalar]]) -> list[Output]:
        """:meth:`sample` for every value at once, with the same exact distribution.

        :meth:`sample` draws, per value, the keep event
        (:class:`~app.engine.sampling.RealProbability`) and a uniform other value in
        ``[0, k−1)``, independent of each other and of the value. Here the keep events are one
        :meth:`~app.engine.sampling.RealProbability.draw_many` and the others one
        :func:`~app.engine.sampling.randbelow_array` (exact rejection sampling), all
        independent, so each output has :meth:`sample`'s distribution and the outputs are
        independent; the work does not depend on the values (a survey chunk samples 5,000:
        per member, the Python calls of :meth:`sample` were most of the sampling's time).
        """
        name = self.attribute.name
        truth = np.array(
            self.attribute.indexes_of([value[name] for value in values], name), dtype=np.int64
        )
        count = len(truth)
        if not count or self.k == 1:
            return [0] * count
        keep = self._keep.draw_many(count)
        other = sampling.randbelow_array(self.k - 1, count).astype(np.int64)
        other += other >= truth
        drawn: list[Output] = np.where(keep, truth, other).tolist()
        return drawn

    @cached_property
    def _keep(self) -> RealProbability:
        """``e^ε / (k - 1 + e^ε)`` for the written ε: bracketed once (a survey samples 10^6)."""
        return rr_probability(decimal_fraction(self.eps), self.k - 1)


def _rr_losses(maxima: FloatArray, minima: FloatArray, hit: float, miss: float) -> FloatArray:
    """Loss after each output of k-ary RR given per-value extremes ``maxima``/``minima``."""
    k = maxima.shape[0]
    if k == 1:
        return np.array([float(maxima[0] - minima[0])])
    top = np.argsort(maxima)[-2:][::-1]
    bottom = np.argsort(minima)[:2]
    idx = np.arange(k)
    other_max = np.where(idx == top[0], maxima[top[1]], maxima[top[0]])
    other_min = np.where(idx == bottom[0], minima[bottom[1]], minima[bottom[0]])
    hi = np.maximum(maxima + hit, other_max + miss)
    lo = np.minimum(minima + hit, other_min + miss)
    return np.asarray(hi - lo, dtype=np.float64)


class BinaryRR(TabulatedMechanism):
    """``binary_rr``: randomised response on the truth of a predicate; outputs ``0``/``1``."""

    kind = "binary_rr"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(raw, field, required=("mechanism", "predicate", "epsilon"))
        self.predicate: Predicate = parse_predicate(
            raw["predicate"], domain, path(field, "predicate")
        )
        eps = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self.eps = eps
        self.axes = (self.predicate.axis,)
        can_true, can_false = self.predicate.attainable()
        super().__init__(domain, eps, eps if (can_true and can_false) else 0.0, field)

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON."""
        return {"mechanism": self.kind, "predicate": self.predicate.to_json(), "epsilon": self.eps}

    @property
    def output_count(self) -> int:
        """Two outputs."""
        return 2

    def parse_output(self, raw: Any, field: str) -> Output:
        """``1`` or ``0``."""
        out = as_integer(raw, field)
        if out not in (0, 1):
            raise InvalidInput(field, "must be 0 or 1")
        return out

    def output_json(self, output: Output) -> Any:
        """``0`` or ``1``."""
        return int(output)  # type: ignore[arg-type]

    def log_table(self) -> FloatArray:
        """Rows: attribute values; columns: outputs 0 and 1."""
        if not self.predicate.attribute.is_finite:
            raise ValueError("tabulating a predicate needs a finite attribute")
        truth = self.predicate.truth_table()
        log_true, log_false = -log1p_exp(-self.eps), -log1p_exp(self.eps)
        col1 = np.where(truth, log_true, log_false)
        col0 = np.where(truth, log_false, log_true)
        return np.stack([col0, col1], axis=-1)

    @property
    def extra_error(self) -> float:
        """The float ε's distance to the written one (:func:`written_epsilon_error`)."""
        return written_epsilon_error(float(np.max(np.abs(self.table()))))

    @cached_property
    def _exact_table(self) -> npt.NDArray[np.int64]:
        """Columns 0 and 1: whether the output equals the predicate's truth, per value."""
        truth = self.predicate.truth_table().astype(np.int64)
        return np.stack([1 - truth, truth], axis=-1)

    def exact_term(self, output: Output) -> ExactTerm | None:
        """``ε`` where the predicate's truth equals the output (finite attributes)."""
        if not self.predicate.attribute.is_finite:
            return None
        column = self._exact_table[:, output_index(output)]
        return ExactTerm(self.predicate.axis, self._group, column)

    def exact_query(self) -> ExactQuery | None:
        """Outputs 0 and 1 as a two-column table (one object per mechanism)."""
        return self._exact_query

    @cached_property
    def _group(self) -> Group:
        """The written ε's group, made once (see :attr:`GeneralizedRR._group`)."""
        return Group(decimal_fraction(self.eps))

    @cached_property
    def _exact_query(self) -> ExactQuery | None:
        """:meth:`exact_query`'s answer, made once with its key (its table's bytes included)."""
        if not self.predicate.attribute.is_finite:
            return None
        return ExactQuery(self.predicate.axis, self._group, "table", self._exact_table)

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Report the truth with probability ``e^ε / (1 + e^ε)``, its negation otherwise."""
        truth = int(self.predicate.evaluate(value[self.predicate.attribute.name]))
        honest = int(self._honest.draw())
        return truth ^ (1 - honest)

    @cached_property
    def _honest(self) -> RealProbability:
        """``e^ε / (1 + e^ε)`` for the written ε, bracketed once."""
        return rr_probability(decimal_fraction(self.eps), 1)

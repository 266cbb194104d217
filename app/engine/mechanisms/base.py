"""What every mechanism (query type) provides to the engine.

A mechanism is parsed against a domain and then knows: its tight ε (the smallest ε for which it
is ε-LDP over that domain), its outputs, ``log Pr(M(x) = y)`` as a :class:`Term` for any output,
the realized loss after each possible output given a :class:`LikelihoodState` (the inner loop of
Algorithm 2), and how to draw an output given the true value with an exact CSPRNG sampler.

Only :meth:`Mechanism.sample` ever sees the true value; everything a filter decision uses
(:meth:`Mechanism.candidate_losses`, :meth:`Mechanism.term`) depends on the public query alone.
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from app.engine.domain import Attribute, Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.exact import (
    MAX_GROUPS,
    ExactLoss,
    ExactQuery,
    ExactTerm,
    moved_losses_at,
    moved_units_each,
)
from app.engine.likelihood import LikelihoodState, Term, TermRows, losses_from_table
from app.engine.limits import EXACT_EPSILON_BITS, EngineLimits
from app.engine.numerics import (
    FloatArray,
    certified_upper,
    decimal_fraction,
    round_up_dyadic,
)

#: Internal form of an output: an index into the mechanism's outputs, or a bit vector.
Output = int | tuple[int, ...]


def output_index(output: Output) -> int:
    """The index form of an output (raises ``TypeError`` for a bit vector)."""
    if not isinstance(output, int):
        raise TypeError("this mechanism's outputs are indexes")
    return output


def output_bits(output: Output) -> tuple[int, ...]:
    """The bit-vector form of an output (raises ``TypeError`` for an index)."""
    if not isinstance(output, tuple):
        raise TypeError("this mechanism's outputs are bit vectors")
    return output


#: Relative slack allowed between a computed tight ε and the declared one before the declared
#: value counts as too low (rounding in the computation of the tight ε).
EPSILON_SLACK = 1e-9


@dataclass(frozen=True)
class CandidateLosses:
    """Computed realized loss after each output of a candidate query.

    ``losses[j]`` is the loss after output ``output_of(j)``. When the mechanism has too many
    outputs to enumerate (``complete`` False), the entries are representatives that include a
    worst one, so ``losses.max()`` is still the worst case over *all* outputs.
    """

    losses: FloatArray
    output_of: Callable[[int], Any]
    term_magnitude: float
    extra_error: float = 0.0
    complete: bool = True


class Mechanism(abc.ABC):
    """A parsed, validated LDP query bound to a domain."""

    kind: ClassVar[str]
    #: Whether two answers practically never coincide (``olh``: a fresh 64-bit seed in each).
    #: A survey then stores no likelihood array per answer (``objects.state_pending``).
    distinct_outputs: ClassVar[bool] = False
    #: :meth:`listed_outputs`' memo: the count it was built for and the outputs' JSON.
    _listed: tuple[int, tuple[Any, ...]] | None = None

    def __init__(
        self, domain: Domain, declared_epsilon: float | None, tight_epsilon: float, field: str
    ) -> None:
        if (
            declared_epsilon is not None
            and tight_epsilon > declared_epsilon * (1 + EPSILON_SLACK) + 1e-12
        ):
            raise InvalidInput(
                f"{field}.epsilon",
                f"is lower than the mechanism's real epsilon over this domain "
                f"({tight_epsilon:.6g})",
            )
        self.domain = domain
        self.declared_epsilon = declared_epsilon
        #: The tight ε over the domain (float).
        self.epsilon = max(0.0, tight_epsilon)
        if declared_epsilon is not None and self.epsilon >= declared_epsilon * (1 - EPSILON_SLACK):
            exact = decimal_fraction(declared_epsilon)
        else:
            exact = (
                round_up_dyadic(certified_upper(self.epsilon), EXACT_EPSILON_BITS)
                if self.epsilon > 0
                else Fraction(0)
            )
            if declared_epsilon is not None:
                exact = min(exact, decimal_fraction(declared_epsilon))
        #: A rational upper bound of the tight ε used for exact basic composition.
        self.epsilon_exact: Fraction = exact

    # --- description -------------------------------------------------------------------------
    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The query in canonical JSON-contract form."""

    # --- outputs -----------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def output_count(self) -> int:
        """Number of possible outputs (may be astronomically large, e.g. 2**k bit vectors)."""

    @abc.abstractmethod
    def parse_output(self, raw: Any, field: str) -> Output:
        """Validate an output of this query from JSON and return its internal form."""

    @abc.abstractmethod
    def output_json(self, output: Output) -> Any:
        """The JSON form of an internal output."""

    def output_text(self, output: Output) -> str:
        """``json.dumps(self.output_json(output))``: the output as a history stores it."""
        return json.dumps(self.output_json(output))

    def listed_output(self, j: int) -> Output:
        """The ``j``-th output in listing order: the index itself by default.

        A decision that lists outputs without ranking them (basic composition) lists the first
        few in this order.
        """
        return j

    def listed_outputs(self, count: int) -> tuple[Any, ...]:
        """The JSON of the first ``count`` outputs in listing order, built once per query.

        Every decision by basic composition lists them (a survey decides one group per public
        state: a thousand groups listed 256 ``olh`` outputs each). Read only.
        """
        found = self._listed
        if found is None or found[0] != count:
            found = (count, tuple(self.output_json(self.listed_output(j)) for j in range(count)))
            self._listed = found
        return found[1]

    # --- likelihood (finite domains) ---------------------------------------------------------
    @abc.abstractmethod
    def term(self, output: Output) -> Term:
        """``log Pr(M(x) = output)`` over the domain's grid."""

    def terms_many(self, outputs: Sequence[Output]) -> TermRows:
        """:meth:`term` of every output (at least one), as rows.

        For :func:`~app.engine.likelihood.fold_many`; a mechanism may compute them at once.
        """
        return TermRows.of([self.term(output) for output in outputs])

    @abc.abstractmethod
    def candidate_losses(self, state: LikelihoodState) -> CandidateLosses:
        """Realized loss of ``state`` extended by each possible output (without mutating it)."""

    def exact_term(self, output: Output) -> ExactTerm | None:
        """The output's log-likelihood in exact form (randomized response only; else None)."""
        return None

    def exact_query(self) -> ExactQuery | None:
        """How each output moves an exact history (randomized response only; else None).

        Its outputs are in the order of :meth:`candidate_losses`.
        """
        return None

    def exact_losses_after(
        self, histories: Sequence[ExactLoss], outputs: Sequence[Output], owners: Sequence[int]
    ) -> list[Fraction] | None:
        """The exact loss after each output, output ``i`` recorded on ``histories[owners[i]]``.

        ``histories[o].with_term(self.exact_term(y)).loss()`` for every output, computed
        without building the states; None when the mechanism has no such shortcut (the caller
        records each output instead) or a history's exact form would not survive the output.

        By default, for queries whose outputs are indexes moving one axis as ``grr`` (ε on the
        output's value) or a table (``binary_rr``): the loss after output ``y`` is the
        candidate loss of ``y`` (:meth:`~app.engine.exact.ExactLoss.candidate_losses`),
        computed for every history at once (:func:`~app.engine.exact.moved_losses_many`).
        """
        query = self.exact_query()
        if query is None or query.kind not in ("grr", "table") or not histories:
            return None
        if any(query.group not in h.groups and len(h.groups) >= MAX_GROUPS for h in histories):
            return None  # that history's exact form ends with the output
        columns = np.array([output_index(y) for y in outputs], dtype=np.int64)
        return moved_losses_at(histories, query, np.asarray(owners, dtype=np.int64), columns)

    def exact_units_after(
        self, histories: Sequence[ExactLoss]
    ) -> list[tuple[list[int], int] | None] | None:
        """Per history, the exact loss after every output: ``(units, denominator)``.

        ``Fraction(units[output_index(y)], denominator)`` is :meth:`exact_losses_after`'s
        loss after output ``y`` on that history (:func:`~app.engine.exact.moved_units_each`,
        kept on the history). None for a history whose exact form would not survive an output
        or is past ``int64`` (:meth:`exact_losses_after` then), and overall when the mechanism
        has no such shortcut.
        """
        if type(self).exact_losses_after is not Mechanism.exact_losses_after:
            return None  # a mechanism with its own shortcut (``olh``): that one's answer
        query = self.exact_query()
        if query is None or query.kind not in ("grr", "table") or not histories:
            return None
        keep = [
            n
            for n, h in enumerate(histories)
            if query.group in h.groups or len(h.groups) < MAX_GROUPS
        ]
        found: list[tuple[list[int], int] | None] = [None] * len(histories)
        units = moved_units_each([histories[n] for n in keep], query)
        if units is None:
            return None
        for n, each in zip(keep, units, strict=True):
            found[n] = each
        return found

    # --- sampling ----------------------------------------------------------------------------
    @abc.abstractmethod
    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Draw an output for the true ``value`` with the exact CSPRNG sampler."""

    def sample_many(self, values: Sequence[Mapping[str, Scalar]]) -> list[Output]:
        """One independent :meth:`sample` per value, in order (a survey chunk's members).

        A mechanism may draw them all at once (``olh``: one generator call per chunk); each
        output keeps :meth:`sample`'s exact distribution.
        """
        return [self.sample(value) for value in values]


class TabulatedMechanism(Mechanism):
    """A mechanism with a small number of outputs whose log-likelihood is a dense table.

    Subclasses implement :meth:`log_table`: an array of shape ``(*cells, n_outputs)`` over the
    attributes :attr:`axes`, computed once and cached.
    """

    axes: tuple[int, ...]
    _table: FloatArray | None = None

    @abc.abstractmethod
    def log_table(self) -> FloatArray:
        """``log Pr(y_j | cell)`` for every cell of :attr:`axes` and output ``j``."""

    def table(self) -> FloatArray:
        """The cached :meth:`log_table`."""
        if self._table is None:
            self._table = self.log_table()
        return self._table

    @property
    def extra_error(self) -> float:
        """Rounding error beyond the default model that one update of this mechanism adds."""
        return 0.0

    def term(self, output: Output) -> Term:
        """The column of the table for ``output``."""
        column = self.table()[..., output_index(output)]
        return Term(
            self.axes, np.ascontiguousarray(column), self.extra_error, self.exact_term(output)
        )

    def candidate_losses(self, state: LikelihoodState) -> CandidateLosses:
        """Loss after every output, from per-cell extremes of ``log P`` (O(|X| + cells·outputs))."""
        table = self.table()
        maxima, minima = state.extremes_over(self.axes)
        losses = losses_from_table(maxima, minima, table)
        return CandidateLosses(
            losses, self.output_json, float(np.max(np.abs(table))), self.extra_error
        )


@dataclass(frozen=True)
class SubsetWorst:
    """The worst output of a two-level mechanism and a pair of values that attains it.

    ``inside`` must gain ``step`` and ``outside`` must not (``None``: every output is worst).
    """

    loss: float
    inside: int | None
    outside: int | None


def subset_worst(maxima: FloatArray, minima: FloatArray, step: float) -> SubsetWorst:
    r"""Worst loss over every output that adds ``step`` on a subset ``S`` of a k-valued attribute.

    A *two-level* output (``unary_encoding``'s bit vectors, ``olh``'s buckets, ``hadamard``'s
    columns) has log-likelihood ``C + step·[v ∈ S]`` on value ``v``. With per-value extremes
    :math:`M_v, m_v` of the history's log-likelihood, the loss after ``S`` is
    :math:`\max(\max_S M + s, \max_{S^c} M) - \min(\min_S m + s, \min_{S^c} m)`, and over all
    ``S``

    .. math::

        \max\Bigl(\max_{v \ne w} (M_v - m_w) + s,\; \max_v (M_v - m_v)\Bigr),

    attained by *every* ``S`` with ``v ∈ S`` and ``w ∉ S`` for the maximising pair (first case;
    the rest of ``S`` changes neither extreme: ``v`` holds the largest ``M`` and ``w`` the
    smallest ``m`` among the values that can matter) or by every ``S`` (second case: the loss
    never falls below the history's). So a mechanism whose outputs separate every ordered pair
    of values reaches this bound with any output that separates the pair returned here.

    >>> import numpy as np
    >>> found = subset_worst(np.array([0.0, 2.0, 1.0]), np.array([0.0, 2.0, -1.0]), 0.5)
    >>> found.loss, found.inside, found.outside
    (3.5, 1, 2)
    """
    k = maxima.shape[0]
    within = float(np.max(maxima - minima))
    if k < 2:
        return SubsetWorst(within, None, None)
    top = _two(maxima, largest=True)
    bottom = _two(minima, largest=False)
    if top[0] != bottom[0]:
        v, w = top[0], bottom[0]
    elif maxima[top[0]] - minima[bottom[1]] >= maxima[top[1]] - minima[bottom[0]]:
        v, w = top[0], bottom[1]
    else:
        v, w = top[1], bottom[0]
    across = float(maxima[v] - minima[w]) + step
    if across >= within:
        return SubsetWorst(across, v, w)
    return SubsetWorst(within, None, None)


def _two(values: FloatArray, *, largest: bool) -> tuple[int, int]:
    """Indexes of the two largest (or smallest) of ``values`` (``len >= 2``), best first: O(k)."""
    k = values.shape[0]
    pair = np.argpartition(values, k - 2)[-2:] if largest else np.argpartition(values, 1)[:2]
    a, b = int(pair[0]), int(pair[1])
    first_wins = values[a] >= values[b] if largest else values[a] <= values[b]
    return (a, b) if first_wins else (b, a)


def finite_attribute(raw: Mapping[str, Any], domain: Domain, field: str) -> tuple[int, Attribute]:
    """The axis and attribute a query's ``attribute`` names: a finite one (integer/categorical).

    Raises :class:`InvalidInput` naming ``{field}.attribute`` otherwise.
    """
    from app.engine.jsonfields import path

    attr_field = path(field, "attribute")
    if not isinstance(raw["attribute"], str):
        raise InvalidInput(attr_field, "must be a string")
    axis = domain.axis(raw["attribute"], attr_field)
    attribute = domain.attributes[axis]
    if not attribute.is_finite:
        raise InvalidInput(attr_field, "must name an integer or categorical attribute")
    return axis, attribute


def check_epsilon(raw: Any, field: str, limits: EngineLimits) -> float:
    """Validate a declared ε: a finite number in ``[limits.min_epsilon, limits.max_epsilon]``."""
    from app.engine.jsonfields import as_positive_number

    return as_positive_number(
        raw, field, maximum=limits.max_epsilon, minimum=limits.min_epsilon or None
    )


def rr_log_probs(epsilon: float, k: int) -> tuple[float, float]:
    r"""Log-probabilities of k-ary randomised response: (same value, each other value).

    .. math::

        \log\frac{e^\varepsilon}{k-1+e^\varepsilon},\quad \log\frac{1}{k-1+e^\varepsilon}
    """
    log_norm = float(np.logaddexp(math.log(k - 1), epsilon)) if k > 1 else epsilon
    return epsilon - log_norm, -log_norm

r"""Exact realized loss of randomized-response histories (exact ties, contract.md).

For ``grr``, ``binary_rr`` and ``unary_encoding`` (both variants) the log-likelihood of an output
is ``ε · a(x) + c(y)`` with ``a(x)`` an integer that depends on one attribute only: the indicator
that x's value equals the output (``grr``), that the predicate's truth equals the output
(``binary_rr``), the output's bit at x's value (``unary_encoding``: ``log Pr(s | v) = C(s) +
(A if s_v else B)`` with ``A - B = ε``, symmetric and optimized alike). Over such a history

.. math::

    \log P(x) = \sum_g \varepsilon_g \sum_a C_{g,a}[x_a] + \text{const},

integer counts ``C`` per distinct ε (a *group*) and attribute ``a``. Since the domain is a
Cartesian product the maximum and minimum separate by attribute, and the realized loss is
``Σ_a (max_v V_a[v] − min_v V_a[v])`` with ``V_a = Σ_g ε_g C_{g,a}``: exact rational arithmetic
on a few integer vectors per object.

Every ε is the decimal the client wrote (:func:`~app.engine.numerics.decimal_fraction`: ``0.1``
is 1/10), and the budget too, so ten ``binary_rr`` of ε = 0.1 reach a loss of exactly 1. All
values are integers in units of ``1/D``, ``D`` the least common multiple of the groups'
denominators, in ``int64`` when they certainly fit, else Python integers.

Samplers. This is the loss of the distributions actually sampled: each sampler draws its real
probabilities exactly (:class:`~app.engine.sampling.RealProbability`, ``e^ε/(c + e^ε)`` for the
written ε), so every output's log-likelihood ratio is exactly ``ε``, as here. Being *at most* ε
would not be enough once two ε's mix: with ratios ``λ_g <= ε_g`` that fall short by different
amounts a history's sampled loss can exceed the exact one (three outputs of ε = 0.5 on one value
and two of 0.25 on the other: ``3λ₁ − 2λ₂ > 1`` when ``λ₂`` falls short by more than
``1.5 (ε₁ − λ₁)``), and a tie would then be unsound. Drawn exactly, mixed ε's tie exactly too.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[Any]
#: Distinct ε's (groups) a history keeps its exact form for (``likelihood._exact_after``).
MAX_GROUPS = 32
#: Marks the exact part appended to a likelihood array's bytes. Version 2: groups are written
#: decimals drawn by exact samplers. A version 1 part (ε's as their floats' values, drawn with a
#: ratio rounded below ``e^ε``) is not read: such a history is decided by the float rule.
MAGIC = b"\x00EXACT2\x00"
_SAFE = 1 << 62


@dataclass(frozen=True)
class Group:
    """A distinct declared ε: the decimal the client wrote, as a rational."""

    epsilon: Fraction


@dataclass(frozen=True)
class ExactTerm:
    """The x-dependent part of one RR-type output's log-likelihood: ``ε · coeff[x_axis]``."""

    axis: int
    group: Group
    coeff: IntArray


@dataclass(frozen=True)
class ExactQuery:
    """How an RR-type candidate moves the exact values, output by output.

    ``kind`` ``"table"``: output ``j`` adds ``ε · table[:, j]`` on the axis; ``"grr"``: output
    ``j`` adds ε on value ``j``; ``"ue"``: outputs are bit patterns adding ε on set bits —
    enumerated in ``itertools.product((0, 1), repeat=k)`` order when ``enumerate`` is true,
    otherwise one worst representative.
    """

    axis: int
    group: Group
    kind: Literal["table", "grr", "ue"]
    table: IntArray | None = None
    enumerate: bool = True


def _in_units(groups: list[Group]) -> tuple[int, list[int]]:
    """``D`` (the lcm of the groups' denominators) and every group's ε in units of ``1/D``."""
    denominator = 1
    for g in groups:
        denominator = math.lcm(denominator, g.epsilon.denominator)
    return denominator, [
        g.epsilon.numerator * (denominator // g.epsilon.denominator) for g in groups
    ]


@dataclass(frozen=True)
class ExactLoss:
    """Integer counts per (attribute, group) of an RR-type history over a finite domain.

    ``counts[a]`` has shape ``(len(groups), shape[a])``; attributes no query touched are absent.
    """

    shape: tuple[int, ...]
    groups: tuple[Group, ...] = ()
    counts: dict[int, IntArray] = field(default_factory=dict)

    # --- building ----------------------------------------------------------------------------
    def with_term(self, term: ExactTerm) -> ExactLoss:
        """The history plus one RR-type output (a new object; this one is unchanged)."""
        groups = self.groups
        if term.group not in groups:
            groups = (*groups, term.group)
        g = groups.index(term.group)
        counts: dict[int, IntArray] = {}
        for axis, arr in self.counts.items():
            counts[axis] = _pad(arr, len(groups))
        row = counts.get(term.axis)
        if row is None:
            row = np.zeros((len(groups), self.shape[term.axis]), dtype=np.int64)
        else:
            row = row.copy()
        row[g] += np.asarray(term.coeff, dtype=np.int64)
        counts[term.axis] = row
        return ExactLoss(self.shape, groups, counts)

    # --- values ------------------------------------------------------------------------------
    def _scale(self, extra: Group | None = None) -> tuple[int, list[int]]:
        """``D`` and every group's ε in units of ``1/D`` (``extra`` counted too)."""
        return _in_units([*self.groups, *([extra] if extra is not None else [])])

    def values(self, axis: int, scaled: list[int]) -> IntArray:
        """``V_axis`` in units of ``1/D`` (``int64`` when it fits, else Python ints)."""
        arr = self.counts.get(axis)
        if arr is None:
            return np.zeros(self.shape[axis], dtype=np.int64)
        weights = scaled[: arr.shape[0]]
        # the weights themselves must fit too (a count of 0 multiplies nothing away)
        bound = sum(abs(w) for w in weights) * max(1, int(np.abs(arr).max()) if arr.size else 0)
        if bound < _SAFE:
            return np.asarray(np.asarray(weights, dtype=np.int64) @ arr, dtype=np.int64)
        return np.asarray(np.asarray(weights, dtype=object) @ arr.astype(object), dtype=object)

    def _ranges(self, scaled: list[int], skip: int | None = None) -> int:
        """``Σ_a (max V_a − min V_a)`` over the touched attributes other than ``skip``."""
        total = 0
        for axis in self.counts:
            if axis != skip:
                v = self.values(axis, scaled)
                total += int(v.max()) - int(v.min())
        return total

    @cached_property
    def _loss(self) -> Fraction:
        denominator, scaled = self._scale()
        return Fraction(self._ranges(scaled), denominator)

    def loss(self) -> Fraction:
        """The exact realized loss (computed once)."""
        return self._loss

    def candidate_losses(self, query: ExactQuery) -> list[Fraction]:
        """The exact loss after each output of ``query``, in the float path's output order."""
        if query.group in self.groups:
            denominator, scaled = self._scale()
            step = scaled[self.groups.index(query.group)]
        else:
            denominator, scaled = self._scale(query.group)
            step = scaled[-1]
        base = self.values(query.axis, scaled)
        others = self._ranges(scaled, skip=query.axis)
        units = [others + u for u in _axis_losses(base, step, query)]
        return [Fraction(u, denominator) for u in units]

    def subset_profile(self, axis: int, group: Group) -> SubsetProfile | None:
        """What :func:`subset_losses` needs of this history for outputs of ``group`` on ``axis``.

        Computed once per history (kept on it: a survey asks it for every chunk). None when
        the history's exact form would be dropped (:data:`MAX_GROUPS`) or its values leave
        ``int64``.
        """
        key = (axis, group)
        if key not in self._profiles:
            self._profiles[key] = self._profile(axis, group)
        return self._profiles[key]

    @cached_property
    def _profiles(self) -> dict[tuple[int, Group], SubsetProfile | None]:
        return {}

    def _profile(self, axis: int, group: Group) -> SubsetProfile | None:
        if group in self.groups:
            denominator, scaled = self._scale()
            step = scaled[self.groups.index(group)]
        elif len(self.groups) >= MAX_GROUPS:
            return None
        else:
            denominator, scaled = self._scale(group)
            step = scaled[-1]
        base = self.values(axis, scaled)
        if base.dtype == object or int(np.abs(base).max(initial=0)) + step >= _SAFE:
            return None
        down = np.argsort(-base, kind="stable")
        up = np.argsort(base, kind="stable")
        others = self._ranges(scaled, skip=axis)
        return SubsetProfile(denominator, step, others, base, down, up)

    # --- persistence -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """A compact JSON encoding (appended to the likelihood array's bytes)."""
        doc = {
            "g": [[g.epsilon.numerator, g.epsilon.denominator] for g in self.groups],
            "c": {str(a): arr.tolist() for a, arr in sorted(self.counts.items())},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, shape: tuple[int, ...], data: bytes) -> ExactLoss:
        """Rebuild from :meth:`to_bytes`."""
        doc = json.loads(data)
        groups = tuple(Group(Fraction(n, d)) for n, d in doc["g"])
        counts = {int(a): np.asarray(rows, dtype=np.int64) for a, rows in doc["c"].items()}
        return cls(shape, groups, counts)

    def canonical_bytes(self) -> bytes:
        """The form's content whatever the order of its history (a stored state's key).

        Groups sorted by ε, each attribute's count rows in that order: two histories with
        the same multiset of randomized-response outputs (per attribute and written ε) have
        the same counts, hence the same canonical bytes — and the same decision, since a
        decision on an exact history reads these counts and nothing else of the state.
        The bytes are the compact JSON ``{"s": shape, "g": [[num, den], ...], "c": {axis:
        rows}}`` (:func:`canonical_json`, the definition), written here without building the
        document (a survey keys every new state by them) and computed once per form.
        """
        return self._canonical

    @cached_property
    def _canonical(self) -> bytes:
        groups = self.groups
        order = (
            list(range(len(groups)))
            if len(groups) < 2
            else sorted(range(len(groups)), key=lambda g: groups[g].epsilon)
        )
        identity = order == list(range(len(groups)))
        written = ",".join(
            f"[{groups[g].epsilon.numerator},{groups[g].epsilon.denominator}]" for g in order
        )
        # a list of integers prints as its JSON but for the spaces after the commas
        counts = ",".join(
            f'"{axis}":'
            + str((self.counts[axis] if identity else self.counts[axis][order]).tolist())
            for axis in sorted(self.counts)
        ).replace(" ", "")
        shape = ",".join(map(str, self.shape))
        return f'{{"s":[{shape}],"g":[{written}],"c":{{{counts}}}}}'.encode()

    def same_as(self, other: ExactLoss | None) -> bool:
        """Equal counts per group, whatever order the groups came in (``verify``).

        A stored state is shared by every history with its content (:meth:`canonical_bytes`),
        so its groups are in the order of the history that stored it first.
        """
        return other is not None and other.canonical_bytes() == self.canonical_bytes()


def canonical_json(exact: ExactLoss) -> bytes:
    """:meth:`ExactLoss.canonical_bytes` by its definition (``json.dumps`` of the document)."""
    order = sorted(range(len(exact.groups)), key=lambda g: exact.groups[g].epsilon)
    doc = {
        "s": list(exact.shape),
        "g": [
            [exact.groups[g].epsilon.numerator, exact.groups[g].epsilon.denominator] for g in order
        ],
        "c": {str(a): arr[order].tolist() for a, arr in sorted(exact.counts.items())},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SubsetProfile:
    """One exact history seen from one axis, for outputs that add ``ε`` on a subset of it.

    ``base``: the axis's values ``V`` in units of ``1/denominator``; ``step``: ``ε`` in those
    units; ``others``: the other attributes' ranges; ``down``/``up``: the values sorted by
    decreasing/increasing ``V``.
    """

    denominator: int
    step: int
    others: int
    base: IntArray
    down: IntArray
    up: IntArray


#: ``hits(rows, values)``: the 0/1 matrix ``[values[i, j] ∈ S_rows[i]]`` of several outputs'
#: subsets (``values`` has one row of value indexes per output).
SubsetHits = Callable[[IntArray, IntArray], IntArray]
#: Marks an extreme a probe did not settle (every settled one is below ``2^62`` in magnitude).
_UNKNOWN = np.iinfo(np.int64).min


def subset_losses(
    profiles: Sequence[SubsetProfile], owners: IntArray, hits: SubsetHits, probe: int = 64
) -> list[Fraction]:
    """The exact loss after each of several two-level outputs, without building their states.

    Output ``i`` is recorded on the history ``profiles[owners[i]]`` (all over one axis of ``k``
    values) and adds ``ε`` on its subset ``S_i``. The loss is the other attributes' ranges plus
    ``max(max_S V + step, max_{S^c} V) − min(min_S V + step, min_{S^c} V)``. Over the values
    sorted by ``V`` (decreasing for the maxima, increasing for the minima) the first member of
    ``S`` and the first non-member give those four extremes, so only the first ``probe`` values
    of each order are looked up, for every output at once; an output whose probe holds no
    member (or no non-member) while values remain is looked up over all of them. Equal to
    ``with_term(...).loss()`` of each output (tested against a brute force).
    """
    owners = np.asarray(owners, dtype=np.int64)
    count = owners.shape[0]
    if not count:
        return []
    k = profiles[0].base.shape[0]
    width = min(probe, k)
    bases = np.stack([p.base for p in profiles])
    steps = np.array([p.step for p in profiles], dtype=np.int64)[owners]
    rows = np.arange(count)
    extremes = []
    for orders, pick in (
        ([p.down for p in profiles], np.maximum),
        ([p.up for p in profiles], np.minimum),
    ):
        probed = np.stack([order[:width] for order in orders])[owners]
        found = _first_extremes(bases, owners, steps, hits, rows, probed, width == k, pick)
        for row in np.flatnonzero(found == _UNKNOWN).tolist():  # rare: look at every value
            owner = int(owners[row])
            single = np.array([row])
            found[row] = _first_extremes(
                bases,
                owners[single],
                steps[single],
                hits,
                single,
                orders[owner][None, :],
                True,
                pick,
            )[0]
        extremes.append(found)
    spans = extremes[0] - extremes[1]
    others = np.array([p.others for p in profiles], dtype=object)[owners]
    denominators = np.array([p.denominator for p in profiles], dtype=object)[owners]
    cache: dict[tuple[int, int], Fraction] = {}  # few distinct losses: build each once
    losses = []
    for units, denominator in zip((others + spans).tolist(), denominators.tolist(), strict=True):
        loss = cache.get((units, denominator))
        if loss is None:
            loss = cache[(units, denominator)] = Fraction(units, denominator)
        losses.append(loss)
    return losses


def _first_extremes(
    bases: IntArray,
    owners: IntArray,
    step: IntArray,
    hits: SubsetHits,
    rows: IntArray,
    order: IntArray,
    complete: bool,
    pick: Any,
) -> IntArray:
    """``pick(extreme over S + step, extreme over S^c)`` per row, from ``order``'s first hits.

    Row ``i`` of ``order`` sorts (some of) the values so that the first member of output
    ``rows[i]``'s subset holds its extreme (and likewise the first non-member);
    ``bases[owners[i]]`` is that output's ``V`` (only the values ``order`` names are read: a
    chunk's 5,000 outputs over k = 1,000 values gather 5,000 × 64, not 5,000 × 1,000). A
    row whose ``order`` has no member or no non-member is settled only when ``complete``
    (``order`` holds every value: that side is empty); else it is :data:`_UNKNOWN`.
    """
    inside = np.asarray(hits(rows, order), dtype=bool)
    has_in, has_out = inside.any(axis=1), (~inside).any(axis=1)
    ordered = bases[owners[:, None], order]
    index = np.arange(order.shape[0])
    at_in = ordered[index, inside.argmax(axis=1)] + step
    at_out = ordered[index, (~inside).argmax(axis=1)]
    # an empty side never wins: the other side's value stands in for it
    found = pick(np.where(has_in, at_in, at_out), np.where(has_out, at_out, at_in))
    settled = np.asarray((has_in & has_out) | complete, dtype=bool)
    return np.asarray(np.where(settled, found, _UNKNOWN), dtype=np.int64)


def _pad(arr: IntArray, rows: int) -> IntArray:
    if arr.shape[0] == rows:
        return arr
    extra = np.zeros((rows - arr.shape[0], arr.shape[1]), dtype=np.int64)
    return np.concatenate([arr, extra])


def _axis_losses(base: IntArray, step: int, query: ExactQuery) -> list[int]:
    """``max − min`` of ``base`` moved by each output's term (integer units, exact).

    ``int64`` arithmetic when every moved value certainly fits, else Python integers.
    """
    top = int(np.abs(base).max()) if base.size else 0
    if base.dtype == object or top + abs(step) >= _SAFE:
        base = base.astype(object)
        step_arr: Any = step
    else:
        step_arr = np.int64(step)
    k = base.shape[0]
    if query.kind == "table":
        assert query.table is not None  # noqa: S101 - a table query carries its table
        moved = base[:, None] + step_arr * query.table.astype(base.dtype)
        return [int(v) for v in (moved.max(axis=0) - moved.min(axis=0)).tolist()]
    if query.kind == "grr":
        if k == 1:
            return [0]
        lo_order = np.argsort(base, kind="stable")
        top2, bottom2 = lo_order[::-1][:2], lo_order[:2]
        # built as arrays of base's dtype: np.where would force Python integers into int64
        other_hi = np.full(k, base[top2[0]], dtype=base.dtype)
        other_hi[top2[0]] = base[top2[1]]
        other_lo = np.full(k, base[bottom2[0]], dtype=base.dtype)
        other_lo[bottom2[0]] = base[bottom2[1]]
        hit = base + step_arr
        hi = np.where(hit > other_hi, hit, other_hi)
        lo = np.where(hit < other_lo, hit, other_lo)
        return [int(v) for v in (hi - lo).tolist()]
    if query.enumerate:  # unary encoding, every bit pattern in itertools.product order
        patterns = np.array(list(itertools.product((0, 1), repeat=k)), dtype=np.int64)
        moved = base[None, :] + step_arr * patterns.astype(base.dtype)
        return [int(v) for v in (moved.max(axis=1) - moved.min(axis=1)).tolist()]
    if k == 1:
        return [0]
    if base.dtype == object:  # Python integers: numpy's sort
        order = np.argsort(base, kind="stable")
        low_i, top_i = order[:2].tolist(), order[-2:].tolist()
    else:  # the two smallest and two largest in O(k)
        low_i = np.argpartition(base, 1)[:2].tolist()
        top_i = np.argpartition(base, k - 2)[-2:].tolist()
    within = max(int(base[i]) for i in top_i) - min(int(base[i]) for i in low_i)
    across = max(int(base[v]) - int(base[w]) for v in top_i for w in low_i if v != w)
    return [max(within, across + step)]

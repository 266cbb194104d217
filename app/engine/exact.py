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
#: What :meth:`ExactLoss.canonical_after`'s templates hold for a key not met yet (this object,
#: by identity: a template is never it).
_NO_TEMPLATE: tuple[bytes, list[int], bytes, list[bytes]] = (b"", [], b"", [])
#: Count arrays of at most this many entries are summed in Python ints (:meth:`ExactLoss._range`).
_SMALL = 64


@dataclass(frozen=True, eq=False)
class Group:
    """A distinct declared ε: the decimal the client wrote, as a rational.

    Equal when their ε's are equal. Compared and hashed by the ε's (numerator, denominator),
    kept on the group: a survey looks groups up for every state it names, and a ``Fraction``'s
    ``==`` (an ABC check) and hash (a modular inverse) cost a few µs each (4% of a diverging
    survey's profile). A ``Fraction`` is in lowest terms, so equal pairs are equal ε's.
    """

    epsilon: Fraction
    _pair: tuple[int, int] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        epsilon = self.epsilon
        if type(epsilon) is not Fraction:
            epsilon = Fraction(epsilon)
        pair = (epsilon.numerator, epsilon.denominator)
        object.__setattr__(self, "_pair", pair)
        object.__setattr__(self, "_hash", hash(pair))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Group:
            return NotImplemented
        return self is other or self._pair == other._pair

    def __hash__(self) -> int:
        return self._hash


#: Groups by their stored (numerator, denominator) (:func:`_group_of`); a survey decodes the
#: stored form of every group it meets, nearly all of one or two ε's.
_GROUPS: dict[tuple[int, int], Group] = {}
_MAX_GROUPS_KEPT = 4096


def _group_of(numerator: int, denominator: int) -> Group:
    """``Group(Fraction(numerator, denominator))``, one per stored pair (immutable: shared).

    Only integer pairs are kept (anything else is built, and refused, as before).
    """
    if type(numerator) is not int or type(denominator) is not int:
        return Group(Fraction(numerator, denominator))
    pair = (numerator, denominator)
    found = _GROUPS.get(pair)
    if found is None:
        found = Group(Fraction(numerator, denominator))
        if len(_GROUPS) < _MAX_GROUPS_KEPT:
            _GROUPS[pair] = found
    return found


@dataclass(frozen=True)
class ExactTerm:
    """The x-dependent part of one RR-type output's log-likelihood: ``ε · coeff[x_axis]``."""

    axis: int
    group: Group
    coeff: IntArray

    @cached_property
    def moves(self) -> tuple[tuple[int, int], ...] | None:
        """The nonzero coefficients as (value, coefficient); None if one could leave ``int64``."""
        moves = tuple((i, c) for i, c in enumerate(np.asarray(self.coeff).tolist()) if c)
        return None if any(abs(c) >= _SAFE for _, c in moves) else moves


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

    @cached_property
    def key(self) -> tuple[Any, ...]:
        """What the query's moves depend on, hashable: equal keys, equal losses after it."""
        table = None
        if self.table is not None:
            table = (self.table.shape, np.asarray(self.table, dtype=np.int64).tobytes())
        return (self.kind, self.axis, self.group, self.enumerate, table)


def _in_units(groups: list[Group]) -> tuple[int, list[int]]:
    """``D`` (the lcm of the groups' denominators) and every group's ε in units of ``1/D``."""
    denominator = 1
    for g in groups:
        denominator = math.lcm(denominator, g.epsilon.denominator)
    return denominator, [
        g.epsilon.numerator * (denominator // g.epsilon.denominator) for g in groups
    ]


#: ``D``, the groups' ε's in units of ``1/D``, and ``max V_a − min V_a`` in those units per
#: touched axis ``a`` (:attr:`Kept.ranges`).
AxisRanges = tuple[int, list[int], dict[int, int]]


@dataclass(eq=False, slots=True)
class Kept:
    """What an :class:`ExactLoss` knows of itself besides its counts: each None until known.

    Computed on the form once, or handed over when it is built — by the form it was built
    from (:meth:`ExactLoss.with_term`: its ranges and texts but the moved axis's), by a caller
    that knows the new form's loss (:meth:`ExactLoss.with_term_known`, :func:`losses_many`)
    or its canonical bytes (:meth:`ExactLoss.canonical_after`'s answer). A form's counts never
    change, so neither does any of these once set; a value handed over must be the one the
    form would compute.
    """

    #: The exact realized loss (:meth:`ExactLoss.loss`).
    loss: Fraction | None = None
    #: The per-axis ranges the loss sums: every touched axis's once the loss was computed from
    #: them; handed over, every axis's but those a term moved since (computed when needed).
    ranges: AxisRanges | None = None
    #: Each touched axis's ``"axis":rows`` text, rows in the canonical order
    #: (:meth:`ExactLoss._axis_texts`): all once the canonical bytes were written; handed over
    #: (same groups in the same order), every axis's but the moved one's.
    texts: dict[int, str] | None = None
    #: :meth:`ExactLoss.canonical_bytes`.
    canonical: bytes | None = None
    #: :meth:`ExactLoss.candidate_losses` per query (:attr:`ExactQuery.key`).
    candidates: dict[tuple[Any, ...], list[Fraction]] | None = None


@dataclass(frozen=True)
class ExactLoss:
    """Integer counts per (attribute, group) of an RR-type history over a finite domain.

    ``counts[a]`` has shape ``(len(groups), shape[a])``; attributes no query touched are absent.
    ``kept``: values known of the form beyond its counts (:class:`Kept`), never compared and
    not an argument: a form built by ``dataclasses.replace`` or anew starts with none.
    """

    shape: tuple[int, ...]
    groups: tuple[Group, ...] = ()
    counts: dict[int, IntArray] = field(default_factory=dict)
    kept: Kept = field(default_factory=Kept, init=False, compare=False, repr=False)

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
        after = ExactLoss(self.shape, groups, counts)
        kept = self.kept
        if kept.ranges is not None:  # this form's ranges are known: the new one's loss from one
            after.kept.ranges = _ranges_after(kept.ranges, groups, term.axis)
        texts = kept.texts
        if texts is not None and groups is self.groups:  # the same groups in the same order
            after.kept.texts = {a: t for a, t in texts.items() if a != term.axis}
        # what depends only on the shape and the groups, computed on this form: the new form's
        # too (each a cached_property, whose first read costs ≈ 3-5 µs on Python 3.11)
        mine, theirs = self.__dict__, after.__dict__
        if "_shape_text" in mine:
            theirs["_shape_text"] = mine["_shape_text"]
        if groups is self.groups:
            for name in _GROUPS_ONLY:
                if name in mine:
                    theirs[name] = mine[name]
        return after

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
                total += self._range(axis, scaled)
        return total

    def _range(self, axis: int, scaled: list[int]) -> int:
        """``max V_axis − min V_axis`` in units of ``1/D`` (a touched axis).

        Small count arrays (a submit's usual attributes) in Python integers: numpy's calls
        cost more than the arithmetic there (≈ 4 µs against 18 µs for one group of 10
        values). The same exact integers either way.
        """
        arr = self.counts[axis]
        if arr.size > _SMALL or not arr.size:
            v = self.values(axis, scaled)
            return int(v.max()) - int(v.min())
        rows = arr.tolist()
        first = scaled[0]
        found = [first * c for c in rows[0]]
        for weight, row in zip(scaled[1 : len(rows)], rows[1:], strict=True):
            if weight:
                found = [v + weight * c for v, c in zip(found, row, strict=True)]
        return int(max(found) - min(found))

    def loss(self) -> Fraction:
        """The exact realized loss (computed once, kept: :attr:`Kept.loss`)."""
        kept = self.kept
        loss = kept.loss
        if loss is None:
            ranges = kept.ranges
            if ranges is None:
                denominator, scaled = self._scale()
                found = {axis: self._range(axis, scaled) for axis in self.counts}
                kept.ranges = (denominator, scaled, found)
            else:
                # handed over: every axis's range but the moved one's (the form's own dict)
                denominator, scaled, found = ranges
                if len(found) != len(self.counts):
                    for axis in self.counts:
                        if axis not in found:
                            found[axis] = self._range(axis, scaled)
            loss = kept.loss = Fraction(sum(found.values()), denominator)
        return loss

    def candidate_losses(self, query: ExactQuery) -> list[Fraction]:
        """The exact loss after each output of ``query``, in the float path's output order.

        Computed once per query (:attr:`ExactQuery.key`) and kept on the form, read-only: a
        submit records the output it samples after deciding on these losses, and the new
        form's loss is the sampled output's (:meth:`with_term_known`).
        """
        key = query.key
        kept = self.kept
        candidates = kept.candidates
        if candidates is None:
            candidates = kept.candidates = {}
        found = candidates.get(key)
        if found is None:
            found = candidates[key] = self._candidate_losses(query)
        return found

    def kept_candidate_losses(self, query: ExactQuery) -> list[Fraction] | None:
        """:meth:`candidate_losses` for ``query`` if it was computed on this form, else None."""
        candidates = self.kept.candidates
        return None if candidates is None else candidates.get(query.key)

    def has_kept_candidates(self) -> bool:
        """Whether :meth:`candidate_losses` was computed on this form (for any query)."""
        return bool(self.kept.candidates)

    def with_term_known(self, term: ExactTerm, loss: Fraction) -> ExactLoss:
        """:meth:`with_term`, the new form's loss given as ``loss`` (not computed again).

        ``loss`` must be ``self.with_term(term).loss()``: the caller knows it from
        :meth:`candidate_losses` (the loss after the output whose term ``term`` is).
        """
        after = self.with_term(term)
        kept = after.kept
        if kept.ranges is not None:  # keep the per-axis ranges a next term derives its loss from
            denominator, _, ranges = kept.ranges
            units = loss * denominator
            if units.denominator != 1:  # not this form's loss: compute it instead
                return after
            missing = [axis for axis in after.counts if axis not in ranges]
            if len(missing) == 1:  # the moved axis's (the others' are the parent's)
                ranges[missing[0]] = units.numerator - sum(ranges.values())
        kept.loss = loss
        return after

    def _candidate_losses(self, query: ExactQuery) -> list[Fraction]:
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

    @cached_property
    def _moved_units(self) -> dict[tuple[Any, ...], tuple[list[int], int] | None]:
        """Per query (:attr:`ExactQuery.key`), :func:`moved_units_each`'s answer for this form."""
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
        """A compact JSON encoding (appended to the likelihood array's bytes).

        The document ``{"g": [[num, den], ...], "c": {axis: rows}}`` — groups in this form's
        order — as ``json.dumps(doc, separators=(",", ":"))`` writes it (:func:`stored_json`,
        the definition), written without building the document: a survey stores every new
        state (``json.dumps`` was 4% of a diverging survey's profile). When the groups are
        already in ε order (one group: always) it is :meth:`canonical_bytes` without the shape.
        """
        if self._sorted_order == list(range(len(self.groups))):
            canonical = self.canonical_bytes()
            return b"{" + canonical[canonical.index(b'"g":') :]
        return b"{" + self._body(list(range(len(self.groups)))) + b"}"

    @classmethod
    def from_bytes(cls, shape: tuple[int, ...], data: bytes) -> ExactLoss:
        """Rebuild from :meth:`to_bytes`."""
        doc = json.loads(data)
        groups = tuple(_group_of(n, d) for n, d in doc["g"])
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
        document (a survey keys every new state by them) and computed once per form
        (:attr:`Kept.canonical`, which a caller that knows them may hand over).
        """
        kept = self.kept
        canonical = kept.canonical
        if canonical is None:
            order = self._sorted_order
            body = self._body(order, self._axis_texts(order))
            canonical = kept.canonical = b'{"s":[' + self._shape_text.encode() + b"]," + body + b"}"
        return canonical

    @cached_property
    def _sorted_order(self) -> list[int]:
        """The groups' positions in ε order (the canonical order)."""
        groups = self.groups
        if len(groups) < 2:
            return list(range(len(groups)))
        return sorted(range(len(groups)), key=lambda g: groups[g].epsilon)

    def _axis_texts(self, order: list[int]) -> dict[int, str]:
        """Each touched axis's ``"axis":rows`` text, its rows in ``order`` (the canonical one).

        Kept on the form (:attr:`Kept.texts`); a form built by one term of a group it already
        had (:meth:`with_term`) inherits its parent's texts but the moved axis's: a submit's
        new state writes one axis's rows, not all of them.
        """
        inherited = self.kept.texts or {}
        texts = {}
        for axis in sorted(self.counts):
            text = inherited.get(axis)
            if text is None:
                text = f'"{axis}":' + str(self._rows_in(axis, order)).replace(" ", "")
            texts[axis] = text
        self.kept.texts = texts
        return texts

    @cached_property
    def _shape_text(self) -> str:
        return ",".join(map(str, self.shape))

    def _groups_text(self, order: list[int]) -> str:
        """The groups' ``[num,den]`` pairs in ``order``, comma-separated."""
        groups = self.groups
        return ",".join(
            f"[{groups[g].epsilon.numerator},{groups[g].epsilon.denominator}]" for g in order
        )

    def _rows_in(self, axis: int, order: list[int]) -> list[list[int]]:
        """``axis``'s count rows, one per group in ``order``."""
        counts = self.counts[axis]
        rows: list[list[int]] = (
            counts if order == list(range(len(order))) else counts[order]
        ).tolist()
        return rows

    def _body(self, order: list[int], texts: dict[int, str] | None = None) -> bytes:
        """``"g":[...],"c":{...}`` with the groups (and the count rows) in ``order``.

        ``texts``: each axis's ``"axis":rows`` text in that order (:meth:`_axis_texts`).
        """
        written = self._groups_text(order)
        if texts is not None:
            counts = ",".join(texts[axis] for axis in sorted(self.counts))
        else:
            # a list of integers prints as its JSON but for the spaces after the commas
            counts = ",".join(
                f'"{axis}":' + str(self._rows_in(axis, order)) for axis in sorted(self.counts)
            ).replace(" ", "")
        return f'"g":[{written}],"c":{{{counts}}}'.encode()

    def canonical_after(self, term: ExactTerm) -> bytes | None:
        """``self.with_term(term).canonical_bytes()``, without building that form.

        A survey keys the state after each of a group's outputs by it: one count row moved,
        the rest of the bytes shared (kept per axis and group on this form). None when the
        term's group is not one of this form's yet, its axis has no counts yet, or a count
        could leave ``int64`` (the caller builds the form then).
        """
        key = (term.axis, term.group)
        templates = self._templates
        template = templates.get(key, _NO_TEMPLATE)  # one lookup (a Group hashes in Python)
        if template is _NO_TEMPLATE:
            template = templates[key] = self._template(term.axis, term.group)
        if template is None:
            return None
        prefix, row, suffix, texts = template
        moves = term.moves
        if moves is None or len(term.coeff) != len(row):
            return None
        # the row's counts written once per template, only the moved ones again (a ``grr``
        # output moves one): the same text as ``",".join(map(str, moved))``
        moved = texts.copy()
        for at, c in moves:
            moved[at] = str(row[at] + c).encode()
        return prefix + b",".join(moved) + suffix

    def to_bytes_after(self, canonical: bytes) -> bytes | None:
        """``with_term(term).to_bytes()`` from :meth:`canonical_after`'s answer for ``term``.

        ``canonical``: that answer (not None: the term's group is one of this form's, so the
        new form has this form's groups in this order). When they are in ε order (one group:
        always) the stored bytes are the canonical ones without the shape (:meth:`to_bytes`);
        None otherwise (the caller builds the form). A survey stores the state after each new
        (group, output) without building its form.
        """
        if not self._in_order:
            return None
        return b"{" + canonical[canonical.index(b'"g":') :]

    @cached_property
    def _in_order(self) -> bool:
        """Whether the groups are in ε order (:meth:`to_bytes` is the canonical bytes then)."""
        return self._sorted_order == list(range(len(self.groups)))

    @cached_property
    def _templates(
        self,
    ) -> dict[tuple[int, Group], tuple[bytes, list[int], bytes, list[bytes]] | None]:
        return {}

    def _template(
        self, axis: int, group: Group
    ) -> tuple[bytes, list[int], bytes, list[bytes]] | None:
        """The canonical bytes around ``group``'s count row on ``axis``, that row, its texts.

        Once per (axis, group) of a form: a survey meets each of its groups' forms once per run,
        each first met in the run (20,000 of them in the seventh diverging survey at 2·10^5).
        Cut from the canonical bytes when they are known (:meth:`_template_cut`), else written.
        """
        counts = self.counts
        if axis not in counts:
            return None
        try:
            g = self.groups.index(group)
        except ValueError:  # not one of this form's groups
            return None
        canonical = self.kept.canonical
        if canonical is not None:
            return self._template_cut(canonical, axis, g)
        order = self._sorted_order
        at = order.index(g)
        rows = self._rows_in(axis, order)
        row = rows[at]
        if row and (max(row) >= _SAFE or min(row) <= -_SAFE):
            return None  # a moved count could leave int64 (with_term's arithmetic)
        # canonical_bytes(), cut around the row: the other axes' rows as _body writes them
        before: list[str] = []
        after: list[str] = []
        for a in sorted(counts):
            if a != axis:
                (after if a > axis else before).append(
                    f'"{a}":' + str(self._rows_in(a, order)).replace(" ", "")
                )
        head = "".join(part + "," for part in before)
        prefix = (
            f'{{"s":[{self._shape_text}],"g":[{self._groups_text(order)}],"c":{{{head}"{axis}":['
            + "".join(str(r).replace(" ", "") + "," for r in rows[:at])
            + "["
        )
        suffix = (
            "]"
            + "".join("," + str(r).replace(" ", "") for r in rows[at + 1 :])
            + "]"
            + "".join("," + part for part in after)
            + "}}"
        )
        # each count's text as str() writes it: the list's text split at its commas
        texts = str(row)[1:-1].replace(" ", "").encode().split(b",") if row else []
        return prefix.encode(), row, suffix.encode(), texts

    def _template_cut(
        self, canonical: bytes, axis: int, g: int
    ) -> tuple[bytes, list[int], bytes, list[bytes]] | None:
        """:meth:`_template` of group ``g``'s row on ``axis``, cut from the canonical bytes.

        ``canonical``: this form's (:attr:`Kept.canonical`, known: never computed here). The
        template is those bytes around the row (:meth:`_template` writes them piece by piece):
        the prefix ends with the row's ``[``, the suffix starts with its ``]``, the row's text
        between is its counts joined by commas. The cut finds the row by the text's structure:
        ``"c":{`` occurs once (the shape and the groups are numbers, commas and brackets), each
        axis's ``"axis":[`` once after it (keys are quoted, counts are not), and a count row is
        ``[`` integers ``]`` with no bracket inside. A survey meets each group's form once per
        run, its canonical bytes verified from its stored bytes (``survey_runs``): ≈ 2 µs
        instead of rendering every axis's rows again (≈ 13 µs, a form of three axes).
        """
        at = 0 if len(self.groups) == 1 else self._sorted_order.index(g)
        row: list[int] = self.counts[axis][g].tolist()
        if row and (max(row) >= _SAFE or min(row) <= -_SAFE):
            return None  # a moved count could leave int64 (with_term's arithmetic)
        head = b'"%d":[' % axis
        start = canonical.index(head, canonical.index(b'"c":{')) + len(head)
        for _ in range(at):  # past the rows before it, each "[...],"
            start = canonical.index(b"]", start) + 2
        end = canonical.index(b"]", start)
        texts = canonical[start + 1 : end].split(b",") if row else []
        return canonical[: start + 1], row, canonical[end:], texts

    def canonical_from_stored(self, stored: bytes) -> bytes:
        """The canonical bytes if ``stored`` is :meth:`to_bytes`'s with groups in ε order.

        Then they are the shape, then the stored document. ``stored``: the bytes this form was
        read from (:meth:`from_bytes`). A candidate only, not checked here: an older writer's
        spacing, group order or numbers (a pair not in lowest terms) parse to this form too.
        The caller verifies it before handing it over (:attr:`Kept.canonical`): a stored
        state's key is the content key of its canonical bytes (``survey_runs``).
        """
        return b'{"s":[' + ",".join(map(str, self.shape)).encode() + b"]," + stored[1:]

    def same_as(self, other: ExactLoss | None) -> bool:
        """Equal counts per group, whatever order the groups came in (``verify``).

        A stored state is shared by every history with its content (:meth:`canonical_bytes`),
        so its groups are in the order of the history that stored it first.
        """
        return other is not None and other.canonical_bytes() == self.canonical_bytes()


#: :class:`ExactLoss`'s cached properties that depend on its groups (in their order) alone:
#: :meth:`ExactLoss.with_term` hands them to a form with the same groups (never changed once
#: computed: read-only).
_GROUPS_ONLY = ("_sorted_order", "_in_order")


def _ranges_after(kept: AxisRanges, groups: tuple[Group, ...], moved: int) -> AxisRanges:
    """A form's ranges handed to the one built from it by one term on axis ``moved``.

    ``kept``: the parent's ``D``, its groups' ε's in units of ``1/D`` and its touched axes'
    ``max V − min V`` in those units (:attr:`Kept.ranges`); ``groups``: the new form's groups
    (the parent's, or the parent's and one new ε last). A new ε changes ``D`` to ``D' =
    lcm(D, d)``: every value, hence every range, is multiplied by ``D' / D`` exactly (the new
    group counts nothing on the other axes). ``moved``'s range is left out (to be computed):
    a new dict, the new form's own.
    """
    denominator, scaled, ranges = kept
    if len(groups) > len(scaled):
        new = groups[-1].epsilon
        wider = math.lcm(denominator, new.denominator)
        factor = wider // denominator
        denominator = wider
        scaled = [w * factor for w in scaled] + [new.numerator * (wider // new.denominator)]
        return denominator, scaled, {a: r * factor for a, r in ranges.items() if a != moved}
    return denominator, scaled, {a: r for a, r in ranges.items() if a != moved}


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


def stored_json(exact: ExactLoss) -> bytes:
    """:meth:`ExactLoss.to_bytes` by its definition (``json.dumps`` of the document)."""
    doc = {
        "g": [[g.epsilon.numerator, g.epsilon.denominator] for g in exact.groups],
        "c": {str(a): arr.tolist() for a, arr in sorted(exact.counts.items())},
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


def subset_profiles(
    histories: Sequence[ExactLoss], axis: int, group: Group
) -> list[SubsetProfile | None]:
    """:meth:`ExactLoss.subset_profile` of every history, those with the same groups at once.

    The same profiles (and remembered on each history alike): the values and both stable
    orders of a whole batch are computed on the stacked values (:class:`ExactStack`), row by
    row as each history's own; a batch past ``int64`` is computed history by history.
    """
    found: list[SubsetProfile | None] = [None] * len(histories)
    todo = [n for n, h in enumerate(histories) if (axis, group) not in h._profiles]
    for n in set(range(len(histories))) - set(todo):
        found[n] = histories[n]._profiles[(axis, group)]
    picked = [histories[n] for n in todo]
    for members, stack in _stacks(picked, group) if picked else []:
        first = picked[members[0]]
        dropped = group not in first.groups and len(first.groups) >= MAX_GROUPS
        base = None
        if stack is not None and not dropped:  # (a dropped form: every one's profile is None)
            base = stack.axis_values(len(members), axis, first.shape[axis])
            if int(np.abs(base).max(initial=0)) + stack.step >= _SAFE:
                base = None
        if stack is None or base is None:
            for m in members:
                found[todo[m]] = picked[m].subset_profile(axis, group)
            continue
        down = np.argsort(-base, axis=1, kind="stable")
        up = np.argsort(base, axis=1, kind="stable")
        others = stack.ranges(len(members), skip=axis).tolist()
        for row, m in enumerate(members):
            profile = SubsetProfile(
                stack.denominator, stack.step, others[row], base[row], down[row], up[row]
            )
            picked[m]._profiles[(axis, group)] = profile
            found[todo[m]] = profile
    return found


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


# --- many histories at once (a survey chunk's members deciding alone) ---------------------------


@dataclass(frozen=True)
class ExactStack:
    """Exact histories with the same groups, stacked: each touched axis's ``V`` per history.

    ``values[a]`` has shape ``(n, shape[a])``, in units of ``1/denominator`` (``int64``: a
    stack is only built when every value and ``step`` certainly fit); ``step`` is the extra
    group's ε (or its own group's, when present) in those units, 0 without one. What
    :meth:`ExactLoss.values` and :meth:`ExactLoss._scale` give each history, for all at once.
    """

    denominator: int
    step: int
    values: dict[int, IntArray]

    @classmethod
    def of(cls, histories: Sequence[ExactLoss], extra: Group | None = None) -> ExactStack | None:
        """The stack of ``histories`` (all with the same ``groups``), or None past ``int64``."""
        first = histories[0]
        groups = first.groups
        if extra is not None and extra not in groups:
            denominator, scaled = _in_units([*groups, extra])
            step = scaled[-1]
        else:
            denominator, scaled = _in_units(list(groups))
            step = scaled[groups.index(extra)] if extra is not None else 0
        weights = np.asarray(scaled[: len(groups)], dtype=np.int64)
        total = sum(abs(w) for w in scaled[: len(groups)])
        values: dict[int, IntArray] = {}
        span = 2 * abs(step)  # bounds every sum of ranges (and a moved one) computed from it
        for axis in sorted({a for h in histories for a in h.counts}):
            k = first.shape[axis]
            empty = np.zeros((len(groups), k), dtype=np.int64)
            counts = np.stack([h.counts.get(axis, empty) for h in histories])
            top = max(int(counts.max()), -int(counts.min())) if counts.size else 0
            span += 2 * total * max(1, top)
            if span >= _SAFE:
                return None
            found = np.zeros((len(histories), k), dtype=np.int64)
            for g, weight in enumerate(weights.tolist()):  # a few groups: one pass each
                found += weight * counts[:, g, :]
            values[axis] = found
        if span >= _SAFE:
            return None
        return cls(denominator, step, values)

    def ranges(self, count: int, skip: int | None = None) -> IntArray:
        """``Σ_a (max V_a − min V_a)`` per history, over the axes other than ``skip``."""
        total = np.zeros(count, dtype=np.int64)
        for axis, v in self.values.items():
            if axis != skip:
                total += v.max(axis=1) - v.min(axis=1)
        return total

    def axis_values(self, count: int, axis: int, k: int) -> IntArray:
        """``V_axis`` per history (zeros when no history touched the axis)."""
        found = self.values.get(axis)
        return found if found is not None else np.zeros((count, k), dtype=np.int64)


def _stacks(
    histories: Sequence[ExactLoss], extra: Group | None = None
) -> list[tuple[list[int], ExactStack | None]]:
    """The histories' positions by their groups, and each such batch's stack."""
    by_object: dict[int, list[int]] = {}  # histories folded together share their groups' tuple
    for n, history in enumerate(histories):
        by_object.setdefault(id(history.groups), []).append(n)
    batches: dict[tuple[Group, ...], list[int]] = {}
    for members in by_object.values():
        batches.setdefault(histories[members[0]].groups, []).extend(members)
    return [
        (members, ExactStack.of([histories[n] for n in members], extra))
        for members in batches.values()
    ]


def fractions_of(
    units: IntArray, denominator: int, cache: dict[tuple[int, int], Fraction]
) -> list[Fraction]:
    """``Fraction(u, denominator)`` per unit count, each distinct one built once."""
    found = []
    for u in units.tolist():
        loss = cache.get((u, denominator))
        if loss is None:
            loss = cache[(u, denominator)] = Fraction(u, denominator)
        found.append(loss)
    return found


def losses_many(histories: Sequence[ExactLoss]) -> list[Fraction]:
    """``h.loss()`` of every history, computed together (and remembered on each).

    Histories with the same groups are stacked (:class:`ExactStack`); one past ``int64`` is
    computed alone.
    """
    found: list[Fraction | None] = [None] * len(histories)
    cache: dict[tuple[int, int], Fraction] = {}
    for members, stack in _stacks(histories):
        if stack is None:
            for n in members:
                found[n] = histories[n].loss()
            continue
        losses = fractions_of(stack.ranges(len(members)), stack.denominator, cache)
        for n, loss in zip(members, losses, strict=True):
            kept = histories[n].kept
            if kept.loss is None:
                kept.loss = loss
            found[n] = kept.loss
    return [loss for loss in found if loss is not None]


#: Elements of a block of rows :func:`_moved` works on at once (its temporaries stay in cache).
_BLOCK = 1 << 15


def _two_extremes(base: IntArray) -> tuple[IntArray, ...]:
    """The two largest and two smallest entries of each row (of at least two entries).

    Per row: the largest's index and value, the largest of the others; likewise the smallest.
    """
    rows = np.arange(base.shape[0])
    top = base.argmax(axis=1)
    bottom = base.argmin(axis=1)
    masked = base.copy()
    masked[rows, top] = np.iinfo(np.int64).min
    second_top = masked.max(axis=1)
    masked[rows, top] = base[rows, top]
    masked[rows, bottom] = np.iinfo(np.int64).max
    second_bottom = masked.min(axis=1)
    return top, base[rows, top], second_top, bottom, base[rows, bottom], second_bottom


def _moved(
    base: IntArray, step: int, query: ExactQuery, columns: IntArray | None = None
) -> IntArray:
    """``max − min`` of each row of ``base`` moved by each output: shape ``(n, outputs)``.

    With ``columns``, by output ``columns[i]`` on row ``i`` only: shape ``(n,)``. The
    vectorised :func:`_axis_losses` for ``grr`` (the top two and bottom two of each row) and
    ``table`` queries, computed in blocks of rows.
    """
    n, k = base.shape
    if columns is None:
        outputs = k if query.kind == "grr" else 0
        if query.kind == "table":
            assert query.table is not None  # noqa: S101 - a table query carries its table
            outputs = query.table.shape[1]
        found: IntArray = np.empty((n, outputs), dtype=np.int64)
    else:
        found = np.empty(n, dtype=np.int64)
    rows = max(1, _BLOCK // max(1, k))
    for start in range(0, n, rows):
        part = slice(start, start + rows)
        at = None if columns is None else columns[part]
        found[part] = _moved_block(base[part], np.int64(step), query, at)
    return found


def _moved_block(
    base: IntArray, step: np.int64, query: ExactQuery, columns: IntArray | None
) -> IntArray:
    """:func:`_moved` of one block of rows."""
    n, k = base.shape
    if query.kind == "table":
        assert query.table is not None  # noqa: S101 - a table query carries its table
        table = query.table.astype(np.int64)
        if columns is not None:
            moved = base + step * table[:, columns].T
            return np.asarray(moved.max(axis=1) - moved.min(axis=1), dtype=np.int64)
        moved = base[:, :, None] + step * table[None, :, :]
        return np.asarray(moved.max(axis=1) - moved.min(axis=1), dtype=np.int64)
    if k == 1:
        return np.zeros(n if columns is not None else (n, 1), dtype=np.int64)
    top, top_value, second_top, bottom, bottom_value, second_bottom = _two_extremes(base)
    if columns is not None:
        hit = base[np.arange(n), columns] + step
        other_hi = np.where(columns == top, second_top, top_value)
        other_lo = np.where(columns == bottom, second_bottom, bottom_value)
    else:
        values = np.arange(k)[None, :]
        other_hi = np.where(values == top[:, None], second_top[:, None], top_value[:, None])
        other_lo = np.where(
            values == bottom[:, None], second_bottom[:, None], bottom_value[:, None]
        )
        hit = base + step
    return np.asarray(np.maximum(hit, other_hi) - np.minimum(hit, other_lo), dtype=np.int64)


def moved_losses_at(
    histories: Sequence[ExactLoss], query: ExactQuery, owners: IntArray, columns: IntArray
) -> list[Fraction]:
    """The exact loss after output ``columns[i]`` of ``query`` on ``histories[owners[i]]``.

    ``history.candidate_losses(query)[column]`` for each, for ``grr`` and ``table`` queries
    (:func:`_moved` on the histories stacked: :class:`ExactStack`); a history past ``int64``
    is computed alone.
    """
    found: list[Fraction | None] = [None] * len(owners)
    cache: dict[tuple[int, int], Fraction] = {}
    owners = np.asarray(owners, dtype=np.int64)
    columns = np.asarray(columns, dtype=np.int64)
    batch_of = np.empty(len(histories), dtype=np.int64)  # each history's batch and row in it
    row_of = np.empty(len(histories), dtype=np.int64)
    stacks = _stacks(histories, query.group)
    for b, (members, _) in enumerate(stacks):
        batch_of[members] = b
        row_of[members] = np.arange(len(members))
    owner_batch = batch_of[owners]
    for b, (members, stack) in enumerate(stacks):
        picks = np.flatnonzero(owner_batch == b)
        if not picks.size:
            continue
        k = histories[members[0]].shape[query.axis]
        base = None
        if stack is not None:
            base = stack.axis_values(len(members), query.axis, k)
            if int(np.abs(base).max(initial=0)) + abs(stack.step) >= _SAFE:
                base = None
        if stack is None or base is None:
            for i in picks.tolist():
                found[i] = histories[int(owners[i])].candidate_losses(query)[int(columns[i])]
            continue
        rows = row_of[owners[picks]]
        whole = rows.size == len(members) and bool((rows == np.arange(rows.size)).all())
        units = _moved(base if whole else base[rows], stack.step, query, columns[picks])
        units += stack.ranges(len(members), skip=query.axis)[rows]
        losses = fractions_of(units, stack.denominator, cache)
        for i, loss in zip(picks.tolist(), losses, strict=True):
            found[i] = loss
    return [loss for loss in found if loss is not None]


def keep_moved_units(
    histories: Sequence[ExactLoss],
    query: ExactQuery,
    batches: Sequence[tuple[list[int], IntArray | None, int]],
) -> None:
    """Keep :func:`moved_losses_many`'s answer on each history (:func:`moved_units_each`).

    ``batches``: what :func:`moved_losses_many` returned for ``histories`` and ``query``; a
    batch past ``int64`` (no units) is not kept.
    """
    key = query.key
    for members, units, denominator in batches:
        if units is None:
            continue
        for n, row in zip(members, units.tolist(), strict=True):
            histories[n]._moved_units[key] = (row, denominator)


def moved_units_each(
    histories: Sequence[ExactLoss], query: ExactQuery
) -> list[tuple[list[int], int] | None] | None:
    """Per history, the exact loss after every output of ``query``: ``(units, denominator)``.

    ``units[j]`` in units of ``1/denominator`` is ``candidate_losses(query)[j]``'s numerator
    (:func:`moved_losses_many`'s row, exact integers). Kept on each history per query (a
    survey meets a decision group in many chunks: its losses are computed once, when it is
    first met or decided, :func:`keep_moved_units`). None for a history past ``int64`` (the
    caller computes its outputs alone), and overall when the query has no vectorised form.
    """
    if query.kind not in ("grr", "table"):
        return None
    key = query.key
    found: list[tuple[list[int], int] | None] = []
    todo: list[int] = []
    for n, history in enumerate(histories):
        known = history._moved_units
        if key in known:
            found.append(known[key])
        else:
            found.append(None)
            todo.append(n)
    if todo:
        batches = moved_losses_many([histories[n] for n in todo], query)
        assert batches is not None  # noqa: S101 - a grr or table query
        for members, units, denominator in batches:
            rows = [None] * len(members) if units is None else units.tolist()
            for m, row in zip(members, rows, strict=True):
                n = todo[m]
                found[n] = histories[n]._moved_units[key] = (
                    None if row is None else (row, denominator)
                )
    return found


def moved_losses_many(
    histories: Sequence[ExactLoss], query: ExactQuery
) -> list[tuple[list[int], IntArray | None, int]] | None:
    """The exact loss after every output of ``query``, for many histories at once.

    Returns, per batch of histories with the same groups, their positions, the losses in
    units of ``1/denominator`` (shape ``(histories, outputs)``, outputs in
    :meth:`ExactLoss.candidate_losses`'s order; None for a batch past ``int64``, whose
    histories the caller computes alone) and the denominator. None overall when the query's
    kind has no vectorised form (``ue``).
    """
    if query.kind not in ("grr", "table"):
        return None
    found: list[tuple[list[int], IntArray | None, int]] = []
    for members, stack in _stacks(histories, query.group):
        if stack is None:
            found.append((members, None, 0))
            continue
        count = len(members)
        k = histories[members[0]].shape[query.axis]
        base = stack.axis_values(count, query.axis, k)
        if int(np.abs(base).max(initial=0)) + abs(stack.step) >= _SAFE:
            found.append((members, None, 0))
            continue
        moved = _moved(base, stack.step, query)
        others = stack.ranges(count, skip=query.axis)[:, None]
        found.append((members, moved + others, stack.denominator))
    return found

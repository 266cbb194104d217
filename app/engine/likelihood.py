"""The likelihood state of a finite-domain object: ``log P(x)`` for every point.

``log P(x) = Σ_i log Pr(M_i(x) = y_i)`` over the recorded history (Algorithm 2, line 12, in log
space). The realized privacy loss (Definition 4.5) is ``max_x log P(x) - min_x log P(x)``.

The array has the domain's shape (one axis per attribute) so that a term depending on a few
attributes is added by broadcasting, and the maxima/minima per value of an attribute are plain
reductions. After every update the array is shifted so that its maximum is 0: values stay in
``[-loss, 0]``, far from float64 overflow or underflow, over any number of queries. Shifting by a
constant changes no ratio ``P(x)/P(x')`` and so no loss or posterior.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from app.engine.domain import Domain
from app.engine.exact import MAGIC, MAX_GROUPS, ExactLoss, ExactTerm, Group, IntArray
from app.engine.numerics import FloatArray, decimal_fraction, float_up, update_error

#: Elements of the stacked arrays :func:`fold_many` works on at once (32 MiB of float64).
FOLD_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class LossBounds:
    """Bounds ``lower <= realized loss <= upper`` (natural-log units), or the loss itself.

    Certified bounds are doubles on either side of the loss. Where the loss is computed exactly
    (randomized response, :mod:`app.engine.exact`) ``value`` holds it and both bounds are its
    nearest double. :attr:`exact` says the two coincide, and either way ``upper`` is then the
    nearest double of the loss: bounds that pinch a loss between ``u`` and ``u`` leave no
    other, and rounding to nearest is monotone, so ``upper <= budget`` in doubles holds exactly
    when ``loss <= budget`` does for the written numbers.
    """

    lower: float
    upper: float
    #: The exact loss, when it is computed exactly (not part of equality).
    value: Fraction | None = field(default=None, compare=False)

    @property
    def exact(self) -> bool:
        """Whether ``upper`` is the nearest double of the loss (the bounds coincide)."""
        return self.lower == self.upper

    def to_json(self) -> dict[str, Any]:
        """``{"lower": ..., "upper": ..., "exact": ...}`` as in the JSON contract."""
        return {"lower": self.lower, "upper": self.upper, "exact": self.exact}

    def within(self, budget: float) -> bool:
        """Whether the loss is at most ``budget`` (as written, for an exact loss).

        An exact loss is compared with :func:`~app.engine.numerics.decimal_fraction` of the
        budget, other bounds by their upper bound.
        """
        if self.value is not None:
            return self.value <= decimal_fraction(budget)
        return self.upper <= budget


def bounds_from(computed: float, err: float, cap: Fraction | None = None) -> LossBounds:
    """Turn a computed loss and a bound on the error of each ``log P`` into certified bounds.

    ``cap`` is another certified upper bound — the exact basic-composition total ``Σ ε_i``
    (Lemma 6.1) — and the upper bound reported is the smaller of the two.
    """
    upper = computed + 2.0 * err
    if cap is not None:
        upper = min(upper, float_up(cap))
    return LossBounds(min(max(0.0, computed - 2.0 * err), upper), upper)


def exact_bounds(loss: Fraction) -> LossBounds:
    """An exact loss: both bounds its nearest double (``float`` of a ``Fraction`` rounds so)."""
    nearest = float(loss)
    return LossBounds(nearest, nearest, loss)


def _exact_after(
    exact: ExactLoss | None, term: Term, loss: Fraction | None = None
) -> ExactLoss | None:
    """The exact form after ``term``: kept only while every term has one.

    A history with more than :data:`~app.engine.exact.MAX_GROUPS` distinct ε's drops it (its
    counts would grow with every new ε; the float rule decides from then on). ``loss``, when
    given, is the new form's exact loss, known to the caller (:meth:`ExactLoss.with_term_known`).
    """
    if exact is None or term.exact is None:
        return None
    if term.exact.group not in exact.groups and len(exact.groups) >= MAX_GROUPS:
        return None
    if loss is not None:
        return exact.with_term_known(term.exact, loss)
    return exact.with_term(term.exact)


def exact_after(exact: ExactLoss | None, term: Term) -> ExactLoss | None:
    """The exact form :meth:`LikelihoodState.applied` gives a state with ``exact`` after ``term``.

    Without the array: a survey keys the state after each of its groups' outputs by this
    form's content and builds the array only for a content not seen yet.
    """
    return _exact_after(exact, term)


@dataclass(frozen=True)
class Term:
    """``log Pr(M(x) = y)`` for one output ``y`` as a function of the point.

    ``values`` has shape ``tuple(domain.shape[a] for a in axes)``: the term depends only on the
    attributes in ``axes`` (sorted), and is broadcast along the others.
    """

    axes: tuple[int, ...]
    values: FloatArray
    extra_error: float = 0.0
    #: The term's exact form when the mechanism is randomized response (:mod:`app.engine.exact`).
    exact: ExactTerm | None = None

    @property
    def magnitude(self) -> float:
        """Largest absolute value of the term (for the rounding-error bound)."""
        return float(np.abs(self.values).max()) if self.values.size else 0.0


class LikelihoodState:
    """``log P(x)`` over a finite domain, normalised so that ``max log P = 0``.

    Parameters
    ----------
    domain:
        A finite domain.
    logp:
        Optional initial array of shape ``domain.shape`` (copied, then shifted so that its
        maximum is 0: not when that maximum is +0.0 already, as a stored array's is — the
        shift would subtract +0.0, which changes no float64); defaults to zeros (P = 1).
    err:
        Bound on the accumulated rounding error of every entry (see :mod:`app.engine.numerics`).
    exact:
        The history's exact form (:class:`~app.engine.exact.ExactLoss`) while every query in it
        is randomized response; ``None`` otherwise. An empty state starts with an empty one; a
        state built from an arbitrary array has none unless given.
    """

    def __init__(
        self,
        domain: Domain,
        logp: FloatArray | None = None,
        err: float = 0.0,
        exact: ExactLoss | None = None,
    ) -> None:
        if not domain.is_finite:
            raise ValueError("a likelihood array needs a finite domain")
        self.domain = domain
        if logp is None:
            self.logp: FloatArray = np.zeros(domain.shape, dtype=np.float64)
            if exact is None:
                exact = ExactLoss(domain.shape)
        else:
            self.logp = np.array(logp, dtype=np.float64).reshape(domain.shape)
            top = self.logp.max()
            # a stored array's maximum is +0.0 already (to_bytes writes a normalised one), and
            # x - (+0.0) is x for every float64 x (-0.0 and infinities included; a NaN would
            # make the maximum NaN): the shift is skipped then, bit-identical. Not for a
            # maximum of -0.0 (x - (-0.0) turns -0.0 into +0.0) nor any other.
            if top != 0.0 or math.copysign(1.0, top) < 0.0:
                self.logp -= top
        self.err = float(err)
        self.exact = exact
        self._min = float(self.logp.min())
        self._extremes: dict[tuple[int, ...], tuple[FloatArray, FloatArray]] = {}

    def copy(self) -> LikelihoodState:
        """An independent copy."""
        return LikelihoodState(self.domain, self.logp, self.err, self.exact)

    @property
    def computed_loss(self) -> float:
        """``max log P - min log P`` as computed in float64 (max is 0 by normalisation)."""
        return -self._min

    def loss(self, cap: Fraction | None = None) -> LossBounds:
        """Certified bounds on the realized loss of the history recorded so far.

        ``cap``, when given, is the exact basic-composition total of that history. A
        randomized-response history's loss is exact (:func:`exact_bounds`; it never exceeds
        the cap, Lemma 6.1).
        """
        if self.exact is not None:
            return exact_bounds(self.exact.loss())
        return bounds_from(self.computed_loss, self.err, cap)

    def extremes_over(self, axes: tuple[int, ...]) -> tuple[FloatArray, FloatArray]:
        """Per-cell maxima and minima of ``log P`` over all attributes *not* in ``axes``.

        Returns two arrays of shape ``tuple(domain.shape[a] for a in axes)``.
        """
        if len(axes) == self.logp.ndim:
            return self.logp, self.logp
        found = self._extremes.get(axes)
        if found is None:  # kept until the array changes: a decision's, reused by its record
            # the ufuncs' reductions are what np.max/np.min call, without their wrapper
            found = (_reduce_to(self.logp, axes, _MAX), _reduce_to(self.logp, axes, _MIN))
            self._extremes[axes] = found
        return found

    def error_after(self, term_magnitude: float, extra_error: float = 0.0) -> float:
        """The error bound the state would have after adding a term of this magnitude."""
        return self.err + update_error(self.computed_loss, term_magnitude) + extra_error

    def broadcast(self, term: Term) -> FloatArray:
        """The term's values reshaped to broadcast against the full ``log P`` array."""
        shape = [1] * self.logp.ndim
        for a in term.axes:
            shape[a] = self.domain.shape[a]
        return term.values.reshape(shape)

    def apply(self, term: Term) -> None:
        """Multiply ``P`` by the term (add it in log space) and renormalise; O(|X|)."""
        self.err = self.error_after(term.magnitude, term.extra_error)
        self.exact = _exact_after(self.exact, term)
        self._extremes = {}
        self.logp += self.broadcast(term)
        top = self.logp.max()
        self.logp -= top
        self._min = float(self.logp.min())

    def applied(self, term: Term, exact_loss: Fraction | None = None) -> LikelihoodState:
        """A new state: this one times the term, renormalised; this one is unchanged. O(|X|).

        ``exact_loss``, when given, is the new exact form's loss, known to the caller (the
        decision computed it for the output: :meth:`ExactLoss.candidate_losses`).

        Two passes over the array (the sum, written into a fresh one, and the shift) instead of
        four: the new maximum and minimum come from the per-cell extremes over the term's axes
        (:meth:`extremes_over`, usually already computed by the decision). They are exact, not
        estimates: rounding is monotone, so ``max_x fl(log P(x) + t_c) = fl(max_c + t_c)`` in
        each cell ``c``, and likewise for the minimum and for the shift by the maximum. The
        result is bit-identical to :meth:`apply` on a copy.
        """
        values = self.broadcast(term)
        # a small array's per-cell extremes, unless a decision kept them, cost more than two
        # passes over it (1,000 points: ≈ 65 µs against 19 µs, extremes_over's two reductions)
        if len(term.axes) < self.logp.ndim and (
            term.axes in self._extremes or self.logp.size > _DIRECT
        ):
            maxima, minima = self.extremes_over(term.axes)
            top = float((maxima + term.values).max())
            bottom = float((minima + term.values).min())
            logp = self.logp + values
            logp -= top
            low = bottom - top
        else:
            logp = self.logp + values
            logp -= logp.max()
            low = float(logp.min())
        after = object.__new__(LikelihoodState)
        after.domain = self.domain
        after.logp = logp
        after.err = self.error_after(term.magnitude, term.extra_error)
        after.exact = _exact_after(self.exact, term, exact_loss)
        after._min = low
        after._extremes = {}
        return after

    def to_bytes(self) -> bytes:
        """The array as little-endian float64 bytes, then the exact form if any (persistence).

        The exact part follows :data:`~app.engine.exact.MAGIC`; arrays stored before it
        existed have none and are restored without one (the float rule decides for them).
        """
        data = self.logp.astype("<f8").tobytes()
        if self.exact is None:
            return data
        return data + MAGIC + self.exact.to_bytes()

    @classmethod
    def from_bytes(
        cls, domain: Domain, data: bytes, err: float, forms: ExactForms | None = None
    ) -> LikelihoodState:
        """Rebuild a state saved with :meth:`to_bytes`.

        ``forms``: exact forms already parsed (or built), by their bytes — the exact part is
        taken from there when its bytes are known, else parsed and kept there.
        """
        size = 8 * math.prod(domain.shape)
        exact = None
        tail = cls.exact_part(domain, data)
        if tail is not None:
            exact = None if forms is None else forms.get(domain.shape, tail)
            if exact is None:
                exact = ExactLoss.from_bytes(domain.shape, tail)
                if forms is not None:
                    forms.put(domain.shape, tail, exact)
        # read in place (no slice of the bytes); the constructor copies it into an array of
        # the state's own, writable (apply adds in place) and sharing nothing with ``data``
        logp = np.frombuffer(data, dtype="<f8", count=size // 8)
        return cls(domain, logp, err, exact)

    @staticmethod
    def exact_part(domain: Domain, data: bytes) -> bytes | None:
        """The exact form's bytes in ``data`` (:meth:`to_bytes`'s), None when it has none."""
        size = 8 * math.prod(domain.shape)
        if len(data) > size and data[size : size + len(MAGIC)] == MAGIC:
            return data[size + len(MAGIC) :]
        return None


class ExactForms:
    """Exact forms (:class:`~app.engine.exact.ExactLoss`) by their stored bytes, most recent kept.

    An exact form is immutable, and what it computes of itself (its loss, its canonical bytes)
    is computed once and kept on it: a form found here by its bytes comes with those. Keyed by
    the domain's shape and the bytes :meth:`ExactLoss.to_bytes` writes, so a form is found only
    for bytes that parse to the same content (:meth:`ExactLoss.from_bytes` of them: the same
    groups in the same order, the same counts). The entries' bytes are bounded by
    ``max_bytes`` in all (the least recently used dropped first); a form whose bytes exceed
    ``max_entry`` is not kept. Thread-safe.
    """

    def __init__(self, max_bytes: int = 8 << 20, max_entry: int = 64 << 10) -> None:
        self.max_bytes = max_bytes
        self.max_entry = max_entry
        self._entries: OrderedDict[tuple[tuple[int, ...], bytes], ExactLoss] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, shape: tuple[int, ...], data: bytes) -> ExactLoss | None:
        """The form whose bytes are ``data`` over ``shape``, if kept (marked recently used)."""
        key = (shape, data)
        with self._guard:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found

    def put(self, shape: tuple[int, ...], data: bytes, exact: ExactLoss) -> None:
        """Keep ``exact`` as the form of ``data`` (which must be ``exact.to_bytes()``)."""
        if len(data) > self.max_entry or exact.shape != shape:
            return
        key = (shape, data)
        with self._guard:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            self._entries[key] = exact
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                (_, dropped), _ = self._entries.popitem(last=False)
                self._bytes -= len(dropped)

    def remember(self, state: LikelihoodState) -> None:
        """Keep ``state``'s exact form (if any) under its bytes."""
        if state.exact is not None:
            self.put(state.domain.shape, state.exact.to_bytes(), state.exact)

    def clear(self) -> None:
        """Forget every form."""
        with self._guard:
            self._entries.clear()
            self._bytes = 0


@dataclass(frozen=True)
class TermRows:
    """The terms of several outputs of one mechanism: row ``i`` is ``term(outputs[i])``.

    ``values`` has shape ``(n, *cells)`` over ``axes``; ``magnitudes`` and ``extra_errors``
    are each term's :attr:`Term.magnitude` and :attr:`Term.extra_error`; the exact forms, when
    every term has one, are ``ε`` of ``group`` times ``coeff[i]`` on ``exact_axis``.
    """

    axes: tuple[int, ...]
    values: FloatArray
    magnitudes: FloatArray
    extra_errors: FloatArray
    exact_axis: int | None = None
    exact_group: Group | None = None
    exact_coeff: IntArray | None = None

    @classmethod
    def of(cls, terms: list[Term]) -> TermRows:
        """The rows of terms computed one by one (all of one mechanism: the same axes)."""
        values = np.stack([t.values for t in terms])
        magnitudes = np.abs(values.reshape(len(terms), -1)).max(axis=1, initial=0.0)
        extra = np.array([t.extra_error for t in terms], dtype=np.float64)
        exact = [t.exact for t in terms]
        if not terms or any(e is None for e in exact):
            return cls(terms[0].axes if terms else (), values, magnitudes, extra)
        first = exact[0]
        assert first is not None  # noqa: S101 - checked above
        coeff = np.stack([np.asarray(e.coeff, dtype=np.int64) for e in exact if e is not None])
        return cls(terms[0].axes, values, magnitudes, extra, first.axis, first.group, coeff)

    def __len__(self) -> int:
        return int(self.values.shape[0])


def fold_many(base: LikelihoodState, steps: list[TermRows]) -> list[LikelihoodState]:
    """Member ``i``'s state: ``base`` with row ``i`` of every step applied in order.

    Bit for bit what ``s = base.copy()`` then ``s.apply(term)`` for each of the member's terms
    gives (a survey chunk's members with pending entries, each folded alone before): the same
    float additions, shifts by the exact maximum, error bounds (:func:`update_error` on the
    same operands, elementwise) and exact counts (:meth:`ExactLoss.with_term`, the groups in
    the same order, dropped past :data:`MAX_GROUPS`) — on members stacked in slices of at most
    :data:`FOLD_ELEMENTS` array elements. Every step has one row per member.
    """
    count = len(steps[0]) if steps else 1
    size = max(1, int(base.logp.size))
    width = max(1, FOLD_ELEMENTS // size)
    found: list[LikelihoodState] = []
    for start in range(0, count, width):
        stop = min(count, start + width)
        found.extend(_fold_slice(base, steps, start, stop))
    return found


def _fold_slice(
    base: LikelihoodState, steps: list[TermRows], start: int, stop: int
) -> list[LikelihoodState]:
    """:func:`fold_many` for members ``start:stop``."""
    n = stop - start
    logp = np.repeat(base.logp[None], n, axis=0)
    err = np.full(n, base.err, dtype=np.float64)
    low = np.full(n, base._min, dtype=np.float64)
    exact = base.exact
    groups = exact.groups if exact is not None else ()
    counts = (
        {a: np.repeat(arr[None], n, axis=0) for a, arr in exact.counts.items()}
        if exact is not None
        else {}
    )
    alive = exact is not None
    ndim = base.logp.ndim
    for step in steps:
        err = err + update_error(-low, step.magnitudes[start:stop]) + step.extra_errors[start:stop]
        if alive and step.exact_coeff is not None and step.exact_group is not None:
            group, axis = step.exact_group, step.exact_axis
            assert axis is not None  # noqa: S101 - set with the coefficients
            if group not in groups:
                if len(groups) >= MAX_GROUPS:
                    alive = False
                else:
                    groups = (*groups, group)
                    counts = {
                        a: np.concatenate([c, np.zeros((n, 1, c.shape[2]), dtype=np.int64)], 1)
                        for a, c in counts.items()
                    }
            if alive:
                if axis not in counts:
                    counts[axis] = np.zeros((n, len(groups), base.domain.shape[axis]), np.int64)
                counts[axis][:, groups.index(group), :] += step.exact_coeff[start:stop]
        else:
            alive = False
        shape = [n] + [1] * ndim
        for a in step.axes:
            shape[a + 1] = base.domain.shape[a]
        logp += step.values[start:stop].reshape(shape)
        flat = logp.reshape(n, -1)
        top = flat.max(axis=1)
        logp -= top.reshape([n] + [1] * ndim)
        low = flat.min(axis=1)
    states = []
    for i in range(n):
        state = object.__new__(LikelihoodState)
        state.domain = base.domain
        state.logp = logp[i]
        state.err = float(err[i])
        state.exact = (
            ExactLoss(exact.shape, groups, {a: c[i] for a, c in counts.items()})
            if alive and exact is not None
            else None
        )
        state._min = float(low[i])
        state._extremes = {}
        states.append(state)
    return states


def _reduce_to(array: FloatArray, keep: tuple[int, ...], fn: Any) -> FloatArray:
    """Reduce ``array`` over every axis not in ``keep`` (sorted), in stages that stay fast.

    Consecutive axes of the same kind (kept or reduced) are merged by a free C-order reshape.
    Each run of reduced axes that has kept axes behind it is reduced first, left to right: with
    the kept axes contiguous behind it that is an element-wise ``max``/``min`` of whole blocks,
    the fast case of numpy. A trailing run (a short strided inner loop, numpy's slow case) is
    reduced last, on what is left. ``max`` and ``min`` do not round, so the order changes no
    bit. On a (100, 16, 125, 5) array keeping axis 2, max + min took 14.67 ms with
    ``fn(axis=others)`` and 0.55 ms staged (median; ``.venv/bin/python bench/reduce_bench.py``,
    docs/benchmarks.md). An array of at most :data:`_DIRECT` elements is reduced in one call.
    """
    if not keep:
        return np.asarray(fn(array, axis=None), dtype=np.float64).reshape(())
    kept_shape = tuple(array.shape[a] for a in keep)
    if array.size <= _DIRECT:  # small: one reduction over the other axes costs less
        others = tuple(a for a in range(array.ndim) if a not in keep)
        return np.asarray(fn(array, axis=others), dtype=np.float64).reshape(kept_shape)
    segments: list[list[int]] = []  # [size, kept]
    for axis, size in enumerate(array.shape):
        kept = int(axis in keep)
        if segments and segments[-1][1] == kept:
            segments[-1][0] *= size
        else:
            segments.append([size, kept])
    array = array.reshape(tuple(size for size, _ in segments))
    position = 0
    for index, (size, kept) in enumerate(segments):
        if kept:
            position += 1
        elif index < len(segments) - 1:
            array = _reduce_axis(array, position, size, fn)
    if not segments[-1][1]:
        array = fn(array, axis=-1)
    return np.asarray(array, dtype=np.float64).reshape(kept_shape)


#: Arrays of at most this many elements are reduced by :func:`_reduce_to` in one call (over a
#: 1,000-point (10, 10, 10) array, max + min keeping one axis: 19–31 µs against 40–98 µs staged;
#: staged was faster from 4,096 elements on).
_DIRECT = 2048

#: ``np.max``/``np.min`` for :func:`_reduce_to`: their ufuncs' ``reduce`` (the same result — it
#: is what numpy's functions call — without the Python wrapper, several calls per decision).
_MAX = np.maximum.reduce
_MIN = np.minimum.reduce

#: Contiguous elements behind a reduced axis from which numpy's block-wise reduction is fast.
_WIDE = 512


def _reduce_axis(array: FloatArray, axis: int, size: int, fn: Any) -> FloatArray:
    """``fn(array, axis=axis)``, widening a narrow block behind the axis first.

    With few contiguous elements ``inner`` behind the axis (``region``: 5), numpy loops over
    short rows. Splitting the axis as ``(size / k, k)`` and reducing the outer part first makes
    rows of ``k * inner`` elements; the ``k`` left are reduced on an array ``size / k`` times
    smaller. ``k`` is the smallest divisor of ``size`` that reaches :data:`_WIDE` elements.
    """
    inner = math.prod(array.shape[axis + 1 :])
    split = 1
    if inner < _WIDE:
        for k in range(2, min(size, -(-_WIDE // inner)) + 1):
            if size % k == 0:
                split = k
                if k * inner >= _WIDE:
                    break
    if split == 1:
        return np.asarray(fn(array, axis=axis))
    head, tail = array.shape[:axis], array.shape[axis + 1 :]
    wide = fn(array.reshape((*head, size // split, split * inner)), axis=axis)
    return np.asarray(fn(wide.reshape((*head, split, *tail)), axis=axis))


def losses_from_table(maxima: FloatArray, minima: FloatArray, table: FloatArray) -> FloatArray:
    """Loss after each output of a tabulated mechanism, from per-cell extremes of ``log P``.

    ``table[..., j]`` is ``log Pr(y_j | cell)`` over the same cells as ``maxima``/``minima``; the
    loss after ``y_j`` is ``max(maxima + table_j) - min(minima + table_j)``.
    """
    n_out = table.shape[-1]
    hi = (maxima[..., None] + table).reshape(-1, n_out).max(axis=0)
    lo = (minima[..., None] + table).reshape(-1, n_out).min(axis=0)
    return np.asarray(hi - lo, dtype=np.float64)

"""The public state of an object over a continuous domain, and bounds on its realized loss.

``log P(x) = Σ_i h_i(θ_i·x + c_i)`` over the box of the domain's numeric attributes (integer ones
are relaxed to intervals by the search and rounded for incumbents; categorical attributes carry
no weights and do not matter). ``max log P`` and ``min log P = -max(-log P)`` are bounded by the
certified branch-and-bound, so the realized loss lies in
``[max_lower - min_upper, max_upper - min_lower]``.

Query values of degree 2 (``x^2``, ``x*y`` weights) put their monomials' coefficients in extra
columns of ``θ`` (:mod:`~app.engine.continuous.lifting`); the history's union of monomials is
the :class:`~app.engine.continuous.lifting.Lifting` of its :class:`TermSet`.

Only ``linear`` and ``logistic`` queries are supported on continuous domains so far.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from app.engine.continuous.branch_and_bound import BnBSettings, MaxResult, maximize
from app.engine.continuous.lifting import Lifting
from app.engine.continuous.problem import Box, TermSet
from app.engine.continuous.univariate import ResponseCurve
from app.engine.domain import AttributeKind, Domain
from app.engine.errors import Unsupported
from app.engine.likelihood import LossBounds
from app.engine.mechanisms import Mechanism, Output
from app.engine.mechanisms.base import output_index
from app.engine.mechanisms.regression import LinearQuery, LogisticQuery, ScalarResponse
from app.engine.numerics import UNIT_ROUNDOFF, FloatArray, float_up


@dataclass(frozen=True)
class ContinuousLoss:
    """Certified bounds on the realized loss with how the searches ended."""

    lower: float
    upper: float
    limit: bool
    nodes: int
    seconds: float
    #: Why a search stopped short of its tolerance (``Status`` values, e.g. ``"time-limit"``).
    reasons: frozenset[str] = frozenset()

    def bounds(self, cap: Fraction | None = None) -> LossBounds:
        """As :class:`LossBounds`, the upper bound capped by exact basic composition."""
        upper = self.upper if cap is None else min(self.upper, float_up(cap))
        return LossBounds(min(self.lower, upper), upper)


def _loss_json(loss: ContinuousLoss) -> dict[str, Any]:
    """``loss`` as plain data (its ``reasons`` as a sorted list)."""
    return {**asdict(loss), "reasons": sorted(loss.reasons)}


@dataclass(frozen=True)
class _Term:
    theta: FloatArray
    c: float
    curve: ResponseCurve
    #: Bound on |clipped mechanism - affine continuation| over the domain (plain linear only).
    excess: float
    #: Coefficients of the monomials ``x_i x_j`` (box coordinates ``i <= j``) of a quadratic query.
    quadratic: tuple[tuple[tuple[int, int], float], ...] = ()
    #: The query's range over the box, holding every computed ``z`` (quadratic queries).
    reach: tuple[float, float] = (-np.inf, np.inf)


def box_of(domain: Domain) -> tuple[Box, tuple[int, ...]]:
    """The box of the numeric attributes of ``domain`` and their axes."""
    axes = tuple(i for i, a in enumerate(domain.attributes) if a.is_numeric)
    lo = np.array([domain.attributes[i].low for i in axes], dtype=np.float64)
    hi = np.array([domain.attributes[i].high for i in axes], dtype=np.float64)
    integer = np.array([domain.attributes[i].kind is AttributeKind.INTEGER for i in axes])
    return Box(lo, hi, integer), axes


def curve_for(
    mechanism: ScalarResponse, output: Output, *, truncate: bool | None = None
) -> ResponseCurve:
    """The log-likelihood curve of ``output`` of a ``linear`` or ``logistic`` query.

    ``truncate`` overrides a ``linear`` query's own flag: the clipped curve is the mechanism's
    exact term; the untruncated one its concave continuation (see
    :mod:`~app.engine.continuous.univariate`).
    """
    high = output_index(output) == 1
    if isinstance(mechanism, LogisticQuery):
        return ResponseCurve.logistic_output(mechanism.eps, high=high)
    assert isinstance(mechanism, LinearQuery)  # noqa: S101 - the two ScalarResponse kinds
    clip = mechanism.truncate if truncate is None else truncate
    return ResponseCurve.linear_output(
        mechanism.eps, mechanism.a, mechanism.b, high=high, truncate=clip
    )


def _term(
    mechanism: Mechanism, output: Output, box: Box, axes: tuple[int, ...], field_path: str
) -> _Term:
    if not isinstance(mechanism, ScalarResponse):
        raise Unsupported(
            field_path,
            f"{mechanism.kind} queries are not supported on continuous domains yet "
            "(linear and logistic are)",
        )
    theta = np.zeros(len(axes))
    for axis, w in mechanism.weights.items():
        theta[axes.index(axis)] = w
    quadratic = tuple(
        ((axes.index(i), axes.index(j)), w) for (i, j), w in mechanism.quadratic.items()
    )
    reach = (mechanism.z_min, mechanism.z_max) if quadratic else (-np.inf, np.inf)
    if isinstance(mechanism, LogisticQuery):
        curve = curve_for(mechanism, output)
        return _Term(theta, mechanism.intercept, curve, 0.0, quadratic, reach)
    assert isinstance(mechanism, LinearQuery)  # noqa: S101 - the two ScalarResponse kinds
    truncate = mechanism.truncate
    excess = 0.0
    if not truncate:
        # the search sees query values up to a rounding pad beyond the reach over the box
        # (Termset.value_ranges), so the continuation must be close there too
        top = np.maximum(np.abs(box.lo), np.abs(box.hi))
        pad = (
            (len(axes) + len(quadratic) + 3)
            * UNIT_ROUNDOFF
            * (
                float(np.abs(theta) @ top)
                + sum(abs(w) * float(top[i] * top[j]) for (i, j), w in quadratic)
                + abs(mechanism.intercept)
            )
        )
        beyond = max(mechanism.a - mechanism.z_min, mechanism.z_max - mechanism.b, 0.0) + 2 * pad
        # the affine continuation differs from the clipped mechanism by at most
        # |d/dz log(1 + tE)| * beyond <= E/(b - a) / (1 + tE) * beyond; with
        # t >= -beyond/(b - a) and beyond * E/(b - a) <= 1e-6 that is <= 1.0001 E/(b-a) beyond
        steep = beyond * mechanism.expm1_eps / (mechanism.b - mechanism.a)
        if steep <= 1e-6:
            excess = steep * 1.0001
        else:  # the continuation is not close (large ε): bound the clipped mechanism itself
            truncate = True
    curve = curve_for(mechanism, output, truncate=truncate)
    return _Term(theta, mechanism.intercept, curve, excess, quadratic, reach)


@dataclass
class ContinuousState:
    """History terms of a continuous-domain object and cached bounds on its loss."""

    domain: Domain
    settings: BnBSettings = field(default_factory=BnBSettings)
    _terms: list[_Term] = field(default_factory=list)
    _cached: ContinuousLoss | None = None
    #: Certified bounds known for the current history without a search (see :meth:`record`).
    _decided: tuple[float, float] | None = None
    #: Why any search of this state (or of the states derived from it) stopped short of its
    #: tolerance: the ``Status`` values of those searches (the calculator's ``reason``).
    limits_hit: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.box, self.axes = box_of(self.domain)

    def term_set(self, extra: list[_Term] | None = None) -> tuple[TermSet, float]:
        """The history (plus ``extra`` terms) as a :class:`TermSet` and its total excess."""
        terms = self._terms + (extra or [])
        if not terms:
            return TermSet(np.zeros((0, len(self.axes))), np.zeros(0), ()), 0.0
        theta = np.array([t.theta for t in terms])
        c = np.array([t.c for t in terms])
        curves = tuple(t.curve for t in terms)
        excess = sum(t.excess for t in terms)
        pairs = sorted({pair for t in terms for pair, _ in t.quadratic})
        if not pairs:
            return TermSet(theta, c, curves), excess
        column = {pair: len(self.axes) + k for k, pair in enumerate(pairs)}
        lifted = np.zeros((len(terms), len(self.axes) + len(pairs)))
        lifted[:, : len(self.axes)] = theta
        for n, t in enumerate(terms):
            for pair, w in t.quadratic:
                lifted[n, column[pair]] = w
        lifting = Lifting(len(self.axes), tuple(pairs))
        reach = (np.array([t.reach[0] for t in terms]), np.array([t.reach[1] for t in terms]))
        return TermSet(lifted, c, curves, lifting=lifting, reach=reach), excess

    def _bound(self, extra: list[_Term] | None = None) -> ContinuousLoss:
        terms, excess = self.term_set(extra)
        if terms.size == 0:
            return ContinuousLoss(0.0, 0.0, False, 0, 0.0)
        m = self.settings.grouping
        groups = [np.arange(terms.size)]
        if m is not None and terms.size > m:
            groups = [np.arange(i, min(i + m, terms.size)) for i in range(0, terms.size, m)]
        tolerance = self.settings.tolerance / (2.0 * len(groups))
        settings = replace(self.settings, tolerance=tolerance)
        upper, nodes, seconds, limit = 0.0, 0, 0.0, False
        reasons: set[str] = set()
        points: list[FloatArray] = []
        for index in groups:
            part = terms.subset(index) if len(groups) > 1 else terms
            top: MaxResult = maximize(part, self.box, settings)
            bottom: MaxResult = maximize(part.negated(), self.box, settings)
            upper += top.upper + bottom.upper
            nodes += top.nodes + bottom.nodes
            seconds += top.seconds + bottom.seconds
            limit = limit or top.status.hit_limit or bottom.status.hit_limit
            reasons |= {r.status.value for r in (top, bottom) if r.status.hit_limit}
            points += [top.x, bottom.x]
        if len(groups) == 1:
            lower = top.lower + bottom.lower
        else:  # certified lower bound: the whole F at the groups' extreme points
            values, errs = terms.evaluate_many(np.array(points))
            lower = float(np.max(values - errs) - np.min(values + errs))
        self.limits_hit |= reasons
        return ContinuousLoss(
            max(0.0, lower - 2.0 * excess),
            upper + 2.0 * excess,
            limit,
            nodes,
            seconds,
            frozenset(reasons),
        )

    def loss_detail(self) -> ContinuousLoss:
        """Bounds on the realized loss of the history (cached).

        Intersected with the bounds the last decision used, when known: both are certified, and
        a search stopped by a limit can come back looser than the bound that accepted the query.
        """
        if self._cached is None:
            self._cached = self._capped(self._bound())
        return self._cached

    def _capped(self, found: ContinuousLoss) -> ContinuousLoss:
        """``found`` intersected with the last decision's bounds (both certified)."""
        if self._decided is None:
            return found
        lower = max(found.lower, self._decided[0])
        upper = min(found.upper, self._decided[1])
        return replace(found, lower=lower, upper=upper) if lower <= upper else found

    def loss(self, cap: Fraction | None = None) -> LossBounds:
        """Certified bounds on the realized loss, capped by ``cap`` (exact Σε) when given."""
        return self.loss_detail().bounds(cap)

    def loss_after(
        self, mechanism: Mechanism, output: Output, field_path: str = "query"
    ) -> ContinuousLoss:
        """Bounds on the loss of the history extended by ``(mechanism, output)``."""
        return self._bound([_term(mechanism, output, self.box, self.axes, field_path)])

    def record(
        self,
        mechanism: Mechanism,
        output: Output,
        field_path: str = "query",
        known: ContinuousLoss | None = None,
        decided: tuple[float, float] | None = None,
    ) -> None:
        """Append an accepted ``(mechanism, output)``.

        ``known`` reuses bounds a search already computed for the extended history; ``decided``
        are the (certified) bounds the filter decision used for this output, kept as a cap.
        """
        self._terms.append(_term(mechanism, output, self.box, self.axes, field_path))
        self._decided = decided
        self._cached = None if known is None else self._capped(known)

    def extended(
        self,
        mechanism: Mechanism,
        output: Output,
        *,
        known: ContinuousLoss | None = None,
        decided: tuple[float, float] | None = None,
        field_path: str = "query",
    ) -> ContinuousState:
        """A new state with ``(mechanism, output)`` appended; this one is unchanged.

        The terms are shared, not recomputed (a list of references is copied); ``known`` and
        ``decided`` as in :meth:`record`. Without ``known``, the new state's loss is searched
        for on first use.
        """
        after = ContinuousState(
            self.domain, self.settings, list(self._terms), limits_hit=self.limits_hit
        )
        after.record(mechanism, output, field_path, known=known, decided=decided)
        return after

    def seeded(self, known: LossBounds) -> ContinuousState:
        """The same history with certified bounds on its loss already known (no search).

        The service stores every object's certified bounds; a decision starts from them
        instead of searching the whole history again.
        """
        seeded = ContinuousState(
            self.domain, self.settings, self._terms, limits_hit=self.limits_hit
        )
        seeded._cached = ContinuousLoss(known.lower, known.upper, False, 0, 0.0)
        return seeded

    def with_settings(self, settings: BnBSettings) -> ContinuousState:
        """The same history and cached bounds, searched with ``settings`` from now on."""
        return ContinuousState(
            self.domain, settings, self._terms, self._cached, self._decided, self.limits_hit
        )

    def to_json(self) -> dict[str, Any]:
        """The history's terms and known bounds as plain data (no settings, no domain).

        What a distributed worker's task carries instead of the state itself: numbers only, so
        a broker never delivers code. :meth:`from_json` rebuilds an equal state. An unbounded
        reach (every query without quadratic weights) is written ``null``, so the usual state
        is strict JSON.
        """
        return {
            "terms": [
                {
                    "theta": [float(v) for v in t.theta],
                    "c": t.c,
                    "curve": asdict(t.curve),
                    "excess": t.excess,
                    "quadratic": [[list(pair), w] for pair, w in t.quadratic],
                    "reach": [
                        t.reach[0] if np.isfinite(t.reach[0]) else None,
                        t.reach[1] if np.isfinite(t.reach[1]) else None,
                    ],
                }
                for t in self._terms
            ],
            "cached": None if self._cached is None else _loss_json(self._cached),
            "decided": None if self._decided is None else list(self._decided),
            "limits_hit": sorted(self.limits_hit),
        }

    @classmethod
    def from_json(
        cls, domain: Domain, data: dict[str, Any], settings: BnBSettings | None = None
    ) -> ContinuousState:
        """The state :meth:`to_json` described, its searches run with ``settings``."""
        terms = [
            _Term(
                np.array(t["theta"], dtype=np.float64),
                float(t["c"]),
                ResponseCurve(**t["curve"]),
                float(t["excess"]),
                tuple(((int(i), int(j)), float(w)) for (i, j), w in t["quadratic"]),
                (
                    -np.inf if t["reach"][0] is None else float(t["reach"][0]),
                    np.inf if t["reach"][1] is None else float(t["reach"][1]),
                ),
            )
            for t in data["terms"]
        ]
        cached = None
        if data["cached"] is not None:
            cached = ContinuousLoss(
                **{**data["cached"], "reasons": frozenset(data["cached"].get("reasons", ()))}
            )
        decided = None if data["decided"] is None else (data["decided"][0], data["decided"][1])
        hit = set(data.get("limits_hit", ()))
        return cls(domain, settings or BnBSettings(), terms, cached, decided, hit)

    @property
    def loss_known(self) -> bool:
        """Whether bounds on the loss are at hand (reading them needs no search)."""
        return self._cached is not None

    def loss_without_search(self, cap: Fraction) -> LossBounds:
        """``[0, cap]`` (basic composition, Lemma 6.1) within the last decision's bounds."""
        return self._capped(ContinuousLoss(0.0, float_up(cap), True, 0, 0.0)).bounds(cap)

    @property
    def size(self) -> int:
        """Queries in the history."""
        return len(self._terms)

    def check_supported(self, mechanism: Mechanism, field_path: str) -> None:
        """Raise :class:`Unsupported` for a mechanism this state cannot account for."""
        _term(mechanism, 0, self.box, self.axes, field_path)

r"""``linear`` and ``logistic`` queries: a scalar response perturbed as in paper eq. (8).

Both compute ``z = Σ_a w_a x_a + c`` over numeric attributes, map it to ``t ∈ [0, 1]`` and output
the high symbol with probability

.. math::

    \Pr(\text{high} \mid x) = \frac{1 + t\,(e^\varepsilon - 1)}{e^\varepsilon + 1},\qquad
    \Pr(\text{low} \mid x) = \frac{1 + (1 - t)(e^\varepsilon - 1)}{e^\varepsilon + 1}

(eq. 37/40 with ``t = (y - a)/(b - a)``; eq. 45 with ``t = σ(z)``), evaluated in log space with
``log1p``/``expm1``. ``linear`` outputs ``a`` (low) or ``b`` (high) of its ``range``; with
``truncate`` its ``y`` is clipped to ``[a, b]``, without it a query whose ``y`` leaves ``[a, b]``
over the domain is rejected. ``logistic`` outputs ``0``/``1`` with ``t = σ(z)``.

The tight ε over the domain comes from the range ``[t_min, t_max]`` of ``t``: the larger of the
log-ratios of ``Pr(high)`` and ``Pr(low)`` at its two ends (both are monotone in ``t``).
"""

from __future__ import annotations

import abc
import math
import struct
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from app.engine.domain import Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_bool, as_list, as_number, as_object, check_keys, path
from app.engine.limits import EngineLimits
from app.engine.mechanisms.base import Output, TabulatedMechanism, check_epsilon
from app.engine.mechanisms.polynomial import Polynomial
from app.engine.numerics import (
    UNIT_ROUNDOFF,
    FloatArray,
    exact_affine,
    exact_fraction,
    exact_lifted_dot,
    expit,
    float_down,
    float_up,
    log1p_exp,
    response_log_prob,
)
from app.engine.sampling import bernoulli

#: Relative slack for a ``linear`` query without ``truncate`` whose range is met up to rounding
#: (e.g. ``‖θ‖₁ = 1`` normalised in floating point); its ``t`` is clipped to ``[0, 1]``.
RANGE_SLACK = 1e-9
#: Points per mechanism whose draw probabilities :meth:`ScalarResponse.sample` keeps (a full
#: memo of 4,096 two-coordinate points held 1.0 MiB, measured; a mechanism of a real-valued
#: population whose members never repeat a value gains nothing from it).
SAMPLE_MEMO = 1024
#: Largest ``|c| + Σ |w_a| max|x_a|`` accepted: keeps every query value and sum finite.
MAX_QUERY_MAGNITUDE = 1e150


def _box(domain: Domain, axes: tuple[int, ...]) -> tuple[dict[int, float], dict[int, float]]:
    """Lower and upper ends of the attributes at ``axes``."""
    lo = {a: float(domain.attributes[a].low) for a in axes}
    hi = {a: float(domain.attributes[a].high) for a in axes}
    return lo, hi


class ScalarResponse(TabulatedMechanism):
    """Common part of ``linear`` and ``logistic``: weights, intercept, ε, two outputs."""

    #: See :meth:`log_table` (set when the table is built).
    _extra: float = 0.0

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        weights_field = path(field, "weights")
        weights_obj = as_object(raw["weights"], weights_field)
        intercept = as_number(raw.get("intercept", 0.0), path(field, "intercept"))
        #: ``z`` as a polynomial of degree <= 2 (``x``, ``x^2``, ``x*y`` weights).
        self.polynomial = Polynomial.parse(weights_obj, intercept, domain, weights_field)
        #: The degree-1 weights by axis; :attr:`quadratic` holds the products ``(i, j)``.
        self.weights = dict(self.polynomial.linear)
        self.quadratic = dict(self.polynomial.quadratic)
        self.weight_names = self.polynomial.names(domain)
        self.intercept = intercept
        self.eps = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self.axes = self.polynomial.axes
        #: :meth:`_drawn`'s memo: a point's coordinates (as bytes) -> (high?, probability).
        self._memo: dict[bytes, tuple[bool, Fraction]] = {}
        self._point = f"<{len(self.axes)}d"  # the key's format (a str: picklable)
        self.expm1_eps = math.expm1(self.eps)
        self.log_norm = log1p_exp(self.eps)
        self.z_min, self.z_max = self._z_range(domain)
        magnitude = self.polynomial.magnitude(*_box(domain, self.axes))
        if not magnitude <= MAX_QUERY_MAGNITUDE:
            raise InvalidInput(
                weights_field,
                f"make the query's value exceed {MAX_QUERY_MAGNITUDE:g} in magnitude",
            )
        self._check_range(field)
        super().__init__(domain, self.eps, self._tight_upper(domain), field)

    def _tight_upper(self, domain: Domain) -> float:
        r"""A float not below the exact tight ε over the domain (never above the declared ε).

        With ``t0 = t(z_min)``, ``t1 = t(z_max)``, ``Δt = t1 - t0`` and ``Pr = t k + q``
        (:func:`~app.engine.numerics.response_log_prob`), the two log-ratios are

        .. math::

            \log\frac{\Pr_{hi}(t_1)}{\Pr_{hi}(t_0)} = \operatorname{log1p}
            \frac{Δt\,k}{t_0 k + q},\qquad
            \log\frac{\Pr_{lo}(t_0)}{\Pr_{lo}(t_1)} = \operatorname{log1p}
            \frac{Δt\,k}{(1 - t_1) k + q},

        computed without subtracting two ~ε-sized logarithms (issue 15 item 4: at ε = 100 that
        difference erred by 1e-14 on a tight ε of 8e-13). ``z_min``, ``z_max`` and ``Δz`` are
        exact rationals (two points: cheap); :meth:`_ends` turns them into a lower bound of ``t0``
        and ``1 - t1`` and an upper bound of ``Δt``, and every remaining float operation is
        covered by a relative ``16u`` margin. Quadratic query values (:meth:`_reach`) use an
        interval containing the exact reach instead: a wider ``[z0, z1]`` only raises the bound.
        """
        z0, z1 = self._reach(domain)
        #: The exact reach ``[z_min, z_max]`` of the query value, rounded outward.
        self.z_outward = (float_down(z0), float_up(z1))
        if not self.weights and not self.quadratic:
            return 0.0
        t0_lo, omt1_lo, dt = self._ends(z0, z1)
        margin = 16.0 * UNIT_ROUNDOFF
        dt *= 1.0 + margin
        k, q = math.tanh(0.5 * self.eps), 1.0 / (1.0 + math.exp(self.eps))
        tight = 0.0
        for own in (t0_lo, omt1_lo):
            den = (max(own, 0.0) * k + q) * (1.0 - margin)
            tight = max(tight, math.log1p(dt * k / den * (1.0 + margin)) * (1.0 + margin))
        return min(tight, self.eps)

    def _reach(self, domain: Domain) -> tuple[Fraction, Fraction]:
        """Rationals ``z0 <= min z`` and ``z1 >= max z`` over the domain.

        Degree 1: exact, at the two extreme vertices. Degree 2 on a box: the ends of
        :meth:`Polynomial.range_over_box` (padded to hold every exact value); on a finite domain:
        the float grid's range (:meth:`_z_range`, already computed) widened by the same rounding
        pad, ``8 (k + 4) u (|c| + Σ|w| max|monomial|)`` for ``k`` axes and products — each
        computed ``z`` is within it of the exact one, and a certified grid (:meth:`_z_bracket`)
        would cost another pass over up to ``max_points`` cells for a few ulp of tight ε.
        """
        if not self.quadratic:
            weights = list(self.weights.values())
            z0, z1 = (
                exact_affine(
                    self.intercept, weights, [float(x) for x in self._end(domain, top=top)]
                )
                for top in (False, True)
            )
            return z0, z1
        if domain.is_finite:
            count = len(self.axes) + len(self.quadratic) + 4
            magnitude = self.polynomial.magnitude(*_box(domain, self.axes))
            pad = exact_fraction(8 * count * UNIT_ROUNDOFF * magnitude)
            return exact_fraction(self.z_min) - pad, exact_fraction(self.z_max) + pad
        lo, hi = self.polynomial.range_over_box(*_box(domain, self.axes))
        return exact_fraction(lo), exact_fraction(hi)

    def _z_range(self, domain: Domain) -> tuple[float, float]:
        if self.quadratic and domain.is_finite:  # the grid's range (floats: see _reach)
            z = self._z_grid(domain)
            return float(z.min()), float(z.max())
        return self.polynomial.range_over_box(*_box(domain, self.axes))

    def _z_grid(self, domain: Domain) -> FloatArray:
        """``z`` over the grid of the read attributes (shape: their sizes, in axis order)."""
        shape = tuple(domain.shape[a] for a in self.axes)
        coords = {}
        for n, axis in enumerate(self.axes):
            view = [1] * len(shape)
            view[n] = shape[n]
            coords[axis] = domain.attributes[axis].numeric_values().reshape(view)
        z = self.polynomial.evaluate(coords)
        return np.asarray(np.broadcast_to(z, shape), dtype=np.float64)

    def _check_range(self, field: str) -> None:
        """Hook for ``linear``'s range check."""

    def _end(self, domain: Domain, *, top: bool) -> FloatArray:
        """The vertex of the weighted attributes' box where ``z`` is largest (``top``) or least.

        Degree 1 only (the extremes of a quadratic need not be vertices).
        """
        up = [(w > 0) == top for w in self.weights.values()]
        return np.array(
            [
                domain.attributes[a].high if u else domain.attributes[a].low
                for a, u in zip(self.weights, up, strict=True)
            ],
            dtype=np.float64,
        )

    def _lifted_weights(self) -> tuple[FloatArray, FloatArray, tuple[tuple[int, int], ...]]:
        """``z``'s weights on :attr:`axes` (in order), on its monomials, and their positions.

        The monomial ``(i, j)`` is ``x_i x_j`` of columns ``i, j`` of the rows
        :meth:`_grid_points` makes, as :func:`~app.engine.numerics.exact_lifted_dot` reads it.
        """
        where = {a: n for n, a in enumerate(self.axes)}
        linear = np.zeros(len(self.axes))
        for axis, w in self.weights.items():
            linear[where[axis]] = w
        pairs = tuple((where[i], where[j]) for i, j in self.quadratic)
        return linear, np.array(list(self.quadratic.values()), dtype=np.float64), pairs

    def _z_bracket(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``z`` at each row of ``points`` (read attributes) with certified ends around it."""
        linear, quadratic, pairs = self._lifted_weights()
        row = np.concatenate([linear, quadratic]).reshape(1, -1)
        z, err = exact_lifted_dot(points, pairs, row, np.array([self.intercept]))
        z, err = z[:, 0], err[:, 0]
        return z, np.nextafter(z - err, -np.inf), np.nextafter(z + err, np.inf)

    @abc.abstractmethod
    def bracket(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Certified ``t_lo <= t <= t_hi`` and ``(1-t)_lo <= 1 - t <= (1-t)_hi`` at each point."""

    @abc.abstractmethod
    def _ends(self, z0: Fraction, z1: Fraction) -> tuple[float, float, float]:
        """Lower bounds of ``t(z0)`` and ``1 - t(z1)``, an upper bound of ``t(z1) - t(z0)``."""

    def _grid_points(self) -> FloatArray:
        """Every cell of the read attributes' grid as a row (last attribute fastest)."""
        values = [self.domain.attributes[a].numeric_values() for a in self.axes]
        if not values:  # no weights: one cell, z = c
            return np.zeros((1, 0))
        mesh = np.meshgrid(*values, indexing="ij")
        return np.stack([m.reshape(-1) for m in mesh], axis=1).astype(np.float64)

    @abc.abstractmethod
    def response(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(t, 1 - t)`` for query values ``z``, each computed without cancellation."""

    def log_table(self) -> FloatArray:
        """``[log Pr(low), log Pr(high)]`` over the grid of the read attributes.

        ``t`` and ``1 - t`` come from :meth:`bracket`'s accurate values (``z`` in twice the
        working precision, monomials split error-free, ``z - a`` and ``b - z`` without
        cancellation); the table is also evaluated at the ends of the brackets, and the largest
        change (``log Pr`` is monotone in ``t``) is this mechanism's :attr:`extra_error`, 0 when
        every ``z`` was exact.
        """
        shape = tuple(self.domain.shape[a] for a in self.axes)
        points = self._grid_points()
        t, omt, inexact = self._accurate(points)
        t_lo, t_hi, omt_lo, omt_hi = self.bracket(points)
        columns = []
        extra = 0.0
        for own, other, own_lo, own_hi, other_lo, other_hi in (
            (omt, t, omt_lo, omt_hi, t_lo, t_hi),
            (t, omt, t_lo, t_hi, omt_lo, omt_hi),
        ):
            value = response_log_prob(own, other, self.eps)
            low_end = response_log_prob(own_lo, other_hi, self.eps)
            high_end = response_log_prob(own_hi, other_lo, self.eps)
            moved = np.maximum(np.abs(high_end - value), np.abs(value - low_end))
            moved = moved + 16.0 * UNIT_ROUNDOFF * (np.abs(low_end) + np.abs(high_end))
            moved = np.where(inexact, moved, 0.0)
            if moved.size:
                extra = max(extra, float(np.max(moved)) if np.all(np.isfinite(moved)) else math.inf)
            columns.append(value.reshape(shape))
        self._extra = extra if extra > 0.0 else 0.0
        return np.stack(columns, axis=-1)

    @property
    def extra_error(self) -> float:
        """How far the table's entries may be from those at the exact ``z`` (see log_table)."""
        self.table()
        return self._extra

    @abc.abstractmethod
    def _accurate(self, points: FloatArray) -> tuple[FloatArray, FloatArray, np.ndarray]:
        """``t``, ``1 - t`` at each point and where ``z`` was not computed exactly.

        ``t`` is as accurate as the brackets allow; where ``z`` is exact the brackets only add
        rounding that the default error model already charges.
        """

    @property
    def output_count(self) -> int:
        """Two outputs: low (index 0) and high (index 1)."""
        return 2

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Output high with probability ``t k + q`` (``k = tanh(ε/2)``, ``q = 1/(e^ε + 1)``).

        ``t`` and ``1 - t`` are the table's accurate values at this point (:meth:`_accurate`: the
        same ``z`` in twice the working precision), so what is sampled is what is accounted.
        The smaller of the two output probabilities is drawn from its own float — ``t k + q``
        or ``(1 - t) k + q``, each a few ulp from the real value relative to itself — and the
        other is its exact complement: both outputs keep a positive probability with a small
        relative error at any ε (a float of ``Pr(high)`` near 1 would round ``Pr(low)`` to 0,
        or far from its value).

        Every call draws anew (one :func:`~app.engine.sampling.bernoulli`); only the rational it
        draws with is memoised per point (:meth:`_drawn`).
        """
        coords = [float(value[self.domain.attributes[a].name]) for a in self.axes]
        high, p = self._drawn(coords)
        drawn = bernoulli(p)
        return int(drawn) if high else int(not drawn)

    def _drawn(self, coords: list[float]) -> tuple[bool, Fraction]:
        """Which output :meth:`sample` draws at this point and its exact probability.

        A deterministic function of the point's floats (no randomness: ``_accurate`` on the one-row
        array of them), memoised by their bit patterns (``-0.0`` apart from ``0.0``) for up to
        :data:`SAMPLE_MEMO` points per mechanism: a survey's population holds few distinct values
        and calls :meth:`sample` once per member, and the one-row evaluation (numpy on arrays of one
        element) was nearly all of a draw (measured 47-82 us a draw without the memo, 1.6-2.7 us
        with it: bench/regression_draws.py). The memoised pair is the very one computed, so every
        draw has the same distribution as before. The memo belongs to this mechanism object: a
        submit parses its ``linear`` or ``logistic`` query anew
        (``app.services.queries._KEPT_KINDS`` keeps randomized response only), so its single draw
        always computes, whatever earlier submits drew. In a survey the sampling time then depends
        on how many distinct values were drawn for (as does the parse of each distinct plaintext
        once, ``app.services.survey_runs._sample_groups``), not on which.
        """
        key = struct.pack(self._point, *coords)
        known = self._memo.get(key)
        if known is not None:
            return known
        t, omt, _ = self._accurate(np.array([coords]))
        k, q = math.tanh(0.5 * self.eps), 1.0 / (1.0 + math.exp(self.eps))
        p_high = min(1.0, float(t[0]) * k + q)
        p_low = min(1.0, float(omt[0]) * k + q)
        found = (
            (True, exact_fraction(p_high)) if p_high <= p_low else (False, exact_fraction(p_low))
        )
        if len(self._memo) < SAMPLE_MEMO:
            self._memo[key] = found
        return found

    def _common_json(self) -> dict[str, Any]:
        return {
            "weights": dict(self.weight_names),
            "intercept": self.intercept,
            "epsilon": self.eps,
        }


class LinearQuery(ScalarResponse):
    """``linear``: ``y = Σ w x + c`` (clipped to ``[a, b]`` with ``truncate``), outputs a or b."""

    kind = "linear"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(
            raw,
            field,
            required=("mechanism", "weights", "range", "epsilon"),
            optional=("intercept", "truncate"),
        )
        range_field = path(field, "range")
        bounds = as_list(raw["range"], range_field, min_len=2, max_len=2)
        self.a_raw, self.b_raw = bounds
        self.a = as_number(bounds[0], path(range_field, 0))
        self.b = as_number(bounds[1], path(range_field, 1))
        if not self.b > self.a:
            raise InvalidInput(path(range_field, 1), "must be greater than range[0]")
        self.truncate = as_bool(raw.get("truncate", False), path(field, "truncate"))
        self.field = field
        super().__init__(raw, domain, field, limits)

    def _check_range(self, field: str) -> None:
        if self.truncate:
            return
        scale = max(abs(self.a), abs(self.b), abs(self.z_min), abs(self.z_max), 1.0)
        slack = RANGE_SLACK * scale
        if self.z_min < self.a - slack or self.z_max > self.b + slack:
            raise InvalidInput(
                path(field, "range"),
                f"the query's values over the domain reach [{self.z_min:.6g}, {self.z_max:.6g}], "
                "outside the range; widen the range or set truncate: true",
            )

    def response(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``t = (clip(z) - a)/(b - a)`` and ``1 - t = (b - clip(z))/(b - a)``."""
        y = np.clip(z, self.a, self.b)
        width = self.b - self.a
        return (y - self.a) / width, (self.b - y) / width

    def _offsets(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """``z - a`` and ``b - z`` in twice the working precision, with their error bounds."""
        linear, quadratic, pairs = self._lifted_weights()
        ones = np.ones((points.shape[0], 1))
        augmented = np.hstack([points, ones])  # the monomials' columns index ``points`` only
        rows = np.array(
            [
                np.concatenate([linear, [-self.a], quadratic]),
                np.concatenate([-linear, [self.b], -quadratic]),
            ]
        )
        value, err = exact_lifted_dot(
            augmented, pairs, rows, np.array([self.intercept, -self.intercept])
        )
        return value[:, 0], err[:, 0], value[:, 1], err[:, 1]

    def _accurate(self, points: FloatArray) -> tuple[FloatArray, FloatArray, np.ndarray]:
        above_a, err_a, below_b, err_b = self._offsets(points)
        width = self.b - self.a
        t = np.clip(above_a, 0.0, width) / width
        return t, np.clip(below_b, 0.0, width) / width, (err_a > 0.0) | (err_b > 0.0)

    def bracket(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """``t = clip(z - a, 0, w)/w`` bracketed from ``z - a ± err`` (likewise ``1 - t``)."""
        above_a, err_a, below_b, err_b = self._offsets(points)
        width = self.b - self.a
        up, down = 1.0 + 4.0 * UNIT_ROUNDOFF, 1.0 - 4.0 * UNIT_ROUNDOFF

        def ends(v: FloatArray, e: FloatArray) -> tuple[FloatArray, FloatArray]:
            lo = np.clip(np.nextafter(v - e, -np.inf), 0.0, width) / width * down
            hi = np.clip(np.nextafter(v + e, np.inf), 0.0, width) / width * up
            return lo, hi

        t_lo, t_hi = ends(above_a, err_a)
        omt_lo, omt_hi = ends(below_b, err_b)
        return t_lo, t_hi, omt_lo, omt_hi

    def _ends(self, z0: Fraction, z1: Fraction) -> tuple[float, float, float]:
        """Exact in rationals (``t`` is piecewise linear), rounded outward."""
        a, b = exact_fraction(self.a), exact_fraction(self.b)
        y0, y1 = min(max(z0, a), b), min(max(z1, a), b)
        width = b - a
        return (
            float_down((y0 - a) / width),
            float_down((b - y1) / width),
            float_up((y1 - y0) / width),
        )

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON."""
        return {
            "mechanism": self.kind,
            **self._common_json(),
            "range": [self.a_raw, self.b_raw],
            "truncate": self.truncate,
        }

    def parse_output(self, raw: Any, field: str) -> Output:
        """``range[0]`` (index 0) or ``range[1]`` (index 1)."""
        value = as_number(raw, field)
        if value == self.a:
            return 0
        if value == self.b:
            return 1
        raise InvalidInput(field, "must be range[0] or range[1] of the query")

    def output_json(self, output: Output) -> Any:
        """``range[0]`` or ``range[1]`` as written in the query."""
        return self.b_raw if output == 1 else self.a_raw


class LogisticQuery(ScalarResponse):
    """``logistic``: ``y = σ(Σ w x + c)``, outputs 0 or 1 (paper eq. 45)."""

    kind = "logistic"

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        check_keys(
            raw, field, required=("mechanism", "weights", "epsilon"), optional=("intercept",)
        )
        super().__init__(raw, domain, field, limits)

    def response(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``σ(z)`` and ``σ(-z)``."""
        return np.asarray(expit(z), dtype=np.float64), np.asarray(expit(-z), dtype=np.float64)

    def _accurate(self, points: FloatArray) -> tuple[FloatArray, FloatArray, np.ndarray]:
        z, z_lo, z_hi = self._z_bracket(points)
        t, omt = self.response(z)
        return t, omt, (np.nextafter(z_lo, np.inf) < z) | (np.nextafter(z_hi, -np.inf) > z)

    def bracket(self, points: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """``σ`` at the certified ends of ``z`` (``σ`` is monotone), widened by ``4u``."""
        _, z_lo, z_hi = self._z_bracket(points)
        up, down = 1.0 + 4.0 * UNIT_ROUNDOFF, 1.0 - 4.0 * UNIT_ROUNDOFF
        return (
            np.asarray(expit(z_lo), dtype=np.float64) * down,
            np.minimum(np.asarray(expit(z_hi), dtype=np.float64) * up, 1.0),
            np.asarray(expit(-z_hi), dtype=np.float64) * down,
            np.minimum(np.asarray(expit(-z_lo), dtype=np.float64) * up, 1.0),
        )

    def _ends(self, z0: Fraction, z1: Fraction) -> tuple[float, float, float]:
        """``σ`` at the outward-rounded ends (8u for ``expit``), and ``Δt`` without cancellation.

        ``σ(z1) - σ(z0) = σ(z1) σ(-z0) (1 - e^{-(z1 - z0)})``.
        """
        up, down = 1.0 + 8.0 * UNIT_ROUNDOFF, 1.0 - 8.0 * UNIT_ROUNDOFF
        lo0, hi1 = float_down(z0), float_up(z1)
        gap = float_up(z1 - z0) * (1.0 + 2.0 * UNIT_ROUNDOFF)
        rise = float(expit(hi1)) * float(expit(-lo0)) * -math.expm1(-gap) * up**3
        return float(expit(lo0)) * down, float(expit(-hi1)) * down, rise

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON."""
        return {"mechanism": self.kind, **self._common_json()}

    def parse_output(self, raw: Any, field: str) -> Output:
        """``0`` or ``1``."""
        if isinstance(raw, bool) or raw not in (0, 1):
            raise InvalidInput(field, "must be 0 or 1")
        return int(raw)

    def output_json(self, output: Output) -> Any:
        """``0`` or ``1``."""
        return int(output)  # type: ignore[arg-type]

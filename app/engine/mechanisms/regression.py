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
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.special import expit

from app.engine.domain import Domain, Scalar
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_bool, as_list, as_number, as_object, check_keys, path
from app.engine.limits import EngineLimits
from app.engine.mechanisms.base import Output, TabulatedMechanism, check_epsilon
from app.engine.numerics import (
    UNIT_ROUNDOFF,
    FloatArray,
    exact_dot,
    exact_fraction,
    log1p_exp,
    response_log_prob,
)
from app.engine.sampling import bernoulli

#: Relative slack for a ``linear`` query without ``truncate`` whose range is met up to rounding
#: (e.g. ``‖θ‖₁ = 1`` normalised in floating point); its ``t`` is clipped to ``[0, 1]``.
RANGE_SLACK = 1e-9
#: Largest ``|c| + Σ |w_a| max|x_a|`` accepted: keeps every query value and sum finite.
MAX_QUERY_MAGNITUDE = 1e150


class ScalarResponse(TabulatedMechanism):
    """Common part of ``linear`` and ``logistic``: weights, intercept, ε, two outputs."""

    def __init__(
        self, raw: Mapping[str, Any], domain: Domain, field: str, limits: EngineLimits
    ) -> None:
        weights_field = path(field, "weights")
        weights_obj = as_object(raw["weights"], weights_field)
        weights: dict[int, float] = {}
        for name, w in weights_obj.items():
            w_field = path(weights_field, str(name))
            axis = domain.axis(name, w_field)
            if not domain.attributes[axis].is_numeric:
                raise InvalidInput(w_field, "must name a numeric (integer or real) attribute")
            weight = as_number(w, w_field)
            if weight != 0.0:
                weights[axis] = weight
        self.weights = dict(sorted(weights.items()))
        self.weight_names = {domain.attributes[a].name: w for a, w in self.weights.items()}
        self.intercept = as_number(raw.get("intercept", 0.0), path(field, "intercept"))
        self.eps = check_epsilon(raw["epsilon"], path(field, "epsilon"), limits)
        self.axes = tuple(self.weights)
        self.expm1_eps = math.expm1(self.eps)
        self.log_norm = log1p_exp(self.eps)
        self.z_min, self.z_max = self._z_range(domain)
        magnitude = abs(self.intercept) + sum(
            abs(w) * max(abs(domain.attributes[a].low), abs(domain.attributes[a].high))
            for a, w in self.weights.items()
        )
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
        difference erred by 1e-14 on a tight ε of 8e-13). ``z_min``/``z_max`` are evaluated with
        :func:`~app.engine.numerics.exact_dot`, widened by its error bound (zero when exact),
        ``Δt`` is bounded from above and the denominators from below at the widened ends (``t``
        is monotone), and every float operation is covered by a relative ``16u`` margin.
        """
        if not self.weights:
            return 0.0
        names = list(self.weights)
        w = np.array([self.weights[a] for a in names])
        low = np.array([domain.attributes[a].low for a in names], dtype=np.float64)
        high = np.array([domain.attributes[a].high for a in names], dtype=np.float64)
        ends = np.stack([np.where(w > 0, low, high), np.where(w > 0, high, low)])
        z, err = exact_dot(ends, w.reshape(1, -1), np.array([self.intercept]))
        z0 = math.nextafter(float(z[0, 0]) - float(err[0, 0]), -math.inf)
        z1 = math.nextafter(float(z[1, 0]) + float(err[1, 0]), math.inf)
        margin = 16.0 * UNIT_ROUNDOFF
        dt = self._delta_t(z0, z1) * (1.0 + margin)
        k, q = math.tanh(0.5 * self.eps), 1.0 / (1.0 + math.exp(self.eps))
        t0 = float(self.response(np.array([z0]))[0][0])
        one_minus_t1 = float(self.response(np.array([z1]))[1][0])
        tight = 0.0
        for own in (t0, one_minus_t1):
            den = (max(own, 0.0) * k + q) * (1.0 - margin)
            if den <= 0.0:
                return self.eps
            tight = max(tight, math.log1p(dt * k / den * (1.0 + margin)) * (1.0 + margin))
        return min(tight, self.eps)

    def _delta_t(self, z0: float, z1: float) -> float:
        """``t(z1) - t(z0)`` (``z0 <= z1``), not below the exact difference of the floats."""
        t = self.response(np.array([z0, z1]))[0]
        return max(float(t[1] - t[0]), 0.0)

    def _z_range(self, domain: Domain) -> tuple[float, float]:
        lo = hi = self.intercept
        for axis, w in self.weights.items():
            attr = domain.attributes[axis]
            a, b = w * attr.low, w * attr.high
            lo += min(a, b)
            hi += max(a, b)
        return lo, hi

    def _check_range(self, field: str) -> None:
        """Hook for ``linear``'s range check."""

    @abc.abstractmethod
    def response(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(t, 1 - t)`` for query values ``z``, each computed without cancellation."""

    def z_of(self, value: Mapping[str, Scalar]) -> float:
        """``Σ w_a x_a + c`` for one value."""
        z = self.intercept
        for name, w in self.weight_names.items():
            z += w * float(value[name])
        return z

    def log_table(self) -> FloatArray:
        """``[log Pr(low), log Pr(high)]`` over the grid of the weighted attributes."""
        shape = tuple(self.domain.shape[a] for a in self.axes)
        z = np.full(shape, self.intercept, dtype=np.float64)
        for n, (axis, w) in enumerate(self.weights.items()):
            view = [1] * len(shape)
            view[n] = shape[n]
            z = z + w * self.domain.attributes[axis].numeric_values().reshape(view)
        t, one_minus_t = self.response(z)
        log_high = response_log_prob(t, one_minus_t, self.eps)
        log_low = response_log_prob(one_minus_t, t, self.eps)
        return np.stack([log_low, log_high], axis=-1)

    @property
    def output_count(self) -> int:
        """Two outputs: low (index 0) and high (index 1)."""
        return 2

    def sample(self, value: Mapping[str, Scalar]) -> Output:
        """Output high with the exact dyadic value of ``Pr(high | x)``."""
        t, _ = self.response(np.array([self.z_of(value)]))
        p_high = float((1.0 + float(t[0]) * self.expm1_eps) / (1.0 + math.exp(self.eps)))
        return int(bernoulli(exact_fraction(min(1.0, max(0.0, p_high)))))

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

    def _delta_t(self, z0: float, z1: float) -> float:
        """``σ(z1) - σ(z0) = σ(z1) σ(-z0) (1 - e^{-(z1 - z0)})``: no cancellation."""
        gap = math.nextafter((z1 - z0) * (1.0 + 2.0 * UNIT_ROUNDOFF), math.inf)
        return float(expit(z1) * expit(-z0)) * -math.expm1(-gap)

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

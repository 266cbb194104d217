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
from app.engine.mechanisms.polynomial import Polynomial
from app.engine.numerics import FloatArray, exact_fraction, log1p_exp
from app.engine.sampling import bernoulli

#: Relative slack for a ``linear`` query without ``truncate`` whose range is met up to rounding
#: (e.g. ``‖θ‖₁ = 1`` normalised in floating point); its ``t`` is clipped to ``[0, 1]``.
RANGE_SLACK = 1e-9
#: Largest ``|c| + Σ |w_a| max|x_a|`` accepted: keeps every query value and sum finite.
MAX_QUERY_MAGNITUDE = 1e150


def _box(domain: Domain, axes: tuple[int, ...]) -> tuple[dict[int, float], dict[int, float]]:
    """Lower and upper ends of the attributes at ``axes``."""
    lo = {a: float(domain.attributes[a].low) for a in axes}
    hi = {a: float(domain.attributes[a].high) for a in axes}
    return lo, hi


class ScalarResponse(TabulatedMechanism):
    """Common part of ``linear`` and ``logistic``: weights, intercept, ε, two outputs."""

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
        t, one_minus_t = self.response(np.array([self.z_min, self.z_max]))
        log_hi = np.log1p(t * self.expm1_eps)
        log_lo = np.log1p(one_minus_t * self.expm1_eps)
        tight = max(float(log_hi[1] - log_hi[0]), float(log_lo[0] - log_lo[1]))
        super().__init__(domain, self.eps, tight, field)

    def _z_range(self, domain: Domain) -> tuple[float, float]:
        if self.quadratic and domain.is_finite:  # exact over the grid the table evaluates
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

    @abc.abstractmethod
    def response(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(t, 1 - t)`` for query values ``z``, each computed without cancellation."""

    def z_of(self, value: Mapping[str, Scalar]) -> float:
        """``z`` for one value: the same :meth:`Polynomial.evaluate` as the table."""
        coords = {a: float(value[self.domain.attributes[a].name]) for a in self.axes}
        return float(self.polynomial.evaluate(coords))

    def log_table(self) -> FloatArray:
        """``[log Pr(low), log Pr(high)]`` over the grid of the read attributes."""
        t, one_minus_t = self.response(self._z_grid(self.domain))
        log_high = np.log1p(t * self.expm1_eps) - self.log_norm
        log_low = np.log1p(one_minus_t * self.expm1_eps) - self.log_norm
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

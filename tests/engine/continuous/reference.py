"""An independent reference for the continuous-domain tests.

``log P(x) = Σ_i log Pr(M_i(x) = y_i)`` written directly from the formulas of contract.md (paper
eqs. 37, 40, 45) — no engine code — plus an independent search for its extremes over a box
(a dense grid, random points and multistart L-BFGS-B) and helpers that turn an instance into the
engine's inputs (JSON request, :class:`TermSet`/:class:`Box`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize

from app.engine.continuous.problem import Box, TermSet
from app.engine.continuous.univariate import ResponseCurve

PLAIN, TRUNCATED, LOGISTIC = "plain", "truncated", "logistic"


def sigmoid(z: np.ndarray) -> np.ndarray:
    """``1 / (1 + e^{-z})`` without overflow."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@dataclass
class Instance:
    """A history of ``linear``/``logistic`` queries with their outputs, over a box.

    Row ``i`` of ``weights`` and ``intercept[i]`` give ``z_i = w_i·x + c_i``; ``kinds[i]`` is
    ``plain`` (linear without truncate), ``truncated`` (linear with truncate) or ``logistic``;
    ``high[i]`` is the output (``b`` / ``1`` when True, ``a`` / ``0`` otherwise).
    """

    lo: np.ndarray
    hi: np.ndarray
    weights: np.ndarray
    intercept: np.ndarray
    kinds: list[str]
    a: np.ndarray
    b: np.ndarray
    eps: np.ndarray
    high: np.ndarray
    integer: bool = False

    @property
    def dim(self) -> int:
        return int(self.lo.size)

    @property
    def size(self) -> int:
        return len(self.kinds)

    def names(self) -> list[str]:
        return [f"x{k}" for k in range(self.dim)]

    # --- the reference likelihood (contract.md formulas) ----------------------------------------
    def _t(self, z: np.ndarray, high: np.ndarray | bool) -> np.ndarray:
        """``t`` where ``high`` is True and ``1 - t`` where it is False, for every term.

        ``t = σ(z)`` for a logistic term, ``(y - a)/(b - a)`` with ``y = clip(z, a, b)``
        otherwise (the mechanism clips y to ``[a, b]``; plain queries only reach it up to
        rounding); ``1 - t`` is formed directly (``σ(-z)``, ``(b - y)/(b - a)``) so that large ε
        keeps its precision. Each kind is computed on its own terms' columns only (on every column
        for a few points, where selecting columns costs more than it saves).
        """
        z = np.asarray(z, dtype=np.float64)
        high = np.asarray(high, dtype=bool)
        logistics = self.kinds.count(LOGISTIC)
        if logistics == self.size:
            return sigmoid(np.where(high, z, -z))
        if not logistics or z.size < 256:  # a few points: both kinds on every column
            y = np.clip(z, self.a, self.b)
            t: np.ndarray = np.where(high, y - self.a, self.b - y) / (self.b - self.a)
            if not logistics:
                return t
            logistic = np.array([kind == LOGISTIC for kind in self.kinds])
            return np.where(logistic, sigmoid(np.where(high, z, -z)), t)
        logistic = np.array([kind == LOGISTIC for kind in self.kinds])
        linear = ~logistic
        t = np.empty(z.shape)
        zl = z[..., logistic]
        t[..., logistic] = sigmoid(np.where(high if high.ndim == 0 else high[logistic], zl, -zl))
        a, b = self.a[linear], self.b[linear]
        y = np.clip(z[..., linear], a, b)
        t[..., linear] = np.where(high if high.ndim == 0 else high[linear], y - a, b - y) / (b - a)
        return t

    def _probs(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``Pr(high | z)``, ``Pr(low | z)`` and ``d Pr(high)/dz`` for every term (``(..., n)``).

        ``Pr(high) = t k + 1/(e^ε + 1)`` with ``k = (e^ε - 1)/(e^ε + 1)`` (eqs. 37, 40, 45) and
        ``Pr(low) = 1 - Pr(high) = (1 - t) k + 1/(e^ε + 1)`` (:meth:`_t`).
        """
        k = np.tanh(self.eps / 2.0)  # (e^ε - 1)/(e^ε + 1)
        base = sigmoid(-self.eps)  # 1/(e^ε + 1)
        t, one_minus_t = self._t(z, True), self._t(z, False)
        return t * k + base, one_minus_t * k + base, self._slope(z, True, t) * k

    def _slope(
        self, z: np.ndarray, high: np.ndarray | bool, t: np.ndarray | None = None
    ) -> np.ndarray:
        """``dt/dz``: ``σ(z)σ(-z)`` for a logistic term, ``1/(b - a)`` inside ``[a, b]`` (else 0)
        for a linear one; ``t`` is :meth:`_t` at ``high`` if the caller has it."""
        inside = (z >= self.a) & (z <= self.b)
        dt_lin = np.where(inside, 1.0 / (self.b - self.a), 0.0)
        if LOGISTIC not in self.kinds:
            return dt_lin
        logistic = np.array([kind == LOGISTIC for kind in self.kinds])
        t = self._t(z, high) if t is None else t
        return np.where(logistic, t * self._t(z, ~np.asarray(high, dtype=bool)), dt_lin)

    def term_logs(self, z: np.ndarray) -> np.ndarray:
        """``log Pr(M_i = y_i | z_i)`` for every term (:meth:`_probs`' value of the output, only
        that one formed)."""
        k = np.tanh(self.eps / 2.0)
        base = sigmoid(-self.eps)
        logs: np.ndarray = np.log(self._t(z, self.high) * k + base)
        return logs

    def values(self, points: np.ndarray) -> np.ndarray:
        """``z`` for each row of ``points``: shape ``(len(points), n)``.

        Accumulated coordinate by coordinate rather than by a matrix product: no BLAS, so no
        OpenBLAS threads competing with the test workers for the CI's two cores.
        """
        points = np.asarray(points, dtype=np.float64)
        z = np.broadcast_to(self.intercept, (points.shape[0], self.size)).copy()
        for k in range(self.dim):
            z += points[:, k : k + 1] * self.weights[:, k]
        return z

    def logp(self, points: np.ndarray) -> np.ndarray:
        """``log P`` at each row of ``points``."""
        points = np.atleast_2d(np.asarray(points, dtype=np.float64))
        return self.term_logs(self.values(points)).sum(axis=-1)

    def logp_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """``log P(x)`` and its gradient (:meth:`_probs`' values; only the output's formed)."""
        z = self.values(x[None, :])[0]
        k = np.tanh(self.eps / 2.0)
        t = self._t(z, self.high)
        p = t * k + sigmoid(-self.eps)
        slope = self._slope(z, self.high, t) * k
        dz = np.where(self.high, slope, -slope) / p
        return float(np.log(p).sum()), (self.weights * dz[:, None]).sum(axis=0)

    # --- independent search --------------------------------------------------------------------
    def lattice(self) -> np.ndarray:
        """Every integer point of the box (for integer instances)."""
        axes = [
            np.arange(math.ceil(lo), math.floor(hi) + 1.0)
            for lo, hi in zip(self.lo, self.hi, strict=True)
        ]
        mesh = np.meshgrid(*axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)

    def grid(self, points_per_axis: int) -> np.ndarray:
        axes = [
            np.unique(np.round(np.linspace(lo, hi, points_per_axis)))
            if self.integer
            else np.linspace(lo, hi, points_per_axis)
            for lo, hi in zip(self.lo, self.hi, strict=True)
        ]
        mesh = np.meshgrid(*axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)

    def search(
        self,
        rng: np.random.Generator,
        *,
        grid_points: int | None = None,
        random_points: int = 0,
        starts: int = 6,
        maxiter: int = 1000,
    ) -> tuple[float, np.ndarray, float, np.ndarray]:
        """``(max, argmax, min, argmin)`` of ``log P`` found by grid + random + L-BFGS-B."""
        if grid_points is None:
            grid_points = {1: 2001, 2: 151, 3: 35, 4: 15}.get(self.dim, 9)
        candidates = [self.grid(grid_points)] if grid_points > 1 else []
        if random_points:
            candidates.append(rng.uniform(self.lo, self.hi, size=(random_points, self.dim)))
        points = np.concatenate(candidates)
        values = self.logp(points)
        best_max, best_min = float(values.max()), float(values.min())
        arg_max, arg_min = points[values.argmax()], points[values.argmin()]
        if self.integer:
            return best_max, arg_max, best_min, arg_min
        bounds = list(zip(self.lo, self.hi, strict=True))
        order = np.argsort(values)
        picks = max(1, starts // 2)
        for sign, seeds in ((-1.0, order[-picks:]), (1.0, order[:picks])):
            extra = rng.uniform(self.lo, self.hi, size=(starts - picks, self.dim))
            for start in np.concatenate([points[seeds], extra]):

                def objective(x: np.ndarray, s: float = sign) -> tuple[float, np.ndarray]:
                    value, grad = self.logp_and_grad(x)
                    return s * value, s * grad

                res = minimize(
                    objective,
                    start,
                    jac=True,
                    method="L-BFGS-B",
                    bounds=bounds,
                    options={"maxiter": maxiter},
                )
                x = np.clip(res.x, self.lo, self.hi)
                value = float(self.logp(x)[0])
                if sign < 0 and value > best_max:
                    best_max, arg_max = value, x
                if sign > 0 and value < best_min:
                    best_min, arg_min = value, x
        return best_max, arg_max, best_min, arg_min

    # --- engine inputs -------------------------------------------------------------------------
    def curves(self) -> tuple[ResponseCurve, ...]:
        return tuple(
            ResponseCurve(
                kind == LOGISTIC,
                bool(h),
                float(e),
                float(a),
                float(b),
                kind == TRUNCATED,
            )
            for kind, h, e, a, b in zip(
                self.kinds, self.high, self.eps, self.a, self.b, strict=True
            )
        )

    def term_set(self) -> TermSet:
        return TermSet(self.weights.copy(), self.intercept.copy(), self.curves())

    def box(self) -> Box:
        return Box(self.lo.copy(), self.hi.copy(), np.full(self.dim, self.integer))

    def domain_json(self, kind: str | None = None) -> dict[str, Any]:
        kind = kind or ("integer" if self.integer else "real")
        attrs = []
        for name, lo, hi in zip(self.names(), self.lo, self.hi, strict=True):
            if kind == "integer":
                attrs.append({"name": name, "type": "integer", "low": int(lo), "high": int(hi)})
            else:
                attrs.append({"name": name, "type": "real", "low": float(lo), "high": float(hi)})
        return {"attributes": attrs}

    def query_json(self, i: int) -> dict[str, Any]:
        weights = {
            name: float(w) for name, w in zip(self.names(), self.weights[i], strict=True) if w
        }
        common = {"weights": weights, "intercept": float(self.intercept[i])}
        if self.kinds[i] == LOGISTIC:
            return {"mechanism": "logistic", **common, "epsilon": float(self.eps[i])}
        return {
            "mechanism": "linear",
            **common,
            "range": [float(self.a[i]), float(self.b[i])],
            "truncate": self.kinds[i] == TRUNCATED,
            "epsilon": float(self.eps[i]),
        }

    def output_json(self, i: int) -> Any:
        if self.kinds[i] == LOGISTIC:
            return int(self.high[i])
        return float(self.b[i]) if self.high[i] else float(self.a[i])

    def history_json(self) -> list[dict[str, Any]]:
        return [
            {"query": self.query_json(i), "output": self.output_json(i)} for i in range(self.size)
        ]

    def request(self, **options: Any) -> dict[str, Any]:
        return {"domain": self.domain_json(), "history": self.history_json(), "options": options}


def z_range(
    weights: np.ndarray, intercept: float, lo: np.ndarray, hi: np.ndarray
) -> tuple[float, float]:
    """``[min, max]`` of ``w·x + c`` over the box."""
    low = intercept + float(np.sum(np.minimum(weights * lo, weights * hi)))
    high = intercept + float(np.sum(np.maximum(weights * lo, weights * hi)))
    return low, high


def fit_query(
    rng: np.random.Generator, kind: str, w: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[float, float, float]:
    """A random intercept and range ``[a, b]`` for a query with weights ``w`` over the box."""
    # centre the query value somewhere near the box (logistic: around the inflection)
    intercept = round(float(-w @ (0.5 * (lo + hi)) + rng.normal(scale=1.5)), 6)
    z_lo, z_hi = z_range(w, intercept, lo, hi)
    span = max(z_hi - z_lo, 1e-3)
    a, b = 0.0, 1.0
    if kind == PLAIN:
        # the range must hold every value; sometimes exactly (t reaches 0 and 1)
        a = z_lo - (0.0 if rng.uniform() < 0.3 else rng.uniform(0.0, 1.0) * span)
        b = z_hi + (0.0 if rng.uniform() < 0.3 else rng.uniform(0.0, 1.0) * span)
        a = math.nextafter(a, -math.inf) if a == z_lo else a
        b = math.nextafter(b, math.inf) if b == z_hi else b
        if b - a < 1e-3:
            a, b = a - 1e-3, b + 1e-3
    elif kind == TRUNCATED:
        ends = np.sort(rng.uniform(z_lo - 0.3 * span, z_hi + 0.3 * span, size=2))
        a, b = float(ends[0]), float(max(ends[1], ends[0] + 1e-3 * span))
    return intercept, a, b


def random_instance(
    rng: np.random.Generator,
    *,
    dim: int,
    size: int,
    kinds: tuple[str, ...] = (PLAIN, TRUNCATED, LOGISTIC),
    integer: bool = False,
) -> Instance:
    """A random box and history (ε in [0.05, 2], mixed query kinds, random outputs)."""
    if integer:
        lo = rng.integers(-4, 3, size=dim).astype(np.float64)
        hi = lo + rng.integers(1, 7, size=dim)
    else:
        lo = rng.uniform(-5.0, 5.0, size=dim)
        hi = lo + rng.uniform(0.1, 10.0, size=dim)
    half = 0.5 * (hi - lo)
    weights = np.zeros((size, dim))
    intercept = np.zeros(size)
    a, b = np.zeros(size), np.ones(size)
    chosen: list[str] = []
    for i in range(size):
        kind = kinds[int(rng.integers(len(kinds)))]
        chosen.append(kind)
        w = rng.normal(size=dim) / np.maximum(half, 1e-9) * rng.uniform(0.2, 3.0)
        w[rng.uniform(size=dim) < 0.25] = 0.0  # some queries read few attributes
        w = np.round(w, 6)
        weights[i] = w
        intercept[i], a[i], b[i] = fit_query(rng, kind, w, lo, hi)
    eps = np.round(rng.uniform(0.05, 2.0, size=size), 4)
    high = rng.uniform(size=size) < 0.5
    return Instance(lo, hi, weights, intercept, chosen, a, b, eps, high, integer)


@dataclass
class MaximizeSpy:
    """Records every ``(terms, box, result)`` of the engine's ``maximize`` calls."""

    calls: list[tuple[TermSet, Box, Any]]

    def results(self) -> list[Any]:
        return [result for _, _, result in self.calls]


def spy_maximize(monkeypatch: Any) -> MaximizeSpy:
    """Wrap ``maximize`` as the continuous state calls it, recording each search."""
    import app.engine.continuous.state as state_module

    original = state_module.maximize
    spy = MaximizeSpy([])

    def recording(terms: TermSet, box: Box, settings: Any = None) -> Any:
        result = original(terms, box, settings)
        spy.calls.append((terms, box, result))
        return result

    monkeypatch.setattr(state_module, "maximize", recording)
    return spy

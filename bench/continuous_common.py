"""Shared pieces of the continuous-domain benchmarks (paper sections 6.3 / 6.4, Algorithm 6).

* the domain ``x1..x9`` in ``[-1, 1]`` and the query generators of sections 6.3 (``linear``,
  ``θ ~ U[-1, 1]^10`` normalised to ``‖θ‖₁ = 1``) and 6.4 (``logistic``, ``θ ~ U[-10, 10]^10``),
  ``numpy.random.default_rng(seed)`` drawing the query parameters only;
* :func:`run_experiment`: Algorithm 6 against the engine's :class:`Accountant` (true value 0,
  stop at the first rejection), timing every ``submit`` call;
* :class:`History`: an accepted history as plain numbers (``θ``, ``c``, output, ``ε``), with
  conversion to the engine's :class:`TermSet` and an **independent** evaluation of ``log P(x)``
  in high precision with mpmath from the paper's formulas (eq. 37 for ``linear``, eq. 45 for
  ``logistic``), used to check the engine's certificate points.

This is benchmark code: it reads the engine through its public API only (``Accountant``,
``submit``, ``parse_query``, ``ContinuousState.term_set``/``loss_after``, ``maximize``).
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from app.engine.accountant import Accountant, submit
from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.continuous.problem import Box, TermSet
from app.engine.continuous.state import ContinuousState
from app.engine.continuous.univariate import ResponseCurve
from app.engine.domain import Domain, parse_domain
from app.engine.mechanisms import parse_query
from app.engine.numerics import decimal_fraction

NAMES = [f"x{i}" for i in range(1, 10)]
DIM = len(NAMES)
EPSILON = 0.1
BUDGET = 1.0
TRUE_VALUE = dict.fromkeys(NAMES, 0.0)
#: The paper's figures (median accepted queries at ε_g = 1).
PAPER_MEDIAN = {"linear": 47, "logistic": 21}


def domain_json() -> dict[str, Any]:
    """Nine real attributes in ``[-1, 1]``."""
    return {"attributes": [{"name": n, "type": "real", "low": -1, "high": 1} for n in NAMES]}


def make_domain() -> Domain:
    """The parsed domain."""
    return parse_domain(domain_json())


def box() -> Box:
    """``[-1, 1]^9`` as the engine's :class:`Box`."""
    return Box(-np.ones(DIM), np.ones(DIM))


def draw_query(kind: str, rng: np.random.Generator) -> dict[str, Any]:
    """One query of section 6.3 (``linear``) or 6.4 (``logistic``) as JSON."""
    if kind == "linear":
        theta = rng.uniform(-1.0, 1.0, DIM + 1)
        theta = theta / np.abs(theta).sum()
        return {
            "mechanism": "linear",
            "weights": {n: float(w) for n, w in zip(NAMES, theta[1:], strict=True)},
            "intercept": float(theta[0]),
            "range": [-1, 1],
            "epsilon": EPSILON,
        }
    if kind == "logistic":
        theta = rng.uniform(-10.0, 10.0, DIM + 1)
        return {
            "mechanism": "logistic",
            "weights": {n: float(w) for n, w in zip(NAMES, theta[1:], strict=True)},
            "intercept": float(theta[0]),
            "epsilon": EPSILON,
        }
    raise ValueError(kind)


@dataclass
class History:
    """An accepted history as plain numbers: ``z_i = theta[i] @ x + c[i]``, output ``y[i]``."""

    kind: str
    theta: list[list[float]] = field(default_factory=list)
    c: list[float] = field(default_factory=list)
    y: list[int] = field(default_factory=list)
    eps: list[float] = field(default_factory=list)

    def append(self, query: dict[str, Any], output: int) -> None:
        """Add a query (JSON as drawn) and its output index (0 low, 1 high)."""
        self.theta.append([float(query["weights"].get(n, 0.0)) for n in NAMES])
        self.c.append(float(query["intercept"]))
        self.y.append(int(output))
        self.eps.append(float(query["epsilon"]))

    def prefix(self, n: int) -> History:
        """The first ``n`` entries."""
        return History(self.kind, self.theta[:n], self.c[:n], self.y[:n], self.eps[:n])

    def extended(self, query: dict[str, Any], output: int) -> History:
        """A copy with one more entry."""
        h = self.prefix(len(self.y))
        h.append(query, output)
        return h

    def __len__(self) -> int:
        return len(self.y)

    def curve(self, i: int) -> ResponseCurve:
        """The engine's curve of entry ``i`` (``+log Pr``)."""
        high = self.y[i] == 1
        if self.kind == "logistic":
            return ResponseCurve(True, high, self.eps[i])
        return ResponseCurve(False, high, self.eps[i], -1.0, 1.0, False)

    def term_set(self) -> TermSet:
        """``log P`` as the engine's :class:`TermSet` (built from these numbers, not the state)."""
        return TermSet(
            np.array(self.theta, dtype=np.float64).reshape(len(self), DIM),
            np.array(self.c, dtype=np.float64),
            tuple(self.curve(i) for i in range(len(self))),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> History:
        """Inverse of :meth:`to_json`."""
        return cls(raw["kind"], raw["theta"], raw["c"], raw["y"], raw["eps"])


# --- independent high-precision evaluation (paper eq. 37 and 45) ----------------------------


def mp_log_p(history: History, x: np.ndarray, dps: int = 60) -> Any:
    """``log P(x) = Σ_i log Pr(y_i | x)`` in mpmath with ``dps`` digits.

    Written from the paper, not from the engine: eq. (37) ``Pr(b|x) = (θx + c - a)/(b - a) ·
    (e^ε - 1)/(e^ε + 1) + 1/(e^ε + 1)`` with ``[a, b] = [-1, 1]``, eq. (45)
    ``Pr(1|x) = (e^ε - 1)/(e^ε + 1) · σ(θx + c) + 1/(e^ε + 1)``, and ``Pr(low) = 1 - Pr(high)``.
    Every float input (θ, c, ε, x) is converted exactly.
    """
    import mpmath  # optional dependency (bench extra)

    with mpmath.workdps(dps):
        total = mpmath.mpf(0)
        xs = [mpmath.mpf(float(v)) for v in x]
        for theta, c, y, eps in zip(history.theta, history.c, history.y, history.eps, strict=True):
            products = (mpmath.mpf(t) * v for t, v in zip(theta, xs, strict=True))
            z = mpmath.mpf(c) + mpmath.fsum(products)
            e = mpmath.exp(mpmath.mpf(eps))
            if history.kind == "logistic":
                t = 1 / (1 + mpmath.exp(-z))
            else:
                a, b = mpmath.mpf(-1), mpmath.mpf(1)
                t = (min(max(z, a), b) - a) / (b - a)  # the mechanism clips y to [a, b]
            p_high = (e - 1) / (e + 1) * t + 1 / (e + 1)
            total += mpmath.log(p_high if y == 1 else 1 - p_high)
        return total


def mp_float(v: Any) -> float:
    """An mpmath number as the nearest float."""
    return float(v)


# --- Algorithm 6 against the engine ----------------------------------------------------------


@dataclass
class Decision:
    """One ``submit`` call."""

    n_before: int  # accepted queries before this one
    accepted: bool
    seconds: float  # wall time (time.perf_counter)
    cpu_seconds: float  # CPU time of the process (time.process_time), less sensitive to load
    loss_lower: float  # certified bounds on the loss after it (accepted) or now (rejected)
    loss_upper: float
    hit_limit: bool  # a branch-and-bound search of the recorded bound hit a node/time limit


@dataclass
class Run:
    """One run of Algorithm 6."""

    kind: str
    seed: int
    accepted: int
    stopped_by_rejection: bool
    loss_lower: float
    loss_upper: float
    basic_total: float  # Σ ε (exact, as float) of the accepted queries
    basic_tight_count: int  # queries of the stream basic composition accepts with the tight ε
    decisions: list[Decision]
    history: History
    rejected_query: dict[str, Any] | None
    rejected_per_output: list[tuple[float, float]] | None  # engine bounds after each output
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        out = asdict(self)
        out["history"] = self.history.to_json()
        return out


def run_experiment(
    kind: str,
    seed: int,
    settings: BnBSettings,
    *,
    max_queries: int = 2000,
    at_stop: Callable[[Accountant, History, dict[str, Any] | None], dict[str, Any]] | None = None,
    budget: float = BUDGET,
) -> Run:
    """Algorithm 6: submit fresh queries until the first rejection (or ``max_queries``).

    ``at_stop(accountant, history, rejected_query)`` runs after the last decision (untimed); what
    it returns is kept in :attr:`Run.extra`.
    """
    domain = make_domain()
    acc = Accountant(domain, budget=budget, bnb=settings)
    rng = np.random.default_rng(seed)
    history = History(kind)
    decisions: list[Decision] = []
    tight_total = Fraction(0)
    tight_count = 0
    tight_open = True
    rejected_query = None
    start = time.perf_counter()
    stopped = False
    while acc.accepted < max_queries:
        query = draw_query(kind, rng)
        mech = parse_query(query, domain)
        if tight_open:
            if tight_total + mech.epsilon_exact <= decimal_fraction(budget):
                tight_total += mech.epsilon_exact
                tight_count += 1
            else:
                tight_open = False
        n_before = acc.accepted
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = submit(acc, mech, TRUE_VALUE)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        state = acc.state
        if not isinstance(state, ContinuousState):
            raise TypeError("expected a continuous-domain accountant")
        detail = state.loss_detail()
        loss = acc.loss()
        decisions.append(
            Decision(
                n_before, result.decision.accepted, dt, cpu, loss.lower, loss.upper, detail.limit
            )
        )
        if not result.decision.accepted:
            rejected_query = query
            stopped = True
            break
        history.append(query, int(result.output))  # type: ignore[arg-type]
    total = time.perf_counter() - start
    loss = acc.loss()
    per_output = None
    if rejected_query is not None:
        per_output = [(o.lower, o.upper) for o in result.decision.candidate.per_output]
    extra = at_stop(acc, history, rejected_query) if at_stop is not None else {}
    return Run(
        kind,
        seed,
        acc.accepted,
        stopped,
        loss.lower,
        loss.upper,
        float(acc.basic_total),
        tight_count,
        decisions,
        history,
        rejected_query,
        per_output,
        total,
        extra,
    )


def percentile(values: list[float] | np.ndarray, q: float) -> float:
    """``numpy.percentile`` (linear interpolation); NaN for no values."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else math.nan


def machine_info() -> str:
    """CPU count and model, Python and numpy versions, load average."""

    model = "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"{os.cpu_count()} CPU(s), {model}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, loadavg {load}"
    )

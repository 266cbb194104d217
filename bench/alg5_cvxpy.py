r"""A straightforward implementation of the paper's Algorithm 5 with cvxpy (benchmark reference).

Paper section 5.3/5.4: each term is a difference of convex functions of ``z_i = θ_i·x + c_i``,
``log Pr(y_i | x) = f_i(z_i) - g_i(z_i)``:

* ``linear`` (eq. 37/38): ``f_i = 0``, ``g_i = -log(α_i z + β_i)`` (``log Pr`` is concave);
* ``logistic`` (eq. 46-48): ``f_i = log(α_i e^z + β_i)``, ``g_i = log(e^z + 1)``.

To *minimise* ``log P = Σ f_i - g_i`` the algorithm replaces each ``g_i`` by its secant over the
node's interval ``[l_i, u_i]`` of ``z_i`` (eq. 49, an overestimator since ``g_i`` is convex), which
leaves the convex problem ``min Σ f_i(z_i) - H_i(z_i)`` over the coordinate box and the node's
``Y``-box: its optimum is the node's lower bound (LB). To *maximise* ``log P`` it minimises
``Σ g_i - f_i`` the same way, with secants of the ``f_i`` (the paper: "equivalent to minimizing
g(x) - f(x)").

Search as in Algorithm 5: best-first on LB; the incumbent (UB, an upper bound of the minimum) is
the true objective at each node relaxation's minimiser, improved at the root by DCA (the
"LDC algorithm": repeatedly minimise ``Σ p_i - (q_i(z^k) + q_i'(z^k)(z - z^k))``); branching
halves the edge of the ``Y``-box that is longest *relative to the root box* (lines 16-28); stop
when ``min open LB >= UB - δ``. δ defaults to 0.01 as in the paper.

This is a reference, not a certified solver: the conic solver's tolerances (Clarabel for the
exponential-cone problems of ``logistic`` terms, HiGHS for the LPs of ``linear`` ones) enter the
LB unaccounted for.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
from continuous_common import DIM, History


@dataclass
class Alg5Result:
    """``lower <= min Φ <= upper`` for the minimised ``Φ`` and the search's outcome."""

    lower: float
    upper: float
    x: np.ndarray
    status: str  # "optimal" (gap <= δ), "time-limit" or "node-limit"
    nodes: int
    seconds: float


class _Terms:
    """``p_i - q_i`` with ``p_i``, ``q_i`` convex: the objective to minimise, term by term."""

    def __init__(self, history: History, maximise: bool) -> None:
        self.theta = np.array(history.theta, dtype=np.float64).reshape(len(history), DIM)
        self.c = np.array(history.c, dtype=np.float64)
        self.n = len(history)
        self.logistic = history.kind == "logistic"
        self.maximise = maximise
        eps = np.array(history.eps, dtype=np.float64)
        y = np.array(history.y)
        e = np.exp(eps)
        if self.logistic:
            # Pr(1|z) = (e^ε e^z + 1)/((e^ε + 1)(e^z + 1)); Pr(0|z) = (e^z + e^ε)/(...)
            alpha = np.where(y == 1, e, 1.0) / (e + 1.0)
            beta = np.where(y == 1, 1.0, e) / (e + 1.0)
            self.log_beta = np.log(beta)
            self.shift = np.log(alpha / beta)  # f = log β + log(1 + e^(z + shift))
        else:
            # Pr(b|z) = (e^ε - 1)/(e^ε + 1) (z - a)/(b - a) + 1/(e^ε + 1), [a, b] = [-1, 1]
            k = (e - 1.0) / (e + 1.0) / 2.0
            slope = np.where(y == 1, k, -k)
            self.alpha = slope
            # Pr(b|z) = k z + (k + 1/(e^ε + 1)); Pr(a|z) = 1 - Pr(b|z)
            self.beta = np.where(y == 1, k + 1.0 / (e + 1.0), 1.0 - k - 1.0 / (e + 1.0))

    # numpy versions -------------------------------------------------------------------------
    def f(self, z: np.ndarray) -> np.ndarray:
        if self.logistic:
            return self.log_beta + np.logaddexp(0.0, z + self.shift)
        return np.zeros_like(z)

    def g(self, z: np.ndarray) -> np.ndarray:
        if self.logistic:
            return np.logaddexp(0.0, z)
        return -np.log(self.alpha * z + self.beta)

    def g_deriv(self, z: np.ndarray) -> np.ndarray:
        if self.logistic:
            return 1.0 / (1.0 + np.exp(-z))
        return -self.alpha / (self.alpha * z + self.beta)

    def f_deriv(self, z: np.ndarray) -> np.ndarray:
        if self.logistic:
            return 1.0 / (1.0 + np.exp(-(z + self.shift)))
        return np.zeros_like(z)

    def p(self, z: np.ndarray) -> np.ndarray:
        return self.g(z) if self.maximise else self.f(z)

    def q(self, z: np.ndarray) -> np.ndarray:
        return self.f(z) if self.maximise else self.g(z)

    def q_deriv(self, z: np.ndarray) -> np.ndarray:
        return self.f_deriv(z) if self.maximise else self.g_deriv(z)

    def objective(self, x: np.ndarray) -> float:
        z = self.theta @ x + self.c
        return float(np.sum(self.p(z) - self.q(z)))

    def q_is_zero(self) -> bool:
        return not self.logistic and self.maximise

    # cvxpy version of Σ p_i(z_i) ------------------------------------------------------------
    def p_expr(self, z: cp.Expression) -> cp.Expression:
        use_g = self.maximise
        if self.logistic:
            if use_g:
                return cp.sum(cp.logistic(z))
            return float(np.sum(self.log_beta)) + cp.sum(cp.logistic(z + self.shift))
        if use_g:
            return -cp.sum(cp.log(cp.multiply(self.alpha, z) + self.beta))
        return cp.Constant(0.0)


class _Relaxation:
    """The node problem, compiled once with the Y-box and the secants as parameters."""

    def __init__(self, terms: _Terms) -> None:
        self.terms = terms
        n = terms.n
        self.x = cp.Variable(DIM)
        z = terms.theta @ self.x + terms.c
        self.l = cp.Parameter(n)
        self.u = cp.Parameter(n)
        self.slope = cp.Parameter(n)
        self.icept = cp.Parameter(n)
        linear_q = cp.sum(cp.multiply(self.slope, z)) + cp.sum(self.icept)
        self.problem = cp.Problem(
            cp.Minimize(terms.p_expr(z) - linear_q),
            [self.x >= -1.0, self.x <= 1.0, z >= self.l, z <= self.u],
        )
        self.solver = cp.CLARABEL if terms.logistic or terms.q_is_zero() else cp.HIGHS

    def solve(
        self, lo: np.ndarray, hi: np.ndarray, slope: np.ndarray, icept: np.ndarray
    ) -> tuple[float, np.ndarray | None]:
        self.l.value, self.u.value = lo, hi
        self.slope.value, self.icept.value = slope, icept
        try:
            self.problem.solve(solver=self.solver)
        except cp.error.SolverError:
            return math.nan, None
        if self.problem.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            return math.inf, None
        if self.problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or self.x.value is None:
            return math.nan, None
        return float(self.problem.value), np.clip(np.asarray(self.x.value), -1.0, 1.0)

    def secants(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q_lo, q_hi = self.terms.q(lo), self.terms.q(hi)
        width = np.maximum(hi - lo, 1e-300)
        slope = np.where(hi > lo, (q_hi - q_lo) / width, 0.0)
        return slope, q_lo - slope * lo

    def bound(self, lo: np.ndarray, hi: np.ndarray) -> tuple[float, np.ndarray | None]:
        slope, icept = self.secants(lo, hi)
        return self.solve(lo, hi, slope, icept)


def _dca(relax: _Relaxation, x0: np.ndarray, l0: np.ndarray, u0: np.ndarray) -> np.ndarray:
    """DCA from ``x0``: linearise ``q`` at the current point, solve the convex problem."""
    terms = relax.terms
    x = x0
    best = terms.objective(x)
    for _ in range(20):
        z = terms.theta @ x + terms.c
        slope = terms.q_deriv(z)
        icept = terms.q(z) - slope * z
        _, nxt = relax.solve(l0, u0, slope, icept)
        if nxt is None:
            break
        value = terms.objective(nxt)
        if value > best - 1e-9:
            if value < best:
                x, best = nxt, value
            break
        x, best = nxt, value
    return x


def alg5_minimise(
    history: History,
    *,
    maximise: bool,
    delta: float = 0.01,
    time_limit: float = 60.0,
    max_nodes: int = 10**7,
) -> Alg5Result:
    """Algorithm 5 on ``min log P`` (``maximise`` False) or ``min -log P`` (True)."""
    start = time.perf_counter()
    terms = _Terms(history, maximise)
    relax = _Relaxation(terms)
    pos, neg = np.maximum(terms.theta, 0.0), np.minimum(terms.theta, 0.0)
    l0 = -pos.sum(axis=1) + neg.sum(axis=1) + terms.c
    u0 = pos.sum(axis=1) - neg.sum(axis=1) + terms.c
    width0 = np.maximum(u0 - l0, 1e-300)
    ub, best_x = math.inf, np.zeros(DIM)

    def offer(x: np.ndarray | None) -> None:
        nonlocal ub, best_x
        if x is not None:
            v = terms.objective(x)
            if v < ub:
                ub, best_x = v, x

    offer(np.zeros(DIM))
    lb_root, x_root = relax.bound(l0, u0)
    nodes = 1
    offer(x_root)
    if x_root is not None and not terms.q_is_zero():
        offer(_dca(relax, x_root, l0, u0))
    counter = itertools.count()
    queue: list[tuple[float, int, np.ndarray, np.ndarray]] = []
    pruned = math.inf
    if math.isfinite(lb_root):
        heapq.heappush(queue, (lb_root, next(counter), l0, u0))
    status = "optimal"
    while queue:
        if queue[0][0] >= ub - delta:
            break
        if time.perf_counter() - start > time_limit:
            status = "time-limit"
            break
        if nodes >= max_nodes:
            status = "node-limit"
            break
        lb, _, lo, hi = heapq.heappop(queue)
        k = int(np.argmax((hi - lo) / width0))  # longest edge relative to the root box
        mid = 0.5 * (lo[k] + hi[k])
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[k], right_lo[k] = mid, mid
        for cl, cu in ((lo, left_hi), (right_lo, hi)):
            child_lb, x = relax.bound(cl, cu)
            nodes += 1
            if math.isnan(child_lb):  # solver failure: keep the parent's bound (still valid)
                child_lb = lb
            offer(x)
            if child_lb < ub - delta:
                heapq.heappush(queue, (max(child_lb, lb), next(counter), cl, cu))
            else:
                pruned = min(pruned, child_lb)
    lower = min([q[0] for q in queue] + [pruned, ub])
    if math.isnan(lb_root):  # the root relaxation failed: no bound
        lower, status = -math.inf, "solver-failure"
    return Alg5Result(lower, ub, best_x, status, nodes, time.perf_counter() - start)

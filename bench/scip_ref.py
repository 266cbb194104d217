r"""``max``/``min log P`` with the global MINLP solver SCIP (pyscipopt), as a reference.

Model: ``x_k ∈ [-1, 1]``, ``w_i = ±(θ_i·x + c_i)`` (auxiliary variables, the sign making ``w_i`` the
argument of the observed output's response, their ranges as bounds), an epigraph variable ``t``
with ``t <= Σ φ_i`` (maximise ``t``) or ``t >= Σ φ_i`` (minimise), and

* ``linear``: ``φ = log Pr(o | z)``, ``Pr`` affine in ``z`` (paper eq. 37);
* ``logistic`` (eq. 45): ``φ = log(1 + (e^ε - 1) s) - log(1 + e^ε)`` with ``s = σ(w)`` an
  auxiliary variable in ``[σ(w_lo), σ(w_hi)]`` tied to ``w`` by one nonlinear equation:

  - ``"sigmoid"`` form (default): ``s (1 + exp(-w)) = 1``;
  - ``"logit"`` form: ``log(s) - log(1 - s) = w``. Faster, but numerically fragile: ``1 - s``
    cancels when ``s`` is within ``1e-16`` of 1, and SCIP then reports wrong "optimal" values
    (the comparison shows them against certified bounds).

  Writing ``log(e^ε e^z + 1) - log(e^z + 1)`` directly overflows: ``e^z`` reaches ``e^50`` here,
  beyond SCIP's infinity (``1e20``); an overflow-free ``softplus`` with ``|w|`` made SCIP far
  slower (its dual bound stayed loose for 60 s even at 5 terms in a trial).

SCIP solves to its default gap (``limits/gap = 0``, up to its feasibility/optimality tolerances,
``1e-6``/``1e-9``) under a time limit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from continuous_common import DIM, History
from pyscipopt import Model, exp, log
from scipy.special import expit


@dataclass
class ScipResult:
    """SCIP's primal (feasible) and dual bounds of the optimum of ``log P``, and its point."""

    primal: float
    dual: float
    x: np.ndarray | None
    status: str
    seconds: float


def scip_optimum(
    history: History, *, maximise: bool, time_limit: float = 60.0, form: str = "sigmoid"
) -> ScipResult:
    """``max log P`` (``maximise``) or ``min log P`` over ``[-1, 1]^9`` with SCIP."""
    start = time.perf_counter()
    model = Model("logP")
    model.hideOutput()
    model.setParam("limits/time", time_limit)
    x = [model.addVar(f"x{k}", lb=-1.0, ub=1.0) for k in range(DIM)]
    total = 0
    for i in range(len(history)):
        theta, c = history.theta[i], history.c[i]
        lo = c - sum(abs(t) for t in theta)
        hi = c + sum(abs(t) for t in theta)
        high = history.y[i] == 1
        w_lo, w_hi = (lo, hi) if high else (-hi, -lo)
        w = model.addVar(f"w{i}", lb=w_lo, ub=w_hi)
        z = sum(t * xk for t, xk in zip(theta, x, strict=True)) + c
        model.addCons(w == (z if high else -z))
        eps = history.eps[i]
        e = math.exp(eps)
        if history.kind == "logistic":
            s = model.addVar(f"s{i}", lb=float(expit(w_lo)), ub=float(expit(w_hi)))
            if form == "sigmoid":
                model.addCons(s * (1 + exp(-w)) == 1)
            elif form == "logit":
                model.addCons(log(s) - log(1 - s) == w)
            else:
                raise ValueError(form)
            total += log(1 + math.expm1(eps) * s) - math.log1p(e)
        else:
            k = (e - 1.0) / (e + 1.0) / 2.0  # Pr(b|z) = k (z + 1) + 1/(e^ε + 1), [a, b] = [-1, 1]
            # w = z for output b, -z for output a: Pr(a|z) = 1 - Pr(b|z) = k (w + 1) + 1/(e^ε + 1)
            total += log(k * (w + 1.0) + 1.0 / (e + 1.0))
    t = model.addVar("t", lb=None, ub=None)
    if maximise:
        model.addCons(t <= total)
        model.setObjective(t, "maximize")
    else:
        model.addCons(t >= total)
        model.setObjective(t, "minimize")
    model.optimize()
    status = str(model.getStatus())
    primal, point = math.nan, None
    if model.getNSols() > 0:
        sol = model.getBestSol()
        point = np.array([model.getSolVal(sol, xk) for xk in x])
        primal = float(model.getPrimalbound())
    dual = float(model.getDualbound())
    return ScipResult(primal, dual, point, status, time.perf_counter() - start)

"""One LP entry point for the branch-and-bound: HiGHS through ``highspy``, or through SciPy.

``solve(cost, A, b, lo, hi)`` minimises ``cost·v`` subject to ``A v <= b`` and ``lo <= v <= hi``
and returns the status, ``v`` and the row duals (SciPy's ``ineqlin.marginals`` convention:
``<= 0`` on active rows of a minimisation). The bound of a node never trusts these numbers: the
caller certifies it by weak duality from the duals (:mod:`.lp_bound`), so the solver is a
performance choice only.

Why ``highspy`` directly. ``scipy.optimize.linprog(method="highs")`` builds a new HiGHS object,
checks every option through Python and converts the answer into an ``OptimizeResult`` on each
call: on the paper's appendix F table (≈ 150 small LPs per row) that wrapper cost more than the
solves themselves (docs/benchmarks.md, ``bench/appendix_f.py`` prints both side by side). Here one
``Highs`` object per thread is kept, its options set once, and each LP is passed as arrays.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Literal

import numpy as np

from app.engine.numerics import FloatArray

if TYPE_CHECKING:
    import highspy

#: Status codes (SciPy's): 0 optimal, 2 infeasible, 1 a limit was reached, 4 anything else.
OPTIMAL, LIMIT, INFEASIBLE, OTHER = 0, 1, 2, 4
Solver = Literal["highspy", "scipy"]
#: Which solver :func:`solve` uses (the benchmark switches it to compare both in one run).
SOLVER: Solver = "highspy"


@dataclass(frozen=True)
class LpResult:
    """Outcome of one LP: ``status`` (see :data:`OPTIMAL`), ``x`` and ``row_duals``.

    ``x`` and ``row_duals`` are None unless the status is optimal.
    """

    status: int
    x: FloatArray | None
    row_duals: FloatArray | None
    #: The model this LP left in the thread's HiGHS (:func:`add_rows` extends it); 0: none
    #: (SciPy builds a new one per call).
    model: int = 0


class _Local(threading.local):
    highs: highspy._core._Highs | None = None
    #: Which model the thread's HiGHS holds (see :attr:`LpResult.model`).
    model: int = 0


_local = _Local()
_models = itertools.count(1)


@cache
def _api() -> ModuleType:
    """``highspy``, imported on the first LP.

    Loading its extension costs every process that imports the engine (each CLI command, server
    worker and Celery worker) about 7 ms of CPU, and most of them never solve an LP
    (tests/test_startup_imports.py keeps it so).
    """
    import highspy

    return highspy


@cache
def _statuses() -> dict[object, int]:
    """HiGHS's model statuses as :data:`OPTIMAL`, :data:`INFEASIBLE` or :data:`LIMIT`."""
    status = _api().HighsModelStatus
    return {
        status.kOptimal: OPTIMAL,
        status.kInfeasible: INFEASIBLE,
        status.kTimeLimit: LIMIT,
        status.kIterationLimit: LIMIT,
    }


def _highs() -> highspy._core._Highs:
    """The calling thread's solver, built once.

    The core class, not ``highspy.Highs``: the wrapper prints a banner on stdout when
    constructed, which would corrupt ``gatekeeper loss``'s JSON output (and it adds callback
    plumbing we do not use).
    """
    if _local.highs is None:
        h = _api()._core._Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("log_to_console", False)
        # the search's LPs have a few dozen rows: presolve cost a third of each solve (821 LPs of
        # the appendix F table: 0.48 s with it, 0.31 s without, CPU), and the bound never trusts
        # the solver's numbers anyway (it is certified from the duals, :mod:`.lp_bound`)
        h.setOptionValue("presolve", "off")
        _local.highs = h
    return _local.highs


def solve(
    cost: FloatArray,
    A: FloatArray,
    b: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    time_limit: float | None = None,
) -> LpResult:
    """``min cost·v  s.t.  A v <= b,  lo <= v <= hi`` with :data:`SOLVER`."""
    if SOLVER == "scipy":
        return _scipy(cost, A, b, lo, hi, time_limit)
    api = _api()
    h = _highs()
    h.clearModel()
    _local.model = 0
    rows, cols = A.shape
    columnwise = np.asarray(A.T)
    nonzero = columnwise != 0.0
    starts = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))]).astype(np.int32)
    index = np.nonzero(nonzero)[1].astype(np.int32)
    values = columnwise[nonzero].astype(np.float64)
    lp = api.HighsLp()
    lp.num_col_, lp.num_row_ = cols, rows
    lp.col_cost_ = np.asarray(cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(lo, dtype=np.float64)
    lp.col_upper_ = np.asarray(hi, dtype=np.float64)
    lp.row_lower_ = np.full(rows, -np.inf)
    lp.row_upper_ = np.asarray(b, dtype=np.float64)
    lp.a_matrix_.format_ = api.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = values
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = cols, rows
    if h.passModel(lp) == api.HighsStatus.kError:
        return LpResult(OTHER, None, None)
    _local.model = next(_models)
    return _run(h, time_limit)


def add_rows(model: int, A: FloatArray, b: FloatArray, time_limit: float | None) -> LpResult | None:
    """Add the rows ``A v <= b`` to ``model`` and solve it again from its last basis.

    ``model`` is :attr:`LpResult.model` of an earlier solve; ``None`` when the thread's HiGHS
    holds another model by now (or the solver is SciPy's): the caller then solves the whole LP.
    The result's duals cover the old rows, then the new ones. Kelley cuts extend a node's LP
    this way instead of building it again, and the dual simplex restarts from the old optimum.
    """
    if SOLVER != "highspy" or model == 0 or _local.model != model:
        return None
    api = _api()
    h = _highs()
    nonzero = A != 0.0
    starts = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))[:-1]]).astype(np.int32)
    index = np.nonzero(nonzero)[1].astype(np.int32)
    values = A[nonzero].astype(np.float64)
    rows = A.shape[0]
    lower = np.full(rows, -np.inf)
    upper = np.asarray(b, dtype=np.float64)
    added = h.addRows(rows, lower, upper, values.size, starts, index, values)
    if added == api.HighsStatus.kError:
        _local.model = 0
        return None
    return _run(h, time_limit)


def _run(h: highspy._core._Highs, time_limit: float | None) -> LpResult:
    # HiGHS compares its *total* run time, accumulated over every run of this object, with
    # time_limit: a kept solver would stop at once after a while (measured: every LP of a thread
    # that had solved for longer than the limit returned "time limit" without a pivot)
    limit = np.inf if time_limit is None else h.getRunTime() + float(time_limit)
    h.setOptionValue("time_limit", limit)
    model = _local.model
    if h.run() == _api().HighsStatus.kError:
        return LpResult(OTHER, None, None, model)
    status = _statuses().get(h.getModelStatus(), OTHER)
    if status != OPTIMAL:
        return LpResult(status, None, None, model)
    solution = h.getSolution()
    return LpResult(
        OPTIMAL,
        np.asarray(solution.col_value, dtype=np.float64),
        np.asarray(solution.row_dual, dtype=np.float64),
        model,
    )


def _scipy(
    cost: FloatArray,
    A: FloatArray,
    b: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    time_limit: float | None,
) -> LpResult:
    # imported here, on the first SciPy solve: scipy.optimize adds about 0.16 s of CPU to the
    # start of every process that imports the engine (each CLI command, server worker, test)
    from scipy.optimize import linprog

    res = linprog(
        cost,
        A_ub=A,
        b_ub=b,
        bounds=np.column_stack([lo, hi]),
        method="highs",
        options={} if time_limit is None else {"time_limit": time_limit},
    )
    if res.status != OPTIMAL or res.x is None or res.ineqlin is None:
        return LpResult(res.status if res.status in (LIMIT, INFEASIBLE) else OTHER, None, None)
    return LpResult(
        OPTIMAL,
        np.asarray(res.x, dtype=np.float64),
        np.asarray(res.ineqlin.marginals, dtype=np.float64),
    )

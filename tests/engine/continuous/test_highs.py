"""The LP entry point: both solvers agree, and a kept HiGHS honours each call's time limit."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.engine.continuous import highs


def _lp(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = 40
    return -rng.random(n), rng.random((120, n)), np.full(120, 10.0), np.zeros(n), np.full(n, 5.0)


def test_both_solvers_find_the_same_optimum_and_duals(monkeypatch: pytest.MonkeyPatch) -> None:
    cost, A, b, lo, hi = _lp(1)
    found = {}
    for solver in ("highspy", "scipy"):
        monkeypatch.setattr(highs, "SOLVER", solver)
        found[solver] = highs.solve(cost, A, b, lo, hi)
    ours, theirs = found["highspy"], found["scipy"]
    assert ours.status == theirs.status == highs.OPTIMAL
    assert ours.x is not None
    assert theirs.x is not None
    assert float(cost @ ours.x) == pytest.approx(float(cost @ theirs.x), rel=1e-9)
    assert ours.row_duals is not None
    assert theirs.row_duals is not None
    assert np.allclose(ours.row_duals, theirs.row_duals, atol=1e-9)


def test_a_time_limit_counts_from_the_call_not_from_the_solvers_birth() -> None:
    """HiGHS accumulates run time over a kept object's runs; a limit shorter than what this
    thread's solver has already spent must still let the next LP run (it did not: every LP
    after the first seconds of a process came back 'time limit', and bounds fell back to Σε)."""
    cost, A, b, lo, hi = _lp(2)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3:
        assert highs.solve(cost, A, b, lo, hi).status == highs.OPTIMAL
    assert highs.solve(cost, A, b, lo, hi, time_limit=0.2).status == highs.OPTIMAL

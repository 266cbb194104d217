"""Finite domains and boxes agree where they must (acceptance test 5).

The same history over a finite domain (integer attributes: the exact likelihood array) and over
the box of reals with the same bounds (branch-and-bound) must give the same realized loss when
the box's extremes of ``log P`` lie at grid points:

* histories monotone in every attribute (every query moves ``log P`` the same way along each
  attribute it reads): both extremes sit at vertices;
* histories of plain ``linear`` queries in symmetric pairs (outputs ``a`` and ``b``, equal ε,
  range centred on ``z(x*)`` for one grid point ``x*``): ``log P`` is concave, so its minimum is
  at a vertex, and every pair peaks at ``t = 1/2``, so its maximum is at ``x*`` (verified
  independently).

In general the box holds the grid, so its loss can only be larger; and a continuous domain whose
numeric attributes are all integers (plus an unweighted real attribute) is searched over the
lattice and must agree with the finite domain for any history.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from app.engine.calculator import compute_loss
from tests.engine.continuous.reference import (
    LOGISTIC,
    PLAIN,
    TRUNCATED,
    Instance,
    fit_query,
    random_instance,
    z_range,
)

TOLERANCE = 1e-4


def integer_box(rng: np.random.Generator, dim: int) -> tuple[np.ndarray, np.ndarray]:
    lo = rng.integers(-3, 3, size=dim).astype(np.float64)
    return lo, lo + rng.integers(1, 6, size=dim)


def monotone_instance(rng: np.random.Generator, dim: int, size: int) -> Instance:
    """Every query moves log P in the direction ``direction[k]`` along each attribute it reads."""
    lo, hi = integer_box(rng, dim)
    direction = rng.choice([-1.0, 1.0], size=dim)
    weights, intercept = np.zeros((size, dim)), np.zeros(size)
    a, b = np.zeros(size), np.ones(size)
    kinds = []
    high = rng.uniform(size=size) < 0.5
    for i in range(size):
        kind = [PLAIN, TRUNCATED, LOGISTIC][int(rng.integers(3))]
        kinds.append(kind)
        reads = rng.uniform(size=dim) < 0.6
        reads[rng.integers(dim)] = True
        # log Pr(high) increases with z, log Pr(low) decreases
        out = 1.0 if high[i] else -1.0
        weights[i] = reads * direction * out * rng.uniform(0.1, 2.0, size=dim) / (hi - lo)
        intercept[i], a[i], b[i] = fit_query(rng, kind, weights[i], lo, hi)
    eps = np.round(rng.uniform(0.05, 2.0, size=size), 4)
    return Instance(lo, hi, weights, intercept, kinds, a, b, eps, high, integer=True)


def paired_plain_instance(
    rng: np.random.Generator, dim: int, pairs: int
) -> tuple[Instance, np.ndarray]:
    """Plain ``linear`` pairs centred at a grid point ``x*``; returns the instance and ``x*``."""
    lo, hi = integer_box(rng, dim)
    peak = np.array(
        [rng.integers(int(low), int(high) + 1) for low, high in zip(lo, hi, strict=True)], float
    )
    weights, intercept = np.zeros((2 * pairs, dim)), np.zeros(2 * pairs)
    a, b, eps = np.zeros(2 * pairs), np.zeros(2 * pairs), np.zeros(2 * pairs)
    for j in range(pairs):
        w = rng.normal(size=dim) * (rng.uniform(size=dim) < 0.7)
        if not w.any():
            w[rng.integers(dim)] = 1.0
        c = round(float(rng.normal(scale=3.0)), 3)
        centre = float(w @ peak) + c
        z_lo, z_hi = z_range(w, c, lo, hi)
        radius = max(z_hi - centre, centre - z_lo) * (1.0 + rng.uniform(0.0, 1.0)) + 1e-3
        for i in (2 * j, 2 * j + 1):
            weights[i], intercept[i] = w, c
            a[i], b[i], eps[i] = centre - radius, centre + radius, round(rng.uniform(0.05, 2), 4)
        eps[2 * j + 1] = eps[2 * j]
    high = np.tile([True, False], pairs)
    inst = Instance(lo, hi, weights, intercept, [PLAIN] * (2 * pairs), a, b, eps, high, True)
    return inst, peak


def both_losses(inst: Instance, extra_real: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``compute_loss`` over the finite domain and over the same domain as a box of reals.

    With ``extra_real`` the second domain keeps the integer attributes and adds an unweighted
    ``real`` one instead (a continuous domain with integer coordinates).
    """
    history = inst.history_json()
    finite = compute_loss({"domain": inst.domain_json("integer"), "history": history})
    if extra_real:
        domain = inst.domain_json("integer")
        domain["attributes"].append({"name": "r", "type": "real", "low": -1.0, "high": 2.5})
    else:
        domain = inst.domain_json("real")
    box = compute_loss({"domain": domain, "history": history, "options": {"time_limit": 60.0}})
    return finite, box


def assert_same_loss(finite: dict[str, Any], box: dict[str, Any]) -> None:
    f, c = finite["realized_loss"], box["realized_loss"]
    assert finite["status"] == "ok"
    assert box["status"] == "ok"
    assert finite["basic_composition"] == box["basic_composition"]
    # the two certified intervals overlap, and the box's is within the tolerance of the exact one
    assert c["upper"] >= f["lower"] - 1e-9, (f, c)
    assert c["lower"] <= f["upper"] + 1e-9, (f, c)
    assert c["upper"] <= f["upper"] + TOLERANCE, (f, c)
    assert c["lower"] >= f["lower"] - TOLERANCE, (f, c)


def grid_extremes(inst: Instance) -> tuple[float, float]:
    values = inst.logp(inst.lattice())
    return float(values.max()), float(values.min())


@pytest.mark.parametrize("seed", range(4))
def test_monotone_histories_agree(seed: int) -> None:
    rng = np.random.default_rng(500 + seed)
    for _ in range(5):
        inst = monotone_instance(rng, int(rng.integers(1, 4)), int(rng.integers(1, 8)))
        finite, box = both_losses(inst)
        assert_same_loss(finite, box)
        grid_max, grid_min = grid_extremes(inst)
        assert abs(finite["realized_loss"]["upper"] - (grid_max - grid_min)) <= 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_paired_plain_linear_histories_agree(seed: int) -> None:
    rng = np.random.default_rng(600 + seed)
    for _ in range(5):
        inst, peak = paired_plain_instance(rng, int(rng.integers(1, 4)), int(rng.integers(1, 5)))
        # the construction puts the box's maximum at the grid point x* (checked independently)
        found_max, _, found_min, _ = replace(inst, integer=False).search(rng)
        grid_max, grid_min = grid_extremes(inst)
        assert inst.logp(peak)[0] == pytest.approx(grid_max, abs=1e-12)
        assert found_max <= grid_max + 1e-9
        assert found_min >= grid_min - 1e-9
        finite, box = both_losses(inst)
        assert_same_loss(finite, box)


@pytest.mark.parametrize("seed", range(3))
def test_box_loss_is_never_below_the_grid_loss(seed: int) -> None:
    """Random plain-linear histories: the box contains the grid (equal when the max is on it)."""
    rng = np.random.default_rng(700 + seed)
    equal = 0
    for _ in range(6):
        inst = random_instance(
            rng,
            dim=int(rng.integers(1, 4)),
            size=int(rng.integers(1, 8)),
            kinds=(PLAIN,),
            integer=True,
        )
        finite, box = both_losses(inst)
        f, c = finite["realized_loss"], box["realized_loss"]
        assert box["status"] == "ok"
        assert c["upper"] >= f["lower"] - 1e-9
        assert c["lower"] >= f["lower"] - TOLERANCE
        found_max, _, found_min, _ = replace(inst, integer=False).search(rng)
        grid_max, grid_min = grid_extremes(inst)
        assert found_min >= grid_min - 1e-9  # concave: the minimum is at a vertex
        if found_max <= grid_max + 1e-9:
            equal += 1
            assert_same_loss(finite, box)
    assert equal >= 2


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_integer_coordinates_in_a_continuous_domain_agree(seed: int) -> None:
    """Any mixed history: a continuous domain with integer attributes searches the lattice."""
    rng = np.random.default_rng(800 + seed)
    for _ in range(5):
        inst = random_instance(
            rng, dim=int(rng.integers(1, 4)), size=int(rng.integers(1, 8)), integer=True
        )
        finite, box = both_losses(inst, extra_real=True)
        assert_same_loss(finite, box)

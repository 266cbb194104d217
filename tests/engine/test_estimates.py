"""Survey estimators (app.engine.estimates): formulas by hand, and 95% intervals that cover.

The coverage tests simulate populations with a known truth — members' values drawn i.i.d. from
a known distribution — and the mechanisms' reports from contract.md's probabilities (written out
here, not taken from the module under test), then check that the 95% interval covers the truth
in 95% of repetitions within binomial error (3 standard errors of a proportion over ``R``
repetitions), and that the estimates average to the truth (unbiasedness, 4 standard errors).
Simulation uses numpy's seeded generator: test data only, the product samples with ``secrets``.
"""

from __future__ import annotations

import doctest
import json
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

from app.engine import estimates
from app.engine.domain import parse_domain
from app.engine.estimates import estimate, output_histogram, tally_keys
from app.engine.mechanisms import parse_query

R = 1000  # repetitions per coverage test
N = 400  # members per simulated survey
BAND = 3 * math.sqrt(0.95 * 0.05 / R)
VALUES = ["a", "b", "c", "d"]
DOMAIN = parse_domain(
    {
        "attributes": [
            {"name": "v", "type": "categorical", "values": VALUES},
            {"name": "x", "type": "integer", "low": 0, "high": 10},
        ]
    }
)


def test_doctests() -> None:
    assert doctest.testmod(estimates).failed == 0


def query(raw: dict[str, Any]) -> Any:
    return parse_query(raw, DOMAIN)


def test_binary_rr_by_hand() -> None:
    mech = query(
        {
            "mechanism": "binary_rr",
            "epsilon": 1.0,
            "predicate": {"attribute": "x", "op": ">=", "value": 5},
        }
    )
    e = math.e
    p, q = e / (1 + e), 1 / (1 + e)
    found = estimate(mech, 1000, {"1": 400, "0": 600}).value
    assert found is not None
    assert found["kind"] == "proportion"
    assert found["value"] == pytest.approx((0.4 - q) / (p - q), rel=1e-12)
    assert found["stderr"] == pytest.approx(math.sqrt(0.4 * 0.6 / 1000) / (p - q), rel=1e-12)
    lo, hi = found["ci95"]
    assert lo < found["value"] < hi
    assert found["n"] == 1000


def test_linear_mean_uses_a_plus_b_minus_a() -> None:
    """Eq. 9 prints a + b(...); for the range [10, 20] the mean is a + (b − a)(...)."""
    mech = query(
        {
            "mechanism": "linear",
            "weights": {"x": 1.0},
            "intercept": 10,
            "range": [10, 20],
            "truncate": False,
            "epsilon": 2.0,
        }
    )
    e = math.exp(2.0)
    share = 0.6
    found = estimate(mech, 1000, {"20": 600, "10": 400}).value
    assert found is not None
    assert found["kind"] == "mean"
    assert found["value"] == pytest.approx(10 + 10 * ((e + 1) * share - 1) / (e - 1), rel=1e-12)
    printed = 10 + 20 * ((e + 1) * share - 1) / (e - 1)  # eq. 9 as printed
    assert abs(found["value"] - printed) > 1


def test_grr_and_unary_encoding_by_hand() -> None:
    grr = query({"mechanism": "grr", "attribute": "v", "epsilon": 1.5})
    e = math.exp(1.5)
    p, q = e / (3 + e), 1 / (3 + e)
    counts = {json.dumps(v): c for v, c in zip(VALUES, [50, 30, 15, 5], strict=True)}
    found = estimate(grr, 100, counts).value
    assert found is not None
    assert found["kind"] == "histogram"
    assert found["values"]["a"] == pytest.approx((0.5 - q) / (p - q), rel=1e-12)
    assert sum(found["values"].values()) == pytest.approx(1.0, rel=1e-12)
    ue = query(
        {"mechanism": "unary_encoding", "attribute": "v", "epsilon": 1.0, "variant": "symmetric"}
    )
    p = math.exp(0.5) / (math.exp(0.5) + 1)
    found = estimate(ue, 100, {json.dumps("b"): 70}).value
    assert found is not None
    assert found["values"]["b"] == pytest.approx((0.7 - (1 - p)) / (2 * p - 1), rel=1e-12)
    assert set(found["ci95"]) == set(VALUES)


def test_tally_keys_count_ones_per_value_for_unary_encoding() -> None:
    ue = query({"mechanism": "unary_encoding", "attribute": "v", "epsilon": 1.0})
    assert tally_keys(ue, (1, 0, 1, 0)) == ('"a"', '"c"')
    grr = query({"mechanism": "grr", "attribute": "v", "epsilon": 1.0})
    assert tally_keys(grr, 2) == ('"c"',)
    assert output_histogram(grr, {'"c"': 3}) == {'"a"': 0, '"b"': 0, '"c"': 3, '"d"': 0}


def test_no_estimate_for_matrix_or_empty_surveys() -> None:
    matrix = parse_query(
        {"mechanism": "matrix", "outputs": ["u", "w"], "probabilities": [[0.6, 0.4], [0.4, 0.6]]},
        parse_domain({"attributes": [{"name": "z", "type": "integer", "low": 0, "high": 1}]}),
    )
    assert estimate(matrix, 10, {'"u"': 4}).value is None
    assert estimate(matrix, 10, {'"u"': 4}).reason
    grr = query({"mechanism": "grr", "attribute": "v", "epsilon": 1.0})
    assert estimate(grr, 0, {}).reason == "no accepted members"


@pytest.mark.parametrize("eps", [50.0, 100.0])  # 100: the largest ε a query may declare
def test_extreme_epsilon_stays_finite(eps: float) -> None:
    for raw in (
        {"mechanism": "grr", "attribute": "v", "epsilon": eps},
        {
            "mechanism": "binary_rr",
            "epsilon": eps,
            "predicate": {"attribute": "x", "op": "==", "value": 1},
        },
        {"mechanism": "unary_encoding", "attribute": "v", "epsilon": eps},
    ):
        found = estimate(query(raw), 10, {'"a"': 3, "1": 3})
        assert found.value is not None
        text = json.dumps(found.value)
        assert "NaN" not in text
        assert "Infinity" not in text


# --------------------------------------------------------------------------- coverage
def covered(hits: int) -> None:
    rate = hits / R
    assert abs(rate - 0.95) <= BAND, f"coverage {rate:.3f} outside 0.95 ± {BAND:.3f}"


def unbiased(values: list[float], truth: float, spread: float) -> None:
    assert abs(np.mean(values) - truth) <= 4 * spread / math.sqrt(R), (np.mean(values), truth)


def binary_report(rng: np.random.Generator, t: np.ndarray, eps: float) -> int:
    """Σ of reports that say 1 when each member's probability is q + (p − q)·t (contract.md)."""
    p, q = math.exp(eps) / (1 + math.exp(eps)), 1 / (1 + math.exp(eps))
    return int((rng.random(t.size) < q + (p - q) * t).sum())


def test_binary_rr_interval_covers_the_population_share() -> None:
    rng = np.random.default_rng(1)
    mech = query(
        {
            "mechanism": "binary_rr",
            "epsilon": 1.0,
            "predicate": {"attribute": "x", "op": ">=", "value": 5},
        }
    )
    truth = 0.3
    hits, values = 0, []
    for _ in range(R):
        t = (rng.random(N) < truth).astype(float)
        ones = binary_report(rng, t, 1.0)
        found = estimate(mech, N, {"1": ones, "0": N - ones}).value
        assert found is not None
        hits += found["ci95"][0] <= truth <= found["ci95"][1]
        values.append(found["value"])
    covered(hits)
    unbiased(values, truth, float(np.std(values)))


@pytest.mark.parametrize("truncate", [False, True])
def test_linear_interval_covers_the_population_mean(truncate: bool) -> None:
    rng = np.random.default_rng(2)
    a, b = (2.0, 6.0) if truncate else (1.0, 11.0)
    mech = query(
        {
            "mechanism": "linear",
            "weights": {"x": 1.0},
            "intercept": 1.0,
            "range": [a, b],
            "truncate": truncate,
            "epsilon": 1.5,
        }
    )
    weights = np.arange(1, 12, dtype=float)
    weights /= weights.sum()  # a skewed population over x = 0..10
    ys = np.clip(np.arange(11) + 1.0, a, b)
    truth = float((weights * ys).sum())
    hits, values = 0, []
    for _ in range(R):
        y = ys[rng.choice(11, size=N, p=weights)]
        highs = binary_report(rng, (y - a) / (b - a), 1.5)
        found = estimate(mech, N, {json.dumps(b): highs}).value  # the output as the range gives it
        if found is None or found["n"] != N:
            raise AssertionError(found)
        hits += found["ci95"][0] <= truth <= found["ci95"][1]
        values.append(found["value"])
    covered(hits)
    unbiased(values, truth, float(np.std(values)))


def test_logistic_interval_covers_the_mean_sigmoid() -> None:
    rng = np.random.default_rng(3)
    mech = query(
        {"mechanism": "logistic", "weights": {"x": 0.5}, "intercept": -2.5, "epsilon": 2.0}
    )
    sig = 1 / (1 + np.exp(-(0.5 * np.arange(11) - 2.5)))
    truth = float(sig.mean())  # x uniform over 0..10
    hits, values = 0, []
    for _ in range(R):
        ones = binary_report(rng, sig[rng.integers(0, 11, N)], 2.0)
        found = estimate(mech, N, {"1": ones}).value
        assert found is not None
        hits += found["ci95"][0] <= truth <= found["ci95"][1]
        values.append(found["value"])
    covered(hits)
    unbiased(values, truth, float(np.std(values)))


SHARES = np.array([0.5, 0.25, 0.15, 0.10])


def histogram_coverage(raw: dict[str, Any], report: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    mech = query(raw)
    hits: Counter[str] = Counter()
    values: dict[str, list[float]] = {v: [] for v in VALUES}
    for _ in range(R):
        x = rng.choice(4, size=N, p=SHARES)
        counts = report(rng, x)
        found = estimate(
            mech, N, {json.dumps(v): int(c) for v, c in zip(VALUES, counts, strict=True)}
        ).value
        assert found is not None
        for v, share in zip(VALUES, SHARES, strict=True):
            lo, hi = found["ci95"][v]
            hits[v] += lo <= share <= hi
            values[v].append(found["values"][v])
    for v, share in zip(VALUES, SHARES, strict=True):
        covered(hits[v])
        unbiased(values[v], float(share), float(np.std(values[v])))


def test_grr_intervals_cover_each_share() -> None:
    e = math.exp(1.0)
    p = e / (3 + e)

    def report(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        other = (x + rng.integers(1, 4, x.size)) % 4  # each other value with (1 − p)/3 = q
        out = np.where(rng.random(x.size) < p, x, other)
        return np.bincount(out, minlength=4)

    histogram_coverage({"mechanism": "grr", "attribute": "v", "epsilon": 1.0}, report, 4)


@pytest.mark.parametrize("variant", ["optimized", "symmetric"])
def test_unary_encoding_intervals_cover_each_share(variant: str) -> None:
    eps = 1.0
    if variant == "optimized":
        p, q = 0.5, 1 / (math.exp(eps) + 1)
    else:
        p = math.exp(eps / 2) / (math.exp(eps / 2) + 1)
        q = 1 - p

    def report(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        own = np.eye(4, dtype=bool)[x]
        bits = rng.random((x.size, 4)) < np.where(own, p, q)
        return bits.sum(axis=0)

    raw = {"mechanism": "unary_encoding", "attribute": "v", "epsilon": eps, "variant": variant}
    histogram_coverage(raw, report, 5 if variant == "optimized" else 6)


def test_the_real_sampler_feeds_an_estimate_near_the_truth() -> None:
    """End to end through the mechanism's own CSPRNG sampler and tally keys."""
    mech = query({"mechanism": "grr", "attribute": "v", "epsilon": 2.0})
    members = [VALUES[i % 4] if i % 5 else "a" for i in range(2000)]  # shares 0.4, 0.2, .2, .2
    counts: Counter[str] = Counter()
    for v in members:
        for key in tally_keys(mech, mech.sample({"v": v, "x": 0})):
            counts[key] += 1
    found = estimate(mech, len(members), counts).value
    assert found is not None
    for v, share in zip(VALUES, [0.4, 0.2, 0.2, 0.2], strict=True):
        assert abs(found["values"][v] - share) <= 5 * found["stderr"][v] + 1e-9, (v, found)

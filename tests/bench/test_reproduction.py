"""Smoke test of ``bench/reproduction.py`` (Figure 1 and 3a of the paper) on tiny configurations.

Runs the numeric core without the bench extras; the plotting test needs matplotlib (a dev
dependency, so CI runs it; skipped in a venv without it). Keeps the script from rotting
silently: every run must be well-formed and plausible (certified loss within the budget on every
accepted prefix, never fewer queries than basic composition, Theorem D.1 met by the simulated
walks).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import reproduction as rp  # noqa: E402
from continuous_common import draw_query, make_domain  # noqa: E402

from app.engine.accountant import Accountant  # noqa: E402
from app.engine.continuous.branch_and_bound import BnBSettings  # noqa: E402
from app.engine.continuous.univariate import ResponseCurve  # noqa: E402
from app.engine.filters import FilterKind  # noqa: E402
from app.engine.mechanisms import parse_query  # noqa: E402


@pytest.mark.parametrize(
    ("kind", "budgets", "max_queries"), [("linear", [0.2, 0.4], 120), ("logistic", [0.1, 0.2], 10)]
)
def test_sweep_run_is_well_formed_and_plausible(
    kind: str, budgets: list[float], max_queries: int
) -> None:
    rec = rp.sweep_run(kind, 7, budgets, BnBSettings(), max_queries=max_queries)
    assert rec["stopped_by_rejection"]
    assert set(rec["accepted"]) == {rp.bkey(b) for b in budgets}
    top = rec["accepted"][rp.bkey(max(budgets))]
    assert len(rec["loss_upper"]) == len(rec["loss_lower"]) == top
    # count >= basic composition, monotone in the budget, loss <= budget on each prefix, ...
    assert rp.check_fig1([rec], budgets) == []
    for b in budgets:
        assert rec["accepted"][rp.bkey(b)] >= rp.basic_count(b)
    summary = rp.fig1_summary([rec], budgets)
    assert [row["basic"] for row in summary] == [rp.basic_count(b) for b in budgets]
    # the paper's reading of the trajectory (rounding: a loss of 0.2 may be 0.2 + 1 ulp)
    assert all(row["interp_median"] >= row["basic"] - 1e-6 for row in summary)


def test_sweep_decisions_are_those_of_an_accountant_with_that_budget() -> None:
    # replay the stream (same seed, same outputs) on one accountant per budget: it must accept
    # exactly the sweep's count for that budget and reject the next query
    budgets = [0.2, 0.3, 0.5]
    rec = rp.sweep_run("linear", 11, budgets, BnBSettings(), max_queries=100)
    domain = make_domain()
    for b in budgets:
        acc = Accountant(domain, budget=b)
        rng = np.random.default_rng(11)
        for i in range(rec["accepted"][rp.bkey(b)]):
            mech = parse_query(draw_query("linear", rng), domain)
            assert acc.dry_run(mech).accepted, (b, i)
            acc.record(mech, rec["outputs"][i])
        assert not acc.dry_run(parse_query(draw_query("linear", rng), domain)).accepted, b


def test_check_fig1_catches_a_loss_above_the_budget() -> None:
    rec = {
        "kind": "linear",
        "seed": 0,
        "accepted": {"0.2": 3},
        "loss_upper": [0.1, 0.15, 0.25],
        "loss_lower": [0.1, 0.15, 0.25],
    }
    assert any("above it" in line for line in rp.check_fig1([rec], [0.2]))
    rec["accepted"]["0.2"] = 1
    assert any("< basic" in line for line in rp.check_fig1([rec], [0.2]))


def test_interpolated_count() -> None:
    assert rp.interpolated_count([0.1, 0.2, 0.3], 0.25) == pytest.approx(2.5)
    assert rp.interpolated_count([0.1, 0.2, 0.3], 0.1) == pytest.approx(1.0)
    assert rp.interpolated_count([0.1, 0.2], 0.5) == 2.0
    assert rp.interpolated_count([], 0.5) == 0.0


@pytest.mark.parametrize("k", [1, 2, 3, 6, 12])
@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0])
def test_theorem_d1_matches_the_markov_chain(k: int, eps: float) -> None:
    chain = rp.walk_expectation(k, eps, ties_rejected=False)
    assert rp.theorem_d1(k, eps) == pytest.approx(chain, rel=1e-9)
    assert rp.walk_expectation(k, eps, ties_rejected=True) <= chain


def test_tie_rule_expectation_by_hand() -> None:
    # k = 2, walls at ±1 after the two basic-composition steps: only d = 0 walks one more step
    eps = 0.7
    p = math.exp(eps) / (1 + math.exp(eps))
    assert rp.walk_expectation(2, eps, ties_rejected=True) == pytest.approx(2 + 2 * p * (1 - p))
    assert rp.walk_expectation(1, eps, ties_rejected=True) == 1.0


@pytest.mark.parametrize("exact_budget", [False, True])
def test_rr_walks_match_the_expectation(exact_budget: bool) -> None:
    # exact ties (issue 15): at exactly kε the engine accepts a worst case equal to the budget,
    # as with a slack, so both walks have walls at ±k (Theorem D.1), not ±(k - 1)
    k, eps, walks = 3, 1.0, 400
    slack = 0.0 if exact_budget else rp.THEOREM_SLACK
    counts = np.array(rp.rr_walks(k, eps, walks, slack=slack, filter_kind=FilterKind.SIMPLIFIED))
    assert counts.min() >= k
    assert np.all((counts - k) % 2 == 0)  # walls at ±k: k + an even number of steps
    se = counts.std(ddof=1) / math.sqrt(walks)
    assert abs(counts.mean() - rp.walk_expectation(k, eps, ties_rejected=False)) <= 5 * se


def test_cache_round_trip(tmp_path: Path) -> None:
    cache = rp.Cache(tmp_path)
    key = {"what": "x", "a": 1}
    assert cache.get(key) is None
    cache.put(key, {"value": 2})
    assert cache.get(key) == {"value": 2}
    assert cache.get({"what": "x", "a": 2}) is None


def test_command_line_on_tiny_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--no-cache", "--no-figures"]
    assert rp.main(["fig3a", "--eps", "1.0", "--k-max", "3", "--rr-runs", "30", *common]) == 0
    args = ["fig1", "--kinds", "linear", "--runs", "1", "--budgets", "0.2,0.3", "--grouped", ""]
    assert rp.main([*args, "--no-check", *common]) == 0
    out = capsys.readouterr().out
    assert "Figure 3a" in out
    assert "Figure 1b" in out
    assert "all pass" in out
    assert "FAIL" not in out


def test_figures_render(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib: pip install -e '.[dev]'")
    budgets = [0.2, 0.3]
    rec = rp.sweep_run("linear", 3, budgets, BnBSettings(), max_queries=60)
    cfg1 = rp.Fig1Config(
        kinds=["linear"],
        runs={"linear": 1},
        budgets=budgets,
        seed=3,
        grouped=[],
        group_size=10,
        max_queries=60,
        independent=False,
        settings=BnBSettings(),
    )
    paths = rp.plot_fig1(cfg1, {("linear", None): [rec]}, tmp_path)
    cfg3 = rp.Fig3Config([1.0], 2, 20, FilterKind.SIMPLIFIED)
    records = [
        {"eps": e, "k": k, "exact_budget": t, "counts": [k, k + 2, k], "seconds": 0.0}
        for e, k, t in cfg3.points()
    ]
    paths.append(rp.plot_fig3(cfg3, records, tmp_path))
    for path in paths:
        assert path.exists()
        assert path.stat().st_size > 1000


def test_half_range_entry_is_the_engine_curve_up_to_a_constant() -> None:
    # eq. (8) with [a, b] = [-1, 1] and y = σ(z), written out; the engine curve the what-if
    # records must differ from its log by a constant (which cancels in the loss)
    eps, a, b = 0.1, -1.0, 1.0
    e = math.exp(eps)
    z = np.linspace(-40.0, 40.0, 201)
    y = 1.0 / (1.0 + np.exp(-z))
    p_high = (e - 1) / (e + 1) * (y - a) / (b - a) + 1 / (e + 1)
    query = {"epsilon": eps, "intercept": 0.0}
    for out, prob in ((1, p_high), (0, 1.0 - p_high)):
        curve = ResponseCurve(True, out == 1, rp.half_range_entry(query, out)["epsilon"])
        diff = np.log(prob) - curve.value(z)
        assert np.ptp(diff) < 1e-12, out
    assert rp.half_range_entry(query, 0)["epsilon"] == pytest.approx(0.05124, abs=1e-5)

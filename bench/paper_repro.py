"""Reproduction of paper sections 6.3 (linear) and 6.4 (logistic) with the engine.

How to run (from the project root, after ``.venv/bin/pip install -e '.[dev,bench]'``)::

    .venv/bin/python bench/paper_repro.py                       # 50 runs of each experiment
    .venv/bin/python bench/paper_repro.py --quick               # 3 runs each, smoke test
    .venv/bin/python bench/paper_repro.py --json /tmp/repro.json --runs 50 --seed 1

The experiment (Algorithm 6): an object with 9 real attributes in ``[-1, 1]``, true value 0,
budget 1.0, Bayesian filter, default :class:`BnBSettings`. Fresh queries with ε = 0.1 (section
6.3: ``linear`` with ``θ ~ U[-1, 1]^10``, ``‖θ‖₁ = 1``, range ``[-1, 1]``; section 6.4:
``logistic`` with ``θ ~ U[-10, 10]^10``) are submitted until the first rejection. Run ``i`` draws
its query parameters with ``numpy.random.default_rng(seed + i)``; outputs come from the engine's
CSPRNG sampler, so histories differ between invocations even with the same seed.

Reported:

* accepted queries per run (median, 10th/90th percentile) next to basic composition (10 with the
  declared ε; also the count basic composition would reach on the same stream with the engine's
  tight ε) and the paper's medians (47 linear, with grouping of 10 queries; 21 logistic);
* time of every ``submit`` call (decision over both outputs + sampling + update): median, p90,
  max; targets linear < 20 ms median (histories up to 200 accepted queries), logistic < 500 ms
  median;
* the certified realized loss at the stop;
* **check at the stop** (every run, untimed): the engine's certificate points for ``max`` and
  ``min log P`` (``maximize`` on the state's ``term_set()`` and its ``negated()``) are evaluated
  again with an independent mpmath implementation of the paper's eq. (37)/(45) at 60 digits, for
  the history and for the history extended by each output of the rejected query. A loss above the
  budget at explicit points proves that *every* sound filter must reject that query;
* optionally (default on) the grouped bound of appendix B, eq. (59): the loss is bounded by the
  sum of the losses of consecutive groups of ``--group-size`` accepted queries, as in the paper's
  6.3 setup (10). With the engine's ``BnBSettings.grouping`` when it exists (the same query
  stream is submitted again to a second accountant); otherwise a bench-side simulation of the
  same filter with the engine's ``maximize`` per group.

Progress goes to stderr (one line per run); tables to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from continuous_common import (
    BUDGET,
    PAPER_MEDIAN,
    TRUE_VALUE,
    History,
    Run,
    box,
    draw_query,
    machine_info,
    make_domain,
    mp_float,
    mp_log_p,
    percentile,
    run_experiment,
)
from scipy.optimize import minimize

from app.engine.accountant import Accountant
from app.engine.continuous.branch_and_bound import BnBSettings, maximize
from app.engine.continuous.problem import TermSet
from app.engine.continuous.state import ContinuousState
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.numerics import DECISION_MARGIN

TARGET_MS = {"linear": 20.0, "logistic": 500.0}
LINEAR_TIMING_SCOPE = 200  # decisions with at most this many accepted queries before them


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def engine_grouping_field() -> str | None:
    """Name of a grouping option of the engine, if it has one by now."""
    for cls in (BnBSettings, ContinuousState):
        names = {f.name for f in dataclasses.fields(cls)}
        for name in names:
            if "group" in name:
                return f"{cls.__name__}.{name}"
    return None


# --- checks at the stop ----------------------------------------------------------------------


def half_settings(settings: BnBSettings) -> BnBSettings:
    """The settings the state uses per search (half the tolerance, as ``ContinuousState``)."""
    return dataclasses.replace(settings, tolerance=settings.tolerance / 2.0)


def certificate_loss(terms: TermSet, history: History, settings: BnBSettings) -> dict[str, Any]:
    """Engine bounds of max/min log P, and log P at the engine's points in mpmath."""
    b = box()
    top = maximize(terms, b, settings)
    bottom = maximize(terms.negated(), b, settings)
    mp_max = mp_log_p(history, top.x)
    mp_min = mp_log_p(history, bottom.x)
    return {
        "max_bounds": [top.lower, top.upper],
        "min_bounds": [-bottom.upper, -bottom.lower],
        "engine_loss": [top.lower + bottom.lower, top.upper + bottom.upper],
        "status": [top.status.value, bottom.status.value],
        "x_max": top.x.tolist(),
        "x_min": bottom.x.tolist(),
        "mp_max": mp_float(mp_max),
        "mp_min": mp_float(mp_min),
        "mp_loss": mp_float(mp_max - mp_min),
        # the exact log P at the engine's max point must lie in its bounds; at the min point too
        "mp_max_in_bounds": top.lower - 1e-12 <= mp_float(mp_max) <= top.upper + 1e-12,
        "mp_min_in_bounds": -bottom.upper - 1e-12 <= mp_float(mp_min) <= -bottom.lower + 1e-12,
    }


def local_loss(terms: TermSet) -> float:
    """Loss found by a *local* solver (L-BFGS-B from the box centre for max and for min).

    Not a bound of anything: what a solver without global guarantees would report.
    """
    b = box()
    bounds = list(zip(b.lo, b.hi, strict=True))
    values = []
    for sign in (1.0, -1.0):

        def neg(x: np.ndarray, s: float = sign) -> tuple[float, np.ndarray]:
            z = terms.values(x)
            val = float(terms.batch.values(z).sum())
            grad = terms.theta.T @ terms.batch.derivs(z)
            return -s * val, -s * grad

        res = minimize(neg, np.zeros(b.dim), jac=True, method="L-BFGS-B", bounds=bounds)
        values.append(float(terms.evaluate(np.asarray(res.x))[0]))
    return values[0] - values[1]


def check_at_stop(
    acc: Accountant, history: History, rejected: dict[str, Any] | None
) -> dict[str, Any]:
    """Independent check of the loss of the history and of the rejected query's outputs."""
    state = acc.state
    if not isinstance(state, ContinuousState):
        raise TypeError("expected a continuous-domain accountant")
    terms, excess = state.term_set()
    mine = history.term_set()
    same = (
        terms.theta.shape == mine.theta.shape
        and np.array_equal(terms.theta, mine.theta)
        and np.array_equal(terms.c, mine.c)
        and terms.curves == mine.curves
    )
    settings = half_settings(acc.bnb)
    out: dict[str, Any] = {"term_set_matches_history": bool(same), "excess": excess}
    if len(history) == 0:
        return out
    out["history"] = certificate_loss(terms, history, settings)
    out["history"]["local_solver_loss"] = local_loss(terms)
    out["history"]["sum_eps"] = float(sum(Fraction(str(e)) for e in history.eps))
    if rejected is not None:
        mech = parse_query(rejected, acc.domain)
        outputs = []
        for j in (0, 1):
            extended = history.extended(rejected, j)
            ts = extended.term_set()
            res = certificate_loss(ts, extended, settings)
            res["output"] = mech.output_json(j)
            res["local_solver_loss"] = local_loss(ts)
            outputs.append(res)
        out["rejected"] = outputs
    return out


# --- bench-side simulation of appendix B (grouping) -----------------------------------------


def group_loss_upper(history: History, settings: BnBSettings) -> float:
    """Certified upper bound of one group's loss (engine ``maximize``), capped by its Σε."""
    terms = history.term_set()
    b = box()
    top = maximize(terms, b, settings)
    bottom = maximize(terms.negated(), b, settings)
    cap = float(sum(Fraction(str(e)) for e in history.eps)) * (1 + 1e-15)
    return min(top.upper + bottom.upper, cap)


def run_grouped(
    kind: str,
    seed: int,
    group_size: int,
    settings: BnBSettings,
    max_queries: int,
    group_bound: Callable[[History], float] | None = None,
    respond: Callable[[dict[str, Any], Mechanism], int] | None = None,
    recorded: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Algorithm 6 with the loss bounded group by group (eq. 59), same query stream as the run.

    Decision as the engine's: accept if exact basic composition allows it, else iff for both
    outputs ``Σ_closed groups U_g + U(open group + query) <= budget - 1e-9``. Outputs are drawn
    with the engine's CSPRNG sampler (``Mechanism.sample``) at the true value 0. ``U_g`` is
    :func:`group_loss_upper` unless ``group_bound`` replaces it. What-if hooks (other mechanisms
    than the engine's): ``respond(query, mechanism)`` draws the output instead of
    ``Mechanism.sample``; ``recorded(query, output)`` is the entry the history gets.
    """
    domain = make_domain()
    rng = np.random.default_rng(seed)
    half = half_settings(settings)
    if group_bound is None:

        def group_bound(h: History) -> float:
            return group_loss_upper(h, half)

    def entry(query: dict[str, Any], output: int) -> dict[str, Any]:
        return query if recorded is None else recorded(query, output)

    def draw(query: dict[str, Any], mech: Mechanism) -> int:
        if respond is not None:
            return respond(query, mech)
        return int(mech.sample(TRUE_VALUE))  # type: ignore[arg-type]

    closed: list[float] = []
    current = History(kind)
    basic = Fraction(0)
    accepted = 0
    times: list[float] = []
    while accepted < max_queries:
        query = draw_query(kind, rng)
        mech = parse_query(query, domain)
        t0 = time.perf_counter()
        if basic + mech.epsilon_exact <= Fraction(str(BUDGET)):
            ok = True
        else:
            base = current if len(current) < group_size else History(kind)
            done = sum(closed) + (group_bound(current) if base is not current else 0.0)
            worst = max(group_bound(base.extended(entry(query, j), j)) for j in (0, 1))
            ok = done + worst <= BUDGET - DECISION_MARGIN
        times.append(time.perf_counter() - t0)
        if not ok:
            break
        output = draw(query, mech)
        if len(current) == group_size:
            closed.append(group_bound(current))
            current = History(kind)
        current.append(entry(query, output), output)
        basic += mech.epsilon_exact
        accepted += 1
    total_upper = sum(closed) + (group_bound(current) if len(current) else 0.0)
    return {
        "source": "bench-sim",
        "seed": seed,
        "accepted": accepted,
        "groups_closed": len(closed),
        "loss_upper_grouped": total_upper,
        "decision_seconds": times,
    }


# --- reporting -------------------------------------------------------------------------------


def fmt(v: float, nd: int = 1) -> str:
    return f"{v:.{nd}f}"


def summary_counts(values: list[int]) -> tuple[float, float, float, int, int]:
    return (
        percentile(values, 50),
        percentile(values, 10),
        percentile(values, 90),
        min(values),
        max(values),
    )


def print_tables(
    runs: dict[str, list[Run]], grouped: dict[str, list[dict[str, Any]]], group_size: int
) -> None:
    print()
    print("Accepted queries per run (budget 1.0, ε = 0.1 per query; percentiles over runs)")
    header = (
        f"{'experiment':<28}{'runs':>5}{'median':>8}{'p10':>7}{'p90':>7}{'min':>6}{'max':>6}"
        f"{'basic':>7}{'basic/tight':>13}{'paper':>7}"
    )
    print(header)
    print("-" * len(header))
    for kind, rs in runs.items():
        if not rs:
            continue
        acc = [r.accepted for r in rs]
        med, p10, p90, lo, hi = summary_counts(acc)
        tight = percentile([r.basic_tight_count for r in rs], 50)
        label = "6.3 linear" if kind == "linear" else "6.4 logistic"
        print(
            f"{label + ' (engine)':<28}{len(rs):>5}{med:>8.1f}{p10:>7.1f}{p90:>7.1f}{lo:>6}{hi:>6}"
            f"{10:>7}{tight:>13.1f}{PAPER_MEDIAN[kind]:>7}"
        )
        g = grouped.get(kind) or []
        if g:
            acc_g = [r["accepted"] for r in g]
            med, p10, p90, lo, hi = summary_counts(acc_g)
            glabel = f"  grouped m={group_size} ({g[0]['source']})"
            print(
                f"{glabel:<28}{len(g):>5}{med:>8.1f}{p10:>7.1f}{p90:>7.1f}{lo:>6}{hi:>6}"
                f"{10:>7}{'':>13}{PAPER_MEDIAN[kind]:>7}"
            )
    print(
        "basic = basic composition with the declared ε (10 x 0.1); basic/tight = median count on "
        "the same stream\nwith the engine's tight ε per query; paper = paper's median (6.3 grouped "
        "10 queries)."
    )
    unfinished = [r.seed for rs in runs.values() for r in rs if not r.stopped_by_rejection]
    if unfinished:
        print(f"runs stopped by --max-queries, not by a rejection: seeds {unfinished}")

    print()
    print("Time per filter decision (one submit call: both outputs + sample + update), ms")
    header = (
        f"{'experiment':<14}{'scope':<22}{'decisions':>10}{'median':>9}{'p90':>9}{'max':>9}"
        f"{'target':>9}{'met':>5}{'limit hits':>12}"
    )
    print(header)
    print("-" * len(header))
    for kind, rs in runs.items():
        if not rs:
            continue
        if kind == "linear":
            ds = [d for r in rs for d in r.decisions if d.n_before < LINEAR_TIMING_SCOPE]
            scope = f"history < {LINEAR_TIMING_SCOPE} accepted"
        else:
            ds = [d for r in rs for d in r.decisions]
            scope = "all decisions"
        ms = [1e3 * d.seconds for d in ds]
        med = percentile(ms, 50)
        met = "yes" if med < TARGET_MS[kind] else "NO"
        hits = sum(d.hit_limit for d in ds)
        print(
            f"{kind:<14}{scope:<22}{len(ms):>10}{med:>9.2f}{percentile(ms, 90):>9.2f}"
            f"{max(ms):>9.2f}{'<' + fmt(TARGET_MS[kind], 0):>9}{met:>5}{hits:>12}"
        )
        cpu = [1e3 * d.cpu_seconds for d in ds]
        print(
            f"{'':<14}{'  CPU time (process)':<22}{len(cpu):>10}{percentile(cpu, 50):>9.2f}"
            f"{percentile(cpu, 90):>9.2f}{max(cpu):>9.2f}"
        )
        for verdict in (True, False):
            sub = [1e3 * d.seconds for d in ds if d.accepted is verdict]
            if sub:
                what = "  accepted only" if verdict else "  rejections only"
                print(
                    f"{'':<14}{what:<22}{len(sub):>10}{percentile(sub, 50):>9.2f}"
                    f"{percentile(sub, 90):>9.2f}{max(sub):>9.2f}"
                )
        g = grouped.get(kind) or []
        if g:
            gms = [1e3 * t for r in g for t in r["decision_seconds"]]
            print(
                f"{'':<14}{'  grouped m=' + str(group_size) + ' (' + g[0]['source'] + ')':<22}"
                f"{len(gms):>10}{percentile(gms, 50):>9.2f}{percentile(gms, 90):>9.2f}"
                f"{max(gms):>9.2f}"
            )
    print("limit hits: recorded loss bounds whose search stopped at a node/time limit (sound).")
    print(
        "CPU time: time.process_time() around the same submit calls (all threads of the process)."
    )

    print()
    print("Time per decision by history length (accepted queries before the decision), ms")
    for kind, rs in runs.items():
        if not rs:
            continue
        ds = [d for r in rs for d in r.decisions]
        if kind == "linear":
            bins = [(0, 25), (25, 50), (50, 100), (100, 150), (150, 200), (200, 10**9)]
        else:
            bins = [(k, k + 1) for k in range(0, max(d.n_before for d in ds) + 1)]
        cells = []
        for lo, hi in bins:
            sub = [1e3 * d.seconds for d in ds if lo <= d.n_before < hi]
            if not sub:
                continue
            if hi - lo == 1:
                name = f"{lo}"
            elif hi >= 10**9:
                name = f"{lo}+"
            else:
                name = f"{lo}-{hi - 1}"
            cells.append(
                f"n={name}: {percentile(sub, 50):.1f}/{percentile(sub, 90):.1f}/{max(sub):.1f}"
                f" ({len(sub)})"
            )
        print(f"  {kind:<9} median/p90/max (count): " + "; ".join(cells))

    print()
    print("Certified realized loss at the stop [lower, upper] and Σε of the accepted queries")
    header = f"{'experiment':<14}{'':<8}{'median':>9}{'p10':>9}{'p90':>9}{'min':>9}{'max':>9}"
    print(header)
    print("-" * len(header))
    for kind, rs in runs.items():
        if not rs:
            continue
        for name, vals in (
            ("lower", [r.loss_lower for r in rs]),
            ("upper", [r.loss_upper for r in rs]),
            ("Σε", [r.basic_total for r in rs]),
        ):
            print(
                f"{kind:<14}{name:<8}{percentile(vals, 50):>9.4f}{percentile(vals, 10):>9.4f}"
                f"{percentile(vals, 90):>9.4f}{min(vals):>9.4f}{max(vals):>9.4f}"
            )
        if grouped.get(kind):
            vals = [g["loss_upper_grouped"] for g in grouped[kind]]
            print(
                f"{kind:<14}{'grp.up':<8}{percentile(vals, 50):>9.4f}{percentile(vals, 10):>9.4f}"
                f"{percentile(vals, 90):>9.4f}{min(vals):>9.4f}{max(vals):>9.4f}"
            )


def print_checks(runs: dict[str, list[Run]]) -> None:
    for kind, rs in runs.items():
        checked = [r for r in rs if r.extra.get("history")]
        if not checked:
            continue
        print()
        print(
            f"Check at the stop, {kind}: log P at the engine's certificate points, recomputed "
            "with mpmath (60 digits, paper eq. 37/45)"
        )
        header = (
            f"{'seed':>6}{'n':>5}{'engine loss [lower, upper]':>30}{'mp loss':>10}{'Σε decl':>8}"
            f"{'local':>8}  {'rejected q: engine worst [lo, up]':>35}{'mp loss':>10}"
            f"{'forced':>8}"
        )
        print(header)
        print("-" * len(header))
        n_forced = n_rej = 0
        bad_points = 0
        mismatched = 0
        for r in checked:
            h = r.extra["history"]
            lo, up = h["engine_loss"]
            mismatched += not r.extra["term_set_matches_history"]
            bad_points += (not h["mp_max_in_bounds"]) + (not h["mp_min_in_bounds"])
            line = (
                f"{r.seed:>6}{r.accepted:>5}{'[' + f'{lo:.6f}, {up:.6f}' + ']':>30}"
                f"{h['mp_loss']:>10.6f}{h['sum_eps']:>8.2f}{h['local_solver_loss']:>8.4f}  "
            )
            rej = r.extra.get("rejected")
            if rej:
                n_rej += 1
                worst = max(rej, key=lambda o: o["engine_loss"][1])
                for o in rej:
                    bad_points += (not o["mp_max_in_bounds"]) + (not o["mp_min_in_bounds"])
                wl, wu = worst["engine_loss"]
                forced = worst["mp_loss"] > BUDGET
                n_forced += forced
                line += (
                    f"{'y=' + str(worst['output']) + ' [' + f'{wl:.6f}, {wu:.6f}' + ']':>35}"
                    f"{worst['mp_loss']:>10.6f}{'yes' if forced else 'no':>8}"
                )
            print(line)
        losses = [r.extra["history"]["mp_loss"] for r in checked]
        local = [r.extra["history"]["local_solver_loss"] for r in checked]
        print(
            f"runs {len(checked)}; mp loss of the history at the stop: median "
            f"{percentile(losses, 50):.4f}, min {min(losses):.4f}, max {max(losses):.4f}; "
            f"local-solver loss median {percentile(local, 50):.4f}"
        )
        print(
            f"rejected queries whose worst output has loss > budget at explicit points "
            f"(rejection forced for any sound filter): {n_forced} of {n_rej}"
        )
        print(
            f"points whose mpmath log P falls outside the engine's bounds: {bad_points}; "
            f"state term_set differing from the recorded history: {mismatched}"
        )
        print(
            "mp loss = log P(x_max) - log P(x_min) in mpmath at the engine's points: a lower "
            "bound of the true loss.\nlocal = L-BFGS-B from x = 0 for max and min "
            "(no guarantee; what a local solver reports)."
        )


def print_trajectory(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Median (p10, p90) certified loss upper bound after the n-th accepted query, vs Σε."""
    for kind, rs in runs.items():
        if not rs:
            continue
        most = max(r["accepted"] for r in rs)
        steps = range(1, most + 1) if kind == "logistic" else [10, 20, 50, 100, 150, 200, 300]
        print()
        print(
            f"Realized loss (certified upper bound) after the n-th accepted query, {kind}: "
            "median [p10, p90] over the runs that got there; n x 0.1 = Σε declared"
        )
        for n in steps:
            vals = [
                d["loss_upper"]
                for r in rs
                for d in r["decisions"]
                if d["n_before"] == n - 1 and d["accepted"]
            ]
            if not vals:
                continue
            print(
                f"  n={n:<4} runs {len(vals):>3}  loss {percentile(vals, 50):.4f} "
                f"[{percentile(vals, 10):.4f}, {percentile(vals, 90):.4f}]  Σε {0.1 * n:.1f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1, help="run i uses seed + i")
    parser.add_argument("--quick", action="store_true", help="3 runs each (smoke test)")
    parser.add_argument("--only", default="linear,logistic")
    parser.add_argument("--max-queries", type=int, default=2000)
    parser.add_argument("--no-check", action="store_true", help="skip the mpmath check")
    parser.add_argument("--no-grouped", action="store_true", help="skip the grouped simulation")
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--json", type=Path, help="dump raw results (histories included)")
    parser.add_argument(
        "--trajectory-from", type=Path, help="only print the loss-after-n table of a --json dump"
    )
    args = parser.parse_args(argv)
    if args.trajectory_from:
        dump = json.loads(args.trajectory_from.read_text(encoding="utf-8"))
        print_trajectory(dump["runs"])
        return 0
    runs_n = 3 if args.quick else args.runs
    kinds = [k for k in args.only.split(",") if k]
    settings = BnBSettings()
    started = time.perf_counter()
    print("paper reproduction: sections 6.3 (linear) and 6.4 (logistic), Algorithm 6")
    print(f"machine: {machine_info()}")
    print(
        f"runs {runs_n} per experiment, seeds {args.seed}..{args.seed + runs_n - 1}, budget "
        f"{BUDGET}, ε 0.1, true x = 0, filter bayesian, {settings}"
    )
    grouping = engine_grouping_field()
    print(
        "engine grouping option: "
        + (grouping or "none (appendix B shown as a bench-side simulation only)")
    )
    runs: dict[str, list[Run]] = {k: [] for k in kinds}
    grouped: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for kind in kinds:
        for i in range(runs_n):
            seed = args.seed + i
            hook = None if args.no_check else check_at_stop
            r = run_experiment(kind, seed, settings, max_queries=args.max_queries, at_stop=hook)
            runs[kind].append(r)
            ms = [1e3 * d.seconds for d in r.decisions]
            note = ""
            if r.extra.get("history"):
                note = f" mp-loss {r.extra['history']['mp_loss']:.4f}"
            log(
                f"[{kind} {i + 1}/{runs_n} seed {seed}] accepted {r.accepted} loss "
                f"[{r.loss_lower:.4f}, {r.loss_upper:.4f}] Σε {r.basic_total:.3f} decision "
                f"median {np.median(ms):.1f} ms max {max(ms):.1f} ms run {r.seconds:.1f} s{note}"
            )
            if not args.no_grouped:
                if grouping == "BnBSettings.grouping":
                    gs = dataclasses.replace(settings, grouping=args.group_size)
                    gr = run_experiment(kind, seed, gs, max_queries=args.max_queries)
                    g = {
                        "source": "engine",
                        "seed": seed,
                        "accepted": gr.accepted,
                        "loss_lower": gr.loss_lower,
                        "loss_upper_grouped": gr.loss_upper,
                        "decision_seconds": [d.seconds for d in gr.decisions],
                        "decision_n_before": [d.n_before for d in gr.decisions],
                        "history": gr.history.to_json(),
                    }
                else:
                    g = run_grouped(kind, seed, args.group_size, settings, args.max_queries)
                grouped[kind].append(g)
                log(
                    f"    grouped m={args.group_size} ({g['source']}): accepted {g['accepted']} "
                    f"loss upper {g['loss_upper_grouped']:.4f}"
                )
    print_tables(runs, grouped, args.group_size)
    print_trajectory({k: [r.to_json() for r in rs] for k, rs in runs.items()})
    if not args.no_check:
        print_checks(runs)
    elapsed = time.perf_counter() - started
    print()
    print(f"total wall time {elapsed:.1f} s; machine at end: {machine_info()}")
    if args.json:
        dump = {
            "settings": dataclasses.asdict(settings),
            "seed": args.seed,
            "runs_per_experiment": runs_n,
            "machine": machine_info(),
            "runs": {k: [r.to_json() for r in rs] for k, rs in runs.items()},
            "grouped": grouped,
            "group_size": args.group_size,
            "seconds": elapsed,
        }
        args.json.write_text(json.dumps(dump, indent=1, default=str), encoding="utf-8")
        print(f"raw results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Solver comparison: ``max``/``min log P`` by the engine, Algorithm 5 (cvxpy) and SCIP.

How to run (from the project root, after ``.venv/bin/pip install -e '.[dev,bench]'``)::

    .venv/bin/python bench/paper_repro.py --json /tmp/repro.json      # histories to compare on
    .venv/bin/python bench/solver_compare.py --histories /tmp/repro.json   # (one or more dumps)
    .venv/bin/python bench/solver_compare.py --quick                  # smoke test, own histories

Instances: accepted histories of the section 6.3 (``linear``) and 6.4 (``logistic``) experiments,
cut to their first ``n`` queries (``--linear-n``, default 5,10,20,50; ``--logistic-n``, default
5,8,10), ``--instances`` histories per experiment (default 2). They are read from a
``paper_repro.py --json`` dump (runs taken in seed order among those long enough), or, without
one, made by running the experiment with the engine (seeds from ``--seed``).

For every instance, ``n`` and sense (``max`` and ``min`` of ``log P``):

* **ours**: the engine's ``maximize`` (on the term set and on its negation for ``min``), default
  settings with the per-search tolerance the state uses (2.5e-5) and ``--time-limit``;
* **Alg. 5**: :mod:`alg5_cvxpy`, the paper's algorithm with cvxpy, δ = ``--delta`` (default 0.01
  as in the paper), the same time limit. After a timeout at some ``n`` it is not run on longer
  prefixes of the same history and sense (``--no-skip`` runs them anyway);
* **SCIP**: :mod:`scip_ref`, the ``sigmoid`` formulation, default gap, the same time limit; and,
  as a side check, the faster ``logit`` formulation (``--no-logit`` skips it).

Agreement (``agree``): with our certified ``[L, U]`` for the optimum, SCIP's primal value must lie
in ``[L - tol, U + tol]`` (``tol = 1e-6 (1 + |U|)``, SCIP's feasibility tolerance on the epigraph
constraint), its dual bound on the right side of our bound (``>= L - tol`` for max, ``<= U + tol``
for min), and ``log P`` at every point a solver returns (evaluated by the engine's ``TermSet``
with its error bound) must not beat our bound (``<= U`` for max, ``>= L`` for min) — the last is
a soundness check of *our* bounds. Alg. 5's interval must overlap ours within ``tol``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from alg5_cvxpy import alg5_minimise
from continuous_common import History, box, machine_info, percentile, run_experiment
from scip_ref import scip_optimum

from app.engine.continuous.branch_and_bound import BnBSettings, maximize
from app.engine.continuous.problem import TermSet


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_instances(args: argparse.Namespace) -> dict[str, list[tuple[int, History]]]:
    """``--instances`` histories per experiment, long enough for the largest ``n``."""
    need = {"linear": max(args.linear_n), "logistic": max(args.logistic_n)}
    out: dict[str, list[tuple[int, History]]] = {"linear": [], "logistic": []}
    for path in args.histories or []:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        for kind in out:
            runs = sorted(raw["runs"].get(kind, []), key=lambda r: r["seed"])
            for r in runs:
                h = History.from_json(r["history"])
                if len(h) >= need[kind] and len(out[kind]) < args.instances:
                    out[kind].append((int(r["seed"]), h))
    for kind in out:
        seed = args.seed
        while len(out[kind]) < args.instances:
            r = run_experiment(kind, seed, BnBSettings(), max_queries=max(need[kind], 10) + 50)
            if len(r.history) >= need[kind]:
                out[kind].append((seed, r.history))
                log(f"generated {kind} history with seed {seed} ({len(r.history)} queries)")
            seed += 1
    return out


@dataclasses.dataclass
class Row:
    kind: str
    seed: int
    n: int
    sense: str
    ours: tuple[float, float]
    ours_s: float
    ours_status: str
    alg5: tuple[float, float] | None
    alg5_s: float | None
    alg5_status: str
    alg5_nodes: int
    scip: tuple[float, float] | None  # (primal, dual)
    scip_s: float | None
    scip_status: str
    logit: tuple[float, float] | None
    logit_s: float | None
    logit_status: str
    agree: str
    notes: list[str]
    ours_cpu: float = math.nan
    alg5_cpu: float | None = None
    scip_cpu: float | None = None


def ours_bounds(terms: TermSet, maximise: bool, time_limit: float) -> tuple[float, float, Any]:
    settings = BnBSettings(tolerance=BnBSettings().tolerance / 2.0, time_limit=time_limit)
    if maximise:
        r = maximize(terms, box(), settings)
        return r.lower, r.upper, r
    r = maximize(terms.negated(), box(), settings)
    return -r.upper, -r.lower, r


def point_value(terms: TermSet, x: np.ndarray | None) -> tuple[float, float] | None:
    if x is None:
        return None
    value, err = terms.evaluate(np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0))
    return value, err


def check(
    terms: TermSet,
    maximise: bool,
    lo: float,
    up: float,
    alg5: tuple[float, float] | None,
    alg5_x: np.ndarray | None,
    scip: tuple[float, float] | None,
    scip_x: np.ndarray | None,
    scip_optimal: bool,
    label: str,
) -> list[str]:
    """Violations of the agreement rules (empty when everything agrees)."""
    bad = []
    tol = 1e-6 * (1.0 + abs(up))
    for name, x in (("Alg5", alg5_x), (label, scip_x)):
        pv = point_value(terms, x)
        if pv is None:
            continue
        value, err = pv
        if maximise and value - err > up:
            bad.append(f"{name} point beats our upper bound by {value - err - up:.3g} (UNSOUND?)")
        if not maximise and value + err < lo:
            bad.append(f"{name} point below our lower bound by {lo - value - err:.3g} (UNSOUND?)")
    if alg5 is not None and (alg5[1] < lo - tol or alg5[0] > up + tol):
        bad.append(f"Alg5 interval [{alg5[0]:.9g}, {alg5[1]:.9g}] misses ours")
    if scip is not None:
        primal, dual = scip
        if not math.isnan(primal) and not (lo - tol <= primal <= up + tol):
            bad.append(f"{label} primal {primal:.9g} outside ours")
        if maximise and dual < lo - tol:
            what = "claimed optimum" if scip_optimal else "dual bound"
            bad.append(f"{label} {what} {dual:.9g} below our certified lower bound {lo:.9g}")
        if not maximise and dual > up + tol:
            what = "claimed optimum" if scip_optimal else "dual bound"
            bad.append(f"{label} {what} {dual:.9g} above our certified upper bound {up:.9g}")
    return bad


def run_case(
    kind: str,
    seed: int,
    history: History,
    n: int,
    maximise: bool,
    args: argparse.Namespace,
    skip_alg5: bool,
) -> tuple[Row, dict[str, Any]]:
    h = history.prefix(n)
    terms = h.term_set()
    c0, t0 = time.process_time(), time.perf_counter()
    lo, up, res = ours_bounds(terms, maximise, args.time_limit)
    ours_s, ours_cpu = time.perf_counter() - t0, time.process_time() - c0
    notes: list[str] = []
    raw: dict[str, Any] = {"ours_x": res.x.tolist(), "ours_nodes": res.nodes}
    alg5 = alg5_s = alg5_cpu = None
    alg5_status, alg5_nodes, alg5_x = "skipped", 0, None
    if not skip_alg5:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c0 = time.process_time()
            a = alg5_minimise(h, maximise=maximise, delta=args.delta, time_limit=args.time_limit)
            alg5_cpu = time.process_time() - c0
        alg5 = (-a.upper, -a.lower) if maximise else (a.lower, a.upper)
        alg5_s, alg5_status, alg5_nodes, alg5_x = a.seconds, a.status, a.nodes, a.x
        raw["alg5_x"] = a.x.tolist()
    c0 = time.process_time()
    s = scip_optimum(h, maximise=maximise, time_limit=args.time_limit, form="sigmoid")
    scip_cpu = time.process_time() - c0
    scip = (s.primal, s.dual)
    raw["scip_x"] = None if s.x is None else s.x.tolist()
    bad = check(terms, maximise, lo, up, alg5, alg5_x, scip, s.x, s.status == "optimal", "SCIP")
    logit = logit_s = None
    logit_status = "skipped"
    if not args.no_logit and kind == "logistic":
        g = scip_optimum(h, maximise=maximise, time_limit=args.time_limit, form="logit")
        logit, logit_s, logit_status = (g.primal, g.dual), g.seconds, g.status
        raw["logit_x"] = None if g.x is None else g.x.tolist()
        notes += check(
            terms, maximise, lo, up, None, None, logit, g.x, g.status == "optimal", "SCIP-logit"
        )
    row = Row(
        kind,
        seed,
        n,
        "max" if maximise else "min",
        (lo, up),
        ours_s,
        res.status.value,
        alg5,
        alg5_s,
        alg5_status,
        alg5_nodes,
        scip,
        s.seconds,
        s.status,
        logit,
        logit_s,
        logit_status,
        "yes" if not bad else "NO",
        bad + notes,
        ours_cpu,
        alg5_cpu,
        scip_cpu,
    )
    return row, raw


def fmt_interval(v: tuple[float, float] | None, nd: int = 6) -> str:
    if v is None:
        return "-"
    return f"[{v[0]:.{nd}f}, {v[1]:.{nd}f}]"


def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def wc(wall: float | None, cpu: float | None) -> str:
    if wall is None or cpu is None:
        return "-"
    return f"{wall:.3f}/{cpu:.3f}"


def ratio(a: float | None, b: float) -> str:
    if a is None:
        return "-"
    r = a / max(b, 1e-6)
    return f"{r:.1f}x" if r < 10 else f"{r:.0f}x"


def print_table(rows: list[Row], time_limit: float, delta: float) -> None:
    print()
    print(
        f"max / min log P per instance: ours (certified bounds), Alg. 5 with cvxpy (δ = {delta}), "
        f"SCIP (sigmoid form); time limit {time_limit:g} s each"
    )
    header = (
        f"{'instance':<14}{'n':>3} {'':<4}{'ours [lower, upper]':>28}{'wall/cpu s':>14} "
        f"{'Alg5 [lower, upper]':>28}{'status':>9}{'wall/cpu s':>14} "
        f"{'SCIP primal / dual':>28}{'status':>9}{'wall/cpu s':>14}"
        f"{'A5/ours':>9}{'SCIP/ours':>10}{'agree':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        scip = "-" if r.scip is None else f"{r.scip[0]:.6f} / {r.scip[1]:.6f}"
        a5_status = {"optimal": "gap<=δ", "time-limit": "TIMEOUT"}.get(r.alg5_status, r.alg5_status)
        sc_status = {"optimal": "optimal", "timelimit": "TIMEOUT"}.get(r.scip_status, r.scip_status)
        print(
            f"{r.kind + '-' + str(r.seed):<14}{r.n:>3} {r.sense:<4}{fmt_interval(r.ours):>28}"
            f"{wc(r.ours_s, r.ours_cpu):>14} {fmt_interval(r.alg5):>28}{a5_status:>9}"
            f"{wc(r.alg5_s, r.alg5_cpu):>14} {scip:>28}{sc_status:>9}{wc(r.scip_s, r.scip_cpu):>14}"
            f"{ratio(r.alg5_cpu, r.ours_cpu):>9}{ratio(r.scip_cpu, r.ours_cpu):>10}{r.agree:>6}"
        )
    print(
        "wall/cpu: time.perf_counter / time.process_time of the call; ratios A5/ours and SCIP/ours "
        "use CPU time.\n"
        "ours: the engine's status was 'ok' (gap <= 2.5e-5) unless listed below. Alg5 status "
        "'gap<=δ' = closed to δ;\nTIMEOUT = stopped by the time limit (bounds at that moment); "
        "'skipped' = timed out on a shorter prefix of the same history."
    )
    for r in rows:
        if r.ours_status != "ok":
            print(f"  ours {r.kind}-{r.seed} n={r.n} {r.sense}: status {r.ours_status}")
    problems = [(r, b) for r in rows for b in r.notes if not b.startswith("SCIP-logit")]
    if problems:
        print("Disagreements:")
        for r, b in problems:
            print(f"  {r.kind}-{r.seed} n={r.n} {r.sense}: {b}")
    else:
        print("Disagreements: none (every SCIP and Alg. 5 result is consistent with our bounds).")

    logit_rows = [r for r in rows if r.logit is not None]
    if logit_rows:
        print()
        print("Side check: SCIP with the faster 'logit' formulation (logistic instances)")
        header = (
            f"{'instance':<14}{'n':>3} {'':<4}{'ours [lower, upper]':>28}"
            f"{'SCIP-logit primal / dual':>30}{'status':>10}{'s':>8}  verdict"
        )
        print(header)
        print("-" * len(header))
        for r in logit_rows:
            assert r.logit is not None  # noqa: S101 - filtered above
            wrong = [b for b in r.notes if b.startswith("SCIP-logit")]
            verdict = "consistent" if not wrong else "; ".join(wrong)
            print(
                f"{r.kind + '-' + str(r.seed):<14}{r.n:>3} {r.sense:<4}{fmt_interval(r.ours):>28}"
                f"{r.logit[0]:>14.6f} / {r.logit[1]:<13.6f}{r.logit_status:>10}"
                f"{fmt_s(r.logit_s):>8}  {verdict}"
            )

    print()
    print(
        "Median CPU time (s) per problem by experiment and n (a timed-out solve counts with the "
        "CPU time it used up to the wall-clock limit)"
    )
    keys = sorted({(r.kind, r.n) for r in rows}, key=lambda k: (k[0], k[1]))
    for kind, n in keys:
        sub = [r for r in rows if r.kind == kind and r.n == n]
        ours = percentile([r.ours_cpu for r in sub], 50)
        a5 = [r.alg5_cpu for r in sub if r.alg5_cpu is not None]
        a5_to = sum(r.alg5_status == "time-limit" for r in sub)
        a5_sk = sum(r.alg5_status == "skipped" for r in sub)
        sc = [r.scip_cpu for r in sub if r.scip_cpu is not None]
        sc_to = sum(r.scip_status == "timelimit" for r in sub)
        a5_txt = f"{percentile(a5, 50):.3f}" if a5 else "-"
        print(
            f"  {kind:<9} n={n:<3} problems {len(sub):>2}: ours {ours:.4f}; Alg5 {a5_txt} "
            f"({a5_to} timeouts, {a5_sk} skipped); SCIP {percentile(sc, 50):.3f} "
            f"({sc_to} timeouts)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--histories", type=Path, nargs="*", help="paper_repro.py --json dump(s)")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--linear-n", default="5,10,20,50")
    parser.add_argument("--logistic-n", default="5,8,10")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--delta", type=float, default=0.01, help="Alg. 5 gap (paper: 0.01)")
    parser.add_argument("--seed", type=int, default=1000, help="for generated histories")
    parser.add_argument("--no-skip", action="store_true")
    parser.add_argument("--no-logit", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1 instance, n=5,10 / 5, 10 s")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.time_limit = 1, 10.0
        args.linear_n, args.logistic_n = "5,10", "5"
    args.linear_n = [int(v) for v in str(args.linear_n).split(",")]
    args.logistic_n = [int(v) for v in str(args.logistic_n).split(",")]
    started = time.perf_counter()
    print("solver comparison: max/min log P on histories of the 6.3/6.4 experiments")
    print(f"machine: {machine_info()}")
    instances = load_instances(args)
    src = ", ".join(map(str, args.histories or [])) or "generated with the engine"
    print(
        f"histories: {src}; instances: "
        + ", ".join(f"{k} seeds {[s for s, _ in v]}" for k, v in instances.items())
    )
    rows: list[Row] = []
    raws: list[dict[str, Any]] = []
    for kind, ns in (("linear", args.linear_n), ("logistic", args.logistic_n)):
        for seed, history in instances[kind]:
            for maximise in (True, False):
                timed_out = False
                for n in ns:
                    skip = timed_out and not args.no_skip
                    row, raw = run_case(kind, seed, history, n, maximise, args, skip)
                    timed_out = timed_out or row.alg5_status == "time-limit"
                    rows.append(row)
                    raws.append({**dataclasses.asdict(row), **raw})
                    log(
                        f"[{kind}-{seed} n={n} {row.sense}] ours {fmt_interval(row.ours)} "
                        f"{row.ours_s:.3f}s | alg5 {fmt_interval(row.alg5)} {row.alg5_status} "
                        f"{fmt_s(row.alg5_s)}s | scip {row.scip} {row.scip_status} "
                        f"{fmt_s(row.scip_s)}s | agree {row.agree} {row.notes}"
                    )
    rows.sort(key=lambda r: (r.kind, r.seed, r.sense, r.n))
    print_table(rows, args.time_limit, args.delta)
    elapsed = time.perf_counter() - started
    print()
    print(f"total wall time {elapsed:.1f} s; machine at end: {machine_info()}")
    if args.json:
        args.json.write_text(json.dumps(raws, indent=1, default=str), encoding="utf-8")
        print(f"raw results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

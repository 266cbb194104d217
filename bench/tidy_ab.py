"""Interleaved A/B of the code the h/tidy review touched: two trees, blocks alternated.

How to run (from the project root; no database)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/tidy_ab.py --trees BASE,NEW --blocks 30

Each tree has a child process of its own (``PYTHONPATH`` its tree), started together; the
parent asks them in turn for a block of one case at a time, ``--blocks`` times per case, the
order within a pair alternating, so the load of this shared machine drifts over both alike.
A child reports the block's CPU (``time.process_time``); the table gives each tree's median µs
per operation and the median of the per-pair ratios (NEW / BASE). The cases:

* ``form build``: an exact form built from its counts (three axes of 10 values, one ε) and its
  loss computed;
* ``submit quick``: one finite ``grr`` submit's engine work, basic composition deciding (the
  service's default budget): ``evaluate``, ``record``, the new state's stored bytes and loss —
  a new form built by ``with_term`` from its parent's kept ranges and texts;
* ``submit tight``: the same with every output's loss computed (``evaluate(tight=True)``), the
  new form's loss handed over (``with_term_known``);
* ``survey losses``: 2,000 stored forms read back (``from_bytes``) and their losses computed
  together (``losses_many``), per form;
* ``hash step`` and ``next hash``: a survey member's next history hash
  (``history_hashes_after``' step) and a submit's (``next_history_hash``);
* ``odometer``: a submit's odometer from its row and the six changed columns (``_Changed`` in a
  tree that has it, else ``odometer_with``).

The objects are ``service_load``'s ``grr`` scenario: a 1,000-point domain, three ``grr``
queries of ε = 0.5 cycled over 10 objects, each history restarted after 60 answers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    "form build",
    "submit quick",
    "submit tight",
    "survey losses",
    "hash step",
    "next hash",
    "odometer",
]


def _submit_case(tight: bool) -> Callable[[int], None]:
    import random
    from fractions import Fraction

    sys.path.insert(0, str(ROOT / "bench"))
    from service_load import GRR_DOMAIN, grr_queries, grr_value  # type: ignore[import-not-found]

    from app.engine.domain import parse_domain
    from app.engine.filters import FilterKind
    from app.engine.likelihood import LikelihoodState
    from app.engine.mechanisms import parse_query
    from app.engine.pipeline import ObjectSnapshot, evaluate, record

    domain = parse_domain(GRR_DOMAIN)
    mechs = [parse_query(q, domain) for q in grr_queries(None)]
    rng = random.Random(5)
    values = [grr_value(rng) for _ in range(10)]

    def fresh() -> ObjectSnapshot:
        return ObjectSnapshot(
            domain, 10_000.0, FilterKind.BAYESIAN, Fraction(0), LikelihoodState(domain)
        )

    objects = [fresh() for _ in values]
    steps = [0]

    def run(n: int) -> None:
        for _ in range(n):
            count = steps[0]
            steps[0] += 1
            at = count % len(objects)
            if (count // len(objects)) % 60 == 0 and count % len(objects) == 0:
                objects[:] = [fresh() for _ in values]
            mech = mechs[count % len(mechs)]
            snapshot = objects[at]
            decision = evaluate(snapshot, mech, tight=tight)
            after = record(snapshot, mech, mech.sample(values[at]), decision)
            after.state.to_bytes()
            after.loss()
            objects[at] = after

    return run


def _build_case() -> Callable[[int], None]:
    from fractions import Fraction

    import numpy as np

    from app.engine.exact import ExactLoss, Group

    groups = (Group(Fraction(1, 2)),)
    counts = {a: np.arange(10, dtype=np.int64).reshape(1, 10) for a in range(3)}

    def run(n: int) -> None:  # n forms built and their losses computed
        for _ in range(n):
            ExactLoss((10, 10, 10), groups, counts).loss()

    return run


def _survey_case() -> Callable[[int], None]:
    import random

    sys.path.insert(0, str(ROOT / "bench"))
    from service_load import GRR_DOMAIN, grr_queries  # type: ignore[import-not-found]

    from app.engine.domain import parse_domain
    from app.engine.exact import ExactLoss, losses_many
    from app.engine.likelihood import LikelihoodState
    from app.engine.mechanisms import parse_query

    domain = parse_domain(GRR_DOMAIN)
    mechs = [parse_query(q, domain) for q in grr_queries(None)]
    rng = random.Random(7)
    stored = []
    for _ in range(2000):
        state = LikelihoodState(domain)
        for _ in range(rng.randint(1, 12)):
            mech = rng.choice(mechs)
            state.apply(mech.term(rng.randrange(10)))
        assert state.exact is not None  # noqa: S101 - grr histories keep their exact form
        stored.append(state.exact.to_bytes())
    shape = domain.shape

    def run(n: int) -> None:  # n forms
        done = 0
        while done < n:
            part = stored[: min(len(stored), n - done)]
            losses_many([ExactLoss.from_bytes(shape, data) for data in part])
            done += len(part)

    return run


def _hash_case(step: bool) -> Callable[[int], None]:
    from app.services.snapshots import history_hashes_after, next_history_hash

    query = '{"mechanism": "grr", "attribute": "a", "epsilon": 0.5}'
    previous = [f"{i:032x}" for i in range(1000)]

    def run_steps(n: int) -> None:  # n survey members
        after = history_hashes_after(query, "3")
        for i in range(n):
            after(previous[i % 1000])

    def run_next(n: int) -> None:  # n submits
        for i in range(n):
            next_history_hash(previous[i % 1000], query, "3")

    return run_steps if step else run_next


def _odometer_case() -> Callable[[int], None]:
    from datetime import UTC, datetime

    from app.services import objects, queries
    from app.store.objects import ObjectState, PrivateValue

    domain = json.dumps(
        {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": 9}]},
        separators=(",", ":"),
    )
    row = ObjectState(
        id="o1", domain=domain, value=PrivateValue("x"), budget=4.0, filter="bayesian",
        finite=True, state_hash=None, state_pending=0, history_hash=None, state=None,
        state_err=0.0, loss_lower=0.5, loss_upper=0.5, basic_total="1/2", accepted=1,
        rejected=0, version=2, updated_at=None, retired_at=None, budget_delta=None,
        f0_account="0", data_version=1, version_start=0, lifetime_budget=None,
        lifetime_exact=None, lifetime_lower=0.0, lifetime_upper=0.0,
    )  # fmt: skip
    now = datetime.now(UTC)
    changed: dict[str, Any] = {
        "loss_lower": 1.0,
        "loss_upper": 1.0,
        "basic_total": "1",
        "f0_account": "0",
        "accepted": 2,
        "updated_at": now,
    }
    proxy = getattr(queries, "_Changed", None)
    if proxy is not None:

        def one() -> Any:
            return objects.odometer_view(proxy(row, dict(changed)))
    else:
        with_ = objects.odometer_with  # type: ignore[attr-defined]

        def one() -> Any:
            return with_(row, **changed)

    def run(n: int) -> None:
        for _ in range(n):
            one()

    return run


def child() -> None:
    """In the tree's code: build the cases, then answer ``case n`` lines with CPU seconds."""
    cases = {
        "form build": _build_case(),
        "submit quick": _submit_case(False),
        "submit tight": _submit_case(True),
        "survey losses": _survey_case(),
        "hash step": _hash_case(True),
        "next hash": _hash_case(False),
        "odometer": _odometer_case(),
    }
    for run in cases.values():
        run(50)  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name, n = line.rsplit(" ", 1)
        if int(n) <= 0:
            break
        run = cases[name]
        cpu0 = time.process_time()
        run(int(n))
        print(json.dumps({"cpu": time.process_time() - cpu0}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", help="two comma-separated source folders: BASE,NEW")
    parser.add_argument("--blocks", type=int, default=30, help="blocks per tree and case (30)")
    parser.add_argument(
        "--sizes",
        default="10000,200,200,4000,20000,20000,5000",
        help="operations per block, per case in the table's order",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child()
        return 0
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    children = []
    for tree in trees:
        env = {
            **os.environ,
            "PYTHONPATH": f"{tree}:{tree / 'clients' / 'python' / 'src'}",
            "OPENBLAS_NUM_THREADS": "1",
        }
        children.append(
            subprocess.Popen(  # noqa: S603 - our own script
                [sys.executable, str(Path(__file__).resolve()), "--child"],
                cwd=tree,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for process in children:
            assert process.stdout is not None  # noqa: S101 - a pipe was asked for
            if not process.stdout.readline().startswith("{"):
                raise RuntimeError(f"a child failed (exit {process.wait()})")
        load0 = Path("/proc/loadavg").read_text().split()[0]
        start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        results: dict[str, list[list[float]]] = {case: [[], []] for case in CASES}
        for b in range(args.blocks):
            for case, n in zip(CASES, sizes, strict=True):
                for i in (0, 1) if b % 2 == 0 else (1, 0):
                    process = children[i]
                    assert process.stdin is not None  # noqa: S101
                    assert process.stdout is not None  # noqa: S101
                    process.stdin.write(f"{case} {n}\n")
                    process.stdin.flush()
                    cpu = json.loads(process.stdout.readline())["cpu"]
                    results[case][i].append(1e6 * cpu / n)
        load1 = Path("/proc/loadavg").read_text().split()[0]
        print(
            f"tidy_ab: {args.blocks} blocks per tree and case, alternated; {start}; "
            f"load {load0} -> {load1}"
        )
        a, b = (t.name for t in trees)
        print(f"{'case':<15} {'n/block':>8} {a + ' µs/op':>16} {b + ' µs/op':>16} {'ratio':>7}")
        for case, n in zip(CASES, sizes, strict=True):
            base, new = results[case]
            ratios = [y / x for x, y in zip(base, new, strict=True) if x > 0]
            print(
                f"{case:<15} {n:>8} {statistics.median(base):>16.3f} "
                f"{statistics.median(new):>16.3f} {statistics.median(ratios):>7.3f}"
            )
    finally:
        for process in children:
            if process.stdin is not None and not process.stdin.closed:
                try:
                    process.stdin.write("stop 0\n")
                    process.stdin.close()
                except BrokenPipeError:
                    pass
            process.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CPU of a single submit's connection handling (``app.store.submitting``), trees side by side.

How to run (from the project root, PostgreSQL reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/submit_conn.py --trees BASE,NEW --rounds 6

A submit's block (:func:`app.store.submitting`) gets a connection, runs the submit's statements
and ends; ``bench/submit_cpu.py`` measures the whole submit, whose ~1.3 ms of CPU moves by more
between rounds on a shared machine than the connection's part of it (≈ 0.1 ms in a profile,
docs/benchmarks.md "h/lean"). This script measures that part alone: for each tree (a folder of
the code, put first on ``PYTHONPATH`` of a child process; the order alternates by round) a child
makes the app's engine (:func:`app.db.session.make_engine`, pool 5 + 5) on the database
``--url`` and times ``--blocks`` blocks, one after another in one thread, of three shapes:

- ``empty``: ``with submitting(engine): pass`` — the connection's handling alone;
- ``select``: one ``SELECT 1`` through :func:`app.store.compiled.fetch_one` (the load's road);
- ``write``: that ``SELECT`` and a one-row ``INSERT … ; COMMIT`` in the block's transaction
  (:func:`app.store.begin_writes`, then the block's end commits), on a temporary table.

It prints the process CPU (``time.process_time``) per block in µs, per tree and round, and each
round's ratio of the second tree to the first, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
    """Run in the tree's code: time the blocks, print one JSON line."""
    from sqlalchemy import literal, select, text

    from app.db.session import make_engine
    from app.store import begin_writes, submitting
    from app.store.compiled import Compiled, fetch_one

    engine = make_engine(args.url, 5, 5)
    one = Compiled.of(select(literal(1)))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS submit_conn_probe (n INTEGER)"))

    def empty() -> None:
        with submitting(engine):
            pass

    def select_one() -> None:
        with submitting(engine) as conn:
            fetch_one(conn, one, {})

    def write() -> None:
        with submitting(engine) as conn:
            fetch_one(conn, one, {})
            begin_writes(conn)
            conn.exec_driver_sql("INSERT INTO submit_conn_probe VALUES (1)")

    out = {}
    for name, block in (("empty", empty), ("select", select_one), ("write", write)):
        for _ in range(args.warmup):
            block()
        start = time.process_time()
        for _ in range(args.blocks):
            block()
        out[name] = (time.process_time() - start) / args.blocks * 1e6
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE submit_conn_probe"))
    engine.dispose()
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", required=True, help="two comma-separated source folders")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=5000, help="timed blocks per shape")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--url", default="postgresql://root@127.0.0.1:5432/test")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = args.trees.split(",")
    shapes = ("empty", "select", "write")
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    print(f"submit_conn: {args.blocks} blocks per shape, µs of CPU per block")
    print(f"{'tree':<22} round " + " ".join(f"{s:>8}" for s in shapes) + "  loadavg")
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            env = dict(os.environ, PYTHONPATH=f"{tree}:{tree}/clients/python/src")
            command = [sys.executable, __file__, "--child", "--trees", args.trees]
            command += ["--blocks", str(args.blocks), "--warmup", str(args.warmup)]
            command += ["--url", args.url]
            done = subprocess.run(  # noqa: S603 - this script
                command, env=env, cwd=tree, check=True, capture_output=True, text=True
            )
            line = done.stdout.strip().splitlines()[-1]
            got = json.loads(line)
            results[tree].append(got)
            load = os.getloadavg()[0]
            print(
                f"{Path(tree).name:<22} {round_ + 1:>5} "
                + " ".join(f"{got[s]:8.1f}" for s in shapes)
                + f"  {load:.2f}"
            )
    if len(trees) == 2:
        a, b = (results[t] for t in trees)
        print(f"per-round ratio {Path(trees[1]).name} / {Path(trees[0]).name}:")
        for shape in shapes:
            ratios = sorted(y[shape] / x[shape] for x, y in zip(a, b, strict=True))
            diffs = sorted(x[shape] - y[shape] for x, y in zip(a, b, strict=True))
            print(
                f"  {shape:<7} ratios {', '.join(f'{r:.3f}' for r in ratios)}"
                f" (median {ratios[len(ratios) // 2]:.3f});"
                f" saved µs median {diffs[len(diffs) // 2]:.1f}"
            )


if __name__ == "__main__":
    main()

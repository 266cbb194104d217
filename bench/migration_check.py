"""A command's migration check (``app.db.migrate.migration_problem``), two checkouts side by side.

Every ``gatekeeper`` command but ``serve`` and ``migrate`` runs the check once; the suite's
in-process commands (``tests/service/factories.py`` ``run_cli``) run it once per call in a test
process that has imported everything already. Per tree, in a new interpreter on its own
migrated SQLite file: the CPU of the first check with what it imports (``import
app.db.migrate`` and the call, after SQLAlchemy and ``app.db.session``: on a tree whose check
loads the migration scripts through Alembic, Alembic and everything the scripts import —
``app.services.history``, ``app.engine.pipeline``, ``app.store.objects``... —, some of which a
command needs anyway: a whole command is ``bench/startup_bench.py``'s ``keys list``), and the
median CPU of ``--calls`` further checks (what an in-process command pays). Rounds alternate
which tree goes first. Usage::

    python bench/migration_check.py --tree main=/path/to/main --tree branch=. --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import json, sys, time
import sqlalchemy, sqlalchemy.orm
from app.db.session import make_engine
engine = make_engine(sys.argv[1])
with engine.connect():
    pass
start = time.process_time()
from app.db.migrate import migration_problem
assert migration_problem(engine) is None
first = time.process_time() - start
calls = []
for _ in range(int(sys.argv[2])):
    start = time.process_time()
    migration_problem(engine)
    calls.append(time.process_time() - start)
print(json.dumps({"first": first, "call": sorted(calls)[len(calls) // 2]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH (repeat)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    folder = Path(tempfile.mkdtemp(prefix="migration_check_"))
    urls = {name: f"sqlite:///{folder / name}.db" for name in trees}
    base = {"PATH": os.environ.get("PATH", ""), "OPENBLAS_NUM_THREADS": "1"}
    for name, tree in trees.items():
        subprocess.run(  # noqa: S603 - this interpreter
            [sys.executable, "-c", f"from app.db.migrate import upgrade; upgrade({urls[name]!r})"],
            cwd=tree,
            env={**base, "PYTHONPATH": tree},
            check=True,
        )
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    load = [os.getloadavg()[0]]
    order = list(trees)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            done = subprocess.run(  # noqa: S603 - this interpreter, a fixed program
                [sys.executable, "-c", PROBE, urls[name], str(args.calls)],
                cwd=trees[name],
                env={**base, "PYTHONPATH": trees[name]},
                check=True,
                capture_output=True,
                text=True,
            )
            found[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    load.append(os.getloadavg()[0])
    first = next(iter(trees))
    print(f"load (1 min) {load[0]:.1f} -> {load[1]:.1f}; {args.rounds} rounds, {args.calls} calls")
    print("| tree | first check with its imports, CPU ms (median) | a further check, CPU ms |")
    print("|---|---:|---:|")
    for name, runs in found.items():
        cold = sorted(r["first"] for r in runs)[len(runs) // 2] * 1000
        warm = sorted(r["call"] for r in runs)[len(runs) // 2] * 1000
        ref = found[first]
        cold_ref = sorted(r["first"] for r in ref)[len(ref) // 2] * 1000
        warm_ref = sorted(r["call"] for r in ref)[len(ref) // 2] * 1000
        print(
            f"| {name} | {cold:.1f} ({cold / cold_ref:.3f}) | {warm:.2f} ({warm / warm_ref:.3f}) |"
        )


if __name__ == "__main__":
    main()

"""``gatekeeper import`` from several trees (worktrees of older commits), interleaved, side by side.

How to run (from the project root, PostgreSQL reachable)::

    .venv/bin/python bench/import_trees.py --tree /work/old --tree /work/older --rounds 2
    .venv/bin/python bench/import_trees.py --objects 200000 --tree . --tree /work/old --jobs 0
    .venv/bin/python bench/import_trees.py --parse-only --objects 20000 --tree . --tree /work/old

Each tree's command runs with PYTHONPATH=<tree> and this interpreter (no venv of its own): the
same population (``bench/survey_load.py``'s, 3 attributes) is written once and imported by every
tree in turn, round after round (A B C A B C ...), each import into a fresh database migrated
by that tree's own ``gatekeeper migrate`` (or by its import, before that command existed), so
the trees share the machine's load. Per run: wall time, CPU of the command and every process it
waited for (its ``--jobs`` workers), and the CPU of the database's PostgreSQL client backends
(sampled every 0.25 s). The machine's load is printed with every run: on a shared machine only
the ratios inside one run mean anything.

``--parse-only`` (no database): per tree, one process does what a ``--jobs`` worker does — its
module imports, then ``parse_lines(batch, seal=True)`` over the population in batches of 5,000
(validation and encryption) — timed in process CPU, so the per-object cost is read apart from
start-up, the database and the importing process.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import survey_load  # noqa: E402
from bench.service_load import BackendSampler, fresh_database  # noqa: E402


def children_cpu() -> float:
    """User + system CPU seconds of every waited-for child (and their waited-for children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def git_head(tree: Path) -> str:
    import subprocess

    done = subprocess.run(  # noqa: S603 - our own worktree
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def import_once(
    tree: Path, population: Path, prefix: str, extra: list[str]
) -> tuple[float, float, float]:
    """(wall s, command CPU s, PostgreSQL CPU s) of one import by ``tree`` on a fresh database."""
    with fresh_database(migrate=False, prefix=prefix) as (url, name):
        done = survey_load.cli(url, "migrate", tree=tree)
        # a tree older than `gatekeeper migrate` (2026-11-25 15:14) has its import migrate
        if done.returncode != 0 and "invalid choice" not in done.stderr:
            raise SystemExit(f"{tree}: migrate failed\n{done.stderr}")
        backends = BackendSampler(name)
        cpu0, start = children_cpu(), time.perf_counter()
        done = survey_load.cli(url, "import", str(population), "--quiet", *extra, tree=tree)
        wall = time.perf_counter() - start
        cpu = children_cpu() - cpu0
        pg = backends.stop()
        if done.returncode != 0:
            raise SystemExit(f"{tree}: import failed\n{done.stderr}")
        return wall, cpu, pg


#: ``--parse-only``: run in each tree's interpreter — the worker's module import, then its job
#: (``parse_lines(batch, seal=True)``: validation and encryption) over the population's batches.
PARSE = """
import json, sys, time
t0 = time.process_time()
from app import crypto
from app.engine.limits import DEFAULT_LIMITS
from app.services.imports import parse_lines
from app.settings import get_settings
crypto.configure(get_settings().value_cipher())
t1 = time.process_time()
lines = list(enumerate(open(sys.argv[1], "rb"), start=1))
t2 = time.process_time()
for i in range(0, len(lines), 5000):
    parse_lines(lines[i : i + 5000], DEFAULT_LIMITS, seal=True)
t3 = time.process_time()
print(json.dumps({"import": t1 - t0, "parse": t3 - t2, "objects": len(lines)}))
"""


def parse_once(tree: Path, population: Path) -> tuple[float, float]:
    """(module import CPU s, parse + seal CPU µs an object) of one worker's job in ``tree``."""
    import json
    import subprocess

    env = {**os.environ, "GATEKEEPER_ENCRYPTION_KEY_FILE": str(survey_load.KEY_FILE)}
    done = subprocess.run(  # noqa: S603 - our own code
        [sys.executable, "-c", PARSE, str(population)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: parse failed\n{done.stderr}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["import"], 1e6 * out["parse"] / out["objects"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--tree", type=Path, action="append", required=True, help="a tree to run (repeat it)"
    )
    parser.add_argument("--db-prefix", default="gk_bench_", help="the databases' name prefix")
    parser.add_argument(
        "--jobs", help="passed to every tree's `gatekeeper import --jobs` (default: its own)"
    )
    parser.add_argument(
        "--parse-only",
        action="store_true",
        help="no database: time a --jobs worker's module import and its job (validate and "
        "encrypt each line) per tree, in one process, interleaved",
    )
    args = parser.parse_args(argv)
    extra = ["--jobs", args.jobs] if args.jobs is not None else []
    trees = [tree.resolve() for tree in args.tree]
    heads = [git_head(tree) for tree in trees]
    from cryptography.fernet import Fernet

    survey_load.KEY_FILE.write_text(Fernet.generate_key().decode())
    print(f"machine: {platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()}")
    print(f"objects {args.objects}, rounds {args.rounds}, import args {extra or 'defaults'}")
    results: dict[int, list[tuple[float, float, float]]] = {n: [] for n in range(len(trees))}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            population = Path(tmp) / "population.ndjson"
            survey_load.write_population(population, args.objects, args.seed)
            if args.parse_only:
                return parse_only(args, trees, heads, population)
            print()
            print("| round | tree | wall s | objects/s | command CPU s | PostgreSQL CPU s | load |")
            print("|---|---|---|---|---|---|---|")
            for r in range(1, args.rounds + 1):
                for n, tree in enumerate(trees):
                    wall, cpu, pg = import_once(tree, population, args.db_prefix, extra)
                    results[n].append((wall, cpu, pg))
                    load = os.getloadavg()[0]
                    print(
                        f"| {r} | {heads[n]} | {wall:.1f} | {args.objects / wall:,.0f} | "
                        f"{cpu:.1f} | {pg:.1f} | {load:.2f} |",
                        flush=True,
                    )
    finally:
        survey_load.KEY_FILE.unlink(missing_ok=True)
    print()
    print(f"medians, ratio to the first tree ({heads[0]}):")
    print()
    print(
        "| tree | wall s | command CPU s | PostgreSQL CPU s | wall ratio | CPU ratio | PG ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    first = [statistics.median(col) for col in zip(*results[0], strict=True)]
    for n in range(len(trees)):
        med = [statistics.median(col) for col in zip(*results[n], strict=True)]
        ratios = " | ".join(f"{m / f:.2f}" if f else "-" for m, f in zip(med, first, strict=True))
        print(f"| {heads[n]} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {ratios} |")
    return 0


def parse_only(
    args: argparse.Namespace, trees: list[Path], heads: list[str], population: Path
) -> int:
    found: dict[int, list[tuple[float, float]]] = {n: [] for n in range(len(trees))}
    print()
    print("| round | tree | worker's imports CPU s | parse + seal CPU µs/object | load |")
    print("|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for n, tree in enumerate(trees):
            imports, per = parse_once(tree, population)
            found[n].append((imports, per))
            print(f"| {r} | {heads[n]} | {imports:.2f} | {per:.1f} | {os.getloadavg()[0]:.2f} |")
    print()
    print(f"medians, ratio to the first tree ({heads[0]}):")
    print()
    print("| tree | imports CPU s | µs/object | imports ratio | µs/object ratio |")
    print("|---|---|---|---|---|")
    first = [statistics.median(col) for col in zip(*found[0], strict=True)]
    for n in range(len(trees)):
        med = [statistics.median(col) for col in zip(*found[n], strict=True)]
        print(
            f"| {heads[n]} | {med[0]:.2f} | {med[1]:.1f} | {med[0] / first[0]:.2f} | "
            f"{med[1] / first[1]:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

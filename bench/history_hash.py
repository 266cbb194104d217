"""CPU of the history hashes and state keys (``app.services.snapshots``), trees side by side.

How to run (from the project root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/history_hash.py --trees BASE,NEW --rounds 6

Every accepted answer hashes its history once (``next_history_hash``: a submit, a replay by
``verify``), a survey's member once per chunk (``history_hashes_after``'s step, 10^6 calls for a
diverged survey of 10^6 members) and a finite state's key once (``state_key``). For each tree (a
folder of the code, put first on ``PYTHONPATH`` of a child process; the order alternates by
round) a child times ``--calls`` calls of each on a submit-sized query and output (the best of
five repeats, ``timeit``), prints µs per call per tree and round and each round's ratio of the
second tree to the first, with the load average. Each child also prints the digests of fixed
inputs: the trees must agree on them byte for byte, or the script stops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

QUERY = '{"mechanism":"grr","epsilon":0.5,"attribute":"a","values":[0,1,2,3,4,5,6,7,8,9]}'
OUTPUT = '"3"'
PREVIOUS = "0123456789abcdef0123456789abcdef"


def child(args: argparse.Namespace) -> None:
    """Run in the tree's code: time the calls, print one JSON line."""
    from app.services.snapshots import history_hashes_after, next_history_hash, state_key

    step = history_hashes_after(QUERY, OUTPUT)
    shapes: dict[str, Callable[[], str]] = {
        "next_history_hash": lambda: next_history_hash(PREVIOUS, QUERY, OUTPUT),
        "step": lambda: step(PREVIOUS),
        "state_key": lambda: state_key('{"a":"integer"}', PREVIOUS),
    }
    out: dict[str, object] = {
        name: min(timeit.repeat(call, number=args.calls, repeat=5)) / args.calls * 1e6
        for name, call in shapes.items()
    }
    out["digests"] = [call() for call in shapes.values()] + [
        next_history_hash(None, "", ""),
        history_hashes_after("", "")(None),
    ]
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", required=True, help="two comma-separated source folders")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=200_000, help="timed calls per repeat")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = args.trees.split(",")
    shapes = ("next_history_hash", "step", "state_key")
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    digests: set[str] = set()
    print(f"history_hash: best of 5 x {args.calls} calls, µs per call")
    print(f"{'tree':<16} round " + " ".join(f"{s:>17}" for s in shapes) + "  loadavg")
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            env = dict(os.environ, PYTHONPATH=f"{tree}:{tree}/clients/python/src")
            command = [sys.executable, __file__, "--child", "--trees", args.trees]
            command += ["--calls", str(args.calls)]
            done = subprocess.run(  # noqa: S603 - this script
                command, env=env, cwd=tree, check=True, capture_output=True, text=True
            )
            got = json.loads(done.stdout.strip().splitlines()[-1])
            digests.add(json.dumps(got.pop("digests")))
            if len(digests) != 1:
                raise SystemExit(f"the trees' digests differ: {sorted(digests)}")
            results[tree].append(got)
            print(
                f"{Path(tree).name:<16} {round_ + 1:>5} "
                + " ".join(f"{got[s]:17.3f}" for s in shapes)
                + f"  {os.getloadavg()[0]:.2f}"
            )
    print("digests identical in every run:", next(iter(digests)))
    if len(trees) == 2:
        a, b = (results[t] for t in trees)
        print(f"per-round ratio {Path(trees[1]).name} / {Path(trees[0]).name}:")
        for shape in shapes:
            ratios = sorted(y[shape] / x[shape] for x, y in zip(a, b, strict=True))
            print(
                f"  {shape:<17} ratios {', '.join(f'{r:.3f}' for r in ratios)}"
                f" (median {ratios[len(ratios) // 2]:.3f})"
            )


if __name__ == "__main__":
    main()

"""``linear``/``logistic`` draws: CPU per draw and a digest of every drawn probability, by tree.

How to run (from the project root; no database)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/regression_draws.py --trees /work/wt/base,.

Issue 27 item 5 (h/fuzz). For every round and tree (the order alternating by round) a child
process with that tree first on ``PYTHONPATH``:

* ``digest``: draws 3 times at every point of 24 queries (``linear`` and ``logistic``, affine
  and quadratic, ε 0.1 to 100, an integer domain and an integer × real one with ``-0.0`` and
  ``0.0`` among its points) with ``regression.bernoulli`` replaced by a recorder, and prints a
  SHA-256 of every rational handed to it and every output: the trees must print the same digest
  (the same rational at every draw, first or repeated);
* ``single``: the CPU per draw of ``mech.sample(value)`` repeated at one point, the loop of
  ``tests/engine/test_sampling.py::test_linear_outputs_...`` and ``test_logistic_outputs_...``
  (``--draws`` draws each);
* ``survey``: the CPU of one ``sample_many`` over ``--members`` members of a ``logistic`` query
  whose values take 101 distinct points (an integer attribute 0..100), a survey chunk's call.

The table: each tree's CPU (process time) per round, and the high outputs' share (about a half:
a sanity check, not a test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import hashlib, json, sys, time
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query, regression

draws, members = int(sys.argv[1]), int(sys.argv[2])
real_bernoulli = regression.bernoulli
seen = []

def record(p):
    seen.append(p)
    return len(seen) % 2 == 0

regression.bernoulli = record
domains = [
    {"attributes": [{"name": "a", "type": "integer", "low": 0, "high": 10}]},
    {"attributes": [{"name": "x", "type": "integer", "low": -5, "high": 5},
                    {"name": "y", "type": "real", "low": -1, "high": 2}]},
]
queries = []
for eps in (0.1, 1.0, 7.25, 100.0):
    queries += [
        ({"mechanism": "linear", "weights": {"a": 0.5}, "intercept": -1.0, "range": [-1, 2],
          "truncate": True, "epsilon": eps}, 0),
        ({"mechanism": "linear", "weights": {"a": 0.1}, "range": [0, 1], "epsilon": eps}, 0),
        ({"mechanism": "logistic", "weights": {"a": 0.7}, "intercept": -2.0, "epsilon": eps}, 0),
        ({"mechanism": "logistic", "weights": {"x": 0.3, "y": -1.7, "x*y": 0.25, "y^2": 0.5},
          "intercept": 0.1, "epsilon": eps}, 1),
        ({"mechanism": "linear", "weights": {"x": 0.1, "y": 0.3}, "intercept": -0.2,
          "range": [-3, 3], "truncate": True, "epsilon": eps}, 1),
        ({"mechanism": "logistic", "weights": {}, "intercept": 0.4, "epsilon": eps}, 0),
    ]
digest = hashlib.sha256()
count = 0
for raw, d in queries:
    mech = parse_query(raw, parse_domain(domains[d]))
    if d == 0:
        points = [{"a": a} for a in range(11)]
    else:
        points = [{"x": x, "y": y} for x in range(-5, 6)
                  for y in (-1.0, -0.0, 0.0, 0.1, 0.3, 1.0 / 3, 1.5, 2.0)]
    for value in points:
        for _ in range(3):
            out = mech.sample(value)
            p = seen[-1]
            digest.update(repr((raw, value, p.numerator, p.denominator, out)).encode())
            count += 1
regression.bernoulli = real_bernoulli

age = parse_domain(domains[0])
single = {}
for name, raw in (
    ("linear", {"mechanism": "linear", "weights": {"a": 0.5}, "intercept": -1.0,
                "range": [-1, 2], "truncate": True, "epsilon": 1.0}),
    ("logistic", {"mechanism": "logistic", "weights": {"a": 0.7}, "intercept": -2.0,
                  "epsilon": 1.5}),
):
    mech = parse_query(raw, age)
    start = time.process_time()
    high = sum(mech.sample({"a": 3}) for _ in range(draws))
    single[name] = (time.process_time() - start, high / draws)
pop = parse_domain({"attributes": [{"name": "y", "type": "integer", "low": 0, "high": 100}]})
mech = parse_query({"mechanism": "logistic", "weights": {"y": 0.05}, "intercept": -2.5,
                    "epsilon": 1.0}, pop)
values = [{"y": i % 101} for i in range(members)]
start = time.process_time()
outputs = mech.sample_many(values)
survey = (time.process_time() - start, sum(outputs) / members)
print(json.dumps({"digest": digest.hexdigest(), "count": count, "single": single,
                  "survey": survey}))
"""


def run(tree: str, draws: int, members: int) -> dict[str, Any]:
    """One child process on ``tree``: its JSON line."""
    path = str(Path(tree).resolve())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(  # noqa: S603 - this interpreter, our own script
        [sys.executable, "-c", CHILD, str(draws), str(members)],
        env=env,
        cwd=path,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Alternate the trees over the rounds; print one row per tree and round."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=f"/work/wt/base,{ROOT}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--members", type=int, default=100_000)
    args = parser.parse_args()
    trees = args.trees.split(",")
    print(
        f"| round | tree | digest (draws) | linear: {args.draws:,} draws, s (us/draw) "
        f"| logistic: s (us/draw) | sample_many of {args.members:,}, s |"
    )
    print("|---:|---|---|---:|---:|---:|")
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            res = run(tree, args.draws, args.members)
            single, survey = res["single"], res["survey"]
            cells = [
                f"{single[k][0]:.3f} ({1e6 * single[k][0] / args.draws:.1f})"
                for k in ("linear", "logistic")
            ]
            print(
                f"| {r + 1} | {tree} | {str(res['digest'])[:16]} ({res['count']}) "
                f"| {cells[0]} | {cells[1]} | {survey[0]:.3f} |"
            )


if __name__ == "__main__":
    main()

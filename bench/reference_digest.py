"""The continuous tests' engine-free reference: a digest of its values and its CPU, by tree.

How to run (from the project root; no database)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/reference_digest.py --trees /work/wt/base,.

Issue 27 item 5 (h/tcost). For every round and tree (the order alternating by round) a child
process with that tree first on ``PYTHONPATH`` prints:

* ``digest``: a SHA-256 of the bytes of every float :class:`tests.engine.continuous.reference.
  Instance` gives over 400 random instances (mixed, single-kind and integer ones; the grid of 5
  per axis and 64 random points, some outside the box): ``logp``, ``term_logs``, ``_probs`` on
  many points and on one, ``logp_and_grad``, ``sigmoid`` (with ``±0``, ``±800``, ``nan``,
  ``±inf``) and, for one in 20, ``search``: the trees must print the same digest;
* ``adversarial``: the SHA-256 of ``reference_loss(case, grid=401)`` (``float.hex``) over the 29
  cases of :mod:`tests.engine.continuous.adversarial` (what ``test_adversarial.py`` computes) and
  the process CPU it took.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CHILD = r"""
import hashlib, time
import numpy as np
from tests.engine.continuous.reference import (
    LOGISTIC, PLAIN, TRUNCATED, random_instance, sigmoid,
)

h = hashlib.sha256()
floats = 0


def add(a):
    global floats
    a = np.asarray(a, dtype=np.float64)
    h.update(a.tobytes())
    floats += a.size


rng = np.random.default_rng(7)
kindsets = [(PLAIN, TRUNCATED, LOGISTIC), (PLAIN,), (TRUNCATED,), (LOGISTIC,), (PLAIN, LOGISTIC)]
for i in range(400):
    inst = random_instance(
        rng, dim=int(rng.integers(1, 5)), size=int(rng.integers(1, 9)),
        kinds=kindsets[i % len(kindsets)], integer=bool(i % 7 == 0),
    )
    pts = np.concatenate([inst.grid(5), rng.uniform(inst.lo - 1, inst.hi + 1, size=(64, inst.dim))])
    z = inst.values(pts)
    add(inst.logp(pts))
    add(inst.term_logs(z))
    for arr in (*inst._probs(z), *inst._probs(z[0])):
        add(arr)
    value, grad = inst.logp_and_grad(pts[3])
    add([value])
    add(grad)
    add(sigmoid(np.concatenate([z.ravel(), [0.0, -0.0, 800.0, -800.0, np.nan, np.inf, -np.inf]])))
    if i % 20 == 0:
        found = inst.search(np.random.default_rng(i))
        add([found[0], found[2]])
        add(found[1])
        add(found[3])
print(f"digest {h.hexdigest()[:16]} ({floats} floats)")

from tests.engine.continuous.adversarial import all_cases, reference_loss

start = time.process_time()
h2 = hashlib.sha256()
for case in all_cases():
    h2.update(float(reference_loss(case, grid=401)).hex().encode())
print(f"adversarial {h2.hexdigest()[:16]} cpu {time.process_time() - start:.2f} s")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", default=".", help="comma-separated project roots")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": tree, "OPENBLAS_NUM_THREADS": "1"}
            load = os.getloadavg()[0]
            stamp = time.strftime("%H:%M:%S", time.gmtime())
            out = subprocess.run(  # noqa: S603 - this interpreter, the script's own code
                [sys.executable, "-c", CHILD],
                cwd=tree,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split("\n")
            print(f"round {r + 1} {stamp} load {load:.2f} {tree}: {out[0]}; {out[1]}", flush=True)


if __name__ == "__main__":
    main()

"""A diverged survey's per-group and per-(group, output) work, two trees side by side.

How to run (from the project root; no database)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/group_work.py --trees /work/wt/base,. --rounds 6

Issue 27 item 3 (h/group). What ``survey_runs._decide_rows`` does for the seventh diverging
survey (``grr`` ε = 0.5 on ``region`` after six surveys on region, age, sex, region, age, sex)
once its members are read and sampled: the groups decided (each group's stored state decoded:
:func:`~app.services.survey_groups.group_snapshot`, then decided per domain at once), every
(group, output) drawn advanced (its next state named by content, its loss computed ahead), the
members answered, the chunk's new arrays built. The members' draws are given (the sampling,
which decrypts values, is replaced by the same fixed draws in both trees), and there is no
database (the states are in the run's cache; ``load_states`` is not called).

The input: ``--groups`` decision groups, each a distinct exact history of six ``grr`` outputs
(the population of the bench's ``survey_load.py``: age 0..9, sex 0..1, 15 regions), each group's
state stored as :meth:`LikelihoodState.to_bytes` writes it under its content key (as the service
stores an exact state, ``snapshots.content_key``: one group per content; h/group's first version
keyed each by a hash of its bytes); ``--members`` members per group, each with a history hash
of its own, spread at random over ``--chunks`` chunks of one run (one run
cache), each member drawing a region (the bench population's skew). For every round and tree
(the order alternating by round) a child process with that tree first on ``PYTHONPATH`` runs the
whole survey and prints its thread CPU seconds and a digest of everything the chunks would
write (each member's columns and variant, each stored state's key, bytes and error): the trees
must print the same digest. The table: each tree's median and minimum CPU over the rounds and
the median of the per-round ratios (tree / first tree).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The bench population's domain (``survey_load.py``: age 0..9, sex 0..1, 15 regions), parsed,
#: and the seeded ``rng``: the start of every child here and of ``sample_work.py``'s (which
#: defines ``seed`` before it).
POPULATION = r"""
import json, random

from app.engine.domain import parse_domain
from app.engine.limits import EngineLimits

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 9},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "region", "type": "categorical", "values": [f"r{i}" for i in range(15)]},
    ]
}
domain_text = json.dumps(DOMAIN)
limits = EngineLimits()
domain = parse_domain(DOMAIN, limits=limits)
rng = random.Random(seed)
"""

CHILD = (
    r"""
import hashlib, json, random, sys, time
from collections import defaultdict
from fractions import Fraction

from app.engine.mechanisms import parse_query
from app.services import survey_runs
from app.services.snapshots import EXACT_FORMS, content_key, empty_state, next_history_hash
from app.store.surveys import GroupKey, MemberRow
from app.worker.pool import BoundWorker, WorkerSettings

groups, per_group, chunks, seed = (int(a) for a in sys.argv[1:5])
"""
    + POPULATION
    + r"""mechs = {
    a: parse_query({"mechanism": "grr", "attribute": a, "epsilon": 0.5}, domain, "q", limits=limits)
    for a in ("region", "age", "sex")
}
def draw(attribute):
    if attribute == "region":
        return f"r{min(int(rng.expovariate(0.3)), 14)}"
    return rng.randrange(10 if attribute == "age" else 2)

# distinct exact histories of six outputs (region, age, sex, region, age, sex)
states = {}
seen = set()
while len(states) < groups:
    state = empty_state(domain)
    path = []
    for attribute in ("region", "age", "sex", "region", "age", "sex"):
        mech = mechs[attribute]
        output = mech.parse_output(draw(attribute), "o")
        path.append((attribute, output))
        state = state.applied(mech.term(output))
    data = state.to_bytes()
    if data in seen:
        continue
    seen.add(data)
    key = content_key(domain_text, state)  # as the service keys an exact state
    if key in states:  # the same outputs in another order: the same content, one state
        continue
    states[key] = (data, state.err, state.exact.loss())

keys = []
for n, (key, (data, err, loss)) in enumerate(states.items()):
    keys.append(GroupKey(domain_text, 4.0, "bayesian", "3", None, key, 0, float(loss),
                         float(loss), None, "0", None, None, 0.0, 0.0))
members = []
for n, key in enumerate(keys):
    for m in range(per_group):
        own = next_history_hash(f"h{n}.{m}", "q", "o")
        row_key = key._replace(history_hash=own)
        members.append((rng.randrange(chunks), MemberRow(f"o{n}.{m}", 7, 6, 0, False, "", row_key),
                        draw("region")))
by_chunk = defaultdict(list)
for chunk, row, output in members:
    by_chunk[chunk].append((row, output))

query = {"mechanism": "grr", "attribute": "region", "epsilon": 0.5}
region = mechs["region"]
draws = {}
def sample_groups(accepted, cipher, rows):
    found = [defaultdict(list) for _ in accepted]
    for n, item in enumerate(accepted):
        for row in item.members:
            found[n][region.parse_output(draws[row.id], "o")].append(row)
    return found

class _Crypto:
    @staticmethod
    def active():
        return None

survey_runs._sample_groups = sample_groups
survey_runs.crypto = _Crypto
survey_runs.load_states = lambda conn, keys: {}
worker = BoundWorker(WorkerSettings(processes=0))
EXACT_FORMS.clear()
PHASES = {}
if len(sys.argv) > 5:  # phase timers (each call of these functions timed; a little overhead)
    def timed(name):
        inner = getattr(survey_runs, name)
        PHASES[name] = 0.0
        def wrapper(*args, **kwargs):
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                PHASES[name] += time.thread_time() - start
        setattr(survey_runs, name, wrapper)
    for name in sys.argv[5].split(","):
        timed(name)
from app.bootstrap import tune_collector
tune_collector()  # as a serving process sets its collector
cache = survey_runs.new_run_cache(query, limits)
cache.parsed.states.update({k: (d, e) for k, (d, e, _) in states.items()})
digest = hashlib.sha256()
spent = 0.0
from datetime import UTC, datetime
now = datetime(2026, 11, 27, tzinfo=UTC)
for chunk in sorted(by_chunk):
    rows = [row for row, _ in by_chunk[chunk]]
    draws.update((row.id, output) for row, output in by_chunk[chunk])
    start = time.thread_time()
    work = survey_runs._Chunk(1, chunk, now)
    work = survey_runs._decide_rows(None, rows, cache, worker, work)
    cache.stored_committed(work.gained)
    spent += time.thread_time() - start
    for advanced in sorted(work.advances, key=lambda a: a[0]):
        columns = dict(advanced[3])  # what the member's row is set to (its own hash, if any)
        if len(advanced) > 4 and advanced[4] is not None:
            columns["history_hash"] = advanced[4]
        digest.update(repr((advanced[0], advanced[1], advanced[2], sorted(columns.items()),
                            work.picks[advanced[0]])).encode())
    for v in work.variants:
        digest.update(repr(v).encode())
    for key in sorted(work.gained):
        stored, count = work.gained[key]
        digest.update(repr((key, stored.state, stored.err, count)).encode())
    digest.update(repr(sorted(work.refused.items())).encode())
print(f"{spent:.4f} {digest.hexdigest()[:16]} {len(work.advances)}")
for name, seconds in PHASES.items():
    print(f"  {name} {seconds:.3f}", file=sys.stderr)
"""
)


def run_trees(child: str, argv: list[object], given: str, rounds: int) -> None:
    """Run ``child`` (``python -c``, the tree first on ``PYTHONPATH``, ``argv`` after it) in each
    tree of ``given`` (comma-separated; the first is the base), ``rounds`` times, the order
    alternating by round; print each round's CPU seconds and the table of medians, minimums,
    per-round ratios and digests (the child prints ``SECONDS DIGEST``)."""
    trees = [str(Path(t).resolve()) for t in given.split(",")]
    times: dict[str, list[float]] = {t: [] for t in trees}
    ratios: dict[str, list[float]] = {t: [] for t in trees}
    digests: dict[str, set[str]] = {t: set() for t in trees}
    for r in range(rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        found: dict[str, float] = {}
        for tree in order:
            env = {**os.environ, "PYTHONPATH": tree, "OPENBLAS_NUM_THREADS": "1"}
            out = subprocess.run(  # noqa: S603 - this interpreter, our own script
                [sys.executable, "-c", child, *map(str, argv)],
                env=env,
                cwd=tree,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            found[tree] = float(out[0])
            times[tree].append(found[tree])
            digests[tree].add(out[1])
        for tree in trees:
            ratios[tree].append(found[tree] / found[trees[0]])
        load = os.getloadavg()[0]
        print(
            f"round {r + 1}: "
            + ", ".join(f"{found[t]:.3f}" for t in trees)
            + f" (load {load:.2f})",
            file=sys.stderr,
        )
    print("| tree | median CPU s | min CPU s | median ratio | digest |")
    print("|---|---|---|---|---|")
    for tree in trees:
        print(
            f"| {tree} | {statistics.median(times[tree]):.3f} | {min(times[tree]):.3f} | "
            f"{statistics.median(ratios[tree]):.3f} | {', '.join(sorted(digests[tree]))} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", required=True, help="comma-separated worktrees (first: base)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--groups", type=int, default=10000)
    parser.add_argument("--members", type=int, default=10, help="members per group")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    run_trees(CHILD, [args.groups, args.members, args.chunks, args.seed], args.trees, args.rounds)


if __name__ == "__main__":
    main()

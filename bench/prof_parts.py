"""The single submit's small parts h/prof changed, each timed in two trees side by side.

How to run (from the project root; no database)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/prof_parts.py --trees BASE,NEW --rounds 6

Each part is well under 1% of a submit's server CPU — below what ``bench/http_ab.py`` resolves
on a shared machine — so each is timed alone: for every round and tree (the order alternating
by round) a child process with that tree first on ``PYTHONPATH`` times every case with
``timeit`` (the best of 5 repeats of ``--calls`` calls, thread CPU time) and prints µs per call.
The table gives each tree's median over the rounds and the median of the per-round ratios
(NEW / BASE). The cases, on ``service_load``'s ``grr`` scenario (a 1,000-point domain, ε = 0.5):

* ``body parse``: the body's JSON read by :func:`app.api.deps.parse_json` (the strict reader,
  :func:`app.engine.jsonfields.loads_strict`);
* ``body validate``: the parsed body validated as a ``QueryRequest`` (unchanged: a control);
* ``body written``: a validated ``QueryRequest``'s ``written("query")`` (what the submit route
  hands the service);
* ``grr exact query``: ``mech.exact_query()`` of a kept mechanism (the decision and the record
  each ask for it);
* ``grr term``: ``mech.term(output)`` (the record's; it makes the output's exact term);
* ``fingerprint``: :func:`app.services.reuse.query_hash` of the query (every submit's
  idempotency fingerprint).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, timeit
from app.api.deps import parse_json
from app.engine.domain import parse_domain
from app.engine.mechanisms import parse_query
from app.services.bodies import validated
from app.services.reuse import query_hash
from app.services.schemas import QueryRequest

calls = int(sys.argv[1])
domain = parse_domain({"attributes": [
    {"name": "a", "type": "integer", "low": 0, "high": 9},
    {"name": "b", "type": "integer", "low": 0, "high": 9},
    {"name": "c", "type": "categorical", "values": [f"v{i}" for i in range(10)]},
]}, "domain")
query = {"mechanism": "grr", "attribute": "b", "epsilon": 0.5}
raw = json.dumps({"query": query}).encode()
document = parse_json(raw)
body = validated(QueryRequest, document)
mech = parse_query(query, domain, "query")
cases = {
    "body parse": lambda: parse_json(raw),
    "body validate": lambda: validated(QueryRequest, document),
    "body written": lambda: body.written("query"),
    "grr exact query": lambda: mech.exact_query(),
    "grr term": lambda: mech.term(3),
    "fingerprint": lambda: query_hash(query),
}
out = {}
for name, call in cases.items():
    timer = timeit.Timer(call, timer=time.thread_time)
    timer.timeit(max(1, calls // 10))
    out[name] = 1e6 * min(timer.repeat(5, calls)) / calls
print(json.dumps(out))
"""


def run(tree: Path, calls: int) -> dict[str, float]:
    """One child's µs per call of every case, ``tree``'s code first on the path."""
    import json

    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'clients' / 'python' / 'src'}",
        "OPENBLAS_NUM_THREADS": "1",
    }
    found = subprocess.run(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", CHILD, str(calls)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(found.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", required=True, help="two comma-separated folders: BASE,NEW")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=20000, help="calls per repeat (20000)")
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    if len(trees) != 2:
        parser.error("--trees takes two folders")
    load0 = os.getloadavg()[0]
    times: list[list[dict[str, float]]] = [[], []]
    for r in range(args.rounds):
        for k in (0, 1) if r % 2 == 0 else (1, 0):
            times[k].append(run(trees[k], args.calls))
    load1 = os.getloadavg()[0]
    names = [t.name for t in trees]
    print(f"prof_parts: {args.rounds} rounds, trees alternated; load {load0:.2f} -> {load1:.2f}")
    print(f"{'case':<18} {names[0] + ' µs':>12} {names[1] + ' µs':>12}  ratio (per round, median)")
    for case in times[0][0]:
        a = [t[case] for t in times[0]]
        b = [t[case] for t in times[1]]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        print(
            f"{case:<18} {statistics.median(a):>12.3f} {statistics.median(b):>12.3f}"
            f"  {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The single submit's likelihood-state work, part by part, in µs per submit (issue 27 item 1).

How to run (from the project root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/state_parts.py --trees BASE,NEW --rounds 6
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/state_parts.py --fetch --rounds 4 \
        --db-prefix gk_state_

**Engine parts** (no database): for every round and tree (the order alternating by round) a
child process with that tree first on ``PYTHONPATH`` builds an object of ``service_load``'s
``grr`` scenario (1,000 points, ``grr`` ε = 0.5 on ``a``, ``b``, ``c`` in turn, budget 10,000:
basic composition decides) with ``--history`` accepted queries, stores its state as a submit
does, and times what a submit does with the state — each case ``timeit``'s best of 5 repeats
of ``--calls`` calls, thread CPU time:

* ``from_bytes``: the stored bytes to a :class:`LikelihoodState` (its exact form found in
  ``EXACT_FORMS``, as after the object's previous submit in the same process);
* ``decide``: :func:`app.engine.pipeline.evaluate` (basic composition certifies);
* ``record``: :func:`app.engine.pipeline.record` (the term added, renormalised; the new form);
* ``+ loss``, ``+ content key``, ``+ to_bytes``: ``record`` and then the new state's exact
  loss, its content key (the canonical bytes hashed) and its stored bytes, each on top of the
  one before (a new form each call: these are computed once per form and kept on it);
* ``advance``: ``record`` and :func:`app.services.snapshots.advance` (what a submit stores);
* ``state path``: all of it, as a submit runs it (``from_bytes`` .. ``remember``).

The table gives each tree's median over the rounds and the median of the per-round ratios.

``--fetch`` (PostgreSQL, a scratch database ``<prefix>parts`` dropped at the end): the stored
state read as the submit's load reads it — an object row joined to its ``likelihood_states``
row (lz4, the service's states) — in psycopg's text and binary result formats, and with the
array left out (``NULL``), alternating; per read, the client's CPU (``process_time``) and the
server backend's (``/proc/PID/stat``, clock ticks over ``--reads`` reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SETUP = r"""
import json, random, sys, time, timeit
from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState
from app.engine.mechanisms import parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record
from app.services import snapshots as S

history = int(sys.argv[2])
domain = parse_domain({"attributes": [
    {"name": "a", "type": "integer", "low": 0, "high": 9},
    {"name": "b", "type": "integer", "low": 0, "high": 9},
    {"name": "c", "type": "categorical", "values": [f"v{i}" for i in range(10)]},
]}, "domain")
domain_text = json.dumps({"attributes": "grr scenario"})
mechs = [parse_query({"mechanism": "grr", "attribute": a, "epsilon": 0.5}, domain, "q")
         for a in "abc"]
rng = random.Random(1)
snap = ObjectSnapshot.empty(domain, budget=10000.0, filter=FilterKind.BAYESIAN)
for i in range(history):
    m = mechs[i % 3]
    snap = record(snap, m, rng.randrange(10), evaluate(snap, m))
stored = snap.state.to_bytes()
err = snap.state.err
S.EXACT_FORMS.remember(snap.state)  # the object's previous submit in this process
mech = mechs[history % 3]


def load():
    return LikelihoodState.from_bytes(domain, stored, err, S.EXACT_FORMS)


def snapshot(state):
    return ObjectSnapshot(domain, 10000.0, FilterKind.BAYESIAN, snap.basic_total, state)


loaded = snapshot(load())
decision = evaluate(loaded, mech)


def recorded():
    return record(loaded, mech, 3, decision)


def advance(after):
    return S.advance(after, domain_text=domain_text, history_hash="0" * 32, query_text="q",
                     output_text="3")


def path():
    before = snapshot(load())
    after = record(before, mech, 3, evaluate(before, mech))
    advance(after)
    S.EXACT_FORMS.remember(after.state)


def with_loss():
    after = recorded()
    after.state.exact.loss()
    return after


def with_key():
    after = with_loss()
    S.content_key(domain_text, after.state)
    return after


cases = {
    "from_bytes": load,
    "decide": lambda: evaluate(loaded, mech),
    "record": recorded,
    "+ loss": with_loss,
    "+ content key": with_key,
    "+ to_bytes": lambda: with_key().state.to_bytes(),
    "advance (record +)": lambda: advance(recorded()),
    "state path": path,
}
"""

CHILD = (
    SETUP
    + r"""
calls = int(sys.argv[1])
out = {}
for name, call in cases.items():
    timer = timeit.Timer(call, timer=time.thread_time)
    timer.timeit(max(1, calls // 10))
    out[name] = 1e6 * min(timer.repeat(5, calls)) / calls
print(json.dumps(out))
"""
)


def run(tree: Path, calls: int, history: int) -> dict[str, float]:
    """One child's µs per call of every case, ``tree``'s code first on the path."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'clients' / 'python' / 'src'}",
        "OPENBLAS_NUM_THREADS": "1",
    }
    found = subprocess.run(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", CHILD, str(calls), str(history)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(found.stdout.strip().splitlines()[-1])
    return result


def parts(args: argparse.Namespace) -> None:
    """The engine parts, two trees side by side."""
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    if len(trees) != 2:
        raise SystemExit("--trees takes two folders")
    load0 = os.getloadavg()[0]
    times: list[list[dict[str, float]]] = [[], []]
    for r in range(args.rounds):
        for k in (0, 1) if r % 2 == 0 else (1, 0):
            times[k].append(run(trees[k], args.calls, args.history))
    load1 = os.getloadavg()[0]
    names = [t.name for t in trees]
    print(
        f"state_parts: {args.rounds} rounds, trees alternated, history {args.history}; "
        f"load {load0:.2f} -> {load1:.2f}"
    )
    print(f"{'case':<20} {names[0] + ' µs':>12} {names[1] + ' µs':>12}  ratio (per round, median)")
    for case in times[0][0]:
        a = [t[case] for t in times[0]]
        b = [t[case] for t in times[1]]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        print(
            f"{case:<20} {statistics.median(a):>12.3f} {statistics.median(b):>12.3f}"
            f"  {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def fetch(args: argparse.Namespace) -> None:
    """The stored state read in text and binary format (and without it), alternating."""
    import psycopg

    tree = ROOT
    env_path = f"{tree}{os.pathsep}{tree / 'clients' / 'python' / 'src'}"
    sys.path[:0] = env_path.split(os.pathsep)
    states: list[tuple[bytes, float]] = json.loads(
        subprocess.run(  # noqa: S603 - our own interpreter and code
            [
                sys.executable,
                "-c",
                SETUP
                + "\nout = []\ns = snap\n"
                + "for i in range(20):\n"
                + "    m = mechs[i % 3]\n"
                + "    s = record(s, m, rng.randrange(10), evaluate(s, m))\n"
                + "    out.append((s.state.to_bytes().hex(), s.state.err))\n"
                + "print(json.dumps(out))\n",
                "1",
                str(args.history),
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": env_path, "OPENBLAS_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    name = f"{args.db_prefix}parts"
    admin = f"host=127.0.0.1 user={args.pg_user} dbname=test"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(f"host=127.0.0.1 user={args.pg_user} dbname={name}") as conn:
            conn.autocommit = True
            conn.execute(
                "CREATE TABLE t (hash text PRIMARY KEY, state bytea COMPRESSION lz4, err float8)"
            )
            conn.execute("CREATE TABLE o (id text PRIMARY KEY, state_hash text)")
            for i, (data, err) in enumerate(states):
                conn.execute(
                    "INSERT INTO t VALUES (%s, %s, %s)", (f"h{i}", bytes.fromhex(data), err)
                )
                conn.execute("INSERT INTO o VALUES (%s, %s)", (f"o{i}", f"h{i}"))
            size = conn.execute(
                "SELECT avg(length(state)), avg(pg_column_size(state)) FROM t"
            ).fetchone()
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            queries = {
                "array": "SELECT o.id, s.state, s.err FROM o LEFT JOIN t s "
                "ON s.hash = o.state_hash WHERE o.id = %(id)s",
                "no array": "SELECT o.id, NULL::bytea, s.err FROM o LEFT JOIN t s "
                "ON s.hash = o.state_hash WHERE o.id = %(id)s",
            }
            found: dict[tuple[str, str], list[tuple[float, float]]] = {}
            load0 = os.getloadavg()[0]
            for r in range(args.rounds):
                order = [(q, f) for q in queries for f in ("text", "binary")]
                for query, form in order if r % 2 == 0 else order[::-1]:
                    cursor = conn.cursor(binary=form == "binary")
                    ticks, cpu = _ticks(pid), time.process_time()
                    for k in range(args.reads):
                        cursor.execute(queries[query], {"id": f"o{k % 20}"}, prepare=True)
                        cursor.fetchone()
                    client = (time.process_time() - cpu) / args.reads * 1e6
                    server = (_ticks(pid) - ticks) / os.sysconf("SC_CLK_TCK") / args.reads * 1e6
                    found.setdefault((query, form), []).append((client, server))
            load1 = os.getloadavg()[0]
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    assert size is not None  # noqa: S101
    print(
        f"state_parts --fetch: {args.rounds} rounds x {args.reads} reads, history "
        f"{args.history}, array {float(size[0]):.0f} B ({float(size[1]):.0f} B stored, lz4); "
        f"load {load0:.2f} -> {load1:.2f}"
    )
    print(
        f"{'read':<20} {'client µs/read (median, range)':>32} "
        f"{'server µs/read (median, range)':>32}"
    )
    for (query, form), values in found.items():
        client = [c for c, _ in values]
        server = [s for _, s in values]
        print(
            f"{query + ', ' + form:<20} {statistics.median(client):>10.1f} "
            f"({min(client):.1f}-{max(client):.1f}){'':>8} {statistics.median(server):>10.1f} "
            f"({min(server):.1f}-{max(server):.1f})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", help="two comma-separated folders: BASE,NEW (engine parts)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=5000, help="calls per repeat (5000)")
    parser.add_argument("--history", type=int, default=300, help="accepted queries first (300)")
    parser.add_argument("--fetch", action="store_true", help="the stored state's read instead")
    parser.add_argument("--reads", type=int, default=5000, help="reads per round (--fetch)")
    parser.add_argument("--db-prefix", default="gk_bench_", help="scratch database's prefix")
    parser.add_argument("--pg-user", default="postgres")
    args: Any = parser.parse_args(argv)
    if args.fetch:
        fetch(args)
    elif args.trees:
        parts(args)
    else:
        parser.error("--trees BASE,NEW or --fetch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

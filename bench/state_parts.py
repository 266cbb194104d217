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

``--fetch`` (PostgreSQL, a scratch database ``<prefix>parts`` dropped at the end): five objects
of the scenario with ``--history`` accepted queries each (through the app, in process), then the
submit's own load statement (:data:`app.store.objects._LOAD_FOR_SUBMIT_PG`, the row and its
likelihood array) run ``--reads`` times per variant and round — psycopg's text and binary result
formats, with the array and with ``NULL`` in its place — the variants' order alternating by
round; per read, this process's CPU (``process_time``) and its PostgreSQL backend's
(``/proc/PID/stat``, clock ticks).

``--instructions CASES`` (valgrind): the named cases counted in instructions (callgrind's
``Ir``), each tree: a child running a case ``--repeat`` times less one running none, so the
interpreter's start, the imports and the set-up cancel out; instruction counts do not move
with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
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

COUNTED = (
    SETUP
    + r"""
call = cases[sys.argv[3]]
for _ in range(int(sys.argv[1])):
    call()
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


def counted(tree: Path, case: str, repeat: int, history: int) -> int:
    """Instructions (callgrind's ``Ir``) of a child running ``case`` ``repeat`` times."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory() as where:
        out = Path(where, "callgrind.out")
        subprocess.run(  # noqa: S603 - our own arguments
            [
                valgrind,
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-c",
                COUNTED,
                str(repeat),
                str(history),
                case,
            ],
            cwd=tree,
            env={
                **os.environ,
                "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'clients' / 'python' / 'src'}",
                "OPENBLAS_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0",
            },
            check=True,
            capture_output=True,
        )
        summary = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if summary is None:
        raise RuntimeError(f"{tree}: no instruction total in callgrind's output")
    return int(summary.group(1))


def instructions(args: argparse.Namespace) -> None:
    """Instructions per call of the named cases, each tree: a run with, one without them."""
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    load0 = os.getloadavg()[0]
    found: dict[tuple[int, str], float] = {}
    for k, tree in enumerate(trees):
        idle = counted(tree, "from_bytes", 0, args.history)
        for case in args.instructions.split(","):
            total = counted(tree, case, args.repeat, args.history)
            found[k, case] = (total - idle) / args.repeat
    load1 = os.getloadavg()[0]
    names = [t.name for t in trees]
    print(
        f"state_parts --instructions: callgrind, {args.repeat} calls a run less a run of none, "
        f"history {args.history}; load {load0:.2f} -> {load1:.2f}"
    )
    print(f"{'case':<20} " + " ".join(f"{n + ' instr.':>16}" for n in names) + "  ratio")
    for case in args.instructions.split(","):
        values = [found[k, case] for k in range(len(trees))]
        ratio = f"  {values[-1] / values[0]:.3f}" if len(values) == 2 else ""
        print(f"{case:<20} " + " ".join(f"{v:>16,.0f}" for v in values) + ratio)


def fetch(args: argparse.Namespace) -> None:
    """The submit's load (its own statement) in text and binary format, with and without the
    array, alternating (a child process: this tree's code, a scratch database)."""
    name = f"{args.db_prefix}parts"
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'clients' / 'python' / 'src'}{os.pathsep}"
        f"{ROOT / 'bench'}",
        "OPENBLAS_NUM_THREADS": "1",
    }
    found = subprocess.run(  # noqa: S603 - our own interpreter and code
        [
            sys.executable,
            "-c",
            FETCH,
            args.admin_url,
            name,
            str(args.history),
            str(args.rounds),
            str(args.reads),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise SystemExit(found.stderr[-3000:])
    print(found.stdout.strip())


FETCH = r"""
import dataclasses, os, random, secrets, statistics, sys, tempfile, time
import psycopg
from fastapi.testclient import TestClient
from service_load import GRR_DOMAIN, grr_value
from app.bootstrap import create_app
from app.db.migrate import upgrade
from app.settings import Settings
from app.store import compiled
from app.store import objects as O

admin_url, name, history, rounds, reads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
url = admin_url.rsplit("/", 1)[0] + "/" + name
with psycopg.connect(admin_url, autocommit=True) as c:
    c.execute(f'DROP DATABASE IF EXISTS "{name}"')
    c.execute(f'CREATE DATABASE "{name}"')
keys = tempfile.TemporaryDirectory()
try:
    upgrade(url)
    admin = "b" * 40
    app = create_app(Settings(database_url=url, gatekeeper_bootstrap_admin_key=admin,
                              gatekeeper_encryption_key_file=keys.name + "/key",
                              bound_processes=0))
    with TestClient(app) as client:
        headers = {"Authorization": "Bearer " + admin}
        r = client.post("/v1/keys", headers=headers, json={"role": "analyst"})
        r.raise_for_status()
        analyst = {"Authorization": "Bearer " + r.json()["key"]}
        ids = [f"parts-{n}" for n in range(5)]
        for n, oid in enumerate(ids):
            body = {"id": oid, "domain": GRR_DOMAIN, "value": grr_value(random.Random(n)),
                    "budget": {"epsilon": 10000}, "filter": "bayesian"}
            client.post("/v1/objects", headers=headers, json=body).raise_for_status()
        for i in range(history):
            query = {"mechanism": "grr", "attribute": "abc"[i % 3], "epsilon": 0.5}
            for oid in ids:
                r = client.post(f"/v1/objects/{oid}/queries", json={"query": query},
                                headers={**analyst, "Idempotency-Key": secrets.token_hex(8)})
                assert r.status_code == 201, r.text
        statement = O._LOAD_FOR_SUBMIT_PG
        no_array = dataclasses.replace(
            statement, text=statement.text.replace("likelihood_states.state,", "NULL::bytea,"))
        variants = [("array, text", statement, False), ("array, binary", statement, True),
                    ("no array, text", no_array, False), ("no array, binary", no_array, True)]
        with app.state.runtime.engine.connect() as conn:
            raw = compiled.raw_connection(conn)
            pid = raw.execute("SELECT pg_backend_pid()").fetchone()[0]
            size = raw.execute("SELECT avg(length(state)), avg(pg_column_size(state)) "
                               "FROM likelihood_states s JOIN objects o ON o.state_hash = s.hash"
                               ).fetchone()

            def ticks():
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                return int(fields[11]) + int(fields[12])

            found = {}
            load0 = os.getloadavg()[0]
            for r in range(rounds):
                for label, st, binary in variants if r % 2 == 0 else variants[::-1]:
                    cpu, t0 = time.process_time(), ticks()
                    for k in range(reads):
                        compiled.fetch_one(conn, st, {"object_id": ids[k % 5], "key": None},
                                           binary=binary)
                    found.setdefault(label, []).append((
                        (time.process_time() - cpu) / reads * 1e6,
                        (ticks() - t0) / os.sysconf("SC_CLK_TCK") / reads * 1e6))
            load1 = os.getloadavg()[0]
    print(f"state_parts --fetch: the submit's load (app.store.objects), {rounds} rounds x "
          f"{reads} reads, variants alternated; objects with {history} accepted grr queries, "
          f"array {float(size[0]):.0f} B ({float(size[1]):.0f} B stored); "
          f"load {load0:.2f} -> {load1:.2f}")
    print(f"{'load':<18} {'client µs/read: median (range)':>32} "
          f"{'PostgreSQL backend µs/read':>30}")
    for label, values in found.items():
        client_us = [c for c, _ in values]
        server_us = [b for _, b in values]
        print(f"{label:<18} {statistics.median(client_us):>12.1f} "
              f"({min(client_us):.1f}-{max(client_us):.1f}){'':>6} "
              f"{statistics.median(server_us):>12.1f} ({min(server_us):.1f}-{max(server_us):.1f})")
finally:
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    keys.cleanup()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", help="two comma-separated folders: BASE,NEW (engine parts)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=5000, help="calls per repeat (5000)")
    parser.add_argument("--history", type=int, default=300, help="accepted queries first (300)")
    parser.add_argument("--fetch", action="store_true", help="the stored state's read instead")
    parser.add_argument(
        "--instructions",
        help="comma-separated cases counted in instructions under callgrind, each tree",
    )
    parser.add_argument("--repeat", type=int, default=200, help="calls a run (--instructions)")
    parser.add_argument("--reads", type=int, default=4000, help="reads per round (--fetch)")
    parser.add_argument("--db-prefix", default="gk_bench_", help="scratch database's prefix")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "GATEKEEPER_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    args: Any = parser.parse_args(argv)
    if args.fetch:
        fetch(args)
    elif args.instructions and args.trees:
        instructions(args)
    elif args.trees:
        parts(args)
    else:
        parser.error("--trees BASE,NEW or --fetch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

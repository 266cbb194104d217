"""Reads of stored likelihood arrays, two trees side by side: service and PostgreSQL CPU per read.

How to run (from the project root, PostgreSQL reachable; Redis for the set-up's app)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/state_loads.py --trees BASE,NEW --blocks 8

A scratch database (``--db-prefix`` and a random suffix, dropped at the end) gets ``--objects``
objects of ``service_load``'s ``grr`` scenario (a 1,000-point domain, labelled ``team: bench``)
with ``--history`` accepted queries each, through the app of this tree (in process), and then
``--states`` more stored arrays (COPY): each object's array with a distinct 8-byte tail, so
each is as large and as compressible (lz4, by TOAST) as a real one, none named by an object.

Each tree has a child process of its own (that tree first on ``PYTHONPATH``, one connection
whose ``application_name`` names the tree), and runs each case's calls when asked:

* ``load_states N``: :func:`app.store.states.load_states` of ``N`` keys (a survey chunk's
  read of its groups' arrays; ``N`` = 1, 100, 10,000), the keys moving on every call;
* ``verify state``: :func:`app.store.verify.likelihood_state` (``gatekeeper verify``'s read
  of one array met again under another history);
* ``load_state``, ``load_state scoped``: :func:`app.store.objects.load_state` (a dry-run's
  load: the object's row and its array), unscoped and in a project's scope;
* ``load_for_submit scoped``: a project key's single submit's load.

For ``--blocks`` blocks, each case, the trees run in turn (the order alternating by block).
A child reports, per case and block, its CPU (``time.process_time``) and its backend's
(``/proc/PID/stat``, clock ticks of 10 ms: summed over the blocks). The table: rows read per
call, each tree's median service µs per call and mean backend µs per call, and the median of the
per-block ratios of service CPU (NEW / BASE). The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import service_load as sl  # type: ignore[import-not-found]  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
ADMIN_KEY = "bench-admin-" + "c" * 40
SCOPE = [("team", "bench")]
#: Each case: calls per block (about 0.2-0.5 s of one tree's CPU on this machine).
CASES = {
    "load_states 1": 1500,
    "load_states 100": 120,
    "load_states 10000": 2,
    "verify state": 1500,
    "load_state": 1500,
    "load_state scoped": 1500,
    "load_for_submit scoped": 1500,
}


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def child(args: argparse.Namespace) -> None:
    """In the tree's code: one connection; answer ``CASE`` lines with one JSON line each."""
    from app.db.session import make_engine
    from app.store import verify
    from app.store.objects import load_for_submit, load_state
    from app.store.states import load_states

    engine = make_engine(args.url)
    keys = json.loads(Path(args.keys).read_text())
    ids: list[str] = keys.pop("ids")
    hashes: list[str] = keys.pop("hashes")
    done = {"calls": 0}

    def run(conn: Any, case: str, calls: int) -> int:
        """``calls`` calls of ``case``; the rows (arrays) they read."""
        rows = 0
        for _ in range(calls):
            n = done["calls"]
            done["calls"] += 1
            oid = ids[n % len(ids)]
            if case.startswith("load_states"):
                size = int(case.split()[1])
                start = (n * size) % len(hashes)
                wanted = {hashes[(start + j) % len(hashes)] for j in range(size)}
                rows += len(load_states(conn, wanted))
            elif case == "verify state":
                rows += verify.likelihood_state(conn, key=hashes[n % len(hashes)]) is not None
            elif case == "load_state":
                found = load_state(conn, object_id=oid)
                rows += found is not None and found.state is not None
            elif case == "load_state scoped":
                found = load_state(conn, object_id=oid, scope=SCOPE)
                rows += found is not None and found.state is not None
            elif case == "load_for_submit scoped":
                got = load_for_submit(conn, object_id=oid, key=None, scope=SCOPE)
                rows += got is not None and got[0].state is not None
            else:
                raise ValueError(case)
        return rows

    with engine.connect() as conn:
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        for case in CASES:  # warm: statements prepared, processors made
            run(conn, case, 3)
        conn.rollback()
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            case, _, calls = line.strip().rpartition(" ")
            if not case:
                break
            cpu0, pg0 = time.process_time(), _ticks(pid)
            rows = run(conn, case, int(calls))
            cpu1, pg1 = time.process_time(), _ticks(pid)
            conn.rollback()  # reads only: end the transaction the block opened
            print(json.dumps({"cpu": cpu1 - cpu0, "pg": (pg1 - pg0) / CLK_TCK, "rows": rows}))
            sys.stdout.flush()
    engine.dispose()


def setup(args: argparse.Namespace, url: str, keys_dir: str) -> dict[str, list[str]]:
    """The objects (through this tree's app) and the extra stored arrays; their ids and keys."""
    import random

    import psycopg
    from fastapi.testclient import TestClient
    from service_load import GRR_DOMAIN, grr_value  # type: ignore[import-not-found]

    from app.bootstrap import create_app
    from app.settings import Settings

    app = create_app(
        Settings(
            database_url=url,
            redis_url=args.redis,
            gatekeeper_bootstrap_admin_key=ADMIN_KEY,
            gatekeeper_encryption_key_file=keys_dir + "/key",
            bound_processes=0,
        )
    )
    rng = random.Random(args.seed)
    ids = [f"loads-{n}" for n in range(args.objects)]
    with TestClient(app) as client:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        r = client.post("/v1/keys", headers=admin, json={"role": "analyst"})
        r.raise_for_status()
        analyst = {"Authorization": "Bearer " + r.json()["key"]}
        for oid in ids:
            body = {
                "id": oid,
                "domain": GRR_DOMAIN,
                "value": grr_value(rng),
                "budget": {"epsilon": 10_000},
                "filter": "bayesian",
                "labels": dict(SCOPE),
            }
            client.post("/v1/objects", headers=admin, json=body).raise_for_status()
        for i in range(args.history):
            query = {"mechanism": "grr", "attribute": "abc"[i % 3], "epsilon": 0.5}
            for oid in ids:
                r = client.post(
                    f"/v1/objects/{oid}/queries",
                    json={"query": query},
                    headers={**analyst, "Idempotency-Key": secrets.token_hex(8)},
                )
                assert r.status_code == 201, r.text  # noqa: S101 - a bench's own check
    with psycopg.connect(url, autocommit=True) as conn:
        named = conn.execute(
            "SELECT s.state, s.err FROM likelihood_states s JOIN objects o "
            "ON o.state_hash = s.hash ORDER BY o.id"
        ).fetchall()
        hashes = [f"loads{n:011d}" for n in range(args.states)]
        with (
            conn.cursor() as cursor,
            cursor.copy(
                "COPY likelihood_states (hash, state, err) FROM STDIN (FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(["text", "bytea", "float8"])
            for n, key in enumerate(hashes):
                state, err = named[n % len(named)]
                copy.write_row((key, bytes(state) + n.to_bytes(8, "big"), err))
        conn.execute("VACUUM ANALYZE likelihood_states")
        size = conn.execute(
            "SELECT avg(length(state)), avg(pg_column_size(state)) FROM likelihood_states"
        ).fetchone()
    assert size is not None  # noqa: S101
    print(
        f"state_loads: {args.objects} objects x {args.history} accepted grr queries, "
        f"{args.states} more arrays; array {float(size[0]):.0f} B ({float(size[1]):.0f} B stored)"
    )
    return {"ids": ids, "hashes": hashes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", help="two comma-separated source folders: BASE,NEW")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per case and tree (8)")
    parser.add_argument("--scale", type=float, default=1.0, help="calls per block x this")
    parser.add_argument("--objects", type=int, default=5)
    parser.add_argument("--history", type=int, default=30, help="accepted queries each (30)")
    parser.add_argument("--states", type=int, default=10_000, help="more arrays (10,000)")
    parser.add_argument("--cases", help="comma-separated subset of the cases")
    parser.add_argument("--seed", type=int, default=1)
    sl.add_scratch_args(parser, db_prefix="state_loads_")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import psycopg

    sys.path.insert(0, str(ROOT))
    from app.db.migrate import upgrade

    trees = [Path(t).resolve() for t in (args.trees or "").split(",") if t]
    if len(trees) != 2:
        parser.error("--trees takes two folders")
    cases = {
        case: max(1, round(calls * args.scale))
        for case, calls in CASES.items()
        if not args.cases or case in args.cases.split(",")
    }
    name = args.db_prefix + secrets.token_hex(4)
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    children: list[subprocess.Popen[str]] = []
    scratch = tempfile.TemporaryDirectory(prefix="state_loads_")
    try:
        upgrade(url)
        keys = setup(args, url, scratch.name)
        keys_file = Path(scratch.name) / "keys.json"
        keys_file.write_text(json.dumps(keys))
        for i, tree in enumerate(trees):
            env = {
                **os.environ,
                "PYTHONPATH": f"{tree}:{tree / 'clients' / 'python' / 'src'}",
                "OPENBLAS_NUM_THREADS": "1",
                "GATEKEEPER_ENCRYPTION_KEY_FILE": str(Path(scratch.name) / "key"),
            }
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                *("--child", "--url", f"{url}?application_name=state_loads_{i}"),
                *("--keys", str(keys_file)),
            ]
            children.append(
                subprocess.Popen(  # noqa: S603 - our own script
                    command,
                    cwd=tree,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for process in children:
            assert process.stdout is not None  # noqa: S101 - a pipe was asked for
            line = process.stdout.readline()
            while line and not line.startswith("{"):
                line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"a child failed (exit {process.wait()})")
        load0 = Path("/proc/loadavg").read_text().split()[0]
        t0 = time.strftime("%H:%M:%S", time.gmtime())
        results: dict[str, list[list[dict[str, float]]]] = {c: [[], []] for c in cases}
        for b in range(args.blocks):
            for case, calls in cases.items():
                for i in (0, 1) if b % 2 == 0 else (1, 0):
                    process = children[i]
                    assert process.stdin is not None  # noqa: S101
                    assert process.stdout is not None  # noqa: S101
                    process.stdin.write(f"{case} {calls}\n")
                    process.stdin.flush()
                    results[case][i].append(json.loads(process.stdout.readline()))
        load1 = Path("/proc/loadavg").read_text().split()[0]
        t1 = time.strftime("%H:%M:%S", time.gmtime())
        print(
            f"state_loads: {args.blocks} blocks per case, trees alternated; "
            f"{t0}-{t1} UTC, load {load0} -> {load1}"
        )
        a, b_ = trees[0].name, trees[1].name
        print(
            f"{'case':<24} {'rows/call':>9} {a + ' µs':>12} {b_ + ' µs':>12} "
            f"{'pg ' + a:>10} {'pg ' + b_:>10} {'ratio':>7}"
        )
        for case, calls in cases.items():
            per = []
            for rows in results[case]:
                service = statistics.median(1e6 * r["cpu"] / calls for r in rows)
                backend = 1e6 * sum(r["pg"] for r in rows) / (calls * len(rows))
                per.append((service, backend, rows[0]["rows"] / calls))
            ratios = [
                y["cpu"] / x["cpu"] for x, y in zip(*results[case], strict=True) if x["cpu"] > 0
            ]
            print(
                f"{case:<24} {per[0][2]:>9,.0f} {per[0][0]:>12,.1f} {per[1][0]:>12,.1f} "
                f"{per[0][1]:>10,.1f} {per[1][1]:>10,.1f} {statistics.median(ratios):>7.3f}"
            )
    finally:
        for process in children:
            if process.stdin is not None and not process.stdin.closed:
                try:
                    process.stdin.write("\n")
                    process.stdin.close()
                except BrokenPipeError:
                    pass
            process.wait(timeout=60)
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

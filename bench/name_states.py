"""A survey chunk's new likelihood states stored two ways, side by side (issue 27 item 3).

How to run (from the project root, PostgreSQL reachable)::

    .venv/bin/python bench/name_states.py                       # 500 and 2,000 states, 15 rounds
    .venv/bin/python bench/name_states.py --sizes 2000 --rounds 30 --db-prefix hs_

:func:`app.store.states.name_states` inserts a chunk's new states or locks the stored rows of
their keys. Two forms of it on PostgreSQL: ``each`` (``_name_each``: one ``executemany`` of the
insert-or-lock statement, a parameter set and an execution per state) and ``copy``
(``_name_copied``: ``COPY`` binary into a temporary table, then one ``INSERT ... SELECT ... ON
CONFLICT``). Per round and size, both run on the same fresh database, in alternating order,
each in its own transaction (commit included), on rows of the shape a ``grr`` survey of
``bench/survey_load.py`` stores: a 10×2×15 ``float64`` log-likelihood array of a few distinct
values (what TOAST compresses) and an exact form's bytes, ``--existing`` of the keys stored
beforehand (those rows are only locked). With ``--known N``, also per round: N stored keys
locked ``FOR KEY SHARE`` (``lock``: ``name_states``' known keys, what a chunk does for the states
an earlier chunk stored) against the same keys only read (``read``: a plain ``SELECT``).
Printed per form and size: the medians of the client's thread CPU and wall time, and the
database backend's CPU (from ``/proc``, its clock ticks summed
over the rounds: 10 ms each) per call.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine.exact import MAGIC  # noqa: E402
from bench.service_load import fresh_database  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def state_bytes(rng: random.Random) -> bytes:
    """A stored state's bytes as a 3-attribute ``grr`` history makes them (sizes and repeats)."""
    logp = np.zeros((10, 2, 15))
    for axis, size in enumerate(logp.shape):
        counts = np.array([rng.randrange(4) for _ in range(size)], dtype=float)
        shape = [1, 1, 1]
        shape[axis] = size
        logp = logp + (counts * 0.5).reshape(shape)
    logp -= logp.max()
    exact = bytes(rng.randrange(4) for _ in range(27)) + b"\x00" * 40
    return logp.astype("<f8").tobytes() + MAGIC + exact


def backend_cpu(pid: int) -> float:
    """The backend's user + system CPU seconds (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500,2000", help="states per call (500,2000)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--existing", type=float, default=0.1, help="keys stored before (0.1)")
    parser.add_argument(
        "--known",
        type=int,
        default=0,
        help="also lock N stored keys FOR KEY SHARE (name_states' known) against reading them",
    )
    parser.add_argument("--db-prefix", default="gk_bench_")
    args = parser.parse_args(argv)
    from sqlalchemy import text

    from app.db.session import make_engine
    from app.store import states as store
    from app.store import transaction

    def lock(conn: Any, rows: list[tuple[str, bytes, float]]) -> None:
        assert not store.name_states(conn, [], [k for k, _, _ in rows])  # noqa: S101

    def read(conn: Any, rows: list[tuple[str, bytes, float]]) -> None:
        keys = [k for k, _, _ in rows]
        found = conn.execute(
            text("SELECT hash FROM likelihood_states WHERE hash = ANY(string_to_array(:k, :n))"),
            {"k": "\n".join(keys), "n": "\n"},
        ).all()
        assert len(found) == len(keys)  # noqa: S101

    forms = {"each": store._name_each, "copy": store._name_copied}
    known = {"lock": lock, "read": read}
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = random.Random(27)
    pool = [state_bytes(rng) for _ in range(4000)]
    print(f"load {os.getloadavg()}, {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    with fresh_database(prefix=args.db_prefix) as (url, _name):
        engine = make_engine(url, pool_size=1)
        results: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
        stored: list[tuple[str, bytes, float]] = []
        for r in range(args.rounds):
            if args.known:
                for name in list(known) if r % 2 else list(known)[::-1]:
                    if len(stored) < args.known:
                        break
                    rows = rng.sample(stored, args.known)
                    with transaction(engine) as conn:
                        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                    pg0, wall0 = backend_cpu(pid), time.perf_counter()
                    cpu0 = time.thread_time()
                    with transaction(engine) as conn:
                        known[name](conn, rows)
                    cpu = time.thread_time() - cpu0
                    wall = time.perf_counter() - wall0
                    pg = backend_cpu(pid) - pg0
                    results.setdefault((args.known, name), []).append((cpu, wall, pg))
            for size in sizes:
                order = list(forms) if (r + size) % 2 else list(forms)[::-1]
                for name in order:
                    keys = [secrets.token_hex(16) for _ in range(size)]
                    rows = [(k, rng.choice(pool), 1e-12) for k in keys]
                    old = rows[: int(size * args.existing)]
                    with transaction(engine) as conn:
                        store._name_each(conn, [(k, b"old" + s, e) for k, s, e in old])
                    rng.shuffle(rows)
                    with transaction(engine) as conn:
                        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                    pg0, wall0 = backend_cpu(pid), time.perf_counter()
                    cpu0 = time.thread_time()
                    with transaction(engine) as conn:
                        forms[name](conn, rows)
                    cpu = time.thread_time() - cpu0
                    wall = time.perf_counter() - wall0
                    pg = backend_cpu(pid) - pg0
                    results.setdefault((size, name), []).append((cpu, wall, pg))
                    stored.extend(rows[int(size * args.existing) :])
        engine.dispose()
    print(f"load {os.getloadavg()}, {time.strftime('%H:%M:%S', time.gmtime())} UTC")
    print()
    print(
        f"| states per call | form | client CPU ms (median of {args.rounds}) | wall ms (median) "
        "| PostgreSQL CPU ms (mean) |"
    )
    print("|---:|---|---:|---:|---:|")
    lines = [(size, name) for size in sizes for name in forms]
    lines += [(args.known, name) for name in known if (args.known, name) in results]
    for size, name in lines:
        found = results[(size, name)]
        cpu = statistics.median(c for c, _, _ in found) * 1000
        wall = statistics.median(w for _, w, _ in found) * 1000
        pg = sum(p for _, _, p in found) / len(found) * 1000
        print(f"| {size:,} | {name} | {cpu:.1f} | {wall:.1f} | {pg:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

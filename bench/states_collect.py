"""The collection of unnamed likelihood states (``app.store.states.collect_unnamed``), timed.

Usage::

    .venv/bin/python bench/states_collect.py --objects 1000000 --states 20000 --unnamed 10000

A fresh PostgreSQL database (bench/service_load.py's ``fresh_database``), ``--objects`` rows
written by SQL (the columns an object needs, no history: only ``state_hash`` matters here),
``--states`` arrays of ``--bytes`` bytes of which ``--unnamed`` no object names, the others named
by the objects in turn. Prints, per repetition: the count of unnamed states
(``count_unnamed``), the collection's seconds, states deleted and left; with ``--explain`` the
plan of one deleting statement. Each repetition adds the unnamed states again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from service_load import fresh_database  # noqa: E402

from app.db.session import make_engine  # noqa: E402
from app.store import transaction  # noqa: E402
from app.store.states import collect_unnamed, count_states, count_unnamed  # noqa: E402

_DOMAIN = '{"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 9}]}'


def populate(url: str, objects: int, states: int, unnamed: int, size: int) -> None:
    """``objects`` objects naming the first ``states - unnamed`` states in turn; the rest none."""
    import psycopg

    named = states - unnamed
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(
            "INSERT INTO domains (hash, text) VALUES ('d', %s) ON CONFLICT DO NOTHING", (_DOMAIN,)
        )
        conn.execute(
            "INSERT INTO likelihood_states (hash, state, err) SELECT 's' || n, "
            "decode(repeat('00', %s), 'hex'), 0 FROM generate_series(0, %s - 1) AS n",
            (size, states),
        )
        conn.execute(
            "INSERT INTO objects (id, domain_hash, value, budget, filter, finite, loss_lower, "
            "loss_upper, basic_total, accepted, rejected, version, created_at, updated_at, "
            "state_hash) SELECT 'o' || n, 'd', 'v', 4, 'bayesian', true, 0, 0, '0', 1, 0, 1, "
            "now(), now(), 's' || (n %% %s) FROM generate_series(0, %s - 1) AS n",
            (max(named, 1), objects),
        )
        conn.execute("ANALYZE objects")
        conn.execute("ANALYZE likelihood_states")


def add_unnamed(url: str, states: int, unnamed: int, size: int) -> None:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(
            "INSERT INTO likelihood_states (hash, state, err) SELECT 's' || n, "
            "decode(repeat('00', %s), 'hex'), 0 FROM generate_series(%s, %s - 1) AS n "
            "ON CONFLICT DO NOTHING",
            (size, states - unnamed, states),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=200_000)
    parser.add_argument("--states", type=int, default=20_000)
    parser.add_argument("--unnamed", type=int, default=10_000)
    parser.add_argument("--bytes", type=int, default=300, help="each array's size")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    with fresh_database(prefix="states_collect_") as (url, _):
        started = time.perf_counter()
        populate(url, args.objects, args.states, args.unnamed, args.bytes)
        print(f"populated in {time.perf_counter() - started:.1f} s", flush=True)
        engine = make_engine(url)
        try:
            print("| objects | states | unnamed | collect s | deleted | states left | load |")
            print("|---|---|---|---|---|---|---|")
            for _ in range(args.repeat):
                with engine.connect() as conn:
                    unnamed = count_unnamed(conn)
                    total = count_states(conn)
                started = time.perf_counter()
                with transaction(engine) as conn:
                    deleted = collect_unnamed(conn)
                seconds = time.perf_counter() - started
                with engine.connect() as conn:
                    left = count_states(conn)
                print(
                    f"| {args.objects:,} | {total:,} | {unnamed:,} | {seconds:.2f} | {deleted:,} "
                    f"| {left:,} | {os.getloadavg()[0]:.2f} |",
                    flush=True,
                )
                add_unnamed(url, args.states, args.unnamed, args.bytes)
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

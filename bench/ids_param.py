"""Ways to pass a list of ids to PostgreSQL, side by side: what ``app/store/ids.py`` chose.

How to run (from the project root, PostgreSQL reachable)::

    .venv/bin/python bench/ids_param.py [--ids 5000] [--rows 200000] [--repeat 5]

What it does: a scratch table ``ids_param_bench`` of ``--rows`` text ids (created, dropped at
the end) in ``--database``; then the same ``SELECT id ... WHERE id among :ids`` for ``--ids``
ids of it, ``--repeat`` times per way, the ways interleaved: ``joined`` (one text split by
``string_to_array``, :func:`app.store.ids.among`), ``text[]`` (an array parameter), and
``expanding`` (an expanding ``IN`` of one placeholder per id). It prints the median wall and
client-CPU milliseconds per statement of each way; every way must return every id.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from sqlalchemy import Column, MetaData, String, Table, any_, bindparam, create_engine, select, text
from sqlalchemy.dialects.postgresql import ARRAY

from app.store import ids as ids_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="postgresql+psycopg://root@127.0.0.1:5432/test")
    parser.add_argument("--ids", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    engine = create_engine(args.database)
    table = Table("ids_param_bench", MetaData(), Column("id", String, primary_key=True))
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS ids_param_bench"))
        table.create(conn)
        conn.execute(
            text(
                "INSERT INTO ids_param_bench SELECT 'obj-' || lpad(g::text, 9, '0') "
                "FROM generate_series(1, :n) g"
            ),
            {"n": args.rows},
        )
    step = max(args.rows // args.ids, 1)
    wanted = [f"obj-{i:09d}" for i in range(1, args.rows + 1, step)][: args.ids]
    ways = {
        "joined": (
            select(table.c.id).where(ids_.among(table.c.id, postgres=True)),
            ids_.parameter(wanted, postgres=True),
        ),
        "text[]": (
            select(table.c.id).where(table.c.id == any_(bindparam("ids", type_=ARRAY(String)))),
            wanted,
        ),
        "expanding": (
            select(table.c.id).where(table.c.id.in_(bindparam("ids", expanding=True))),
            wanted,
        ),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    try:
        with engine.connect() as conn:
            for _ in range(args.repeat):
                for name, (statement, value) in ways.items():
                    wall, cpu = time.perf_counter(), time.process_time()
                    found = conn.execute(statement, {"ids": value}).scalars().all()
                    times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
                    if sorted(found) != wanted:
                        raise SystemExit(f"{name}: {len(found)} rows for {len(wanted)} ids")
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS ids_param_bench"))
    print(
        f"{len(wanted)} ids among {args.rows} rows, {args.repeat} runs each, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(f"{'way':<10} {'wall ms':>9} {'client CPU ms':>14}")
    for name, runs in times.items():
        wall = statistics.median(w for w, _ in runs) * 1000
        cpu = statistics.median(c for _, c in runs) * 1000
        print(f"{name:<10} {wall:>9.1f} {cpu:>14.1f}")


if __name__ == "__main__":
    main()

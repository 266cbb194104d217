"""Time reading objects' histories (single submits + survey answers packed per chunk).

Run it on a database kept by ``bench/survey_load.py --keep-database`` (10^6 objects, three
surveys: three answers per object, each in a 5,000-member chunk)::

    .venv/bin/python bench/history_read.py postgresql+psycopg://postgres@127.0.0.1:5432/gk_bench_…

It reads ``--objects`` histories through :func:`app.services.history.object_history` (the road
of the history API, the odometer history, continuous snapshots), twice: objects of neighbouring
ids (a sample of table blocks: a dashboard paging through a list, ``gatekeeper verify``), and
objects in random order (every chunk read cold), each with a fresh process chunk cache, and
prints the milliseconds per read. Then, side by side on the same random objects, two ways of
finding the chunks that cover an object: one probe per survey of ``ix_survey_chunks_first_id``
(:func:`app.store.chunks.chunks_covering` on PostgreSQL) and a scan of every decided
chunk's range (what it does on SQLite); both must find the same chunks. ``--lookups-only``
times just these (on a database given more chunk rows, to see how the two grow).
"""

from __future__ import annotations

import argparse
import os
import time

from sqlalchemy import text

from app.db.session import make_engine
from app.services.history import object_history
from app.store import chunks as survey_chunks
from app.store.chunks import chunks_covering

#: The alternative: every decided chunk's range compared with the id.
SCAN = text(
    "SELECT survey_id, chunk FROM survey_chunks WHERE decided_at IS NOT NULL "
    'AND first_id COLLATE "C" <= :x AND last_id COLLATE "C" >= :x'
)

ORDERS = {
    "neighbouring ids": "SELECT id FROM objects TABLESAMPLE SYSTEM (0.1) ORDER BY id LIMIT :n",
    "random order": "SELECT id FROM objects ORDER BY random() LIMIT :n",
}


def main() -> None:
    """Print a table of milliseconds per history read, by access order."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="SQLAlchemy URL of a database kept by survey_load.py")
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument(
        "--lookups-only",
        action="store_true",
        help="only the chunk lookups (a database with copied chunks has no valid histories)",
    )
    args = parser.parse_args()
    engine = make_engine(args.url)
    print(f"machine load {os.getloadavg()[0]:.2f}; {args.objects} objects per order")
    print("| order | histories | entries | ms per read |")
    print("|---|---|---|---|")
    try:
        for name, sql in ORDERS.items() if not args.lookups_only else ():
            with survey_chunks._SHARED_GUARD:  # every order starts cold
                survey_chunks._SHARED.clear()
            with engine.connect() as conn:
                ids = [str(i) for i in conn.execute(text(sql), {"n": args.objects}).scalars()]
                started = time.perf_counter()
                entries = sum(len(object_history(conn, oid)) for oid in ids)
                seconds = time.perf_counter() - started
            print(f"| {name} | {len(ids)} | {entries} | {seconds / len(ids) * 1000:.2f} |")
        print()
        print("| chunk lookup | objects | chunks in the table | ms per lookup |")
        print("|---|---|---|---|")
        with engine.connect() as conn:
            chunks = conn.execute(text("SELECT count(*) FROM survey_chunks")).scalar_one()
            ids = [str(i) for i in conn.execute(text(ORDERS["random order"]), {"n": args.objects})]
            found: dict[str, list[list[tuple[int, int]]]] = {}
            for name, lookup in (
                ("index probe per survey (the service)", lambda oid: chunks_covering(conn, oid)),
                (
                    "scan of every range",
                    lambda oid: [tuple(r) for r in conn.execute(SCAN, {"x": oid})],
                ),
            ):
                started = time.perf_counter()
                found[name] = [sorted(lookup(oid)) for oid in ids]
                seconds = time.perf_counter() - started
                print(f"| {name} | {len(ids)} | {chunks} | {seconds / len(ids) * 1000:.3f} |")
            if len({repr(v) for v in found.values()}) != 1:
                raise SystemExit("the two lookups found different chunks")
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()

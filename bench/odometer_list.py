"""Time the odometers list and its totals on a large database (issue 25, item 5).

Run it on a migrated database holding many objects (PostgreSQL: a database kept by
``bench/survey_load.py --keep-database`` has 10^6)::

    .venv/bin/python bench/odometer_list.py postgresql+psycopg://postgres@127.0.0.1:5432/NAME

Each row is one call of the use case behind an endpoint (the dashboard's requests, without
HTTP), timed ``--rounds`` times (the median and the slowest in milliseconds): the first page
and its total, the totals by status (kept in ``object_counts``; and, for contrast, counted over
the rows as before migration 0013), a search by id prefix (a whole id; a prefix of many), the
exhausted objects, a deep page by keyset (``after`` an id 90% of the way) and, for contrast,
the same depth by ``offset``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from app.db.session import make_engine
from app.services.objects import list_odometers, odometer_totals
from app.store import objects as store

PAGE = 250  # rows a page of the dashboard shows


def _timed(call: Callable[[], Any], rounds: int) -> tuple[float, float, Any]:
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), result


def scanned(engine: Any) -> dict[str, Any]:
    """The totals as they were counted before ``object_counts`` (a scan), for contrast."""
    with engine.connect() as conn:
        return vars(store.scanned_totals(conn))


def main() -> None:
    """Print a table of milliseconds per call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="SQLAlchemy URL of a migrated database with objects")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    engine = make_engine(args.url)
    with engine.connect() as conn:
        count = int(conn.execute(text("SELECT count(*) FROM objects")).scalar() or 0)
        deep = conn.execute(
            text("SELECT id FROM objects ORDER BY id OFFSET :n LIMIT 1"), {"n": count * 9 // 10}
        ).scalar()
        last = conn.execute(text("SELECT max(id) FROM objects")).scalar()
    page: dict[str, Any] = {
        "engine": engine,
        "limit": PAGE,
        "offset": 0,
        "remaining_lt": None,
        "remaining_gt": None,
        "include_retired": False,
    }
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("first page + total", lambda: list_odometers(**page)),
        ("totals by status", lambda: odometer_totals(engine=engine)),
        ("totals by status, counted over the rows (before 0013)", lambda: scanned(engine)),
        ("search: a whole id", lambda: list_odometers(**page, id_prefix=str(last))),
        ("search: a prefix of ~10", lambda: list_odometers(**page, id_prefix=str(last)[:-1])),
        (
            "totals of a prefix of ~10",
            lambda: odometer_totals(engine=engine, id_prefix=str(last)[:-1]),
        ),
        (
            "status=exhausted, first page + total",
            lambda: list_odometers(**page, status="exhausted"),
        ),
        ("page at 90% by keyset (after=)", lambda: list_odometers(**page, after=str(deep))),
        ("page at 90% by offset", lambda: list_odometers(**{**page, "offset": count * 9 // 10})),
    ]
    print(f"{count} objects; machine load {os.getloadavg()[0]:.2f}; {args.rounds} rounds each")
    print("| call | median ms | slowest ms | rows | total |")
    print("|---|---|---|---|---|")
    try:
        for name, call in calls:
            median, slowest, result = _timed(call, args.rounds)
            rows = len(result["items"]) if "items" in result else "-"
            total = result.get("total", result.get("objects"))
            print(f"| {name} | {median:.1f} | {slowest:.1f} | {rows} | {total} |")
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()

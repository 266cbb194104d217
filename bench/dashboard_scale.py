"""The dashboard's first screen and a search by id at 10^6 objects in PostgreSQL (issue 25, 5).

How to run (from the project root, PostgreSQL reachable; ``GATEKEEPER_BENCH_POSTGRES_URL`` as for
``bench/service_load.py``)::

    .venv/bin/python bench/dashboard_scale.py                    # 10^6 objects, a fresh database
    .venv/bin/python bench/dashboard_scale.py --objects 100000   # a quicker look
    .venv/bin/python bench/dashboard_scale.py --keep-database    # keep it (name printed) ...
    .venv/bin/python bench/dashboard_scale.py --database gk_bench_…   # ... and time it again

What it does
------------
1. A fresh migrated database (``bench.service_load.fresh_database``) and ``gatekeeper serve``
   (one web worker).
2. **Seeding** (seconds, not the import's minutes): one object is registered through
   ``POST /v1/objects``; the others are copies of its row made by the server
   (``INSERT … SELECT … FROM generate_series``), ids ``dash-0000001`` …, labels
   ``site: a|b|c`` (a third each). Accounting columns are set so that every status occurs:
   of each 100 objects, 10 exhausted (loss = budget), 10 more near exhaustion (loss 0.95 of the
   budget), 1 retired; one in 7 has a rejected submit. These rows have no history (the bench
   times reads, not ``gatekeeper verify``). Then ``VACUUM ANALYZE``, as autovacuum would after
   a bulk insert.
3. **The first screen, as the page makes it** (``app/api/static/dashboard/app.js``):
   ``GET /dashboard/`` and its scripts, ``GET /v1/whoami``, then ``GET /v1/odometers/totals``
   and ``GET /v1/odometers?limit=250`` sent at once (the rows are painted when the page
   arrives, the summary cards when the totals do). **A search by id**: the same two requests
   with ``id_prefix=`` a whole id near the end. The same for a project key scoped to
   ``site: a``. Each is timed ``--rounds`` times (median and slowest, milliseconds).
4. **What the counting triggers cost writers**: single-row updates (a submit's compare-and-set)
   and 5,000-row updates (a survey's chunk), each with the triggers and without
   (``session_replication_role = replica``), alternated on disjoint rows; the counts are
   recounted afterwards.
5. **Rows rewritten, not vacuumed**: every row updated once (as a survey over every member
   does), then the same requests again before autovacuum has caught up — the worst case for
   index-only scans, whose visibility map the updates cleared.
6. ``--explain``: ``EXPLAIN (ANALYZE, BUFFERS)`` of the statements behind the totals and the
   page's count. ``--import-cost N`` instead times ``gatekeeper import`` of N objects into fresh
   databases with the triggers and without, alternated.

The figures are in docs/benchmarks.md ("Dashboard at 10^6 objects").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import ADMIN_KEY, POSTGRES_URL, Server, fresh_database  # noqa: E402

PAGE = 250  # rows a page of the dashboard shows (PAGE in app/api/static/dashboard/app.js)
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}
STATIC = ["", "dashboard.css", "app.js"]  # the page and what it loads first (all cached later)

#: the copies of the template row, with every status represented (see the module's docstring)
_SEED = """
INSERT INTO objects ({columns}, id, labels, loss_lower, loss_upper, basic_total, accepted,
                     rejected, retired_at)
SELECT {columns}, 'dash-' || lpad(n::text, 7, '0'),
       json_build_object('site', chr(97 + n % 3)),
       CASE WHEN n % 100 < 10 THEN budget WHEN n % 100 < 20 THEN 0.95 * budget ELSE 0 END,
       CASE WHEN n % 100 < 10 THEN budget WHEN n % 100 < 20 THEN 0.95 * budget ELSE 0 END,
       CASE WHEN n % 100 < 20 THEN '1' ELSE '0' END,
       CASE WHEN n % 100 < 20 THEN 1 ELSE 0 END,
       CASE WHEN n % 7 = 0 THEN 1 ELSE 0 END,
       CASE WHEN n % 100 = 99 THEN now() END
FROM objects, generate_series(1, :last) AS n
WHERE objects.id = 'dash-0000000'
"""
_COPIED = [
    "domain_hash",
    "value",
    "budget",
    "budget_delta",
    "filter",
    "finite",
    "state_hash",
    "state_pending",
    "history_hash",
    "f0_account",
    "version",
    "data_version",
    "version_start",
    "lifetime_budget",
    "lifetime_exact",
    "lifetime_lower",
    "lifetime_upper",
    "created_at",
    "updated_at",
]


def psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def seed(http: httpx.Client, url: str, count: int) -> float:
    """Register one object, copy it ``count - 1`` times; the seconds it took."""
    import psycopg

    started = time.monotonic()
    body = {
        "id": "dash-0000000",
        "domain": DOMAIN,
        "value": {"x": 1},
        "budget": {"epsilon": 1.0},
        "filter": "bayesian",
        "labels": {"site": "a"},
    }
    r = http.post("/v1/objects", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    r.raise_for_status()
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        statement = _SEED.format(columns=", ".join(_COPIED)).replace(":last", str(count - 1))
        conn.execute(statement)  # type: ignore[arg-type]  # built from constants above
        conn.execute("VACUUM ANALYZE objects")
    return time.monotonic() - started


def rewrite_rows(url: str) -> float:
    """Update every row once (a survey's write), without a vacuum after; the seconds taken."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        conn.execute("ALTER TABLE objects SET (autovacuum_enabled = false)")
        conn.execute("UPDATE objects SET version = version + 1")
    return time.monotonic() - started


def trigger_cost(url: str, count: int, rounds: int) -> list[str]:
    """Milliseconds of writes with the counting triggers and without (``session_replication_role
    = replica`` skips them), alternated on disjoint rows of the same table.

    A submit's compare-and-set is one row updated in its own transaction; a survey's chunk
    updates 5,000 rows in one statement (here the loss of each, so each changes status).
    """
    import psycopg

    found: dict[tuple[str, bool], list[float]] = {}
    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        start = 0
        for _ in range(rounds):
            for triggers in (True, False):
                conn.execute(
                    "SET session_replication_role = " + ("origin" if triggers else "replica")
                )
                started = time.perf_counter()
                for n in range(start, start + 200):
                    conn.execute(
                        "UPDATE objects SET version = version + 1, loss_upper = budget "
                        "WHERE id = %s",
                        (f"dash-{n:07d}",),
                    )
                found.setdefault(("200 one-row updates (submits)", triggers), []).append(
                    (time.perf_counter() - started) * 1000
                )
                start += 200
                started = time.perf_counter()
                with conn.transaction():
                    conn.execute(
                        "UPDATE objects SET version = version + 1, loss_upper = 0.5 * budget "
                        "WHERE id >= %s AND id < %s",
                        (f"dash-{start:07d}", f"dash-{start + 5000:07d}"),
                    )
                found.setdefault(("one 5,000-row update (a survey chunk)", triggers), []).append(
                    (time.perf_counter() - started) * 1000
                )
                start += 5000
                if start >= count:
                    raise SystemExit(f"--rounds {rounds} needs more than {count} objects")
        conn.execute("SET session_replication_role = origin")
        # the disabled triggers missed those changes: count again (as the migration does)
        conn.execute("DELETE FROM object_counts")
        shares = ", ".join(f"sum({kept})" for kept in _recount_shares())
        recount = (
            f"INSERT INTO object_counts (slot, {', '.join(_names())}) SELECT 0, {shares} "  # noqa: S608 - the store's own expressions
            "FROM objects"
        )
        conn.execute(recount)  # type: ignore[arg-type]
    lines = ["| write | with triggers ms (median) | without ms (median) |", "|---|---|---|"]
    for name in dict.fromkeys(k[0] for k in found):
        on, off = statistics.median(found[name, True]), statistics.median(found[name, False])
        lines.append(f"| {name} | {on:.1f} | {off:.1f} |")
    return lines


def _names() -> list[str]:
    from app.store.objects import ROW_COUNTS

    return list(ROW_COUNTS)


def _recount_shares() -> list[str]:
    from sqlalchemy.dialects import postgresql

    from app.store.objects import row_counts_sql

    return list(row_counts_sql(postgresql.dialect(), "objects").values())


def import_cost(objects: int, rounds: int) -> list[str]:
    """Seconds of ``gatekeeper import`` of ``objects`` registrations into a fresh database,
    with the counting triggers and with them disabled (``DISABLE TRIGGER USER``), alternated."""
    import psycopg
    from cryptography.fernet import Fernet

    from bench.survey_load import KEY_FILE, cli, write_population

    found: dict[bool, list[float]] = {True: [], False: []}
    KEY_FILE.write_text(Fernet.generate_key().decode())
    with tempfile.TemporaryDirectory() as tmp:
        population = Path(tmp) / "population.ndjson"
        write_population(population, objects, seed=1)
        for _ in range(rounds):
            for triggers in (True, False):
                with fresh_database() as (url, _name):
                    if not triggers:
                        with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
                            conn.execute("ALTER TABLE objects DISABLE TRIGGER USER")
                    started = time.monotonic()
                    done = cli(url, "import", str(population), "--quiet")
                    found[triggers].append(time.monotonic() - started)
                    if done.returncode != 0:
                        raise SystemExit(done.stderr)
    KEY_FILE.unlink(missing_ok=True)
    return [
        "| import | with triggers s (each run) | without s (each run) |",
        "|---|---|---|",
        f"| {objects} objects | {', '.join(f'{t:.1f}' for t in found[True])} | "
        f"{', '.join(f'{t:.1f}' for t in found[False])} |",
    ]


def allow_autovacuum(url: str) -> None:
    import psycopg

    with psycopg.connect(psycopg_url(url), autocommit=True) as conn:
        conn.execute("ALTER TABLE objects RESET (autovacuum_enabled)")


def get(http: httpx.Client, path: str, key: str) -> Any:
    r = http.get(path, headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return r.json() if r.headers["content-type"].startswith("application/json") else r.text


def screen(http: httpx.Client, key: str, query: str = "") -> dict[str, Any]:
    """The page's requests for one list: whoami, then totals and the page at once.

    Returns the milliseconds until the rows (``rows``) and until the summary (``summary``),
    from the first request, and the two answers.
    """
    started = time.perf_counter()
    get(http, "/v1/whoami", key)
    found: dict[str, Any] = {}

    def totals() -> None:
        found["totals"] = get(http, f"/v1/odometers/totals?{query}", key)
        found["summary"] = (time.perf_counter() - started) * 1000

    pending = threading.Thread(target=totals)
    pending.start()
    found["page"] = get(http, f"/v1/odometers?limit={PAGE}&{query}", key)
    found["rows"] = (time.perf_counter() - started) * 1000
    pending.join()
    found["summary"] = max(found["summary"], found["rows"])
    return found


def first_screen(http: httpx.Client, key: str) -> dict[str, Any]:
    """The static files (no key), then the list's requests."""
    started = time.perf_counter()
    for name in STATIC:
        http.get(f"/dashboard/{name}").raise_for_status()
    static = (time.perf_counter() - started) * 1000
    found = screen(http, key)
    found["rows"] += static
    found["summary"] += static
    return found


def timed(call: Callable[[], dict[str, Any]], rounds: int) -> dict[str, Any]:
    runs = [call() for _ in range(rounds)]
    return {
        "rows": statistics.median(r["rows"] for r in runs),
        "rows_max": max(r["rows"] for r in runs),
        "summary": statistics.median(r["summary"] for r in runs),
        "summary_max": max(r["summary"] for r in runs),
        "last": runs[-1],
    }


def explain(url: str, scope: tuple[tuple[str, str], ...] | None) -> None:
    """EXPLAIN ANALYZE the totals' and the page count's statements, as the store builds them."""
    from sqlalchemy import func, select, text

    from app.db.session import make_engine
    from app.store import objects as store

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            where = store.ObjectFilter(scope=scope)
            conditions = where.conditions(conn)
            statements = {
                "the page": select(store.OBJECTS.c.id)
                .where(*conditions)
                .order_by(store.OBJECTS.c.id)
                .limit(PAGE),
                "the page's count, counted": select(func.count())
                .select_from(store.OBJECTS)
                .where(*conditions),
                "totals, counted": store.SCANNED_TOTALS.where(
                    *where.conditions(conn, statuses=False)
                ),
                "totals, kept": store.KEPT_TOTALS,
            }
            for name, statement in statements.items():
                compiled = statement.compile(conn, compile_kwargs={"literal_binds": True})
                plan = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}")).scalars()
                print(f"\n-- {name} (scope {scope}):\n{compiled}")
                print("\n".join(plan))
    finally:
        engine.dispose()


@contextmanager
def database(args: argparse.Namespace) -> Iterator[tuple[str, bool]]:
    """The database's URL and whether it must be seeded."""
    if args.database:
        yield psycopg_url(POSTGRES_URL).rsplit("/", 1)[0] + "/" + args.database, False
        return
    with fresh_database(keep=args.keep_database) as (url, _name):
        yield url, True


def totals_count(http: httpx.Client, key: str) -> int:
    totals = get(http, "/v1/odometers/totals?include_retired=true", key)
    return int(totals["active"] + totals["retired"])


def row(name: str, measured: dict[str, Any], total: Any) -> str:
    return (
        f"| {name} | {measured['rows']:.0f} | {measured['rows_max']:.0f} | "
        f"{measured['summary']:.0f} | {measured['summary_max']:.0f} | {total} |"
    )


def run(http: httpx.Client, viewer: str, scoped: str, rounds: int) -> list[str]:
    """The table's rows: the first screen and a search, unscoped and scoped."""
    totals = get(http, "/v1/odometers/totals?include_retired=true", viewer)
    count = totals["active"] + totals["retired"]
    # near the end, active (n % 100 = 98), and in the project's scope (site a: n % 3 = 0)
    target = "dash-" + f"{max(n for n in range(count - 300, count) if n % 300 == 198):07d}"
    found = []
    for who, key in (("viewer", viewer), ("project key site:a", scoped)):
        first = timed(lambda key=key: first_screen(http, key), rounds)  # type: ignore[misc]
        totals = first["last"]["totals"]
        if first["last"]["page"]["total"] != totals["objects"]:
            raise SystemExit(f"the list's total differs from the totals': {first['last']}")
        found.append(row(f"first screen, {who}", first, json.dumps(totals)))
        search = timed(
            lambda key=key: screen(http, key, f"id_prefix={target}"),  # type: ignore[misc]
            rounds,
        )
        found.append(row(f"search by id {target}, {who}", search, search["last"]["page"]["total"]))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--database", help="an existing seeded database (its name) to time again")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the statements")
    parser.add_argument("--no-rewrite", action="store_true", help="skip step 5")
    parser.add_argument("--no-trigger-cost", action="store_true", help="skip step 4")
    parser.add_argument(
        "--import-cost",
        type=int,
        metavar="N",
        help="only time `gatekeeper import` of N objects with and without the triggers",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if args.import_cost:
        print(f"load {os.getloadavg()[0]:.2f} (1 min) at start; {args.rounds} rounds")
        print("\n".join(import_cost(args.import_cost, args.rounds)))
        print(f"load {os.getloadavg()[0]:.2f} (1 min) at the end")
        return 0
    with database(args) as (url, fresh), tempfile.TemporaryDirectory() as tmp:
        server = Server(url, workers=1, bound=0, log_path=Path(tmp) / "serve.log")
        try:
            http = httpx.Client(base_url=server.url, timeout=120)
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            if fresh:
                print(f"seeded {args.objects} objects in {seed(http, url, args.objects):.1f} s")
            viewer = http.post("/v1/keys", json={"role": "viewer"}, headers=admin).json()["key"]
            project = f"dash-{os.getpid()}"
            r = http.post(
                "/v1/projects",
                headers=admin,
                json={"name": project, "scope": {"labels": {"site": "a"}}, "quota": {"epsilon": 1}},
            )
            r.raise_for_status()
            r = http.post("/v1/keys", json={"role": "viewer", "project": project}, headers=admin)
            r.raise_for_status()
            scoped = r.json()["key"]
            print(
                f"load {os.getloadavg()[0]:.2f} (1 min) at start; {args.rounds} rounds each; "
                "ms from the first request"
            )
            print(
                "| requests | rows median | rows slowest | summary median | summary slowest "
                "| totals / listed |"
            )
            print("|---|---|---|---|---|---|")
            for line in run(http, viewer, scoped, args.rounds):
                print(line, flush=True)
            if args.explain:
                explain(url, None)
                explain(url, (("site", "a"),))
            if not args.no_trigger_cost:
                print(
                    "\nthe counting triggers' cost (alternated on disjoint rows, "
                    f"{args.rounds} rounds):"
                )
                print("\n".join(trigger_cost(url, totals_count(http, viewer), args.rounds)))
            if not args.no_rewrite:
                print(f"\nevery row updated once in {rewrite_rows(url):.1f} s, not vacuumed:")
                try:
                    for line in run(http, viewer, scoped, args.rounds):
                        print(line, flush=True)
                    if args.explain:
                        explain(url, None)
                finally:
                    allow_autovacuum(url)
            print(f"load {os.getloadavg()[0]:.2f} (1 min) at the end")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A scoped key's object loads, statement by statement: an object out of scope against a missing id.

DESIGN.md "Tenants": an object outside a project key's scope is a 404 "exactly as if it did not
exist". ``tests/service/test_scope_matrix.py::test_out_of_scope_and_missing_take_the_same_time``
checks it over HTTP (about 1.5 ms a request); this bench times the store's loads themselves
(tens of µs), which resolves a difference of a µs with a few thousand calls.

How to run (from the project root; PostgreSQL reachable, Redis for the set-up's app)::

    PYTHONPATH=$PWD:$PWD/clients/python/src .venv/bin/python bench/scope_timing.py --pairs 5000

The code timed is the ``app`` first on ``PYTHONPATH``: run the script with another tree's
folder first (``PYTHONPATH=/other/tree:$PWD/clients/python/src``) to time that tree's loads.

Per backend (``--backends``: a SQLite file in a temporary folder; a PostgreSQL scratch database
named ``--db-prefix`` and a random suffix, dropped at the end): ``--objects`` objects registered
through the app, labelled ``team: t0`` .. ``t4`` (the first id in order is one of theirs), and four
more: ``in`` (``team: mine``); out of scope, ``out`` (``team: t9``, labels as long as the
others'), ``other`` (``team: other``, three characters longer) and ``big`` (20 labels of 256
random hex digits: the largest labels an object may have). ``missing`` is an id no object has,
sorted among the others; ``past`` one sorted after every id.

Each function of :mod:`app.store.objects` that reads one object for a scoped key
(``get_object``: the object view, odometers, histories, a submit's replay; ``load_state``: a
dry-run; ``load_for_submit``: a submit) is called in the scope ``{team: mine}`` on one
connection, in pairs of two ids in an order drawn at random (``perf_counter`` around each call).
Per row: the two medians (µs), the median of the differences within pairs, the two-sample
Kolmogorov-Smirnov test's p (as the HTTP test's) and the paired Wilcoxon signed-rank test's p.
Then an ids cohort's check (:func:`app.store.surveys.unknown_ids`, ``--pairs`` / 10 pairs): the
ids of ``--cohort`` objects of the population (all out of scope) against as many missing ids.
The last rows time the functions on the ``in`` object, in the scope and unscoped (an admin's
read). The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import service_load as sl  # type: ignore[import-not-found]  # noqa: E402

ADMIN_KEY = "bench-admin-" + "c" * 40
SCOPE = [("team", "mine")]
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}
#: The pairs compared: (first, second) ids by name.
PAIRS = [("out", "missing"), ("out", "past"), ("other", "missing"), ("big", "missing")]


def setup(url: str, redis: str, objects: int, keys_dir: str) -> dict[str, str]:
    """The objects, through the app of the tree on the path; the ids by name."""
    from fastapi.testclient import TestClient

    from app.bootstrap import create_app
    from app.settings import Settings

    app = create_app(
        Settings(
            database_url=url,
            redis_url=redis,
            gatekeeper_bootstrap_admin_key=ADMIN_KEY,
            gatekeeper_encryption_key_file=keys_dir + "/key",
            bound_processes=0,
        )
    )
    ids = {"in": "scope-m-in", "out": "scope-m-out", "other": "scope-m-other", "big": "scope-m-big"}
    labels = {
        "in": {"team": "mine", "site": "s1"},
        "out": {"team": "t9", "site": "s1"},
        "other": {"team": "other", "site": "s1"},
        "big": {f"name{i:02d}": secrets.token_hex(128) for i in range(20)},
    }
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with TestClient(app) as client:

        def register(oid: str, tags: dict[str, str]) -> None:
            body = {
                "id": oid,
                "domain": DOMAIN,
                "value": {"x": 1},
                "budget": {"epsilon": 100},
                "labels": tags,
            }
            client.post("/v1/objects", headers=admin, json=body).raise_for_status()

        for n in range(objects):
            register(f"scope-a-{n:06d}", {"team": f"t{n % 5}", "site": "s1"})
        for name, oid in ids.items():
            register(oid, labels[name])
    # sorted among the population's ids (not next to the three above), and after every id
    return {**ids, "missing": f"scope-a-{objects // 2:06d}x", "past": "zz-" + secrets.token_hex(4)}


def calls(conn: Any) -> dict[str, Callable[[str, Any], Any]]:
    """The store's scoped single-object reads, by name: ``(object id, scope) -> row or None``."""
    from app.store import objects

    return {
        "get_object": lambda oid, scope: objects.get_object(conn, object_id=oid, scope=scope),
        "load_state": lambda oid, scope: objects.load_state(conn, object_id=oid, scope=scope),
        "load_for_submit": lambda oid, scope: objects.load_for_submit(
            conn, object_id=oid, key="bench-key", scope=scope
        ),
    }


def timed_pairs(
    call: Callable[[str, Any], Any], a: str, b: str, pairs: int, rng: random.Random
) -> tuple[list[float], list[float]]:
    """``pairs`` calls on ``a`` and on ``b``, each pair in an order drawn at random (seconds)."""
    times: dict[str, list[float]] = {a: [], b: []}
    for _ in range(pairs):
        for oid in (a, b) if rng.random() < 0.5 else (b, a):
            start = time.perf_counter()
            call(oid, SCOPE)
            times[oid].append(time.perf_counter() - start)
    return times[a], times[b]


def run_backend(name: str, url: str, ids: dict[str, str], args: argparse.Namespace) -> None:
    from scipy.stats import ks_2samp, wilcoxon

    from app.db.session import make_engine

    engine = make_engine(url, pool_size=1, max_overflow=0)
    rng = random.Random(args.seed)
    with engine.connect() as conn:
        functions = calls(conn)
        for call in functions.values():  # warm: statements prepared, processors made
            for oid in ids.values():
                call(oid, SCOPE)
                call(oid, None)
        # the answers the table is about: none for the out-of-scope and missing ids
        for fname, call in functions.items():
            for oid in ("out", "other", "big", "missing", "past"):
                assert call(ids[oid], SCOPE) is None, (fname, oid)  # noqa: S101
            assert call(ids["in"], SCOPE) is not None, fname  # noqa: S101
        print(
            f"{name:<9} {'function':<16} {'a vs b':<14} {'a µs':>8} {'b µs':>8} "
            f"{'paired':>8} {'KS p':>7} {'Wilcoxon p':>10}"
        )
        for fname, call in functions.items():
            for a, b in PAIRS:
                ta, tb = timed_pairs(call, ids[a], ids[b], args.pairs, rng)
                conn.rollback()
                diffs = [x - y for x, y in zip(ta, tb, strict=True)]
                print(
                    f"{name:<9} {fname:<16} {a + ' vs ' + b:<14} "
                    f"{1e6 * statistics.median(ta):8.2f} {1e6 * statistics.median(tb):8.2f} "
                    f"{1e6 * statistics.median(diffs):+8.2f} {ks_2samp(ta, tb).pvalue:7.3f} "
                    f"{wilcoxon(diffs).pvalue:10.4f}"
                )
        # an ids cohort's check: as many ids of objects out of scope as missing ones
        from app.store.surveys import unknown_ids

        step = max(1, args.objects // args.cohort)
        cohorts = {
            "out": [f"scope-a-{n:06d}" for n in range(0, args.objects, step)][: args.cohort],
            "missing": [f"scope-a-{n:06d}y" for n in range(0, args.objects, step)][: args.cohort],
        }
        assert unknown_ids(conn, cohorts["out"], SCOPE) == cohorts["out"]  # noqa: S101
        ta, tb = timed_pairs(
            lambda name, scope: unknown_ids(conn, cohorts[name], scope),
            "out",
            "missing",
            max(1, args.pairs // 10),
            rng,
        )
        conn.rollback()
        diffs = [x - y for x, y in zip(ta, tb, strict=True)]
        print(
            f"{name:<9} {'unknown_ids':<16} {f'{args.cohort} ids':<14} "
            f"{1e6 * statistics.median(ta):8.2f} {1e6 * statistics.median(tb):8.2f} "
            f"{1e6 * statistics.median(diffs):+8.2f} {ks_2samp(ta, tb).pvalue:7.3f} "
            f"{wilcoxon(diffs).pvalue:10.4f}  (a: out of scope, b: missing)"
        )
        for fname, call in functions.items():
            scoped, unscoped = [], []
            for _ in range(args.pairs // 2):
                for scope in (SCOPE, None) if rng.random() < 0.5 else (None, SCOPE):
                    start = time.perf_counter()
                    call(ids["in"], scope)
                    (scoped if scope else unscoped).append(time.perf_counter() - start)
            conn.rollback()
            print(
                f"{name:<9} {fname:<16} {'in: scoped':<14} {1e6 * statistics.median(scoped):8.2f}"
                f" {1e6 * statistics.median(unscoped):8.2f}  (b: the same object unscoped)"
            )
    engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=5000, help="pairs per row (5,000)")
    parser.add_argument("--objects", type=int, default=1000, help="population (1,000)")
    parser.add_argument("--cohort", type=int, default=100, help="ids per cohort check (100)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--seed", type=int, default=1)
    sl.add_scratch_args(parser, db_prefix="scope_timing_")
    args = parser.parse_args(argv)
    import psycopg

    import app
    from app.db.migrate import upgrade

    load0 = Path("/proc/loadavg").read_text().split()[0]
    t0 = time.strftime("%H:%M:%S", time.gmtime())
    print(f"scope_timing: app from {Path(app.__file__).parent.parent}, {args.pairs} pairs per row")
    with tempfile.TemporaryDirectory(prefix="scope_timing_") as scratch:
        os.environ["GATEKEEPER_ENCRYPTION_KEY_FILE"] = scratch + "/key"
        for backend in args.backends.split(","):
            if backend == "sqlite":
                url = f"sqlite:///{scratch}/scope.db"
                upgrade(url)
                ids = setup(url, args.redis, args.objects, scratch)
                run_backend(backend, url, ids, args)
                continue
            name = args.db_prefix + secrets.token_hex(4)
            with psycopg.connect(args.admin_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            url = args.admin_url.rsplit("/", 1)[0] + "/" + name
            try:
                upgrade(url)
                ids = setup(url, args.redis, args.objects, scratch)
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE objects")
                run_backend(backend, url, ids, args)
            finally:
                with psycopg.connect(args.admin_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    load1 = Path("/proc/loadavg").read_text().split()[0]
    t1 = time.strftime("%H:%M:%S", time.gmtime())
    print(f"scope_timing: {t0}-{t1} UTC, load {load0} -> {load1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

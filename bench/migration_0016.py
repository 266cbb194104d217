"""Time migration 0016 (packing ``object_versions`` into ``version_batches``) on PostgreSQL.

Builds a database at revision 0015 holding ``--objects`` objects, each with ``--versions``
closed versions written by bulk requests (one closing instant per request of ``--bulk``
objects) and a few single ones, then times ``alembic upgrade 0016`` — for this tree's
``migrations/`` and, with ``--baseline DIR``, for another checkout's, side by side on the
same data. Prints one row per variant and checks that every row was packed once.

    .venv/bin/python bench/migration_0016.py --objects 100000 --versions 2 --baseline /path/to/main
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _admin(*statements: str) -> None:
    engine = sa.create_engine(f"{SERVER}/test", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))
    engine.dispose()


def _config(migrations: Path, url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations))
    config.set_main_option("sqlalchemy.url", url)
    return config


def _populate(url: str, objects: int, versions: int, bulk: int) -> int:
    """Objects and their closed versions (values as opaque texts); how many versions."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO domains (hash, text) VALUES ('d', '{}')"))
        conn.execute(
            sa.text(
                "INSERT INTO objects (id, value, budget, filter, finite, loss_lower, loss_upper,"
                " basic_total, accepted, rejected, version, created_at, updated_at, domain_hash,"
                " data_version) SELECT 'o' || lpad(i::text, 8, '0'), 'v', 1, 'bayesian', true,"
                " 0, 0, '0', 0, 0, 0, now(), now(), 'd', :next FROM generate_series(1, :n) i"
            ),
            {"n": objects, "next": versions + 1},
        )
        for n in range(1, versions + 1):
            # bulk requests of `bulk` objects each close at one instant; every 97th object's
            # version is a single one, closed at an instant of its own
            conn.execute(
                sa.text(
                    "INSERT INTO object_versions (object_id, data_version, value, seq_start,"
                    " seq_end, loss_lower, loss_upper, loss_exact, basic_total, rejected,"
                    " closed_at) SELECT 'o' || lpad(i::text, 8, '0'), :n,"
                    " md5(i::text || :n) || md5(:n || i::text), 0, 2, 0.5, 0.5, NULL, '1', 0,"
                    " timestamptz '2026-01-01' + make_interval(days => :n) + CASE WHEN"
                    " i % 97 = 0 THEN make_interval(secs => i) ELSE make_interval(mins =>"
                    " (i / :bulk)::int) END FROM generate_series(1, :o) i"
                ),
                {"n": n, "o": objects, "bulk": bulk},
            )
        total = conn.execute(sa.text("SELECT count(*) FROM object_versions")).scalar_one()
    engine.dispose()
    return int(total)


def _run(name: str, migrations: Path, args: argparse.Namespace) -> tuple[str, float, int, int]:
    database = f"bench_m16_{name}"
    _admin(f"DROP DATABASE IF EXISTS {database}", f"CREATE DATABASE {database}")
    url = f"{SERVER}/{database}"
    command.upgrade(_config(migrations, url), "0015")
    rows = _populate(url, args.objects, args.versions, args.bulk)
    started = time.perf_counter()
    command.upgrade(_config(migrations, url), "0016")
    seconds = time.perf_counter() - started
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM object_versions")).scalar_one()
        packed = conn.execute(sa.text("SELECT coalesce(sum(size), 0) FROM version_batches"))
        packed_rows = int(packed.scalar_one())
    engine.dispose()
    _admin(f"DROP DATABASE {database}")
    if left or packed_rows != rows:
        raise SystemExit(f"{name}: {left} rows left, {packed_rows} of {rows} packed")
    return name, seconds, rows, packed_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--versions", type=int, default=2, help="closed versions per object")
    parser.add_argument("--bulk", type=int, default=10_000, help="objects per bulk request")
    parser.add_argument("--baseline", type=Path, help="another checkout, timed on the same data")
    args = parser.parse_args()
    variants = [("this", Path(__file__).resolve().parents[1] / "migrations")]
    if args.baseline:
        variants.insert(0, ("baseline", args.baseline.resolve() / "migrations"))
    print(f"load {os.getloadavg()[0]:.1f}; {args.objects:,} objects x {args.versions} versions")
    print(f"{'variant':>9} {'rows':>10} {'upgrade s':>10} {'rows/s':>10}")
    for name, migrations in variants:
        _, seconds, rows, _ = _run(name, migrations, args)
        print(f"{name:>9} {rows:>10,} {seconds:>10.1f} {rows / seconds:>10,.0f}")


if __name__ == "__main__":
    main()

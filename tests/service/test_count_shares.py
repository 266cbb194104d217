"""Migration 0018: the object-count triggers decide two shares by floats where they may.

The exhausted and near-exhaustion shares of a row were NUMERIC comparisons for every row a
statement wrote (``CAST(budget AS NUMERIC)``: nearly all the triggers' cost); revision 0018
decides them by ``double precision`` comparisons where these cannot disagree, and by the
NUMERIC expression elsewhere. The shares must be the same for every row — boundaries, tiny and
huge budgets, infinities, NaN, retired rows — and the kept counts equal a count of the rows.
"""

from __future__ import annotations

import importlib.util
import math
import random
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from app.db.migrate import alembic_config, upgrade
from app.db.session import make_engine
from app.store import objects as store
from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import integer_domain

ROOT = Path(__file__).resolve().parents[2]


def revision_0018() -> ModuleType:
    path = ROOT / "migrations" / "versions" / "0018_cheaper_object_counts.py"
    spec = importlib.util.spec_from_file_location("revision_0018", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tricky_rows(seed: int = 27) -> list[tuple[float, float, bool]]:
    """``(budget, loss_upper, retired)`` at and around every boundary the proof uses."""
    rng = random.Random(seed)
    budgets = [
        5e-324, 1e-7, 9.9e-5, 1e-4, math.nextafter(1e-4, 1), 0.001, 1 / 3, 0.5, 1.0, 3.7, 4.0,
        10.0, 999_999.9, math.nextafter(1e6, 0), 1e6, 1e300, math.inf, -math.inf, math.nan,
        -1.0, 0.0,
    ]  # fmt: skip
    budgets += [10 ** rng.uniform(-4, 6) for _ in range(20)]
    rows = []
    for budget in budgets:
        marks = [0.0, -1.0, -math.inf, math.inf, math.nan, 1e-300]
        if math.isfinite(budget):
            for centre in (
                budget,
                budget - 1e-5,
                budget - 1e-6,
                0.9 * budget,
                0.89 * budget,
                0.91 * budget,
            ):
                step = centre
                marks.append(centre)
                for _ in range(3):  # ulps either side
                    step = math.nextafter(step, math.inf)
                    marks.append(step)
                step = centre
                for _ in range(3):
                    step = math.nextafter(step, -math.inf)
                    marks.append(step)
                marks += [centre * (1 + d) for d in (1e-15, -1e-15, 1e-14, -1e-14, 1e-9, -1e-9)]
            marks += [budget * rng.uniform(0, 1.2) for _ in range(30)]
            marks += [budget * rng.uniform(0.88, 0.92) for _ in range(30)]
            marks += [budget - rng.uniform(0, 2e-5) for _ in range(30)]
        rows += [(budget, loss, retired) for loss in marks for retired in (False, True)]
    return rows


def test_0018_shares_equal_the_numeric_ones(postgres_url: str) -> None:
    """Each share decided by floats equals the NUMERIC one of 0014, row by row."""
    exact = store.row_counts_sql(postgresql.dialect(), "n")  # type: ignore[no-untyped-call]
    fast = revision_0018().fast_shares(exact, "n")
    assert fast.keys() == exact.keys()
    assert fast["exhausted"] != exact["exhausted"]
    assert fast["near_exhaustion"] != exact["near_exhaustion"]
    rows = tricky_rows()
    budgets, losses, retired = (list(column) for column in zip(*rows, strict=True))
    pairs = ", ".join(f"{fast[k]} AS f_{k}, {exact[k]} AS e_{k}" for k in exact)
    query = (
        f"SELECT n.budget, n.loss_upper, n.retired_at IS NOT NULL, {pairs} FROM ("  # noqa: S608
        "SELECT b AS budget, l AS loss_upper, CASE WHEN r THEN now() END AS retired_at, "
        "3 AS rejected FROM unnest(%s::float8[], %s::float8[], %s::bool[]) AS u(b, l, r)) AS n"
    )
    with psycopg.connect(postgres_url.replace("+psycopg", "")) as conn:
        found = conn.execute(query, (budgets, losses, retired)).fetchall()
    assert len(found) == len(rows) > 5_000
    names = list(exact)
    wrong = []
    counted = dict.fromkeys(names, 0)
    for row in found:
        shares = row[3:]
        for at, name in enumerate(names):
            if shares[2 * at] != shares[2 * at + 1]:
                wrong.append((name, row[:3], shares[2 * at], shares[2 * at + 1]))
            counted[name] += shares[2 * at + 1]
    assert wrong == []
    # the rows reach both sides of both boundaries
    assert 0 < counted["exhausted"] < counted["near_exhaustion"] < counted["active"]


def test_0018_installs_the_float_shares_and_downgrades_to_0014s(postgres_url: str) -> None:
    """Head's functions are 0018's and new states compress with lz4; a downgrade restores 0014's
    functions and the default compression, an upgrade 0018's again."""
    engine = make_engine(postgres_url)
    events = ("insert", "update", "delete")

    def sources() -> dict[str, str]:
        with engine.connect() as conn:
            return {
                event: str(
                    conn.execute(
                        text("SELECT prosrc FROM pg_proc WHERE proname = :name"),
                        {"name": f"gatekeeper_object_counts_{event}"},
                    ).scalar_one()
                )
                for event in events
            }

    def compression() -> str:
        """The states' arrays' compression method ("l": lz4, "": the server's default)."""
        with engine.connect() as conn:
            return str(
                conn.execute(
                    text(
                        "SELECT attcompression FROM pg_attribute WHERE attname = 'state' "
                        "AND attrelid = 'likelihood_states'::regclass"
                    )
                ).scalar_one()
            )

    try:
        head = sources()
        assert compression() == "l"  # this server has lz4 (PostgreSQL 15 built with it)
        for event in events:  # the float comparisons are in, the NUMERIC ones kept behind them
            assert "CAST(0.89 AS DOUBLE PRECISION)" in head[event], event
            assert "AS NUMERIC" in head[event], event
        command.downgrade(alembic_config(postgres_url), "0017")
        before = sources()
        assert compression() == ""  # the server's default (pglz)
        for event in events:
            assert "DOUBLE PRECISION" not in before[event], event
            assert "CAST(n.budget AS NUMERIC)" in before[event] or event == "delete"
        upgrade(postgres_url)
        assert sources() == head
        assert compression() == "l"
    finally:
        engine.dispose()


def test_kept_counts_stay_exact_at_the_boundaries(client: TestClient, database_url: str) -> None:
    """Rows written by hand at the boundaries (and past them) are counted as a scan counts."""
    ids = []
    for n in range(6):
        oid = unique_id("edge")
        body = {"id": oid, "domain": integer_domain(3), "value": {"x": n % 3}}
        body["budget"] = {"epsilon": 4.0}
        r = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
        assert r.status_code == 201, r.text
        ids.append(oid)
    engine = make_engine(database_url)
    b = 4.0
    losses = [
        0.9 * b,
        math.nextafter(0.9 * b, 0),
        math.nextafter(0.9 * b, 9),
        b - 1e-6,
        math.nextafter(b - 1e-6, 9),
        math.nextafter(b - 1e-6, 0),
        b,
        math.nextafter(b, 0),
        0.5,
        5.0,
    ]
    try:
        for loss in losses:  # each row moved into and out of every zone, one statement each
            with engine.begin() as conn:
                conn.execute(
                    text("UPDATE objects SET loss_upper = :loss WHERE id = :a OR id = :b"),
                    {"loss": loss, "a": ids[0], "b": ids[1]},
                )
                conn.execute(
                    text("UPDATE objects SET loss_upper = :loss, rejected = rejected + 1 "
                         "WHERE id = :c"),
                    {"loss": math.nextafter(loss, 0), "c": ids[2]},
                )  # fmt: skip
            with engine.connect() as conn:
                for retired in (False, True):
                    kept = store.kept_totals(conn, include_retired=retired)
                    where = store.ObjectFilter(include_retired=retired)
                    assert kept == store.scanned_totals(conn, where), (loss, retired)
        with engine.begin() as conn:  # retired, then deleted: the old rows' shares go
            conn.execute(
                text("UPDATE objects SET retired_at = :t, loss_upper = :l WHERE id = :a"),
                {"t": datetime.now(UTC), "l": b, "a": ids[3]},
            )
            conn.execute(text("DELETE FROM objects WHERE id = :a"), {"a": ids[4]})
        with engine.connect() as conn:
            for retired in (False, True):
                kept = store.kept_totals(conn, include_retired=retired)
                assert kept == store.scanned_totals(
                    conn, store.ObjectFilter(include_retired=retired)
                )
    finally:
        engine.dispose()


@pytest.mark.parametrize("budget", [5e-324, 1e-4, 1e6, 4.0])
def test_budgets_outside_the_floats_range_keep_the_numeric_shares(
    postgres_url: str, budget: float
) -> None:
    """A budget outside (1e-4, 1e6) — a tiny one stored before the floor — never meets a float
    product (which would underflow: the reason the shares are NUMERIC) and counts as before."""
    exact = store.row_counts_sql(postgresql.dialect(), "n")  # type: ignore[no-untyped-call]
    fast = revision_0018().fast_shares(exact, "n")
    query = (
        f"SELECT {fast['near_exhaustion']}, {exact['near_exhaustion']}, "  # noqa: S608
        f"{fast['exhausted']}, {exact['exhausted']} FROM (SELECT %s::float8 AS budget, "
        "%s::float8 AS loss_upper, NULL::timestamptz AS retired_at) AS n"
    )
    with psycopg.connect(postgres_url.replace("+psycopg", "")) as conn:
        for loss in (0.0, budget * 0.95, budget, 1.0):
            near, near_exact, exhausted, exhausted_exact = (
                conn.execute(query, (budget, loss)).fetchone() or ()
            )
            assert (near, exhausted) == (near_exact, exhausted_exact), loss

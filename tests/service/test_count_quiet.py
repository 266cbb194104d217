"""Migration 0019: the object-count UPDATE trigger skips its sums when no share can change.

The trigger's function first asks whether the statement changed one row whose old and new
versions are both *quiet* (active, budget in 0018's float range, loss below both of 0018's
"not exhausted" and "not near exhaustion" thresholds) with the same ``rejected``; then every
sum is zero and it returns without running 0018's query. That is right only if a quiet row's
six shares are what the test assumes, and if no statement the test lets through changes a
count (nor one of several rows, which it must never let through): both are checked here, the
second against a count of the rows after each of many random statements, and the revision's
upgrade and downgrade.
"""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path
from types import ModuleType

import psycopg
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from app.bootstrap import create_app
from app.db.migrate import alembic_config, upgrade
from app.db.session import make_engine
from app.store import objects as store
from tests.service.conftest import ADMIN_KEY, auth, make_settings, unique_id
from tests.service.factories import integer_domain
from tests.service.test_count_shares import revision_0018, tricky_rows

ROOT = Path(__file__).resolve().parents[2]


def revision_0019() -> ModuleType:
    path = ROOT / "migrations" / "versions" / "0019_count_updates_fast_path.py"
    spec = importlib.util.spec_from_file_location("revision_0019", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_quiet_rows_shares_are_what_the_test_assumes(postgres_url: str) -> None:
    """For every row at and around 0018's boundaries (and NaN, infinities, tiny and huge
    budgets), retired or not, with ``rejected`` 0, 3 or NULL: where the quiet test holds, the
    row's shares (0018's expressions) are active 1, retired 0, exhausted 0, near exhaustion 0
    and both rejected shares ``coalesce(rejected, 0)``."""
    exact = store.row_counts_sql(postgresql.dialect(), "n")  # type: ignore[no-untyped-call]
    shares = revision_0018().fast_shares(exact, "n")
    quiet = revision_0019().quiet("n")
    rows = [(b, loss, r, rej) for b, loss, r in tricky_rows() for rej in (0, 3, None)]
    budgets, losses, retired, rejected = (list(column) for column in zip(*rows, strict=True))
    names = list(exact)
    query = (
        f"SELECT {quiet}, coalesce(n.rejected, 0), "  # noqa: S608
        + ", ".join(shares[k] for k in names)
        + " FROM (SELECT b AS budget, l AS loss_upper, CASE WHEN r THEN now() END AS "
        "retired_at, j AS rejected FROM unnest(%s::float8[], %s::float8[], %s::bool[], "
        "%s::int[]) AS u(b, l, r, j)) AS n"
    )
    with psycopg.connect(postgres_url.replace("+psycopg", "")) as conn:
        found = conn.execute(query, (budgets, losses, retired, rejected)).fetchall()
    assert len(found) == len(rows) > 15_000
    wrong = []
    quiet_rows = 0
    for row in found:
        is_quiet, rejected_value, *values = row
        if is_quiet:
            quiet_rows += 1
            expected = [1, 0, 0, 0, rejected_value, rejected_value]
            if list(values) != expected:
                wrong.append((row, expected))
    assert wrong == []
    # both answers occur, and a quiet row is never retired or past a threshold
    assert 0 < quiet_rows < len(found)


def test_kept_counts_stay_exact_under_random_updates(postgres_url: str) -> None:
    """Random ``UPDATE``s of one or several objects — quiet ones, ones moving into and out of
    every zone, rejections counted (also +1 on one row and -1 on another), retirements, budget
    changes, NaN, no row at all — keep ``object_counts`` equal to a count of the rows."""
    with TestClient(create_app(make_settings(postgres_url))) as client:
        ids = []
        for n in range(8):
            oid = unique_id("quiet")
            body = {"id": oid, "domain": integer_domain(3), "value": {"x": n % 3}}
            body["budget"] = {"epsilon": 4.0}
            r = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
            assert r.status_code == 201, r.text
            ids.append(oid)
    rng = random.Random(19)
    engine = make_engine(postgres_url)

    def loss(budget: float) -> float:
        return rng.choice(
            [
                0.1 * budget,
                0.5 * budget,
                math.nextafter(0.89 * budget, 0),
                0.89 * budget,
                0.9 * budget,
                budget - 1e-5,
                math.nextafter(budget - 1e-5, 0),
                budget,
                2 * budget,
                math.nan,
            ]
        )

    statements = 0
    try:
        for step in range(160):
            chosen = rng.sample(ids, rng.choice([1, 1, 1, 2, 3, 8]))
            kind = rng.choice(["quiet", "quiet", "loss", "reject", "swap", "retire", "budget"])
            budget = rng.choice([4.0, 4.0, 1e-5, 2e6, 0.5])
            with engine.begin() as conn:
                if step == 0:  # no row at all
                    conn.execute(text("UPDATE objects SET loss_upper = 0 WHERE id = 'none'"))
                elif kind == "quiet":  # the loss moves far from the budget: nothing changes
                    conn.execute(
                        text(
                            "UPDATE objects SET loss_upper = :l, budget = 4.0, retired_at = NULL "
                            "WHERE id = ANY(:ids)"
                        ),
                        {"l": rng.uniform(0, 3.5), "ids": chosen},
                    )
                elif kind == "loss":
                    conn.execute(
                        text("UPDATE objects SET loss_upper = :l WHERE id = ANY(:ids)"),
                        {"l": loss(4.0), "ids": chosen},
                    )
                elif kind == "reject":
                    conn.execute(
                        text("UPDATE objects SET rejected = rejected + 1 WHERE id = ANY(:ids)"),
                        {"ids": chosen},
                    )
                elif kind == "swap" and len(chosen) >= 2:  # the total of rejected unchanged
                    conn.execute(
                        text(
                            "UPDATE objects SET rejected = rejected + CASE WHEN id = :a THEN 1 "
                            "ELSE -1 END WHERE id = :a OR (id = :b AND rejected > 0)"
                        ),
                        {"a": chosen[0], "b": chosen[1]},
                    )
                elif kind == "retire":
                    conn.execute(
                        text(
                            "UPDATE objects SET retired_at = CASE WHEN retired_at IS NULL "
                            "THEN now() END WHERE id = ANY(:ids)"
                        ),
                        {"ids": chosen},
                    )
                else:
                    conn.execute(
                        text(
                            "UPDATE objects SET budget = :b, loss_upper = :l WHERE id = ANY(:ids)"
                        ),
                        {"b": budget, "l": loss(budget), "ids": chosen},
                    )
            statements += 1
            with engine.connect() as conn:
                for retired in (False, True):
                    kept = store.kept_totals(conn, include_retired=retired)
                    where = store.ObjectFilter(include_retired=retired)
                    assert kept == store.scanned_totals(conn, where), (step, kind, retired)
        with engine.connect() as conn:  # the statements reached the zones the test guards
            totals = store.scanned_totals(conn, store.ObjectFilter(include_retired=True))
        assert statements == 160
        assert totals.rejected > 0
    finally:
        engine.dispose()


def test_0019_installs_the_quiet_test_and_downgrades_to_0018s(postgres_url: str) -> None:
    """Head's UPDATE function asks the quiet question, then runs 0018's query unchanged; a
    downgrade to 0018 restores 0018's function and an upgrade the quiet test again. The INSERT
    and DELETE functions are 0018's throughout."""
    engine = make_engine(postgres_url)
    event = "update"

    def sources() -> dict[str, str]:
        with engine.connect() as conn:
            return {
                e: str(
                    conn.execute(
                        text("SELECT prosrc FROM pg_proc WHERE proname = :name"),
                        {"name": f"gatekeeper_object_counts_{e}"},
                    ).scalar_one()
                )
                for e in ("insert", "update", "delete")
            }

    try:
        head = sources()
        assert "INTO unchanged" in head[event]
        assert "IF unchanged THEN" in head[event]
        command.downgrade(alembic_config(postgres_url), "0018")
        before = sources()
        assert "unchanged" not in before[event]
        # 0018's query is kept whole behind the test, and nothing else differs
        assert head[event].endswith(before[event].split("BEGIN\n", 1)[1])
        assert {k: v for k, v in head.items() if k != event} == {
            k: v for k, v in before.items() if k != event
        }
        upgrade(postgres_url)
        assert sources() == head
    finally:
        engine.dispose()

"""The counts ``object_counts`` keeps equal a count of the rows after every writer (issue 25, 5).

The dashboard's summary without filters, the list's ``total`` and the gauges read the counts
that triggers on ``objects`` keep in each writer's statement (migration 0014). Whatever path
changes an object — a registration, an import, submits accepted and refused, a survey, a new
data version, a retirement, SQL by hand — the kept counts must equal an aggregate over the
rows, on SQLite and PostgreSQL; concurrent writers on PostgreSQL too; and ``gatekeeper
verify`` says so when they do not.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.db.session import make_engine
from app.services.verify import verify_all
from app.store import objects as store
from app.store.base import Database
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id
from tests.service.factories import grr_query, integer_domain, run_cli
from tests.service.test_surveys import wait_done

ADMIN = auth(ADMIN_KEY)


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Database]:
    found = make_engine(database_url)
    yield found
    found.dispose()


def counts(engine: Database) -> dict[bool, tuple[store.ObjectTotals, store.ObjectTotals]]:
    """Kept and counted totals, with and without the retired."""
    with engine.connect() as conn:
        return {
            retired: (
                store.kept_totals(conn, include_retired=retired),
                store.scanned_totals(conn, store.ObjectFilter(include_retired=retired)),
            )
            for retired in (False, True)
        }


def assert_exact(client: TestClient, engine: Database) -> store.ObjectTotals:
    """Kept = counted, and the API's totals and the list's total are the counted ones."""
    found = counts(engine)
    for retired, (kept, counted) in found.items():
        assert kept == counted, retired
        params = {"include_retired": str(retired).lower()}
        api = client.get("/v1/odometers/totals", params=params, headers=ADMIN).json()
        assert api == {
            "objects": counted.objects,
            "active": counted.active,
            "retired": counted.retired,
            "exhausted": counted.exhausted,
            "near_exhaustion": counted.near_exhaustion,
            "rejected": counted.rejected,
        }
        listed = client.get("/v1/odometers", params={**params, "limit": 1}, headers=ADMIN)
        assert listed.json()["total"] == counted.objects
        for status in ("active", "exhausted", "near_exhaustion", "retired"):
            r = client.get("/v1/odometers", params={"status": status, "limit": 1}, headers=ADMIN)
            assert r.json()["total"] == getattr(counted, status), status
    return found[True][1]


def register(client: TestClient, labels: dict[str, str]) -> str:
    oid = unique_id("cnt")
    body = {
        "id": oid,
        "domain": integer_domain(3),
        "value": {"x": 1},
        "budget": {"epsilon": 1.0},
        "filter": "basic",
        "labels": labels,
    }
    assert client.post("/v1/objects", json=body, headers=ADMIN).status_code == 201
    return oid


def submit(client: TestClient, headers: dict[str, str], oid: str, epsilon: float) -> int:
    body = {"query": grr_query(epsilon)}
    return client.post(f"/v1/objects/{oid}/queries", json=body, headers=headers).status_code


def test_every_writer_keeps_the_counts_exact(client: TestClient, engine: Database) -> None:
    study = unique_id("study")
    before = assert_exact(client, engine)
    analyst = auth(new_key(client, "analyst"))

    single = [register(client, {"study": study}) for _ in range(3)]
    imported = [unique_id("imp") for _ in range(12)]
    objects = [
        {
            "id": oid,
            "domain": integer_domain(3),
            "value": {"x": n % 4},
            "budget": {"epsilon": 1.0},
            "filter": "basic",
            "labels": {"study": study},
        }
        for n, oid in enumerate(imported)
    ]
    assert client.post("/v1/imports", json={"objects": objects}, headers=ADMIN).status_code == 200
    after = assert_exact(client, engine)
    assert after.active == before.active + 15

    # accepted submits take objects near exhaustion and to exhaustion; refusals are counted
    assert submit(client, analyst, single[0], 0.95) == 201
    assert submit(client, analyst, single[1], 1.0) == 201
    assert submit(client, analyst, single[1], 0.1) == 409
    assert submit(client, analyst, single[1], 0.2) == 409
    after = assert_exact(client, engine)
    assert after.exhausted == before.exhausted + 1
    assert after.near_exhaustion == before.near_exhaustion + 2
    assert after.rejected == before.rejected + 2

    # a survey over the study: the 13 members with room answer (one grr answer's loss is its
    # ε, here the budget: exhausted), the two spent ones are refused; a second refuses all
    body = {"name": "counts", "query": grr_query(1.0), "cohort": {"labels": {"study": study}}}
    r = client.post("/v1/surveys", headers=analyst, json=body)
    assert r.status_code == 202, r.text
    assert wait_done(client, analyst, r.json()["id"])["progress"]["accepted"] == 13
    after = assert_exact(client, engine)
    assert after.exhausted == before.exhausted + 14
    r = client.post("/v1/surveys", headers=analyst, json={**body, "name": "counts-2"})
    assert wait_done(client, analyst, r.json()["id"])["progress"]["accepted"] == 0
    assert_exact(client, engine)

    # a new data version starts the object's loss again: exhausted no more
    r = client.post(f"/v1/objects/{single[1]}/versions", headers=ADMIN, json={"value": {"x": 2}})
    assert r.status_code in (200, 201), r.text
    assert_exact(client, engine)

    # retirement moves an object (and its refusals) from active to retired
    for oid in (single[1], imported[0]):
        assert client.delete(f"/v1/objects/{oid}", headers=ADMIN).status_code == 200
    after = assert_exact(client, engine)
    assert after.retired == before.retired + 2

    # SQL by hand (a repair): counted too, and a deleted row leaves the counts
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE objects SET loss_upper = budget, rejected = 7 WHERE id = :id"),
            {"id": imported[1]},
        )
        conn.execute(text("DELETE FROM objects WHERE id = :id"), {"id": imported[2]})
    assert_exact(client, engine)

    # the label-filtered totals are counted over the rows: they add up to the whole study
    by_label = client.get(
        "/v1/odometers/totals",
        params={"label": f"study:{study}", "include_retired": "true"},
        headers=ADMIN,
    ).json()
    assert by_label["objects"] == 14  # 15 registered, one deleted
    assert by_label["retired"] == 2
    # a project key scoped to the study counts its scope's objects, not the kept counts
    project = {
        "name": unique_id("p"),
        "scope": {"labels": {"study": study}},
        "quota": {"epsilon": 1},
    }
    assert client.post("/v1/projects", headers=ADMIN, json=project).status_code == 201
    r = client.post("/v1/keys", headers=ADMIN, json={"role": "viewer", "project": project["name"]})
    scoped = auth(r.json()["key"])
    params = {"include_retired": "true"}
    assert client.get("/v1/odometers/totals", params=params, headers=scoped).json() == by_label
    listed = client.get("/v1/odometers", params={**params, "limit": 1}, headers=scoped).json()
    assert listed["total"] == 14
    assert verify_problems(engine) == []


def verify_problems(engine: Database) -> list[str]:
    return [p for p in verify_all(engine).problems if p.startswith("object counts")]


def test_verify_reports_counts_that_differ_from_the_rows(
    client: TestClient, engine: Database
) -> None:
    register(client, {"study": unique_id("study")})
    assert verify_problems(engine) == []
    with engine.begin() as conn:
        conn.execute(text("UPDATE object_counts SET exhausted = exhausted + 1 WHERE slot = 0"))
    try:
        problems = verify_problems(engine)
        assert len(problems) == 1
        assert "exhausted=" in problems[0]
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE object_counts SET exhausted = exhausted - 1 WHERE slot = 0"))
    assert verify_problems(engine) == []


def test_concurrent_writers_keep_the_counts_exact(
    client: TestClient, engine: Database, database_url: str
) -> None:
    """Writers on their own connections at once (PostgreSQL: each adds to its own slot)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time")
    ids = [register(client, {"study": "concurrent"}) for _ in range(40)]
    errors: list[Any] = []
    start = threading.Barrier(4)

    def writer(part: list[str]) -> None:
        try:
            start.wait()
            for n, oid in enumerate(part):
                loss = "budget" if n % 2 else "0.95 * budget"
                with engine.begin() as conn:
                    conn.execute(
                        text(
                            f"UPDATE objects SET loss_upper = {loss}, "  # noqa: S608 - constants
                            "rejected = rejected + 1 WHERE id = :id"
                        ),
                        {"id": oid},
                    )
                if n % 5 == 0:
                    with engine.begin() as conn:
                        conn.execute(
                            text("UPDATE objects SET retired_at = now() WHERE id = :id"),
                            {"id": oid},
                        )
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(ids[k::4],)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with engine.connect() as conn:
        slots = conn.execute(text("SELECT count(*) FROM object_counts")).scalar()
    assert slots is not None
    assert slots > 1  # the writers' connections wrote their own rows
    assert_exact(client, engine)


def test_a_writer_never_waits_for_another_writers_counts(
    client: TestClient, engine: Database, database_url: str
) -> None:
    """Two open transactions that both change counts: neither waits for the other's counts row.

    Were the counts one shared row (or rows shared by several connections), the second would
    wait for the first's commit, and a first that then waited for an object the second had
    locked would deadlock. Each connection writes its own row (its server process id).
    """
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time")
    first_id, second_id = (register(client, {"study": "waits"}) for _ in range(2))
    spend = text("UPDATE objects SET loss_upper = budget WHERE id = :id")
    with engine.connect() as first, engine.connect() as second:
        first.execute(spend, {"id": first_id})  # its transaction stays open, its row locked
        second.execute(text("SET lock_timeout = '2s'"))
        second.execute(spend, {"id": second_id})  # would time out waiting for a shared row
        second.commit()
        first.commit()
    assert_exact(client, engine)


def slots(engine: Database) -> list[int]:
    """The slots of ``object_counts``'s rows (on PostgreSQL: 0 and writers' process ids)."""
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT slot FROM object_counts")).scalars())


def test_a_fold_leaves_one_row_and_skips_an_open_writers_row(
    client: TestClient, engine: Database, database_url: str
) -> None:
    """``fold_counts`` adds every row to slot 0 without waiting for a writer: the row of a
    transaction still open (its backend alive) stays, and goes at the next fold."""
    oid = register(client, {"study": "fold"})
    if not database_url.startswith("postgresql"):
        with engine.begin() as conn:
            assert store.fold_counts(conn) == 0  # the triggers write slot 0 only
        assert slots(engine) == [0]
        assert_exact(client, engine)
        return
    spend = text("UPDATE objects SET loss_upper = budget, rejected = rejected + 1 WHERE id = :id")
    with engine.connect() as writer:
        pid = writer.execute(text("SELECT pg_backend_pid()")).scalar_one()
        writer.execute(spend, {"id": oid})
        writer.commit()  # its row, visible to the fold
        writer.execute(spend, {"id": oid})  # its transaction stays open, its row locked
        assert pid in slots(engine)
        with engine.connect() as folder:
            folder.execute(text("SET lock_timeout = '2s'"))  # a fold that waited would fail
            store.fold_counts(folder)
            folder.commit()
        assert slots(engine) == [0, pid]
        writer.commit()
    with engine.begin() as conn:
        assert store.fold_counts(conn) == 1
    assert slots(engine) == [0]
    assert_exact(client, engine)


def test_folds_among_concurrent_writers_keep_the_counts_exact(
    client: TestClient, engine: Database, database_url: str
) -> None:
    """Writers each on a new connection per transaction (a new backend, so a new row each time:
    the churn that made the table grow) while folds run: every snapshot's kept counts equal the
    rows' count, the folds remove rows meanwhile, and ``gatekeeper verify`` folds a row left
    after them."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite keeps one row (slot 0): nothing to fold")
    ids = [register(client, {"study": "churn"}) for _ in range(12)]
    churn = make_engine(database_url, 4, 0)  # a connection per writer, invalidated after each use
    errors: list[Any] = []
    differ: list[tuple[list[int], list[int]]] = []
    folded: list[int] = []
    writers_done = threading.Event()
    start = threading.Barrier(5)

    def writer(part: list[str]) -> None:
        try:
            start.wait()
            for n, oid in enumerate(part * 2):
                loss = "budget" if n % 2 else "0.95 * budget"
                with churn.connect() as conn:
                    with conn.begin():
                        conn.execute(
                            text(
                                f"UPDATE objects SET loss_upper = {loss}, "  # noqa: S608
                                "rejected = rejected + 1 WHERE id = :id"
                            ),
                            {"id": oid},
                        )
                        if n % 5 == 0:
                            conn.execute(
                                text("UPDATE objects SET retired_at = now() WHERE id = :id"),
                                {"id": oid},
                            )
                    conn.invalidate()  # the next transaction starts a new backend
        except Exception as error:  # reported below
            errors.append(error)

    def folder() -> None:
        try:
            start.wait()
            while not writers_done.is_set():
                with engine.begin() as conn:
                    folded.append(store.fold_counts(conn))
                with engine.connect() as conn:
                    kept, counted = store.kept_and_counted(conn)
                if kept != counted:
                    differ.append((kept, counted))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(ids[k::4],)) for k in range(4)]
    folding = threading.Thread(target=folder)
    for thread in [*threads, folding]:
        thread.start()
    for thread in threads:
        thread.join()
    writers_done.set()
    folding.join()
    assert errors == []
    assert differ == []
    assert sum(folded) > 0, folded  # the folds ran among the writers and removed rows
    assert_exact(client, engine)
    # a last writer's row (its connection closed), folded by ``gatekeeper verify``; the
    # objects' loss bounds were written by hand above, so verify's exit code is not checked
    with churn.connect() as conn, conn.begin():
        conn.execute(text("UPDATE objects SET rejected = 1 WHERE id = :id"), {"id": ids[0]})
    churn.dispose()
    assert len(slots(engine)) > 1
    verified = run_cli("verify", "--quiet", database_url=database_url)
    assert "folded" in verified.stderr, verified.stderr
    assert slots(engine) == [0]
    assert_exact(client, engine)

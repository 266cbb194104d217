"""The ``gatekeeper`` command against real databases: ``keys create``, ``verify``, ``serve``.

``keys create`` and ``verify`` work on a SQLite file ``gatekeeper migrate`` created; ``verify``
exits 0 on a consistent database and non-zero once a stored row is tampered with (rows are
changed with SQLAlchemy directly and restored afterwards). ``serve`` migrates a fresh database
before answering ``/readyz``, and production settings refuse unsafe defaults.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import Engine, delete, func, insert, inspect, select, update

from app.bootstrap import create_app
from app.cli import main as cli_main
from app.db.models import LikelihoodStateRecord, ProtectedObject, QueryRecord
from app.db.session import make_engine
from app.settings import Settings, get_settings
from tests.service.conftest import ADMIN_KEY, auth, make_settings, start_server, unique_id
from tests.service.factories import SETTINGS_ENV, run_cli, run_cli_process

ROOT = Path(__file__).resolve().parents[2]
FINITE = {
    "attributes": [
        {"name": "x", "type": "integer", "low": 0, "high": 3},
        {"name": "c", "type": "categorical", "values": ["a", "b", "c"]},
    ]
}
CONTINUOUS = {
    "attributes": [
        {"name": "r", "type": "real", "low": -1, "high": 1},
        {"name": "s", "type": "real", "low": 0, "high": 2},
    ]
}
FINITE_QUERIES = [
    {"mechanism": "grr", "attribute": "x", "epsilon": 0.3},
    {
        "mechanism": "binary_rr",
        "epsilon": 0.2,
        "predicate": {"attribute": "c", "op": "in", "value": ["a", "c"]},
    },
    {"mechanism": "unary_encoding", "attribute": "c", "epsilon": 0.4, "variant": "symmetric"},
    {"mechanism": "grr", "attribute": "c", "epsilon": 0.25},
    {"mechanism": "grr", "attribute": "x", "epsilon": 0.3},
]
CONTINUOUS_QUERIES = [
    {"mechanism": "logistic", "weights": {"r": 2.0}, "intercept": 0.1, "epsilon": 0.4},
    {
        "mechanism": "linear",
        "weights": {"s": 0.5},
        "intercept": -0.5,
        "range": [-0.5, 0.5],
        "epsilon": 0.3,
    },
]


@pytest.fixture
def verify_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[str], tuple[int, str]]:
    """``gatekeeper verify`` through ``app.cli.main`` (cheaper than a subprocess)."""

    def run(database_url: str) -> tuple[int, str]:
        for name in SETTINGS_ENV:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("DATABASE_URL", database_url)
        get_settings.cache_clear()
        capsys.readouterr()
        try:
            code = cli_main(["verify"])
        finally:
            get_settings.cache_clear()
        return code, capsys.readouterr().out

    return run


# ------------------------------------------------------------------------------------------------
# keys create
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_keys_create_on_a_fresh_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "fresh.db"
    url = f"sqlite:///{db}"
    assert not db.exists()
    migrated = run_cli("migrate", database_url=url)
    assert migrated.returncode == 0, migrated.stderr
    assert db.exists()
    done = run_cli("keys", "create", "--role", "analyst", database_url=url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    analyst = lines[0]
    assert analyst.startswith("gk_")
    assert analyst not in done.stderr

    admin_done = run_cli("keys", "create", "--role", "admin", "--label", "ops", database_url=url)
    assert admin_done.returncode == 0, admin_done.stderr
    admin = admin_done.stdout.strip()
    assert admin.startswith("gk_")
    assert admin != analyst

    # both keys work against an app on that database, with their roles
    with TestClient(create_app(make_settings(url))) as client:
        r = client.post(
            "/v1/objects",
            headers=auth(admin),
            json={
                "id": "o1",
                "domain": FINITE,
                "value": {"x": 1, "c": "b"},
                "budget": {"epsilon": 1},
            },
        )
        assert r.status_code == 201, r.text
        q = {"query": FINITE_QUERIES[0]}
        r = client.post("/v1/objects/o1/dry-run", headers=auth(analyst), json=q)
        assert r.status_code == 200, r.text
        r = client.post("/v1/objects/o1/queries", headers=auth(analyst), json=q)
        assert r.status_code == 201, r.text
        assert client.get("/v1/objects/o1/queries", headers=auth(analyst)).status_code == 200
        # the analyst key is not an admin key
        r = client.post("/v1/keys", headers=auth(analyst), json={"role": "admin"})
        assert r.status_code == 403
        r = client.delete("/v1/objects/o1", headers=auth(analyst))
        assert r.status_code == 403


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "create"],
        ["keys", "create", "--role", "root"],
    ],
    ids=["no-role", "unknown-role"],
)
def test_keys_create_usage_errors(tmp_path: Path, args: list[str]) -> None:
    done = run_cli(*args, database_url=f"sqlite:///{tmp_path / 'x.db'}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout.strip() == ""  # no key printed


# ------------------------------------------------------------------------------------------------
# verify
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def populated(database_url: str) -> dict[str, str]:
    """Objects with histories on the module's database: finite, continuous, empty, retired."""
    ids = {kind: unique_id(kind) for kind in ("finite", "cont", "empty", "retired")}
    with TestClient(create_app(make_settings(database_url))) as client:
        specs = [
            ("finite", FINITE, {"x": 2, "c": "a"}, FINITE_QUERIES),
            ("cont", CONTINUOUS, {"r": 0.3, "s": 1.5}, CONTINUOUS_QUERIES),
            ("empty", FINITE, {"x": 0, "c": "c"}, []),
            ("retired", FINITE, {"x": 3, "c": "b"}, FINITE_QUERIES[:2]),
        ]
        for kind, domain, value, queries in specs:
            r = client.post(
                "/v1/objects",
                headers=auth(ADMIN_KEY),
                json={"id": ids[kind], "domain": domain, "value": value, "budget": {"epsilon": 3}},
            )
            assert r.status_code == 201, r.text
            for n, query in enumerate(queries):
                r = client.post(
                    f"/v1/objects/{ids[kind]}/queries",
                    headers={**auth(ADMIN_KEY), "Idempotency-Key": f"{kind}-{n}"},
                    json={"query": query},
                )
                assert r.status_code == 201, r.text
        # a rejected submit is counted and must not upset verify
        big = {"mechanism": "grr", "attribute": "x", "epsilon": 50}
        r = client.post(
            f"/v1/objects/{ids['finite']}/queries", headers=auth(ADMIN_KEY), json={"query": big}
        )
        assert r.status_code == 409, r.text
        assert (
            client.delete(f"/v1/objects/{ids['retired']}", headers=auth(ADMIN_KEY)).status_code
            == 200
        )
    return ids


def test_verify_exits_0_on_a_consistent_database(
    database_url: str, populated: dict[str, str]
) -> None:
    done = run_cli("verify", database_url=database_url)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "MISMATCH" not in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("verified ")
    assert last.endswith(": ok")
    checked = int(last.split()[1])
    assert checked >= 4
    # it was silent for minutes on a large database: a progress bar (stderr) and a summary
    assert f"{checked}/{checked}" in done.stderr
    assert " survey(s) in " in last
    quiet = run_cli("verify", "--quiet", database_url=database_url)
    assert quiet.returncode == 0, quiet.stderr
    assert f"{checked}/{checked}" not in quiet.stderr


def test_states_collect_deletes_the_unnamed_states_verify_counted(
    database_url: str, populated: dict[str, str]
) -> None:
    """An unnamed state is no mismatch: verify counts it, ``states collect`` deletes it."""
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(LikelihoodStateRecord.__table__),
                [{"hash": "cli-unnamed", "state": b"\x00" * 8, "err": 0.0}],
            )
        done = run_cli("verify", "--quiet", database_url=database_url)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "likelihood state(s) no object names" in done.stdout
        assert done.stdout.strip().splitlines()[-1].endswith(": ok")
        collected = run_cli("states", "collect", database_url=database_url)
        assert collected.returncode == 0, (collected.stdout, collected.stderr)
        deleted = int(collected.stdout.split()[1])
        assert deleted >= 1
        with engine.connect() as conn:
            left = conn.execute(
                select(func.count()).where(LikelihoodStateRecord.hash == "cli-unnamed")
            ).scalar_one()
        assert left == 0
        done = run_cli("verify", "--quiet", database_url=database_url)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "no object names" not in done.stdout
        again = run_cli("states", "collect", database_url=database_url)
        assert again.stdout.strip() == "deleted 0 likelihood state(s) no object names"
    finally:
        engine.dispose()


def test_verify_on_a_freshly_migrated_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert run_cli("migrate", database_url=url).returncode == 0
    done = run_cli("verify", database_url=url)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "verified 0 object(s)" in done.stdout
    assert done.stdout.strip().endswith(": ok")


@contextmanager
def restored(engine: Engine, object_id: str) -> Iterator[None]:
    """Snapshot an object's row, query rows and state row; put them back afterwards."""
    objects, queries = ProtectedObject.__table__, QueryRecord.__table__
    states = LikelihoodStateRecord.__table__
    with engine.connect() as conn:
        obj_row = dict(
            conn.execute(select(objects).where(objects.c.id == object_id)).mappings().one()
        )
        state_rows = [
            dict(r)
            for r in conn.execute(
                select(states).where(states.c.hash == obj_row["state_hash"])
            ).mappings()
        ]
        query_rows = [
            dict(r)
            for r in conn.execute(
                select(queries).where(queries.c.object_id == object_id)
            ).mappings()
        ]
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(delete(queries).where(queries.c.object_id == object_id))
            conn.execute(update(objects).where(objects.c.id == object_id).values(**obj_row))
            if query_rows:
                conn.execute(insert(queries), query_rows)
            for state_row in state_rows:
                conn.execute(delete(states).where(states.c.hash == state_row["hash"]))
                conn.execute(insert(states), [state_row])


def _tamper_object(**values: Any) -> Callable[[Any, str], None]:
    def tamper(conn: Any, oid: str) -> None:
        table = ProtectedObject.__table__
        columns = {k: (v(table) if callable(v) else v) for k, v in values.items()}
        result = conn.execute(update(table).where(table.c.id == oid).values(**columns))
        assert result.rowcount == 1

    return tamper


def _delete_query(which: str) -> Callable[[Any, str], None]:
    def tamper(conn: Any, oid: str) -> None:
        table = QueryRecord.__table__
        seqs = sorted(conn.execute(select(table.c.seq).where(table.c.object_id == oid)).scalars())
        seq = seqs[-1] if which == "last" else seqs[len(seqs) // 2]
        conn.execute(delete(table).where(table.c.object_id == oid, table.c.seq == seq))

    return tamper


def _change_query(
    column: str, change: Callable[[Any], Any], seq: int = 1
) -> Callable[[Any, str], None]:
    def tamper(conn: Any, oid: str) -> None:
        table = QueryRecord.__table__
        row = (
            conn.execute(select(table).where(table.c.object_id == oid, table.c.seq == seq))
            .mappings()
            .one()
        )
        conn.execute(
            update(table)
            .where(table.c.object_id == oid, table.c.seq == seq)
            .values({column: change(row[column])})
        )

    return tamper


def _other_grr_output(raw: str) -> str:
    return json.dumps((json.loads(raw) + 1) % 4)


def _bigger_epsilon(raw: str) -> str:
    query = json.loads(raw)
    query["epsilon"] = query["epsilon"] + 0.5
    return json.dumps(query)


def _flip_state_byte(conn: Any, oid: str) -> None:
    objects, states = ProtectedObject.__table__, LikelihoodStateRecord.__table__
    key = conn.execute(select(objects.c.state_hash).where(objects.c.id == oid)).scalar_one()
    state = bytearray(conn.execute(select(states.c.state).where(states.c.hash == key)).scalar_one())
    state[7] ^= 0x40  # the sign/exponent byte of the first float64: a large change
    conn.execute(update(states).where(states.c.hash == key).values(state=bytes(state)))


def _delete_state(conn: Any, oid: str) -> None:
    objects, states = ProtectedObject.__table__, LikelihoodStateRecord.__table__
    key = conn.execute(select(objects.c.state_hash).where(objects.c.id == oid)).scalar_one()
    conn.execute(delete(states).where(states.c.hash == key))


TAMPERS: dict[str, tuple[str, Callable[[Any, str], None]]] = {
    "loss_upper+1": ("finite", _tamper_object(loss_upper=lambda t: t.c.loss_upper + 1)),
    "loss_lower+0.1": ("finite", _tamper_object(loss_lower=lambda t: t.c.loss_lower + 0.1)),
    "loss_upper-0.1": ("finite", _tamper_object(loss_upper=lambda t: t.c.loss_upper - 0.1)),
    "basic_total": ("finite", _tamper_object(basic_total="1/7")),
    "accepted+1": ("finite", _tamper_object(accepted=lambda t: t.c.accepted + 1)),
    "state-null": ("finite", _tamper_object(state_hash=None)),
    "state-byte": ("finite", _flip_state_byte),
    "state-deleted": ("finite", _delete_state),
    "history-hash": ("finite", _tamper_object(history_hash="0" * 32)),
    "cont-history-hash": ("cont", _tamper_object(history_hash=None)),
    "delete-last-query": ("finite", _delete_query("last")),
    "delete-middle-query": ("finite", _delete_query("middle")),
    "change-output": ("finite", _change_query("output", _other_grr_output)),
    "change-query-epsilon": ("finite", _change_query("query", _bigger_epsilon)),
    "change-epsilon-exact": ("finite", _change_query("epsilon_exact", lambda v: "1/3")),
    "change-seq": ("finite", _change_query("seq", lambda v: 99)),
    "retired-delete-query": ("retired", _delete_query("last")),
    "empty-loss_upper+1": ("empty", _tamper_object(loss_upper=lambda t: t.c.loss_upper + 1)),
    "empty-accepted+1": ("empty", _tamper_object(accepted=lambda t: t.c.accepted + 1)),
    "cont-loss_upper+1": ("cont", _tamper_object(loss_upper=lambda t: t.c.loss_upper + 1)),
    "cont-loss_lower+1": ("cont", _tamper_object(loss_lower=lambda t: t.c.loss_lower + 1)),
    "cont-loss_upper=0": ("cont", _tamper_object(loss_upper=0.0, loss_lower=0.0)),
    "cont-delete-last-query": ("cont", _delete_query("last")),
    "cont-basic_total": ("cont", _tamper_object(basic_total="0")),
}


@pytest.mark.parametrize("tamper_name", list(TAMPERS))
def test_verify_detects_tampering(
    database_url: str,
    populated: dict[str, str],
    verify_in_process: Callable[[str], tuple[int, str]],
    tamper_name: str,
) -> None:
    kind, tamper = TAMPERS[tamper_name]
    oid = populated[kind]
    engine = make_engine(database_url)
    try:
        code, out = verify_in_process(database_url)
        assert code == 0, out  # the baseline is consistent
        with engine.connect() as conn:
            table = ProtectedObject.__table__
            key = conn.execute(select(table.c.state_hash).where(table.c.id == oid)).scalar_one()
        # a line names the object, or the shared state row it named before the tampering
        names = {oid, key} - {None}
        with restored(engine, oid):
            with engine.begin() as conn:
                tamper(conn, oid)
            code, out = verify_in_process(database_url)
            assert code != 0, f"verify missed {tamper_name}: {out}"
            mismatches = [line for line in out.splitlines() if line.startswith("MISMATCH")]
            assert mismatches, out
            assert all(any(name in line for name in names) for line in mismatches), out
            assert "mismatch" in out.splitlines()[-1]
        code, out = verify_in_process(database_url)
        assert code == 0, out  # restored
    finally:
        engine.dispose()


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("tamper_name", ["loss_upper+1", "delete-last-query"])
def test_verify_command_exits_nonzero_after_tampering(
    database_url: str, populated: dict[str, str], tamper_name: str, jobs: str
) -> None:
    """The real ``python -m app.cli verify`` process, for the two classic tamperings.

    ``--jobs 2``: the objects are checked in two processes, one id range each.
    """
    kind, tamper = TAMPERS[tamper_name]
    engine = make_engine(database_url)
    try:
        with restored(engine, populated[kind]):
            with engine.begin() as conn:
                tamper(conn, populated[kind])
            done = run_cli("verify", "--jobs", jobs, database_url=database_url)
            assert done.returncode != 0, (done.stdout, done.stderr)
            assert f"MISMATCH {populated[kind]}" in done.stdout
            with engine.connect() as conn:
                count = conn.execute(select(func.count()).select_from(ProtectedObject)).scalar()
            assert f"verified {count} object(s)" in done.stdout  # every range checked once
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------------------
# serve: the prestart migration; production settings
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_migrates_a_fresh_database_first(tmp_path: Path) -> None:
    db = tmp_path / "new" / "gatekeeper.db"
    url = f"sqlite:///{db}"
    assert not db.exists()
    server = start_server(tmp_path, database_url=url, redis_url=None, workers=1)
    try:
        r = httpx.get(server.url + "/readyz", timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["database"] == "ok"
        assert db.exists()
        engine = make_engine(url)
        try:
            tables = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert {"objects", "queries", "api_keys", "alembic_version"} <= tables
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/healthz").status_code == 200
            r = http.post(
                "/v1/objects",
                headers=auth(ADMIN_KEY),
                json={
                    "id": "s1",
                    "domain": FINITE,
                    "value": {"x": 1, "c": "a"},
                    "budget": {"epsilon": 1},
                },
            )
            assert r.status_code == 201, r.text
            # a key made by the CLI on the same database works against the running server
            done = run_cli("keys", "create", "--role", "viewer", database_url=url)
            assert done.returncode == 0, done.stderr
            viewer = done.stdout.strip()
            assert http.get("/v1/odometers", headers=auth(viewer)).status_code == 200
            r = http.post(
                "/v1/objects/s1/dry-run", headers=auth(viewer), json={"query": FINITE_QUERIES[0]}
            )
            assert r.status_code == 403
            r = http.post(
                "/v1/objects/s1/queries",
                headers={**auth(ADMIN_KEY), "Idempotency-Key": "one"},
                json={"query": FINITE_QUERIES[0]},
            )
            assert r.status_code == 201, r.text
            assert http.get("/metrics").status_code == 200
    finally:
        server.stop()
    done = run_cli("verify", database_url=url)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "verified 1 object(s)" in done.stdout
    assert done.stdout.strip().endswith(": ok")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)


LONG_KEY = "k" * 40


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"database_url": "sqlite:///x.db"}, "DATABASE_URL"),
        (
            {"database_url": "sqlite:///x.db", "gatekeeper_bootstrap_admin_key": LONG_KEY},
            "DATABASE_URL",
        ),
        ({"database_url": "sqlite://"}, "DATABASE_URL"),
        ({"database_url": "sqlite+pysqlite:///x.db"}, "DATABASE_URL"),
        (
            {"database_url": "postgresql://db/gk", "gatekeeper_bootstrap_admin_key": "short"},
            "GATEKEEPER_BOOTSTRAP_ADMIN_KEY",
        ),
        ({"database_url": "postgresql://db/gk", "web_workers": 4}, "REDIS_URL"),
        ({"database_url": "postgresql://db/gk", "web_workers": 4, "redis_url": ""}, "REDIS_URL"),
    ],
    ids=[
        "sqlite",
        "sqlite-with-key",
        "sqlite-memory",
        "sqlite-driver",
        "short-key",
        "workers-no-redis",
        "workers-empty-redis",
    ],
)
def test_production_refuses_unsafe_settings(kwargs: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(gatekeeper_env="production", **kwargs)
    assert complaint in str(info.value)


@pytest.mark.usefixtures("clean_env")
def test_production_accepts_safe_settings() -> None:
    settings = Settings(
        gatekeeper_env="production",
        database_url="postgresql://db/gk",
        gatekeeper_bootstrap_admin_key=LONG_KEY,
        redis_url="redis://cache:6379/0",
        web_workers=4,
    )
    assert settings.gatekeeper_env == "production"
    assert LONG_KEY not in repr(settings)
    # development allows the embedded defaults
    assert Settings(database_url="sqlite:///x.db").is_sqlite


@pytest.mark.usefixtures("clean_env")
def test_production_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEKEEPER_ENV", "production")
    monkeypatch.setenv("DATABASE_URL", "sqlite:///x.db")
    with pytest.raises(ValidationError):
        Settings()


def test_serve_refuses_to_start_in_production_on_sqlite(tmp_path: Path) -> None:
    """It exits non-zero without creating the database, and never prints the bootstrap key."""
    db = tmp_path / "prod.db"
    key = "boot-" + secrets.token_hex(24)
    # a subprocess: what is checked is that the process exits; in this process a `serve` that
    # wrongly started would run uvicorn here and never return
    done = run_cli_process(
        "serve",
        "--port",
        "1",
        database_url=f"sqlite:///{db}",
        bound_processes=None,
        GATEKEEPER_ENV="production",
        GATEKEEPER_BOOTSTRAP_ADMIN_KEY=key,
    )
    assert done.returncode != 0
    assert "DATABASE_URL" in done.stderr
    assert not db.exists()
    output = done.stdout + done.stderr
    leaked = [key[i : i + 12] for i in range(len(key) - 11) if key[i : i + 12] in output]
    assert not leaked, "the bootstrap admin key (or part of it) was printed"

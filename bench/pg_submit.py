"""Where a single submit's PostgreSQL CPU goes: the service's own statements, part by part.

How to run (from the project root, PostgreSQL and Redis reachable; ``pgbench`` on the PATH)::

    GATEKEEPER_BENCH_REDIS_URL=redis://127.0.0.1:6379/13 OPENBLAS_NUM_THREADS=1 \\
      .venv/bin/python bench/pg_submit.py --rounds 16 --block 150 --pgbench 10 --db-prefix pgsub_
    .venv/bin/python bench/pg_submit.py --pgbench 10 --clients 8,16 --pgbench-variants 0,1,2,4 \\
      --bulk 5000

A warm finite submit sends PostgreSQL two statements (docs/benchmarks.md, "h/async"): the
object's ``SELECT`` with the answer stored under the key (prepared,
:func:`app.store.objects.load_for_submit`) and the accepted write as one statement (the
compare-and-set, the query row, the audit event and the named likelihood array as CTEs, in
autocommit, :func:`app.store.submits.record_accepted`). This script

1. **captures** them from real accepted ``grr`` submits (the whole application in process,
   ``create_app``; psycopg's ``Cursor.execute`` watched): the SQL text and the parameters, as
   the service sent them, and refuses to go on unless a warm submit sent exactly these two;
2. **replays** them on one connection per *variant* — a copy of the captured database
   (``CREATE DATABASE … TEMPLATE``) with one thing taken away (the object-count trigger, the
   foreign keys of ``queries``, an index, a CTE of the statement, the commit's WAL flush, …) —
   with fresh values per submit (a new key, state hash, history hash; the object's version and
   count as the load returned them), psycopg executing them as the service does (the load with
   ``prepare=True`` in binary, the write prepared by psycopg's threshold). The backend's CPU
   of each statement is read from ``/proc/PID/schedstat`` (nanoseconds of run time) before and
   after it — the backend is idle between statements, so the difference is that statement's,
   its commit included. The variants run in blocks, their order rotating by round, so the
   machine's load is shared alike; the table gives each variant's median over the rounds and
   the median of its per-round difference from ``as is`` (the part's cost);
3. prints ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of both statements (on the ``as is`` copy, with
   real values: the write is a real submit), the triggers' times, and whether the prepared
   statements run generic plans (``pg_prepared_statements``), and the WAL per submit
   (``pg_current_wal_lsn`` over a block: the server's, so other databases' writes add to it —
   the smallest block of the rounds is given, an upper bound);
4. runs ``pgbench`` (``--pgbench SECONDS``, 8 clients, ``-M prepared``) with its own
   submit-shaped transaction (``bench/survey_load.py``: lock a row, insert a history row, bump
   a version) and with **the service's two statements** (the load with ``\\gset``, the write
   with the version and count it returned; one object per client), alternating, with the
   PostgreSQL backends' CPU per transaction: the ceiling of this SQL shape next to pgbench's
   own, in one run. (pgbench reads results as text: the load's 8 kB array travels as 16 kB of
   hex, which the service's binary read does not pay.) ``--pgbench-variants`` replays them on
   copies of other variants too, ``--clients 8,16`` at several client counts;
5. with ``--bulk ROWS``, times many-row ``UPDATE``s of ``objects`` (a survey chunk's shape)
   under the object-count function of revision 0018 and under this tree's, alternating: what a
   change of that trigger costs statements other than a single submit's.

The copies are dropped at the end (``--keep``: kept). CPU figures are of one backend at a time
(one replaying connection), not under the service's concurrency; the ``pgbench`` rows are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import service_load as sl  # noqa: E402

#: The columns of the load's row that the replay needs (its positions in the captured row).
LOAD_PREFIX, ACCEPT_PREFIX = "SELECT objects.id,", "WITH cas AS"


# --------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class Statement:
    """One statement as the service sent it: text (psycopg's ``%(name)s``), values, options."""

    text: str
    params: dict[str, Any]
    prepare: bool | None


@dataclass(frozen=True)
class Captured:
    """A warm accepted submit's two statements, on which object."""

    load: Statement
    accept: Statement
    object_id: str


@contextlib.contextmanager
def watched() -> Iterator[list[Statement]]:
    """Every statement psycopg's blocking ``Cursor.execute`` sends meanwhile."""
    import psycopg

    seen: list[Statement] = []
    original = psycopg.Cursor.execute

    def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        seen.append(Statement(text, dict(params or {}), kwargs.get("prepare")))
        return original(self, query, params, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def capture(url: str, redis_url: str, key_file: str, submits: int = 8) -> Captured:
    """The statements of the last of ``submits`` accepted ``grr`` submits of the real app.

    Raises unless that (warm) submit sent exactly the load and the accepted write.
    """
    import httpx

    from app.bootstrap import create_app
    from app.settings import Settings

    settings = Settings(
        database_url=url,
        redis_url=redis_url,
        gatekeeper_bootstrap_admin_key=sl.ADMIN_KEY,
        gatekeeper_encryption_key_file=key_file,
        bound_processes=0,
    )
    app = create_app(settings)
    admin = {"Authorization": f"Bearer {sl.ADMIN_KEY}"}
    last: list[Statement] = []
    object_id = "pgsub-" + secrets.token_hex(4)

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://capture") as client,
        ):
            key = await client.post("/v1/keys", json={"role": "analyst"}, headers=admin)
            key.raise_for_status()
            auth = {"Authorization": f"Bearer {key.json()['key']}"}
            answer = await client.post(
                "/v1/objects",
                json={
                    "id": object_id,
                    "domain": sl.GRR_DOMAIN,
                    "value": sl.grr_value(random.Random(1)),
                    "budget": {"epsilon": sl.BUDGET},
                    "filter": "bayesian",
                },
                headers=admin,
            )
            answer.raise_for_status()
            queries = sl.grr_queries(random.Random(1))
            for i in range(submits):
                headers = {**auth, "Idempotency-Key": uuid.uuid4().hex}
                with watched() as seen:
                    answer = await client.post(
                        f"/v1/objects/{object_id}/queries",
                        json={"query": queries[i % len(queries)]},
                        headers=headers,
                    )
                if answer.status_code != 201:
                    raise RuntimeError(f"the real submit failed: {answer.status_code}")
                last[:] = seen

    asyncio.run(run())
    shapes = [(s.text.split("\n", 1)[0][:18], s.prepare) for s in last]
    if (
        len(last) != 2
        or not last[0].text.startswith(LOAD_PREFIX)
        or not last[1].text.startswith(ACCEPT_PREFIX)
        or last[0].prepare is not True
    ):
        raise RuntimeError(f"a warm submit sent {shapes}, not the load and the accepted write")
    return Captured(last[0], last[1], object_id)


# --------------------------------------------------------------------------- the replay


def load_column(text: str, name: str) -> int:
    """The position of the load's output column ``objects.NAME`` (its ``SELECT`` list)."""
    columns = text[len("SELECT ") : text.index("\nFROM objects")]
    # split the top-level list (the domain's sub-select has commas only inside parentheses)
    depth, start, found = 0, 0, []
    for i, ch in enumerate(columns):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            found.append(columns[start:i].strip())
            start = i + 1
    found.append(columns[start:].strip())
    return found.index(f"objects.{name}")


def fresh_accept(
    captured: Captured, object_id: str, version: int, accepted: int, key: str
) -> dict[str, Any]:
    """The write's values for one more submit of ``object_id`` at ``version``, ``accepted``.

    As the service makes them: the captured submit's, with the key, the object's next version
    and seq, a new state hash (the array is named under it) and history hash, and now.
    """
    now = datetime.now(UTC)
    state = secrets.token_hex(16)
    params = dict(captured.accept.params)
    params.update(
        where_id=object_id,
        object_id=object_id,
        query_object_id=object_id,
        where_version=version,
        version=version + 1,
        accepted=accepted + 1,
        query_seq=accepted + 1,
        query_idempotency_key=key,
        state_hash=state,
        named_hash=state,
        history_hash=secrets.token_hex(16),
        query_created_at=now,
        at=now,
        updated_at=now,
    )
    return params


def schedstat_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has run on a CPU (``/proc/PID/schedstat``)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def without_cte(text: str, name: str) -> str:
    """The accepted write without its data-modifying CTE ``name`` (one no other CTE reads)."""
    start = text.index(f", \n{name} AS \n(")
    depth, i = 0, text.index("(", start)
    while True:
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            break
        i += 1
    return text[:start] + text[i + 1 :]


@dataclass
class Variant:
    """A copy of the captured database with one thing changed, and how it is replayed."""

    name: str
    #: Run once in the copy (as its owner) before any submit.
    ddl: tuple[str, ...] = ()
    #: Run on the replaying connection first (session settings).
    session: tuple[str, ...] = ()
    #: The accepted write's text from the captured one.
    text: Callable[[str], str] = field(default=lambda text: text)


def function_0018() -> str:
    """The object-count UPDATE function as revision 0018 made it (before 0019's quiet test)."""
    import importlib.util
    from types import SimpleNamespace

    from sqlalchemy.dialects import postgresql

    path = BENCH.parent / "migrations" / "versions" / "0018_cheaper_object_counts.py"
    spec = importlib.util.spec_from_file_location("bench_revision_0018", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # its text needs only the dialect of alembic's bind
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    module.op = SimpleNamespace(get_bind=lambda: SimpleNamespace(dialect=dialect))
    return str(module.postgres_function("update", fast=True))


VARIANTS = (
    Variant("as is"),
    Variant("the count trigger's function as 0018 made it", ddl=(function_0018(),)),
    Variant(
        "no object-count trigger on UPDATE",
        ddl=("ALTER TABLE objects DISABLE TRIGGER object_counts_update",),
    ),
    Variant(
        "the count trigger's body empty (transition tables kept)",
        ddl=(
            "CREATE OR REPLACE FUNCTION gatekeeper_object_counts_update() RETURNS trigger "
            "LANGUAGE plpgsql AS $b$ BEGIN RETURN NULL; END $b$",
        ),
    ),
    Variant(
        "no foreign keys on queries (2 RI checks)",
        ddl=(
            "ALTER TABLE queries DROP CONSTRAINT queries_analyst_key_id_fkey",
            "ALTER TABLE queries DROP CONSTRAINT queries_object_id_fkey",
        ),
    ),
    Variant(
        "no secondary indexes on audit_events (3)",
        ddl=("DROP INDEX ix_audit_at", "DROP INDEX ix_audit_kind", "DROP INDEX ix_audit_object"),
    ),
    Variant("no ix_queries_reuse", ddl=("DROP INDEX ix_queries_reuse",)),
    Variant(
        "states stored uncompressed (EXTERNAL)",
        ddl=("ALTER TABLE likelihood_states ALTER COLUMN state SET STORAGE EXTERNAL",),
    ),
    Variant("without the named-state CTE", text=lambda text: without_cte(text, "named")),
    Variant("without the audit-event CTE", text=lambda text: without_cte(text, "event")),
    Variant(
        "synchronous_commit off (no WAL flush wait)", session=("SET synchronous_commit = off",)
    ),
)


class Replay:
    """One connection replaying the captured submit on one variant's copy."""

    def __init__(self, url: str, variant: Variant, captured: Captured) -> None:
        import psycopg

        self.variant, self.captured = variant, captured
        self.conn = psycopg.connect(url, autocommit=True)
        for statement in variant.session:
            self.conn.execute(statement)
        self.pid = int(self.conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        self.accept_text = variant.text(captured.accept.text)
        load = captured.load.text
        self.at_version = load_column(load, "version")
        self.at_accepted = load_column(load, "accepted")
        self.lost = 0

    def load(self, key: str) -> tuple[Any, ...]:
        params = {**self.captured.load.params, "object_id": self.captured.object_id, "key": key}
        with self.conn.cursor(binary=True) as cursor:
            cursor.execute(self.captured.load.text, params, prepare=True)
            row = cursor.fetchone()
        if row is None:
            raise RuntimeError("the object is gone")
        return tuple(row)

    def accept(self, row: tuple[Any, ...], key: str, prefix: str = "") -> None:
        params = fresh_accept(
            self.captured,
            self.captured.object_id,
            row[self.at_version],
            row[self.at_accepted],
            key,
        )
        with self.conn.cursor() as cursor:
            cursor.execute(prefix + self.accept_text, params)
            found = cursor.fetchall()
        if not prefix and (not found or found[0][0] is None):
            self.lost += 1

    def block(self, submits: int) -> tuple[float, float, int]:
        """``submits`` submits: the load's and the write's backend µs per submit, WAL bytes."""
        load_ns = accept_ns = 0
        lsn0 = self.lsn()
        for _ in range(submits):
            key = uuid.uuid4().hex
            a = schedstat_ns(self.pid)
            row = self.load(key)
            b = schedstat_ns(self.pid)
            self.accept(row, key)
            c = schedstat_ns(self.pid)
            load_ns += b - a
            accept_ns += c - b
        wal = self.lsn() - lsn0
        return load_ns / submits / 1e3, accept_ns / submits / 1e3, wal

    def lsn(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        return int(row[0])  # type: ignore[index]

    def explain(self) -> tuple[list[str], list[str]]:
        """EXPLAIN (ANALYZE, BUFFERS, WAL) of the load and of a real write (one submit)."""
        key = uuid.uuid4().hex
        params = {**self.captured.load.params, "object_id": self.captured.object_id, "key": key}
        with self.conn.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + self.captured.load.text, params)
            load_plan = [r[0] for r in cursor.fetchall()]
        row = self.load(key)
        params = fresh_accept(
            self.captured, self.captured.object_id, row[self.at_version], row[self.at_accepted], key
        )
        with self.conn.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + self.accept_text, params)
            accept_plan = [r[0] for r in cursor.fetchall()]
        return load_plan, accept_plan

    def prepared(self) -> list[tuple[str, int, int]]:
        """This connection's prepared statements: (first words, generic plans, custom plans)."""
        rows = self.conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
        return [(str(s)[:40].replace("\n", " "), int(g), int(c)) for s, g, c in rows]

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- pgbench


def pgbench_script(captured: Captured) -> tuple[str, dict[str, str]]:
    """The service's two statements as a ``pgbench`` script, and its ``-D`` variables.

    Each ``%(name)s`` becomes the variable ``:l_name`` (the load) or ``:a_name`` (the write);
    constants go in ``-D``; per transaction a new key and state/history hash (random
    integers: text columns), the object is the client's own (ids ``0`` … ``N-1``), and the
    version and count come from the load (``\\gset g_``).
    """
    variables: dict[str, str] = {}

    def convert(statement: Statement, prefix: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            value = statement.params.get(name)
            if isinstance(value, bytes):
                variables[prefix + name] = "\\x" + value.hex()
            elif isinstance(value, datetime):
                variables[prefix + name] = value.isoformat()
            elif value is not None:
                variables[prefix + name] = str(value)
            return ":" + prefix + name

        return re.sub(r"%\((\w+)\)s", one, statement.text).replace("\n", " ")

    load = convert(captured.load, "l_")
    accept = convert(captured.accept, "a_")
    for name in ("l_object_id", "l_key"):
        variables.pop(name, None)
    lines = [
        "\\set l_key random(1, 9000000000000000000)",
        "\\set l_object_id :client_id",
        load,
        "\\gset g_",
        "\\set h random(1, 9000000000000000000)",
        "\\set a_where_id :client_id",
        "\\set a_query_object_id :client_id",
        "\\set a_where_version :g_version",
        "\\set a_version :g_version + 1",
        "\\set a_accepted :g_accepted + 1",
        "\\set a_query_seq :g_accepted + 1",
        "\\set a_query_idempotency_key :l_key",
        "\\set a_state_hash :h",
        "\\set a_named_hash :h",
        "\\set a_history_hash :h",
        accept,
    ]
    for name in (
        "a_where_id",
        "a_query_object_id",
        "a_where_version",
        "a_version",
        "a_accepted",
        "a_query_seq",
        "a_query_idempotency_key",
        "a_state_hash",
        "a_named_hash",
        "a_history_hash",
    ):
        variables.pop(name, None)
    return "\n".join(lines) + "\n", variables


def pgbench_objects(url: str, object_id: str, clients: int) -> None:
    """Objects ``0`` … ``clients - 1``: copies of the captured one (one per pgbench client)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO objects SELECT (jsonb_populate_record(NULL::objects, "
            "to_jsonb(o) || jsonb_build_object('id', k::text))).* "
            "FROM objects o, generate_series(0, %s - 1) k WHERE o.id = %s",
            (clients, object_id),
        )


def pgbench_once(
    url: str,
    name: str,
    script: str,
    variables: dict[str, str],
    seconds: int,
    clients: int,
    mode: str = "prepared",
    env: dict[str, str] | None = None,
) -> tuple[float, float]:
    """One ``pgbench`` run (``-M mode``): transactions per second, PostgreSQL CPU ms per tx."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as out:
        out.write(script)
    command = ["pgbench", "-n", "-M", mode, "-c", str(clients), "-j", "2"]
    command += ["-T", str(seconds), "-f", out.name]
    for key, value in variables.items():
        command += ["-D", f"{key}={value}"]
    sampler = sl.BackendSampler(name)
    try:
        done = subprocess.run(  # noqa: S603 - pgbench from PATH
            [*command, url],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **(env or {})},
        )
    finally:
        cpu = sampler.stop()
        Path(out.name).unlink()
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    tps = count = None
    for line in done.stdout.splitlines():
        if line.startswith("tps ="):
            tps = float(line.split()[2])
        if line.startswith("number of transactions actually processed:"):
            count = int(line.split(":")[1].split()[0])
        failed = line.startswith("number of failed transactions:")
        if failed and not line.split(":")[1].strip().startswith("0 "):
            raise RuntimeError(done.stdout)
    if tps is None or not count:
        raise RuntimeError(done.stdout + done.stderr)
    return tps, 1000 * cpu / count


def pgbench_side(
    admin: Any, stem: str, base_name: str, captured: Captured, chosen: list[Variant], args: Any
) -> None:
    """pgbench's own transaction and the service's statements on variants, alternating."""
    from survey_load import PGBENCH_SCRIPT, pgbench_tables

    clients = [int(c) for c in args.clients.split(",")]
    picked = [VARIANTS[int(i)] for i in args.pgbench_variants.split(",")]
    own = PGBENCH_SCRIPT.format(rows=100_000)
    # one copy per variant (its DDL), objects 0 … max(clients) - 1; pgbench's tables in the first
    copies: list[tuple[str, str, str, dict[str, str], dict[str, str]]] = []
    for i, variant in enumerate(picked):
        name = f"{base_name}_pgb{i}"
        url = f"{stem}/{name}"
        copy_database(admin, base_name, name)
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for statement in variant.ddl:
                conn.execute(statement)
        pgbench_objects(url, captured.object_id, max(clients))
        text, values = pgbench_script(
            Captured(captured.load, replace_text(captured.accept, variant.text), captured.object_id)
        )
        # a session's "SET name = value" as the server option "-c name=value"
        options = (s.split(" ", 1)[1].replace(" = ", "=") for s in variant.session)
        env = {"PGOPTIONS": " ".join("-c " + option for option in options)}
        copies.append((variant.name, name, text, values, env))
        if i == 0:
            pgbench_tables(url)
    print(
        f"\npgbench {datetime.now(UTC):%H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}: -j 2 "
        f"-T {args.pgbench}; pgbench's own transaction as service_load runs it (simple "
        "protocol), the service's statements -M prepared; order rotating by round"
    )
    print("| clients | round | script (database) | tx/s | PostgreSQL CPU ms/tx |")
    print("|---:|---|---|---:|---:|")
    for n in clients:
        for rnd in range(args.pgbench_rounds):
            runs = [("pgbench's submit-shaped tx", copies[0][1], own, {}, {}, "simple")]
            runs += [
                (f"the service's 2 statements ({label})", name, text, values, env, "prepared")
                for label, name, text, values, env in copies
            ]
            shift = rnd % len(runs)
            for label, name, text, values, env, mode in runs[shift:] + runs[:shift]:
                tps, ms = pgbench_once(
                    f"{stem}/{name}", name, text, values, args.pgbench, n, mode, env
                )
                print(f"| {n} | {rnd + 1} | {label} | {tps:,.0f} | {ms:.3f} |", flush=True)


def bulk_side(admin: Any, stem: str, base_name: str, captured: Captured, args: Any) -> None:
    """Many-row ``UPDATE``s under 0018's count function and this tree's, interleaved.

    ``--bulk ROWS`` copies of the captured object (far from their budget); per round, with each
    function in turn (order alternating): a statement moving every row's loss a little (no
    count changes), one counting a rejection on every row (two counts change per row), and a
    one-row quiet statement; the backend's CPU per statement.
    """
    import psycopg

    name = f"{base_name}_bulk"
    url = f"{stem}/{name}"
    copy_database(admin, base_name, name)
    with psycopg.connect(url, autocommit=True) as conn:
        head = str(
            conn.execute(
                "SELECT pg_get_functiondef('gatekeeper_object_counts_update'::regproc)"
            ).fetchone()[0]  # type: ignore[index]
        )
        conn.execute(
            "INSERT INTO objects SELECT (jsonb_populate_record(NULL::objects, to_jsonb(o) || "
            "jsonb_build_object('id', 'bulk-' || k))).* FROM objects o, "
            "generate_series(1, %s) k WHERE o.id = %s",
            (args.bulk, captured.object_id),
        )
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        statements = {
            f"{args.bulk:,} rows, loss + 0.001 (no count changes)": (
                "UPDATE objects SET loss_upper = loss_upper + 0.001 WHERE id LIKE 'bulk-%'",
                3,
            ),
            f"{args.bulk:,} rows, rejected + 1 (two counts change per row)": (
                "UPDATE objects SET rejected = rejected + 1 WHERE id LIKE 'bulk-%'",
                3,
            ),
            "1 row, loss + 0.001": (
                "UPDATE objects SET loss_upper = loss_upper + 0.001 WHERE id = 'bulk-1'",
                200,
            ),
        }
        functions = {"0018": function_0018(), "this tree": head}
        found: dict[tuple[str, str], list[float]] = {
            (f, s): [] for f in functions for s in statements
        }
        for rnd in range(args.bulk_rounds):
            order = list(functions) if rnd % 2 == 0 else list(functions)[::-1]
            for label in order:
                conn.execute(functions[label])
                for text, (sql, repeat) in statements.items():
                    conn.execute(sql)  # warm: the function's plans made
                    before = schedstat_ns(pid)
                    for _ in range(repeat):
                        conn.execute(sql)
                    found[label, text].append((schedstat_ns(pid) - before) / repeat / 1e6)
        conn.execute(head)
    print(
        f"\nmany-row UPDATEs {datetime.now(UTC):%H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}: "
        f"{args.bulk_rounds} rounds, functions alternating"
    )
    print("| statement | 0018 ms | this tree ms | per round: this tree / 0018, median |")
    print("|---|---:|---:|---:|")
    for text in statements:
        old, new = found["0018", text], found["this tree", text]
        ratio = statistics.median(b / a for a, b in zip(old, new, strict=True))
        print(
            f"| {text} | {statistics.median(old):.3f} | {statistics.median(new):.3f} | "
            f"{ratio:.3f} |"
        )


def replace_text(statement: Statement, change: Callable[[str], str]) -> Statement:
    return Statement(change(statement.text), statement.params, statement.prepare)


# --------------------------------------------------------------------------- the run


def copy_database(admin: Any, template: str, name: str) -> None:
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')


def plan_summary(lines: list[str]) -> list[str]:
    """The plan's lines that say where time, buffers and WAL go (all of them, indented)."""
    return ["    " + line for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=16, help="blocks per variant")
    parser.add_argument("--block", type=int, default=150, help="submits per block")
    parser.add_argument("--warmup", type=int, default=30, help="untimed submits per variant")
    parser.add_argument("--pgbench", type=int, default=10, metavar="SECONDS", help="0: skip")
    parser.add_argument("--pgbench-rounds", type=int, default=2)
    parser.add_argument(
        "--clients", default="8", help="pgbench clients, comma-separated runs (8,32)"
    )
    parser.add_argument(
        "--pgbench-variants",
        default="0",
        help="the variants (numbers) pgbench replays the service's statements on (default: as is)",
    )
    parser.add_argument(
        "--variants", default="", help="comma-separated variant numbers (default: all)"
    )
    parser.add_argument(
        "--bulk", type=int, default=0, metavar="ROWS", help="many-row UPDATEs (0: skip)"
    )
    parser.add_argument("--bulk-rounds", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--no-explain", action="store_true")
    sl.add_scratch_args(parser, db_prefix="gk_pgsub_")
    args = parser.parse_args(argv)
    sl.POSTGRES_URL = args.admin_url
    import psycopg

    chosen = (
        [VARIANTS[0]] + [VARIANTS[int(i)] for i in args.variants.split(",") if int(i) != 0]
        if args.variants
        else list(VARIANTS)
    )
    print(f"start {datetime.now(UTC):%H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}")
    admin_url = args.admin_url.replace("postgresql+psycopg://", "postgresql://")
    base_name = args.db_prefix + secrets.token_hex(4)
    names = [f"{base_name}_{i}" for i in range(len(chosen))]
    names += [f"{base_name}_pgb{i}" for i in range(len(VARIANTS))] + [f"{base_name}_bulk"]
    replays: list[Replay] = []
    with (
        tempfile.TemporaryDirectory() as keys,
        psycopg.connect(admin_url, autocommit=True) as admin,
        sl.fresh_database(name=base_name, keep=args.keep) as (url, _),
    ):
        try:
            captured = capture(url, args.redis, str(Path(keys) / "encryption.key"))
            # the template must have no sessions: the app's pool is gone with its lifespan
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND pid <> pg_backend_pid()",
                (base_name,),
            )
            time.sleep(0.5)
            stem = url.rsplit("/", 1)[0]
            for variant, name in zip(chosen, names, strict=False):
                copy_database(admin, base_name, name)
                with psycopg.connect(f"{stem}/{name}", autocommit=True) as conn:
                    for statement in variant.ddl:
                        conn.execute(statement)
                replays.append(Replay(f"{stem}/{name}", variant, captured))
            for replay in replays:
                for _ in range(args.warmup):
                    key = uuid.uuid4().hex
                    replay.accept(replay.load(key), key)
            results: dict[str, list[tuple[float, float, int]]] = {
                r.variant.name: [] for r in replays
            }
            for rnd in range(args.rounds):
                shift = rnd % len(replays)
                for replay in replays[shift:] + replays[:shift]:
                    results[replay.variant.name].append(replay.block(args.block))
            print(
                f"replayed {datetime.now(UTC):%H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}; "
                f"{args.rounds} rounds x {args.block} submits per variant, one connection each"
            )
            base = results[VARIANTS[0].name]
            print()
            print(
                "| variant | load µs | write µs | both µs | write − as is, per round: median (IQR) "
                "| WAL bytes/submit (min block) |"
            )
            print("|---|---:|---:|---:|---|---:|")
            for replay in replays:
                found = results[replay.variant.name]
                load = statistics.median(x[0] for x in found)
                write = statistics.median(x[1] for x in found)
                both = statistics.median(x[0] + x[1] for x in found)
                diffs = sorted(x[1] - b[1] for x, b in zip(found, base, strict=True))
                q = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
                wal = min(x[2] for x in found) / args.block
                print(
                    f"| {replay.variant.name} | {load:.1f} | {write:.1f} | {both:.1f} | "
                    f"{q[1]:+.1f} ({q[0]:+.1f} … {q[2]:+.1f}) | {wal:,.0f} |"
                )
            lost = {r.variant.name: r.lost for r in replays if r.lost}
            if lost:
                print(f"lost races (write hit no row): {lost}")
            if not args.no_explain:
                first = replays[0]
                print()
                print(f"prepared on the replaying connection: {first.prepared()}")
                load_plan, accept_plan = first.explain()
                print("\nEXPLAIN (ANALYZE, BUFFERS, WAL) of the load:")
                print("\n".join(plan_summary(load_plan)))
                print("\nEXPLAIN (ANALYZE, BUFFERS, WAL) of the accepted write:")
                print("\n".join(plan_summary(accept_plan)))
            for replay in replays:
                replay.close()
            replays.clear()
            if args.pgbench:
                pgbench_side(admin, stem, base_name, captured, chosen, args)
            if args.bulk:
                bulk_side(admin, stem, base_name, captured, args)
            print(f"\nend {datetime.now(UTC):%H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}")
        finally:
            for replay in replays:
                replay.close()
            if not args.keep:
                for name in names:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())

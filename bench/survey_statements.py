"""One survey of the diverging series on copies of a kept database: PostgreSQL's side, per tree.

How to run (from the project root; PostgreSQL on this machine, its log file readable)::

    # a database after six surveys, and the key its values are encrypted with
    .venv/bin/python bench/survey_load.py --objects 200000 --surveys 6 --keep-database ...
    .venv/bin/python bench/survey_statements.py --template KEPT_DB --key KEY_FILE --survey 7 \
        --trees /work/wt/base,. --rounds 2 [--explain]

Per round and tree (alternating which goes first): ``CREATE DATABASE ... TEMPLATE KEPT_DB``,
the tree's ``gatekeeper migrate``, its ``serve``, survey ``--survey`` of
``bench.survey_load.series_query`` through HTTP, timed as ``survey_load.py`` times one (wall,
the server's CPU, its PostgreSQL backends' CPU), with the tables' ``pg_stat_user_tables``
deltas (rows updated, of them HOT, inserted, deleted) and the database's WAL (the sum of its
statements' ``WAL Bytes``, with ``--explain``); the copy is dropped after. Every tree starts
from the same bytes, so the survey's work is the same but for its random draws.

``--explain``: ``auto_explain`` (``log_analyze``, ``log_buffers``, ``log_wal``,
``log_triggers``, JSON) and ``log_min_duration_statement = 0`` for the copy's sessions
(``ALTER DATABASE ... SET session_preload_libraries``: no server restart; ``pg_stat_statements``
needs one). The server's log is read afterwards and every statement of the copy's client
backends summed by its text (numbers and parameters folded): calls, time (parse + bind +
execute, or the simple query's), executor time, rows, WAL records, full-page images and bytes,
shared buffers hit/read/dirtied. ``EXPLAIN ANALYZE`` timing slows every statement: the CPU
figures of an ``--explain`` round are not comparable with a plain round's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import ADMIN_KEY, POSTGRES_URL, BackendSampler, Server  # noqa: E402
from bench.survey_load import cli, run_survey, series_query  # noqa: E402

LOG = Path("/var/log/postgresql/postgresql-15-main.log")
ADMIN = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
TABLES = ("objects", "likelihood_states", "survey_chunks", "surveys", "object_counts")
EXPLAIN = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_wal": "on",
    "auto_explain.log_triggers": "on",
    "auto_explain.log_timing": "off",
    "auto_explain.log_format": "json",
    "log_min_duration_statement": "0",
    "log_parameter_max_length": "0",
    "log_statement_stats": "on",
}
_ENTRY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \w+) \[(\d+)\] (?:(\S*)@(\S*) )?")
_USAGE = re.compile(r"([\d.]+) s user, ([\d.]+) s system")


def admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(statement)


def table_stats(url: str) -> dict[str, tuple[int, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup "
            "FROM pg_stat_user_tables"
        ).fetchall()
    return {r[0]: tuple(int(v) for v in r[1:]) for r in rows if r[0] in TABLES}


def normalize(text: str) -> str:
    """A statement's text with its literals and parameter numbers folded, on one line."""
    text = " ".join(text.split())
    text = re.sub(r"'(?:[^']|'')*'", "?", text)
    text = re.sub(r"\$\d+", "$", text)
    text = re.sub(r"\b\d+\b", "N", text)
    text = re.sub(r"_pg3_\d+", "_pg3", text)
    text = re.sub(r'"c_[0-9a-f]+_\d+"', '"c_"', text)  # SQLAlchemy's server-side cursors
    return text[:160]


def entries(path: Path, offset: int, database: str) -> list[tuple[int, str]]:
    """The log's entries of ``database`` written after ``offset``: (pid, text after prefix)."""
    with path.open("rb") as log:
        log.seek(offset)
        data = log.read().decode("utf-8", "replace")
    found: list[tuple[int, str]] = []
    current: list[str] | None = None
    pid = 0
    for line in data.splitlines():
        match = _ENTRY.match(line)
        if match:
            if current is not None:
                found.append((pid, "\n".join(current)))
            if match.group(4) == database:
                pid = int(match.group(2))
                current = [line[match.end() :]]
            else:
                current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        found.append((pid, "\n".join(current)))
    return found


def _walk(plan: dict[str, Any], key: str) -> int:
    return int(plan.get(key, 0))


def summarize(logged: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """Per statement text: calls, time (ms), executor time (ms), rows, WAL, buffers."""
    stats: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    duration = re.compile(
        r"^LOG:\s+duration: ([\d.]+) ms\s+(parse|bind|execute|statement)\s*([^:]*):\s?(.*)$",
        re.S,
    )
    usage: dict[int, float] = {}  # per backend: the CPU of its last statistics entry
    for pid, text in logged:
        if text.startswith("DETAIL:  ! system usage stats:"):
            found = _USAGE.search(text)
            if found:
                usage[pid] = 1000 * (float(found.group(1)) + float(found.group(2)))
            continue
        if text.startswith("STATEMENT:"):
            if pid in usage:
                stats[normalize(text[len("STATEMENT:") :])]["cpu ms"] += usage.pop(pid)
            continue
        if text.startswith("LOG:  duration:") and "plan:" in text.split("\n", 1)[0]:
            head, _, body = text.partition("plan:")
            ms = float(head.split("duration:")[1].split("ms")[0])
            try:
                plan = json.loads(body)
            except ValueError:
                continue
            key = normalize(plan.get("Query Text", "?"))
            top = plan["Plan"]
            row = stats[key]
            row["executor ms"] += ms
            rows = _walk(top, "Actual Rows")
            if top.get("Node Type") == "ModifyTable" and top.get("Plans"):
                rows = _walk(top["Plans"][0], "Actual Rows")
            row["rows"] += rows
            row["WAL records"] += _walk(top, "WAL Records")
            row["WAL FPI"] += _walk(top, "WAL FPI")
            row["WAL bytes"] += _walk(top, "WAL Bytes")
            row["hit"] += _walk(top, "Shared Hit Blocks")
            row["read"] += _walk(top, "Shared Read Blocks")
            row["dirtied"] += _walk(top, "Shared Dirtied Blocks")
            continue
        match = duration.match(text)
        if match:
            took, step, _name, statement = match.groups()
            row = stats[normalize(statement)]
            row["ms"] += float(took)
            if step in ("execute", "statement"):
                row["calls"] += 1
    out = [{"statement": key, **values} for key, values in stats.items()]
    return sorted(out, key=lambda r: -r.get("cpu ms", 0.0))


def one(tree: Path, args: argparse.Namespace, label: str) -> dict[str, Any]:
    name = f"{args.db_prefix}{os.getpid()}_{label}"
    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{name}" TEMPLATE "{args.template}"')
    url = ADMIN.rsplit("/", 1)[0] + "/" + name
    result: dict[str, Any] = {"tree": str(tree)}
    try:
        done = cli(url, "migrate", tree=tree)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        if args.explain:
            for setting, value in EXPLAIN.items():
                admin(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'")
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GATEKEEPER_ENCRYPTION_KEY_FILE": str(args.key), "BOUND_PROCESSES": "1"}
            server = Server(url, 1, 1, Path(tmp) / "server.log", env, tree=tree)
            try:
                before = table_stats(url)
                offset = args.log.stat().st_size if args.explain else 0
                headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
                with httpx.Client(base_url=server.url, timeout=60) as http:
                    cpu = server.cpu()
                    backends = BackendSampler(name)
                    view, seconds = run_survey(
                        http, headers, series_query(args.survey - 1), "bench"
                    )
                    result["pg cpu"] = backends.stop()
                    result["server cpu"] = server.cpu() - cpu
                result["wall"] = seconds
                result["groups"] = view["groups"]
                result["status"] = view["status"]
                result["load"] = os.getloadavg()[0]
            finally:
                server.stop()
            time.sleep(11)  # a backend reports its table counts up to 10 s late (PostgreSQL 15)
            after = table_stats(url)
            result["tables"] = {
                t: [a - b for a, b in zip(after[t], before.get(t, (0,) * 5), strict=False)]
                for t in after
            }
            if args.explain:
                result["statements"] = summarize(entries(args.log, offset, name))
    finally:
        if not args.keep:
            admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", required=True, help="a kept database (survey_load.py)")
    parser.add_argument("--key", type=Path, required=True, help="its values' encryption key file")
    parser.add_argument("--survey", type=int, default=7, help="which survey of the series (7)")
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated source trees")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--explain", action="store_true", help="per-statement table (slower)")
    parser.add_argument("--keep", action="store_true", help="keep the copies")
    parser.add_argument("--db-prefix", default="gk_stmt_")
    parser.add_argument("--json", type=Path, help="write every round's results here")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--log", type=Path, default=LOG, help=f"the server's log file, readable ({LOG})"
    )
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    results = []
    print(f"load {os.getloadavg()}", flush=True)
    print("| round | tree | wall s | server CPU s | PG CPU s | groups | objects upd (HOT) | load |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for r in range(args.rounds):
        order = list(range(len(trees)))
        if r % 2:
            order.reverse()
        for n in order:
            res = one(trees[n], args, f"{r}_{n}")
            res["round"] = r
            results.append(res)
            objects = res["tables"].get("objects", [0, 0, 0, 0, 0])
            print(
                f"| {r + 1} | {trees[n]} | {res['wall']:.1f} | {res['server cpu']:.1f} | "
                f"{res['pg cpu']:.1f} | {res['groups']} | {objects[1]:,} ({objects[2]:,}) | "
                f"{res['load']:.2f} |",
                flush=True,
            )
            if args.explain:
                print(f"tables (ins, upd, HOT upd, del, dead): {res['tables']}")
                total = sum(s.get("cpu ms", 0) for s in res["statements"])
                wal = sum(s.get("WAL bytes", 0) for s in res["statements"])
                print(f"statements' CPU {total / 1000:.1f} s, WAL {wal / 1e6:.1f} MB")
                print(
                    "| statement | calls | CPU ms | wall ms | executor ms | rows | WAL rec | "
                    "WAL FPI | WAL MB | hit | read | dirtied |"
                )
                print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
                for s in res["statements"][: args.top]:
                    print(
                        f"| `{s['statement'][:110]}` | {s.get('calls', 0):,.0f} | "
                        f"{s.get('cpu ms', 0):,.0f} | {s.get('ms', 0):,.0f} | "
                        f"{s.get('executor ms', 0):,.0f} | {s.get('rows', 0):,.0f} | "
                        f"{s.get('WAL records', 0):,.0f} | {s.get('WAL FPI', 0):,.0f} | "
                        f"{s.get('WAL bytes', 0) / 1e6:,.1f} | {s.get('hit', 0):,.0f} | "
                        f"{s.get('read', 0):,.0f} | {s.get('dirtied', 0):,.0f} |"
                    )
                print(flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["status"] == "done" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

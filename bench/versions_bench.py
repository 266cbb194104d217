"""Bulk data versions on PostgreSQL: ``gatekeeper import --versions`` of N objects, timed.

For each tree (``--baseline DIR``, e.g. a worktree of main, then this one; ``--rounds`` times,
interleaved, so both see the same machine): a fresh database, N objects registered
(``gatekeeper import``), then

1. with ``--survey``: a survey of the whole population (``grr`` ε = 1 on ``region``, through
   ``gatekeeper serve``), the first on the fresh population;
2. ``gatekeeper import --versions FILE`` (batches of 10,000, one transaction each): wall time,
   CPU of the command and its worker processes, CPU of the PostgreSQL backends serving it;
3. the same file again (every batch replayed by its key);
4. with ``--survey``: the same survey right after the bulk version;
   (with ``--vacuum``, after a ``VACUUM ANALYZE``: the objects' pages pruned, whatever
   autovacuum did before — else the update of a page not pruned yet may not fit in it);
5. with ``--verify``: ``gatekeeper verify`` (every object, every version, one process);
6. the bytes per closed version: the growth of every table over the bulk version
   (``pg_total_relation_size``: heap, TOAST and all indexes, each table before and after),
   per object-version, beside the value's ciphertext; ``object_versions``' heap and index per
   row when a tree stores one row per closed version; and the database's growth.

The load average is printed beside every figure (the machine is shared)::

    .venv/bin/python bench/versions_bench.py --objects 100000
    .venv/bin/python bench/versions_bench.py --objects 200000 --survey --baseline /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import (  # noqa: E402
    ADMIN_KEY,
    BackendSampler,
    Server,
    fresh_database,
    proc_cpu,
)
from bench.survey_load import (  # noqa: E402
    KEY_FILE,
    REGIONS,
    SURVEYS,
    cli,
    db_size,
    run_survey,
    sql,
    write_population,
)


def write_versions(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(n):
            value = {
                "age": rng.randrange(10),
                "sex": rng.randrange(2),
                "region": rng.choice(REGIONS),
            }
            out.write(json.dumps({"id": f"p{i:07d}", "value": value}) + "\n")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def children_cpu() -> float:
    """CPU seconds of this process's finished children (and the processes they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree_cpu(pid: int) -> float:
    """CPU seconds of a live process and its live descendants."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)] = int(stat[1])
    wanted, total = [pid], 0.0
    while wanted:
        current = wanted.pop()
        total += proc_cpu(current)
        wanted.extend(child for child, parent in parents.items() if parent == current)
    return total


def timed_cli(url: str, name: str, tree: Path, *args: str) -> tuple[dict[str, Any], str]:
    """``gatekeeper ARGS`` from ``tree``: wall, its CPU (with workers), the backends' CPU."""
    sampler = BackendSampler(name)
    cpu = children_cpu()
    start = time.perf_counter()
    done = cli(url, *args, tree=tree)
    seconds = time.perf_counter() - start
    figures = {
        "seconds": seconds,
        "cpu": children_cpu() - cpu,
        "pg_cpu": sampler.stop(),
        "load": load(),
    }
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return figures, done.stdout.strip()


def timed_survey(
    http: httpx.Client, server: Server, name: str, study: str = "bench"
) -> dict[str, Any]:
    """The first of ``survey_load``'s surveys on the whole population, start to done."""
    sampler = BackendSampler(name)
    cpu = tree_cpu(server.process.pid)
    view, seconds = run_survey(http, {"Authorization": f"Bearer {ADMIN_KEY}"}, SURVEYS[0], study)
    return {
        "seconds": seconds,
        "cpu": tree_cpu(server.process.pid) - cpu,
        "pg_cpu": sampler.stop(),
        "load": load(),
        "status": view["status"],
        "decided": view["progress"]["decided"],
        "accepted": view["progress"]["accepted"],
    }


def run_tree(args: argparse.Namespace, label: str, tree: Path) -> dict[str, Any]:
    """One tree's whole run on its own fresh database."""
    found: dict[str, Any] = {"tree": label}
    with (
        fresh_database(migrate=False, prefix=f"bulkv_{label}_") as (url, name),
        tempfile.TemporaryDirectory() as tmp,
    ):
        migrated = cli(url, "migrate", tree=tree)  # each tree to its own head
        if migrated.returncode != 0:
            raise RuntimeError(migrated.stderr[-2000:])
        population = Path(tmp) / "population.ndjson"
        write_population(population, args.objects, args.seed)
        found["import"], _ = timed_cli(url, name, tree, "import", str(population), "--quiet")
        versions = Path(tmp) / "versions.ndjson"
        write_versions(versions, args.objects, args.seed + 1)
        batch = ("--quiet", "--batch-size", "10000")

        def with_server(step: Callable[[httpx.Client, Server], None]) -> None:
            env = {"GATEKEEPER_ENCRYPTION_KEY_FILE": str(KEY_FILE), "BOUND_PROCESSES": "1"}
            server = Server(url, 1, 1, Path(tmp) / "server.log", env, tree=tree)
            try:
                with httpx.Client(base_url=server.url, timeout=60) as http:
                    step(http, server)
            finally:
                server.stop()

        if args.survey:
            with_server(
                lambda http, server: found.__setitem__(
                    "survey_fresh", timed_survey(http, server, name)
                )
            )
        if args.vacuum:
            vacuum(url)
        size, tables = db_size(url), relation_sizes(url)
        found["versions"], found["answer"] = timed_cli(
            url, name, tree, "import", "--versions", str(versions), *batch
        )
        found["growth"] = db_size(url) - size
        after = relation_sizes(url)
        found["tables"] = {
            t: after[t] - tables.get(t, 0) for t in after if after[t] != tables.get(t, 0)
        }
        found["cipher"] = closed_ciphertext(url)
        found["replayed"], found["replayed_answer"] = timed_cli(
            url, name, tree, "import", "--versions", str(versions), *batch
        )
        if args.survey:
            with_server(
                lambda http, server: found.__setitem__(
                    "survey_after", timed_survey(http, server, name)
                )
            )
        if args.verify:
            found["verify"], found["verify_answer"] = timed_cli(
                url, name, tree, "verify", "--quiet"
            )
        count = int(sql(url, "SELECT count(*) FROM object_versions"))
        found["rows"] = count
        if count:
            found["heap"] = int(sql(url, "SELECT pg_relation_size('object_versions')")) / count
            found["total"] = (
                int(sql(url, "SELECT pg_total_relation_size('object_versions')")) / count
            )
    return found


def vacuum(url: str) -> None:
    """``VACUUM ANALYZE`` every table: the pages pruned, the statistics fresh."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def relation_sizes(url: str) -> dict[str, int]:
    """Every table's ``pg_total_relation_size`` (heap, TOAST, indexes), by name."""
    found = sql(
        url,
        "SELECT CAST(json_object_agg(relname, pg_total_relation_size(oid)) AS text) FROM pg_class "
        "WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace",
    )
    return {str(k): int(v) for k, v in json.loads(found).items()}


def closed_ciphertext(url: str) -> float:
    """The mean length of a closed version's value as stored (either layout)."""
    packed = sql(url, "SELECT to_regclass('version_batches') IS NOT NULL")
    if packed == "True" and int(sql(url, "SELECT count(*) FROM version_batches")):
        return float(
            sql(
                url,
                "SELECT (sum(octet_length(ciphertexts)) - sum(size - 1)) / sum(size) "
                "FROM version_batches",
            )
        )
    return float(sql(url, "SELECT avg(octet_length(value)) FROM object_versions"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--survey", action="store_true", help="a survey before and after")
    parser.add_argument("--verify", action="store_true", help="gatekeeper verify at the end")
    parser.add_argument(
        "--vacuum", action="store_true", help="VACUUM ANALYZE before the bulk version"
    )
    parser.add_argument(
        "--baseline", type=Path, help="another tree (e.g. a worktree of main), run alternately"
    )
    args = parser.parse_args(argv)
    from cryptography.fernet import Fernet

    KEY_FILE.write_text(Fernet.generate_key().decode())
    trees = [("this", ROOT)]
    if args.baseline is not None:
        trees.insert(0, ("base", args.baseline.resolve()))
    print(f"{os.cpu_count()} cpus, load {load()}", flush=True)
    results = []
    try:
        for _ in range(args.rounds):
            for label, tree in trees:
                results.append(run_tree(args, label, tree))
                print(json.dumps(results[-1]), flush=True)
    finally:
        KEY_FILE.unlink(missing_ok=True)
    n = args.objects
    print()
    print("| tree | step | wall s | objects/s | CPU s (command) | CPU s (PostgreSQL) | load |")
    print("|---|---|---|---|---|---|---|")
    for found in results:
        for step in ("import", "survey_fresh", "versions", "replayed", "survey_after", "verify"):
            if step not in found:
                continue
            f = found[step]
            print(
                f"| {found['tree']} | {step} | {f['seconds']:.1f} | {n / f['seconds']:,.0f} | "
                f"{f['cpu']:.1f} | {f['pg_cpu']:.1f} | {f['load']} |"
            )
    print()
    for found in results:
        cipher = found["cipher"]
        grown = sum(found["tables"].values())
        tables = ", ".join(
            f"{t} {b / n:.1f}" for t, b in sorted(found["tables"].items(), key=lambda i: -i[1])
        )
        print(
            f"{found['tree']}: tables grew {grown / n:.1f} B per object-version ({tables}), "
            f"value ciphertext {cipher:.1f} B: **{grown / n - cipher:.1f} B beyond it**; "
            f"database grew {found['growth'] / n:.0f} B per object-version; {found['answer']}"
        )
        if found["rows"]:
            heap, total = found["heap"], found["total"]
            print(
                f"  object_versions {found['rows']:,} rows, heap {heap:.0f} B/row, with index "
                f"{total:.0f} B/row (beyond the ciphertext: {heap - cipher:.0f} B, "
                f"{total - cipher:.0f} B)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

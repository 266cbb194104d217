"""A diverged survey chunk's write side alone, in process: trees side by side (h/arrays).

Issue 27 item 3. A chunk of a diverged survey (the seventh of ``bench/survey_load.py``'s
sequence) meets each member in a decision group and answer of its own: per member,
``survey_runs._answer_group`` (its new history hash, the answer's variant, its columns) and
then ``survey_store.advance_members`` (the compare-and-set: a binary ``COPY`` into a temporary
table and one ``UPDATE``). This times those two steps for a synthetic chunk of ``--members``
such members, each with its own answer's columns (``Advance``) and its own history hash, with
each tree's code (a subprocess per tree and round, ``PYTHONPATH`` set to the tree), and prints
the client's CPU per chunk (``time.process_time``) of each step, the median over
``--repeats``. The ``UPDATE`` runs on an empty migrated database (``--db-prefix``), so it
finds no rows: PostgreSQL's side is not measured here (``bench/chunk_arrays.py`` measures the
survey whole).

    bench/chunk_write.py --trees /work/wt/arrays,/work/wt/arrays_base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # appended: a tree's run imports that tree's ``app`` (PYTHONPATH)

from bench.service_load import fresh_database  # noqa: E402
from bench.survey_load import DOMAIN, series_query  # noqa: E402


def one_tree(url: str, members: int, repeats: int, *, warm: bool = False) -> dict[str, Any]:
    """Time ``repeats`` synthetic chunks with this process's ``app`` (run with ``--one``).

    ``warm``: one run cache and one chunk's answers for all repeats (after the first, every
    answer was met in an earlier chunk of the run), not new ones per repeat.
    """
    import app
    from app.db.session import make_engine
    from app.engine.limits import DEFAULT_LIMITS
    from app.services import survey_runs
    from app.services.snapshots import Advance, StoredState
    from app.store import surveys as survey_store
    from app.store.surveys import GroupKey, MemberRow

    query = series_query(6)  # the seventh survey: grr on region
    domain = json.dumps(DOMAIN)
    engine = make_engine(url)
    answer_cpu: list[float] = []
    write_cpu: list[float] = []
    try:
        chunk: list[Any] = []
        for _ in range(repeats + warm):
            if not (warm and chunk):
                cache = survey_runs.new_run_cache(query, DEFAULT_LIMITS)
                chunk = []
            mech = cache.parsed.mech(domain)
            assert mech is not None  # noqa: S101 - the bench's own query
            output = mech.parse_output(DOMAIN["attributes"][2]["values"][0], "output")
            work = survey_runs._Chunk(1, 1, datetime.now(UTC))
            # each member its own group, answer and history (built once when ``warm``)
            for n in range(0 if chunk else members):
                group_hash = secrets.token_hex(16)
                key = GroupKey(domain, 4.0, "bayesian", f"{n}/7", group_hash, None, 0,
                               0.1, 0.2, None, "0", None, None, 0.0, 0.0)  # fmt: skip
                state = secrets.token_hex(16)
                columns = {
                    "state_hash": state,
                    "state_pending": 0,
                    "history_hash": secrets.token_hex(16),
                    "loss_lower": 0.25 + (n % 50) * 1e-3,
                    "loss_upper": 0.25 + (n % 50) * 1e-3 + 1e-12,
                    "basic_total": f"{n % 50 + 1}/2",
                    "f0_account": f"{n % 50 + 1}/4",
                }
                change = Advance(columns, StoredState(state, b"", 0.0), by_content=True)
                own = key._replace(history_hash=secrets.token_hex(16))
                row = MemberRow(f"m{n:07d}", 3, 6, 0, False, "", own)
                chunk.append((key, change, [row]))
            cpu = time.process_time()
            for key, change, answered in chunk:
                survey_runs._answer_group(work, key, mech, output, change, answered, cache)
            answer_cpu.append(time.process_time() - cpu)
            with engine.connect() as conn:
                cpu = time.process_time()
                moved = survey_store.advance_members(conn, work.advances, updated_at=work.now)
                write_cpu.append(time.process_time() - cpu)
                conn.rollback()
            assert moved == 0  # noqa: S101 - no object rows: the statement finds none
    finally:
        engine.dispose()
    return {
        "app": str(Path(app.__file__).parents[1]),
        "answer_ms": 1e3 * statistics.median(answer_cpu[warm:]),
        "write_ms": 1e3 * statistics.median(write_cpu[warm:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated trees (alternated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--members", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--db-prefix", default="cw_")
    parser.add_argument("--warm", action="store_true", help="answers met in an earlier chunk")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        found = one_tree(args.one, args.members, args.repeats, warm=args.warm)
        print(json.dumps(found), flush=True)
        return 0
    trees = [Path(t) for t in args.trees.split(",")]
    print("| round | tree | answer CPU ms per chunk | write CPU ms per chunk | load |")
    print("|---|---|---:|---:|---|")
    with fresh_database(prefix=args.db_prefix) as (url, _):
        for round_ in range(args.rounds):
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                env = {
                    **os.environ,
                    "PYTHONPATH": f"{tree}:{tree}/clients/python/src",
                    "OPENBLAS_NUM_THREADS": "1",
                }
                command = [sys.executable, str(Path(__file__).resolve()), "--one", url]
                command += ["--members", str(args.members), "--repeats", str(args.repeats)]
                command += ["--warm"] if args.warm else []
                done = subprocess.run(  # noqa: S603 - this script
                    command, cwd=tree, env=env, capture_output=True, text=True, check=False
                )
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-3000:])
                r = json.loads(done.stdout.strip().splitlines()[-1])
                if Path(r["app"]).resolve() != tree.resolve():
                    raise SystemExit(f"{tree}'s run imported the app of {r['app']}")
                print(
                    f"| {round_ + 1} | {tree} | {r['answer_ms']:.1f} | {r['write_ms']:.1f} | "
                    f"{os.getloadavg()[0]:.2f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

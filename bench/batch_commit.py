"""PostgreSQL's CPU per accepted write when writes of different objects are committed together:
the database side of group commit (issue 27 item 1, option (c)), without HTTP.

How to run (from the project root, PostgreSQL and Redis reachable)::

    GATEKEEPER_BENCH_REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python \\
      bench/batch_commit.py --sizes 1,2,4,8,16,32 --rounds 14 --db-prefix gc_

On a fresh database: as many objects as the largest batch, each registered and submitted to
once through the real application (``async_probe.capture``). Per round and batch size, in an
order that rotates at random: the same number of accepted writes (the largest size's), each of
its own object, sent as :class:`server_road.Committer` sends a batch — the real accepted write
(``server_road.accept_statement``, the statement and parameters ``record_accepted`` sends; each
after a real ``load_for_submit`` of its object, not timed) — a batch of one alone in autocommit,
a larger one as ``BEGIN``, the writes, ``COMMIT`` in one pipeline, on one connection. Per
write: the backend's CPU (``/proc/PID/schedstat`` before and after each batch: the backend is
idle between batches) and this process's thread CPU (the client side: psycopg's send and
receive, not the statement's building). One connection: the commit's flush is not shared with
other sessions as under concurrency (so a batch of one pays it whole, as the h/pgsub replay's
writes did). Medians over the rounds after the first two.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import async_probe as ap  # noqa: E402
import server_road as sr  # noqa: E402
import service_load as sl  # noqa: E402


def backend_us(pid: int) -> float:
    """A local backend's CPU so far, in µs (``schedstat``: time on a CPU)."""
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0]) / 1e3


def send(conn: Any, batch: list[tuple[str, dict[str, Any]]]) -> None:
    """``batch`` as the committer sends it (one write alone; more in one pipelined transaction);
    every write must have hit."""
    if len(batch) == 1:
        if conn.cursor().execute(*batch[0]).fetchone() is None:
            raise RuntimeError("a write missed")
        return
    cursors = [conn.cursor() for _ in batch]
    with conn.pipeline():
        conn.execute(b"BEGIN", prepare=False)
        for cursor, (text, params) in zip(cursors, batch, strict=True):
            cursor.execute(text, params)
        conn.execute(b"COMMIT", prepare=False)
    if any(cursor.fetchone() is None for cursor in cursors):
        raise RuntimeError("a write missed")


def measure(url: str, redis_url: str, sizes: list[int], rounds: int) -> dict[int, list[Any]]:
    """Per size, per round: (backend µs, client µs) per write."""
    from app.db.session import make_engine
    from app.services.auth import ensure_bootstrap_admin
    from app.store import objects as object_store
    from app.store.base import submitting

    engine = make_engine(url, pool_size=2, max_overflow=0)
    ensure_bootstrap_admin(engine=engine, secret=sl.ADMIN_KEY)
    most = max(sizes)
    made = [ap.capture(url, redis_url, submits=1) for _ in range(most)]
    key_id = made[0].key_id
    own = engine.raw_connection()
    conn = own.driver_connection
    conn.autocommit = True
    pid = conn.info.backend_pid

    def statements(count: int) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for one in made[:count]:
            with submitting(engine) as tx:
                found = object_store.load_for_submit(tx, object_id=one.object_id, key=None)
            if found is None:
                raise LookupError(one.object_id)
            row = found[0]
            out.append(
                sr.accept_statement(ap.accept_inputs(row, uuid.uuid4().hex, key_id, row.state))
            )
        return out

    rows: dict[int, list[Any]] = {size: [] for size in sizes}
    try:
        for _ in range(rounds):
            for size in random.sample(sizes, len(sizes)):
                pg = client = 0.0
                writes = 0
                for _ in range(max(1, most // size)):
                    batch = statements(size)
                    pg0, client0 = backend_us(pid), time.thread_time()
                    send(conn, batch)
                    client += time.thread_time() - client0
                    pg += backend_us(pid) - pg0
                    writes += size
                rows[size].append((pg / writes, 1e6 * client / writes))
    finally:
        own.close()
        engine.dispose()
    return rows


def table(rows: dict[int, list[Any]], skip: int = 2) -> list[str]:
    """Per size: the medians (and the backend's quartiles) over the rounds after ``skip``."""
    lines = []
    alone = statistics.median(pg for pg, _ in rows[min(rows)][skip:])
    for size, found in rows.items():
        kept = found[skip:]
        pgs = [pg for pg, _ in kept]
        q = statistics.quantiles(pgs, n=4) if len(pgs) > 1 else [pgs[0]] * 3
        pg = statistics.median(pgs)
        lines.append(
            f"batch {size:>3}: PostgreSQL {pg:7.1f} us/write (IQR {q[0]:.1f}-{q[2]:.1f}; "
            f"{pg / alone:.2f}x batch {min(rows)}), client "
            f"{statistics.median(c for _, c in kept):6.1f} us/write"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sizes", default="1,2,4,8,16,32", help="batch sizes (1,2,4,8,16,32)")
    parser.add_argument("--rounds", type=int, default=14, help="rounds (14; the first 2 dropped)")
    sl.add_scratch_args(parser, db_prefix="gk_batch_", redis=False)
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if not sizes or sizes[0] < 1 or args.rounds < 3:
        parser.error("--sizes: positive; --rounds: at least 3")
    sl.POSTGRES_URL = args.admin_url
    os.environ.setdefault(
        "GATEKEEPER_ENCRYPTION_KEY_FILE", str(Path(tempfile.mkdtemp(prefix="gk_batch_")) / "key")
    )
    load0 = os.getloadavg()
    with sl.fresh_database(prefix=args.db_prefix) as (url, _):
        rows = measure(url, sl.REDIS_URL, sizes, args.rounds)
    load1 = os.getloadavg()
    print(
        f"batch_commit: {args.rounds} rounds of {max(sizes)} writes per size, one connection; "
        f"load {load0[0]:.2f} -> {load1[0]:.2f}"
    )
    for line in table(rows):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

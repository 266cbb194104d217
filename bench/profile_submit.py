"""Where a single submit's server time goes: py-spy over the uvicorn workers under load.

How to run (from the project root, PostgreSQL and Redis reachable, ``py-spy`` installed — it is
in the ``dev`` extra)::

    .venv/bin/python bench/profile_submit.py                       # grr, bayesian, 2 workers
    .venv/bin/python bench/profile_submit.py --raw /tmp/submit.raw --seconds 20
    .venv/bin/python bench/profile_submit.py --summarize /tmp/submit.raw --functions 25

It starts ``bench/service_load.py --scenarios grr --filters bayesian --workers 2`` (pgbench and
verify skipped), waits ``--delay`` seconds for the server to start and the warm-up to pass, then
samples the server's process tree (both workers) with ``py-spy record --subprocesses`` for
``--seconds`` at ``--rate`` Hz and prints the share of the samples spent in each part of the
request (inclusive: a sample counts for every part on its stack), next to the benchmark's own
table. py-spy samples threads that are not idle in its sense, and a thread blocked in psycopg's
``Connection.wait`` counts: the shares are of the time the request threads are busy or waiting
on PostgreSQL, not of CPU (the benchmark's ``cpu ms/submit`` is the CPU figure). With ``--gil``
py-spy samples only the thread holding the GIL: the shares are then of the Python code's CPU
(time in C code that releases the GIL, and the other processes, are not in them).

With ``--direct`` there is no server: py-spy runs ``bench/submit_cpu.py --direct`` (the service's
``submit`` called in process, one at a time, ``--submits`` of them; its first tree from
``--trees``) and only the samples inside ``submit`` are kept, so the shares are of the submit's
own time without HTTP, ASGI or the thread hand-off::

    .venv/bin/python bench/profile_submit.py --direct --gil --submits 3000 --functions 25
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (label, frame prefix): a sample counts for a part if a frame of its stack starts so.
PARTS = [
    ("request threads (the submit's synchronous part)", "WorkerThread.run "),
    ("request threads (after: the runtime's executor)", "_worker (concurrent/futures/thread.py"),
    ("  submit (app/services/queries.py)", "submit (app/services/queries.py"),
    ("    load the object (and the key's rejection)", "load_for_submit (app/store/objects.py"),
    ("    load the object (before: _load_active)", "load_state (app/store/objects.py"),
    ("    stored rejection (before: _replay_rejection)", "find_rejection (app/store/queries.py"),
    ("    accepted writes in one pipeline", "record_accepted (app/store/submits.py"),
    ("    history insert (before)", "insert_query (app/store/queries.py"),
    ("    compare-and-set (before)", "compare_and_set (app/store/objects.py"),
    ("    state references (before: move_state_refs)", "move_state_refs (app/services/snapshots"),
    ("    audit insert (before)", "record (app/services/audit.py"),
    ("    decision and sampling (engine)", "decide (app/services/decisions.py"),
    ("    COMMIT (leaving Engine.begin)", "Engine.begin (sqlalchemy"),
    ("    Redis lock", "ObjectLocks._redis_lock (app/services/locks.py"),
    ("    the submit's transaction (connection, autocommit, return)", "submitting (app/store/base"),
    ("    load on psycopg directly", "fetch_one (app/store/compiled.py"),
    ("      value decryption", "EncryptedText.process_result_value (app/db/types.py"),
    ("    value decryption (after: only to sample)", "PrivateValue.reveal (app/store/objects.py"),
    ("    SQLAlchemy Connection.execute", "Connection.execute (sqlalchemy"),
    ("event loop: HTTP, middleware, routing", "RequestResponseCycle.run_asgi (uvicorn"),
    ("  authentication (API key)", "get_caller (app/api/deps.py"),
    ("  request body (pydantic)", "typed_body.<locals>.read (app/api/deps.py"),
    ("  hand-off to the worker thread (anyio)", "run_sync_in_worker_thread (anyio"),
    ("  hand-off to the worker thread (after: run_in_executor)", "in_thread (app/api/deps.py"),
    ("  access log (JSON)", "Logger.info (logging"),
    ("  metrics (multiprocess)", "Histogram.observe (prometheus_client"),
    ("inside psycopg's Connection.wait (waiting for PostgreSQL)", "Connection.wait (psycopg"),
]


def summarize(raw: Path) -> str:
    """The share of ``raw``'s samples (py-spy's collapsed stacks) in each of :data:`PARTS`."""
    counts = dict.fromkeys(range(len(PARTS)), 0)
    total = 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        for i, (_, prefix) in enumerate(PARTS):
            if any(frame.startswith(prefix) for frame in frames):
                counts[i] += int(count)
    lines = [f"{'share':>6}  part (of {total} samples, both workers)"]
    for i, (label, _) in enumerate(PARTS):
        if counts[i]:
            lines.append(f"{100 * counts[i] / max(1, total):5.1f}%  {label}")
    return "\n".join(lines)


def _function(frame: str) -> str:
    """``name (file`` of a py-spy frame ``name (path:line)``, the path from the package on."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for cut in ("site-packages/", "/python3.11/", "/python3.12/", "/python3.13/"):
        path = path.split(cut)[-1]
    return f"{name} ({path})"


def by_function(raw: Path, top: int) -> str:
    """The ``top`` functions by their own samples (the stack's last frame), and inclusive."""
    own: dict[str, int] = {}
    within: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        frames = [
            _function(f) for f in stack.split(";") if " (" in f and not f.startswith("process ")
        ]
        total += int(count)
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for f in set(frames):
            within[f] = within.get(f, 0) + int(count)
    lines = [f"{'self':>6}  {'incl':>6}  function (of {total} samples)"]
    for name in sorted(own, key=lambda n: -own[n])[:top]:
        lines.append(
            f"{100 * own[name] / max(1, total):5.1f}%  {100 * within[name] / max(1, total):5.1f}%"
            f"  {name}"
        )
    return "\n".join(lines)


def server_pid(parent: int, deadline: float) -> int:
    """The ``app.cli serve`` process the benchmark started."""
    while time.monotonic() < deadline:
        found = subprocess.run(  # noqa: S603 - fixed arguments
            ["pgrep", "-P", str(parent), "-f", "app.cli serve"],  # noqa: S607
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if found:
            return int(found[0])
        time.sleep(0.2)
    raise RuntimeError("the benchmark's server did not start")


def direct(args: argparse.Namespace, spy: str, raw: Path) -> int:
    """py-spy over ``submit_cpu.py --direct``; the stacks outside ``submit`` are dropped."""
    tree = args.trees.split(",")[0] if args.trees else str(ROOT)
    command = [
        *(spy, "record", "--subprocesses", "-r", str(args.rate), "-f", "raw", "-o", str(raw)),
        *(["--gil"] if args.gil else []),
        "--",
        *(sys.executable, str(ROOT / "bench" / "submit_cpu.py"), "--direct", "--trees", tree),
        *("--rounds", "1", "--submits", str(args.submits), "--warmup", "50"),
    ]
    print("$ " + " ".join(command[command.index("--") + 2 :]), flush=True)
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603
    print(out.stdout)
    marker = "submit (app/services/queries.py"
    kept = [line for line in raw.read_text().splitlines() if marker in line]
    raw.write_text("\n".join(kept) + "\n")
    gil = " --gil" if args.gil else ""
    print(f"py-spy record --subprocesses{gil} -r {args.rate}, only inside submit (stacks: {raw})")
    print(summarize(raw).replace("both workers", "the submits"))
    if args.functions:
        print(by_function(raw, args.functions))
    return out.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=int, default=12, help="sampling time (12)")
    parser.add_argument("--rate", type=int, default=100, help="samples per second (100)")
    parser.add_argument(
        "--delay", type=float, default=8.0, help="seconds after the workers started (warm-up)"
    )
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only threads holding the GIL (Python's CPU, not the waits)",
    )
    parser.add_argument("--trees", default="", help="passed to service_load (one tree)")
    parser.add_argument(
        "--functions", type=int, default=0, help="also the N functions with most own samples"
    )
    parser.add_argument(
        "--summarize", type=Path, help="only summarize these collapsed stacks (no benchmark)"
    )
    parser.add_argument(
        "--direct", action="store_true", help="no HTTP: submit_cpu.py --direct under py-spy"
    )
    parser.add_argument("--submits", type=int, default=3000, help="with --direct (3000)")
    parser.add_argument("--db-prefix", default="", help="passed to service_load")
    args = parser.parse_args(argv)
    if args.summarize is not None:
        print(summarize(args.summarize))
        if args.functions:
            print(by_function(args.summarize, args.functions))
        return 0
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    raw = args.raw or Path(tempfile.mkdtemp(prefix="gk_spy_")) / "submit.raw"
    if args.direct:
        return direct(args, spy, raw)
    duration = args.delay + args.seconds + 15
    command = [
        sys.executable,
        str(ROOT / "bench" / "service_load.py"),
        *("--scenarios", "grr", "--filters", "bayesian", "--workers", "2"),
        *("--duration", str(duration), "--pgbench", "0", "--no-verify"),
    ]
    if args.trees:
        command += ["--trees", args.trees]
    if args.db_prefix:
        command += ["--db-prefix", args.db_prefix]
    print("$ " + " ".join(command[1:]), flush=True)
    bench = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # noqa: S603
    assert bench.stdout is not None  # noqa: S101 - a pipe was asked for
    head = []
    for line in bench.stdout:  # the log folder is printed before the server starts
        head.append(line)
        if line.startswith("server logs: "):
            break
    logs = Path(head[-1].split(": ", 1)[1].strip())
    pid = server_pid(bench.pid, time.monotonic() + 120)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # both workers up: the sampling must miss the imports
        text = "".join(p.read_text(errors="replace") for p in logs.glob("server-*.log"))
        if text.count("Application startup complete") >= 2:
            break
        time.sleep(0.2)
    time.sleep(args.delay)
    subprocess.run(  # noqa: S603 - our own arguments
        [
            *(spy, "record", "-p", str(pid), "--subprocesses", "--nonblocking"),
            *("-d", str(args.seconds), "-r", str(args.rate), "-f", "raw", "-o", str(raw)),
            *(["--gil"] if args.gil else []),
        ],
        check=True,
        capture_output=True,
    )
    out, _ = bench.communicate()
    print("".join(head) + out)
    gil = " --gil" if args.gil else ""
    print(f"py-spy record --subprocesses{gil} -r {args.rate} -d {args.seconds} (stacks: {raw})")
    print(summarize(raw))
    if args.functions:
        print(by_function(raw, args.functions))
    return bench.returncode


if __name__ == "__main__":
    raise SystemExit(main())

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

With ``--layers`` every sample is also given to one layer of the service (:data:`LAYERS`): the
innermost frame of its stack that a layer's rule names decides (a frame no rule names passes the
sample to its caller: numpy's frames count for the engine code that called them, ``json``'s are a
layer of their own). Each layer is marked ``A`` when ``bench/async_probe.py``'s road A — uvicorn,
Starlette, the request context (access line, metrics), the thread hand-off and the submit's four
round trips (Redis lock, the object's load, the accepted write) — does that work too, and
``above`` when only the real submit does (FastAPI and the route's dependencies, pydantic, JSON,
the engine, the decryption, audit, the odometer, the submit's own code): the "above the floor"
share. ``--summarize RAW --layers`` tabulates stored stacks, several files side by side.
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


_ENGINE_LABEL = "engine: other (app/engine)"
#: (label, in road A, substrings of a frame ``name (path``): the first rule naming the innermost
#: frame it names decides a sample's layer (:func:`layers`).
LAYERS: list[tuple[str, bool, tuple[str, ...]]] = [
    ("Redis lock (redis-py, services/locks.py)", True, ("(redis/", "(app/services/locks.py")),
    (
        "crypto: the value's decryption",
        False,
        ("(cryptography/", "(app/crypto.py", "reveal (app/store/objects.py"),
    ),
    ("SQL: psycopg, SQLAlchemy", True, ("(psycopg/", "(psycopg_binary", "(sqlalchemy/")),
    ("SQL: app/store (parameters, rows, kept connection)", True, ("(app/store/", "(app/db/")),
    ("logging (the access line)", True, ("(logging/", "(app/logs.py")),
    ("metrics (prometheus_client)", True, ("(prometheus_client/", "(app/metrics.py")),
    (
        "pydantic (models in and out, schemas.py, bodies.py)",
        False,
        ("(pydantic/", "(pydantic_core", "(app/services/schemas.py", "(app/services/bodies.py"),
    ),
    ("JSON (json, the strict body reader)", False, ("(json/", "(app/engine/jsonfields.py")),
    (
        "sampling (mech.sample)",
        False,
        ("sample (app/engine/mechanisms", "(app/engine/sampling.py", "(secrets.py", "(random.py"),
    ),
    ("engine: decide (services/decisions.py)", False, ("decide (app/services/decisions.py",)),
    ("engine: record (services/decisions.py)", False, ("recorded (app/services/decisions.py",)),
    ("engine: state load, advance, hashes (snapshots.py)", False, ("(app/services/snapshots.py",)),
    (_ENGINE_LABEL, False, ("(app/engine/",)),
    ("audit event (services/audit.py)", False, ("(app/services/audit.py",)),
    (
        "odometer (services/objects.py, quota.py)",
        False,
        ("(app/services/objects.py", "(app/services/quota.py"),
    ),
    ("fingerprint (services/reuse.py)", False, ("(app/services/reuse.py",)),
    ("auth (key cache)", False, ("(app/services/auth.py", "get_caller (app/api/deps.py")),
    ("the submit's own code (services/queries.py)", False, ("(app/services/queries.py",)),
    (
        "hand-off (in_thread, executor, threads)",
        True,
        (
            "in_thread (app/api/deps.py",
            "_settle (app/api/deps.py",
            "_set_result (app/api/deps.py",
            "_cancel_unstarted (app/api/deps.py",
            "(concurrent/futures/",
            "(threading.py",
            "(queue.py",
        ),
    ),
    (
        "FastAPI, route and dependencies (app/api lean, direct, deps, routes)",
        False,
        (
            "(app/api/direct.py",
            "(app/api/lean.py",
            "(app/api/deps.py",
            "(app/api/routes/",
            "(fastapi/",
        ),
    ),
    (
        "request context (api/middleware.py, ratelimit.py)",
        True,
        ("(app/api/middleware.py", "(app/api/ratelimit.py"),
    ),
    ("Starlette (Request, Response, exception wrapper)", True, ("(starlette/",)),
    ("uvicorn (parsing, socket writes)", True, ("(uvicorn/", "(httptools/")),
    ("event loop (asyncio, uvloop)", True, ("(asyncio/", "(uvloop/")),
]


_ENGINE = _ENGINE_LABEL


def _layer(frames: list[str]) -> str:
    """The layer of one sample's stack (root first): its innermost frame that a rule names.

    The engine's own frames count for the service code that called into the engine (decide,
    record, the state's load and advance, the sampling, the odometer) when one encloses them.
    """
    found = "other"
    for n in range(len(frames) - 1, -1, -1):
        named = _function(frames[n])
        label = next((lb for lb, _, keys in LAYERS if any(k in named for k in keys)), None)
        if label is None:
            continue
        if found == _ENGINE:  # the first enclosing service frame, if it is an engine caller
            if label == _ENGINE:
                continue
            return label if label.startswith(("engine:", "sampling", "odometer")) else _ENGINE
        found = label
        if found != _ENGINE:
            return found
    return found


def layers(raws: list[Path]) -> str:
    """A markdown table: each layer's share of each file's samples; the floor's and the rest."""
    counts: list[dict[str, int]] = []
    for raw in raws:
        found: dict[str, int] = {}
        for line in raw.read_text().splitlines():
            if not line.strip():
                continue
            stack, _, count = line.rpartition(" ")
            frames = [f for f in stack.split(";") if " (" in f and not f.startswith("process ")]
            label = _layer(frames)
            found[label] = found.get(label, 0) + int(count)
        counts.append(found)
    totals = [max(1, sum(found.values())) for found in counts]
    floor = {label: road_a for label, road_a, _ in LAYERS}
    head = " | ".join(
        f"{raw.name} ({sum(c.values())})" for raw, c in zip(raws, counts, strict=True)
    )
    lines = [f"| layer | road A | {head} |", "|---|---|" + "---:|" * len(raws)]
    for label in [label for label, _, _ in LAYERS] + ["other"]:
        if any(found.get(label) for found in counts):
            mark = {True: "A", False: "above"}.get(floor.get(label), "?")  # type: ignore[call-overload]
            shares = " | ".join(
                f"{100 * found.get(label, 0) / total:.1f}%"
                for found, total in zip(counts, totals, strict=True)
            )
            lines.append(f"| {label} | {mark} | {shares} |")
    for road_a, name in ((True, "in road A (the floor)"), (False, "above the floor")):
        shares = " | ".join(
            f"{100 * sum(n for k, n in found.items() if floor.get(k) is road_a) / total:.1f}%"
            for found, total in zip(counts, totals, strict=True)
        )
        lines.append(f"| **{name}** | | {shares} |")
    return "\n".join(lines)


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
    if args.layers:
        print(layers([raw]))
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
        "--summarize",
        type=Path,
        nargs="+",
        help="only summarize these collapsed stacks (no benchmark; with --layers, side by side)",
    )
    parser.add_argument(
        "--layers", action="store_true", help="also each layer's share (LAYERS): above the floor"
    )
    parser.add_argument(
        "--direct", action="store_true", help="no HTTP: submit_cpu.py --direct under py-spy"
    )
    parser.add_argument("--submits", type=int, default=3000, help="with --direct (3000)")
    parser.add_argument("--db-prefix", default="", help="passed to service_load")
    args = parser.parse_args(argv)
    if args.summarize is not None:
        for raw in args.summarize:
            print(summarize(raw))
            if args.functions:
                print(by_function(raw, args.functions))
        if args.layers:
            print(layers(args.summarize))
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
    if args.layers:
        print(layers([raw]))
    return bench.returncode


if __name__ == "__main__":
    raise SystemExit(main())

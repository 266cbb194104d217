"""A single submit's server CPU by thread: the event loop's against the request threads'.

How to run (from the project root, PostgreSQL and Redis reachable)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/server_threads.py --trees BASE,NEW --seconds 12

py-spy's shares (``bench/profile_submit.py``) are of wall time — a thread preempted while it
holds the GIL, or waiting for a CPU, is sampled where it stopped — so on a loaded machine they
overstate whatever wakes another task (a socket write, a hand-off to a thread). Here each tree's
server (``gatekeeper serve --workers 1``: uvicorn's event loop in the process's main thread, the
request threads beside it) serves ``grr`` submits from ``--clients`` keep-alive connections
(fresh ``Idempotency-Key`` each) for ``--seconds``, and the kernel's own accounts of every thread
(``/proc/PID/task/TID``: user and system CPU, voluntary and involuntary context switches) are read
before and after, with the submits the client saw answered in between. Reported per submit: the
main thread's (the event loop: uvicorn, the middleware, the route, the hand-off) and the other
threads' (the request threads: the service's submit, PostgreSQL, Redis) CPU and context switches.
With ``--perf`` (``perf`` installed, tracepoints readable), the process's system calls by kind
per submit too (``perf stat``). Trees take turns, ``--rounds`` times, the order alternating; CPU
comes in clock ticks (10 ms), so a round of 12 s at ≈ 300 submits/s resolves ≈ 3 µs per submit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import service_load as sl

SYSCALLS = (
    "futex",
    "poll",
    "sendto",
    "recvfrom",
    "write",
    "read",
    "epoll_pwait",
    "getpid",
    "getrandom",
)


def threads(pid: int) -> dict[int, tuple[float, float, int, int]]:
    """Per thread of ``pid``: user and system CPU seconds, voluntary and involuntary switches."""
    out: dict[int, tuple[float, float, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text()
        except OSError:
            continue
        switches = {
            key: int(value)
            for key, _, value in (line.partition(":") for line in status.splitlines())
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
        }
        out[int(task.name)] = (
            int(fields[11]) / sl.CLK_TCK,
            int(fields[12]) / sl.CLK_TCK,
            switches.get("voluntary_ctxt_switches", 0),
            switches.get("nonvoluntary_ctxt_switches", 0),
        )
    return out


class Load:
    """Submits from ``clients`` connections on a thread of this process, counted as answered."""

    def __init__(self, server: sl.Server, ids: list[str], analyst: str, clients: int) -> None:
        self.server, self.ids, self.analyst, self.clients = server, ids, analyst, clients
        self.done = 0
        self.bad = 0
        self.stop = False
        self.body = json.dumps({"query": sl.grr_queries(random.Random(1))[0]}).encode()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start submitting (connections opened anew)."""
        self.stop = False
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    def finish(self) -> None:
        """Stop after every connection's submit in flight is answered."""
        self.stop = True
        if self.thread is not None:
            self.thread.join(30)

    async def _run(self) -> None:
        async def client(n: int) -> None:
            conn = sl.Connection("127.0.0.1", self.server.port)
            try:
                while not self.stop:
                    headers = {
                        "Authorization": f"Bearer {self.analyst}",
                        "Idempotency-Key": uuid.uuid4().hex,
                    }
                    path = f"/v1/objects/{self.ids[n % len(self.ids)]}/queries"
                    status, _ = await conn.post(path, self.body, headers)
                    n += self.clients
                    if status == 201:
                        self.done += 1
                    else:
                        self.bad += 1
            finally:
                await conn.close()

        await asyncio.gather(*(client(k) for k in range(self.clients)))


def perf_counts(pid: int, seconds: float) -> dict[str, int]:
    """``perf stat``'s counts of the process's system calls over ``seconds`` (empty: no perf)."""
    events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
    done = subprocess.run(  # noqa: S603 - a fixed command
        ["perf", "stat", "-x", ",", "-e", events, "-p", str(pid), "--", "sleep", str(seconds)],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    counts: dict[str, int] = {}
    for line in done.stderr.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("syscalls:sys_enter_") and parts[0].isdigit():
            counts[parts[2].removeprefix("syscalls:sys_enter_")] = int(parts[0])
    return counts


def measure(server: sl.Server, load: Load, seconds: float, perf: bool) -> dict[str, float]:
    """One window: per submit, the main thread's and the others' CPU µs and switches."""
    pid = server.process.pid
    before, done0, t0 = threads(pid), load.done, time.monotonic()
    counts = perf_counts(pid, seconds) if perf else {}
    if not perf:
        time.sleep(seconds)
    after, done1, wall = threads(pid), load.done, time.monotonic() - t0
    n = done1 - done0
    row = {"submits": float(n), "rate": n / wall}
    for tid, (u1, s1, v1, i1) in after.items():
        u0, s0, v0, i0 = before.get(tid, (0.0, 0.0, 0, 0))
        role = "loop" if tid == pid else "threads"
        for key, value in (
            ("user", (u1 - u0) * 1e6),
            ("sys", (s1 - s0) * 1e6),
            ("vol", v1 - v0),
            ("invol", i1 - i0),
        ):
            row[f"{role}_{key}"] = row.get(f"{role}_{key}", 0.0) + value / n
    for name, count in counts.items():
        row[f"sc_{name}"] = count / n
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", default=str(sl.ROOT), help="comma-separated source folders")
    parser.add_argument("--rounds", type=int, default=2, help="windows per tree (2)")
    parser.add_argument("--seconds", type=float, default=12.0, help="one window (12 s)")
    parser.add_argument("--clients", type=int, default=32, help="connections (32)")
    parser.add_argument("--objects", type=int, default=20, help="objects per server (20)")
    parser.add_argument("--perf", action="store_true", help="system calls by kind (perf stat)")
    parser.add_argument("--db-prefix", default="gk_threads_", help="the database's name prefix")
    args = parser.parse_args(argv)
    if args.perf and shutil.which("perf") is None:
        parser.error("--perf: perf is not installed")
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    rng = random.Random(1)
    logs = Path(tempfile.mkdtemp(prefix="gk_threads_"))
    load0 = os.getloadavg()[0]
    rows: dict[str, list[dict[str, float]]] = {t.name: [] for t in trees}
    with sl.fresh_database(prefix=args.db_prefix) as (url, _name):
        servers, loads = [], []
        try:
            for n, tree in enumerate(trees):
                server = sl.Server(url, 1, 1, logs / f"server{n}.log", tree=tree)
                servers.append(server)
                ids, analyst = sl.register_objects(server, "grr", "bayesian", args.objects, rng)
                loads.append(Load(server, ids, analyst, args.clients))
            for r in range(args.rounds):
                for k in range(len(trees)) if r % 2 == 0 else reversed(range(len(trees))):
                    loads[k].start()
                    time.sleep(2.0)  # connections open, the server warm
                    rows[trees[k].name].append(
                        measure(servers[k], loads[k], args.seconds, args.perf)
                    )
                    loads[k].finish()
        finally:
            for server in servers:
                server.stop()
    load1 = os.getloadavg()[0]
    print(
        f"server_threads: grr submits, 1 worker, {args.clients} connections, {args.rounds} "
        f"window(s) of {args.seconds:g} s per tree; load {load0:.2f} -> {load1:.2f}"
    )
    print(
        f"{'tree':<12} {'submits/s':>9}  {'loop user':>9} {'sys':>6}"
        f"  {'threads user':>12} {'sys':>6}"
        f"  {'loop share':>10}  switches/submit loop vol+invol, threads vol+invol"
    )
    for name, got in rows.items():

        def med(key: str, got: list[dict[str, float]] = got) -> float:
            return statistics.median(row.get(key, 0.0) for row in got)

        loop = med("loop_user") + med("loop_sys")
        total = loop + med("threads_user") + med("threads_sys")
        print(
            f"{name:<12} {med('rate'):>9.1f}  {med('loop_user'):>9.1f} {med('loop_sys'):>6.1f}"
            f"  {med('threads_user'):>12.1f} {med('threads_sys'):>6.1f}  {loop / total:>10.1%}"
            f"  {med('loop_vol'):.2f}+{med('loop_invol'):.2f}, "
            f"{med('threads_vol'):.2f}+{med('threads_invol'):.2f}"
        )
        if args.perf:
            print(
                "    system calls per submit: "
                + ", ".join(f"{s} {med('sc_' + s):.2f}" for s in SYSCALLS)
            )
    print("(CPU in µs per answered submit, medians over the windows)")
    if len(trees) == 2:
        first, second = (rows[t.name] for t in trees)

        def ratio(key: str) -> str:
            pairs = [
                (b[f"loop_{key}"] if key != "total" else _total(b))
                / (a[f"loop_{key}"] if key != "total" else _total(a))
                for a, b in zip(first, second, strict=True)
            ]
            lower = sum(p < 1 for p in pairs)
            return f"{statistics.median(pairs):.3f} (lower in {lower} of {len(pairs)})"

        print(
            f"{trees[1].name} / {trees[0].name}, median per-window ratio: "
            f"loop user {ratio('user')}, "
            f"loop sys {ratio('sys')}, whole server {ratio('total')}"
        )
    return 0


def _total(row: dict[str, float]) -> float:
    """A window's CPU per submit, every thread."""
    return sum(row[f"{role}_{kind}"] for role in ("loop", "threads") for kind in ("user", "sys"))


if __name__ == "__main__":
    raise SystemExit(main())

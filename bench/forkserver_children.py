"""Survey children, two checkouts side by side: spawned (main) or forked by a preloaded forkserver.

Every run is a process of its own under this one, a *subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``): the forkserver, its children and the resource tracker are
re-parented to it when their parent exits, and it reaps them all (waiting at most
``--reap-seconds``), so ``getrusage(RUSAGE_CHILDREN)`` holds the CPU of the whole process tree.
Trees alternate which goes first, round by round; the load average is printed beside each run.

* ``--start``: a process builds the survey children's pool as the app does
  (``app.bootstrap.survey_children``, two children, their own initializer
  ``_start_survey_child`` building settings, cipher, engine and bound worker on a SQLite URL),
  with ``time.sleep`` in place of a chunk's decision (the bench's one liberty, so no survey is
  needed): one 0.5 s call per child at once (the pool's start: seconds until both answered,
  less the 0.5 s), three trivial calls, the children's memory, then one child killed
  (``SIGKILL``), the pool restarted and given one call per child again (the replacement
  children's start, restart included), then closed; the tree's CPU.
* ``--tests FILE ...``: ``python -m pytest -q -n 0 -p no:cacheprovider FILE ...`` in each tree;
  its last line (pass/fail), wall time and the tree's CPU.

Usage::

    python bench/forkserver_children.py --tree base=/work/wt/base --tree branch=. \\
        --rounds 3 --start
    python bench/forkserver_children.py --tree base=/work/wt/base --tree branch=. \\
        --rounds 2 --tests tests/service/test_survey_children.py tests/worker/test_children.py
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36

#: the ``--start`` run, in the tree under test (``python -c``; argv[1]: the SQLite URL)
START = r"""
import json, os, signal, sys, time
from app.bootstrap import survey_children
from app.settings import Settings

PAUSE = 0.5
settings = Settings(database_url=sys.argv[1], survey_processes=2, bound_processes=0)
pool = survey_children(settings)
pool._target = time.sleep  # a trivial call: the children's start is what is timed


def both():
    # one call per child at once, as a survey's chunks: the seconds until both children answered
    t = time.perf_counter()
    calls = [pool.submit(PAUSE) for _ in range(2)]
    for call in calls:
        call.result(timeout=300)
    return time.perf_counter() - t - PAUSE


def memory(pid):
    # proportional set size (shared pages split among their users) and resident set, MiB
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:"):
                fields[parts[0][:-1]] = int(parts[1]) / 1024
    return fields


def forkservers():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and b"multiprocessing.forkserver" in cmdline:
                found.append(int(entry))
    return found


started = both()
t = time.perf_counter()
for _ in range(3):
    pool.submit(0).result(timeout=300)
calls = time.perf_counter() - t
pids = pool.pids()
children = [memory(pid) for pid in pids]
servers = [memory(pid) for pid in forkservers()]
os.kill(pids[0], signal.SIGKILL)
deadline = time.monotonic() + 30
while True:  # until the pool knows (a call then fails)
    try:
        pool.submit(0).result(timeout=300)
    except Exception:
        break
    if time.monotonic() > deadline:
        raise SystemExit("the killed child was not noticed")
    time.sleep(0.01)
t = time.perf_counter()
pool.restart()
both()  # restart + one call per child, timed from before the restart:
replaced = time.perf_counter() - t - PAUSE
pool.close()
method = getattr(pool, "start_method", "spawn")
print(json.dumps({
    "method": method, "start": started, "calls": calls, "replace": replaced,
    "children": children, "forkserver": servers,
}))
"""


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_all(seconds: float) -> int:
    """Reap every descendant re-parented here; how many were still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            if time.monotonic() > deadline:
                left = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
                mine = 0
                for p in left:
                    try:
                        ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError):
                        continue
                    if ppid == os.getpid():
                        os.kill(int(p.name), signal.SIGKILL)
                        mine += 1
                reap_all(5.0)
                return mine
            time.sleep(0.02)


def run(tree: Path, argv: list[str], reap_seconds: float) -> tuple[str, float, float, int]:
    """``argv`` in ``tree``: its stdout, wall time, the tree's CPU, descendants left over."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}:{tree}/clients/python/src",
        "PYTHONDONTWRITEBYTECODE": "",
    }
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run(  # noqa: S603 - our own interpreter and arguments
        argv, cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - wall
    left = reap_all(reap_seconds)
    if done.returncode != 0 and "--tests" not in sys.argv:
        raise SystemExit(f"{tree}: {done.stdout}\n{done.stderr}")
    return done.stdout, wall, children_cpu() - cpu, left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tree", action="append", required=True, help="name=path")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reap-seconds", type=float, default=30.0)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--start", action="store_true")
    what.add_argument("--tests", nargs="+")
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    become_subreaper()
    python = sys.executable
    if args.start:
        print(
            "| round | tree | start method | pool start s | 3 calls s "
            "| replacement children (restart + start) s | run wall s | tree CPU s | load | left "
            "| children: PSS (RSS) MiB each | forkserver PSS (RSS) MiB |"
        )
        print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---|")
    else:
        print("| round | tree | pytest | wall s | tree CPU s | load before → after | left |")
        print("|---|---|---|---:|---:|---|---:|")
    for r in range(1, args.rounds + 1):
        order = trees if r % 2 else trees[::-1]
        for name, tree in order:
            before = load()
            if args.start:
                with tempfile.TemporaryDirectory() as tmp:
                    url = f"sqlite:///{tmp}/children.db"
                    out, wall, cpu, left = run(tree, [python, "-c", START, url], args.reap_seconds)
                f = json.loads(out.strip().splitlines()[-1])
                sizes = [
                    ", ".join(f"{m['Pss']:.0f} ({m['Rss']:.0f})" for m in f[part]) or "-"
                    for part in ("children", "forkserver")
                ]
                print(
                    f"| {r} | {name} | {f['method']} | {f['start']:.2f} | {f['calls']:.3f} "
                    f"| {f['replace']:.2f} | {wall:.2f} | {cpu:.2f} | {before} → {load()} "
                    f"| {left} | {sizes[0]} | {sizes[1]} |",
                    flush=True,
                )
            else:
                argv = [python, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
                out, wall, cpu, left = run(tree, argv + args.tests, args.reap_seconds)
                last = out.strip().splitlines()[-1] if out.strip() else "(no output)"
                print(
                    f"| {r} | {name} | {last} | {wall:.1f} | {cpu:.1f} | {before} → {load()} "
                    f"| {left} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""A CPU map of the suite: each test's CPU time, per test and per file (opt-in).

Enabled by ``GATEKEEPER_TEST_CPU=path.jsonl`` (``tests/conftest.py`` registers :class:`CpuMap`
in every pytest process, xdist's workers included). Each test appends one JSON line to the file:

* ``cpu``: user + system CPU of the pytest process over the test's setup, call and teardown
  (``resource.getrusage(RUSAGE_SELF)``: every thread of the process, so a server on a thread
  of the test process is counted, and so is anything a thread left running does meanwhile);
* ``children``: the user + system CPU of the child processes *reaped* meanwhile
  (``RUSAGE_CHILDREN``, which grows when a child is waited for; a reaped child's own reaped
  children are in its figure, its un-reaped ones are not), plus ``forkserver``;
* ``forkserver``: the CPU the process's multiprocessing forkserver spent meanwhile, its own and
  its reaped children's (``/proc/PID/stat``). The forkserver is started by the process with its
  first forkserver child (:mod:`app.worker.children`) and lives as long as the process, so it
  is never reaped: without this its children (the survey children) would count as 0 s, being
  the forkserver's children, not the pytest process's;
* ``call``: the process's CPU over the call phase alone; ``wall``: the whole test's wall time;
* ``start``, ``end``: when the test began and ended (Unix time, s): the processes' lines share a
  clock, so a run's timeline (which test ran when, what ended last) can be read from them.

Each process also appends one ``{"session": ...}`` line when its session ends, with its CPU
since it started (imports and collection included), its reaped children's and its ``end`` (Unix
time): the controller's children are the xdist workers, so its line holds the whole run's CPU
(PostgreSQL's aside) but for the workers' forkservers (re-parented when a worker exits: in the
workers' lines alone).

Not counted: PostgreSQL's and Redis's CPU (other processes, never children of the suite),
children still running or not reaped when the process ends (a forkserver's children too: they
count when the forkserver reaps them), and the xdist controller's tests
(it runs none; its own CPU is in its session line). Module- and session-scoped fixtures are
charged to the test that sets them up or tears them down, so the per-file sums are the figure
to read for fixtures of module scope.

``python -m tests.cpu_map path.jsonl [--top N]`` prints the total and the top files and tests;
``--timeline`` prints instead when each process's tests ended and when the ``--top`` longest tests
(by wall) started and ended, in seconds before the last test's end: the run's critical path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Generator, Iterable
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest

ENV = "GATEKEEPER_TEST_CPU"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _forkserver_cpu() -> tuple[int | None, float]:
    """This process's forkserver (None before it started) and its CPU, reaped children's included.

    A forkserver that died and was started again is another pid: its CPU counts from 0.
    """
    pid: int | None = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    if pid is None:
        return None, 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return pid, 0.0
    # after the name: state (field 3) ... utime stime cutime cstime (fields 14-17), in ticks
    ticks = stat.rsplit(")", 1)[1].split()[11:15]
    return pid, sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK")


def _forkserver_since(before: tuple[int | None, float]) -> float:
    pid, cpu = _forkserver_cpu()
    return cpu - before[1] if pid is not None and pid == before[0] else cpu


class CpuMap:
    """The pytest plugin: one line per test, one per session (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.start_wall = time.monotonic()

    def _write(self, record: dict[str, Any]) -> None:
        # one write of one line in append mode: the processes' lines do not interleave
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        start, wall, own, children, server = (
            time.time(),
            time.monotonic(),
            _cpu(resource.RUSAGE_SELF),
            _cpu(resource.RUSAGE_CHILDREN),
            _forkserver_cpu(),
        )
        item.stash[_CALL] = 0.0
        yield
        served = _forkserver_since(server)
        call: float = item.stash[_CALL]
        self._write(
            {
                "test": item.nodeid,
                "file": item.nodeid.split("::", 1)[0],
                "worker": self.worker,
                "cpu": round(_cpu(resource.RUSAGE_SELF) - own, 4),
                "children": round(_cpu(resource.RUSAGE_CHILDREN) - children + served, 4),
                "forkserver": round(served, 4),
                "call": round(call, 4),
                "wall": round(time.monotonic() - wall, 4),
                "start": round(start, 3),
                "end": round(time.time(), 3),
            }
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        own = _cpu(resource.RUSAGE_SELF)
        yield
        item.stash[_CALL] = _cpu(resource.RUSAGE_SELF) - own

    def pytest_sessionfinish(self) -> None:
        self._write(
            {
                "session": self.worker,
                "cpu": round(_cpu(resource.RUSAGE_SELF), 4),
                "children": round(_cpu(resource.RUSAGE_CHILDREN) + _forkserver_cpu()[1], 4),
                "wall": round(time.monotonic() - self.start_wall, 4),
                "end": round(time.time(), 3),
            }
        )


_CALL = pytest.StashKey[float]()


def register(config: pytest.Config) -> None:
    """Register :class:`CpuMap` when ``GATEKEEPER_TEST_CPU`` names a file."""
    path = os.environ.get(ENV)
    if path and not config.pluginmanager.has_plugin("cpu_map"):
        config.pluginmanager.register(CpuMap(path), "cpu_map")


def pytest_configure(config: pytest.Config) -> None:
    """As a plugin of its own (``pytest -p tests.cpu_map``, for tests outside this folder)."""
    register(config)


def read(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The file's test lines and session lines."""
    tests: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            (sessions if "session" in record else tests).append(record)
    return tests, sessions


def summary(tests: Iterable[dict[str, Any]], sessions: Iterable[dict[str, Any]], top: int) -> str:
    """The totals, then the ``top`` files and tests by CPU (own + reaped children's)."""
    tests = list(tests)
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for t in tests:
        row = by_file[t["file"]]
        row[0] += t["cpu"]
        row[1] += t["children"]
        row[2] += t["wall"]
        row[3] += 1
    own = sum(t["cpu"] for t in tests)
    children = sum(t["children"] for t in tests)
    total = own + children
    out = [
        f"{len(tests)} tests: {own:.1f} s own CPU + {children:.1f} s reaped children's = "
        f"{total:.1f} s; wall summed {sum(t['wall'] for t in tests):.1f} s"
    ]
    for s in sessions:
        out.append(
            f"  session {s['session']}: {s['cpu']:.1f} s own + {s['children']:.1f} s children, "
            f"wall {s['wall']:.1f} s"
        )
    out += ["", f"top {top} files: CPU (own + children) s, share, tests, wall s"]
    files = sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for name, (c, ch, w, n) in files[:top]:
        out.append(
            f"  {c + ch:8.1f} ({c:.1f} + {ch:.1f})  {100 * (c + ch) / total:5.1f} %  "
            f"{int(n):5d}  {w:8.1f}  {name}"
        )
    out += ["", f"top {top} tests: CPU (own + children) s, call s, wall s"]
    for t in sorted(tests, key=lambda t: -(t["cpu"] + t["children"]))[:top]:
        out.append(
            f"  {t['cpu'] + t['children']:8.1f} ({t['cpu']:.1f} + {t['children']:.1f})  "
            f"{t['call']:8.1f}  {t['wall']:8.1f}  {t['test']}"
        )
    return "\n".join(out)


def timeline(tests: Iterable[dict[str, Any]], top: int) -> str:
    """Each process's test span and the ``top`` longest tests' start and end, relative to the
    last test's end (lines of maps written before ``start`` and ``end`` existed are skipped)."""
    tests = [t for t in tests if "start" in t]
    if not tests:
        return "no line with start and end times"
    first, last = min(t["start"] for t in tests), max(t["end"] for t in tests)
    out = [f"{len(tests)} tests from the first start to the last end: {last - first:.1f} s", ""]
    out.append("per process: tests, wall summed s, first start s, last end s (before the end)")
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in tests:
        by_worker[t["worker"]].append(t)
    for worker, mine in sorted(by_worker.items()):
        began, ended = min(t["start"] for t in mine), max(t["end"] for t in mine)
        out.append(
            f"  {worker:5s} {len(mine):5d}  {sum(t['wall'] for t in mine):8.1f}  "
            f"{last - began:8.1f}  {last - ended:8.1f}"
        )
    out += ["", f"top {top} tests by wall: wall s, started s and ended s before the end, process"]
    for t in sorted(tests, key=lambda t: -t["wall"])[:top]:
        out.append(
            f"  {t['wall']:8.1f}  {last - t['start']:8.1f}  {last - t['end']:8.1f}  "
            f"{t['worker']:5s} {t['test']}"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--timeline", action="store_true", help="when the tests ran, not CPU")
    args = parser.parse_args()
    tests, sessions = read(args.path)
    print(timeline(tests, args.top) if args.timeline else summary(tests, sessions, args.top))


if __name__ == "__main__":
    main()

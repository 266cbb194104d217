"""A web process's stand-in for tests/worker/test_children_forkserver.py: child pools in a
process of their own (the forkserver is one per process, and the kill test kills this one).

``python -c 'from tests.worker.forkserver_standin import main; main()' MODE START_METHOD``
prints one JSON line per fact, then (``kill`` mode) waits to be killed. This module imports no
more of the app than :mod:`app.worker.children` at its top: what a child finds in
``sys.modules`` before its initializer runs is what its start brought.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.worker.children import ChildPool

#: What the initializer found (in a child).
AT_START: dict[str, Any] = {}


def note(watch: list[str], given: dict[str, Any] | None) -> None:
    """The initializer: which of ``watch`` were imported before it ran; then, with ``given``,
    the survey children's own start, and which ``app`` modules that start imported."""
    AT_START["preloaded"] = [m for m in watch if m in sys.modules]
    if given is not None:
        from app import bootstrap  # loaded already when preloaded; the spawn comparison loads it

        before = {m for m in sys.modules if m.startswith("app.")}
        bootstrap._start_survey_child(given)
        AT_START["imported by the start"] = sorted(
            m for m in sys.modules if m.startswith("app.") and m not in before
        )


def report(pause: float = 0.0) -> dict[str, Any]:
    """The target: the child's pid, parent, what its initializer found; after ``pause`` s."""
    time.sleep(pause)
    return {"pid": os.getpid(), "ppid": os.getppid(), **AT_START}


def forkservers(pid: int) -> list[int]:
    """Child processes of ``pid`` that are a multiprocessing forkserver."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"multiprocessing.forkserver" in (
            cmdline
        ):
            found.append(int(entry.name))
    return found


def threads_and_sockets(pid: int) -> dict[str, int]:
    """Process ``pid``'s threads and open sockets."""
    fds = Path(f"/proc/{pid}/fd")
    links = []
    for fd in fds.iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:
            continue
    return {
        "threads": len(list(Path(f"/proc/{pid}/task").iterdir())),
        "sockets": sum(link.startswith("socket:") for link in links),
    }


def say(**fact: Any) -> None:
    print(json.dumps(fact), flush=True)


def main() -> None:
    mode, start_method = sys.argv[1], sys.argv[2]
    if mode == "survey":  # the survey children's list, and their own start
        from app.bootstrap import SURVEY_CHILD_MODULES

        given = json.loads(sys.argv[3])
        pool: ChildPool[dict[str, Any]] = ChildPool(
            processes=1,
            target=report,
            initializer=note,
            initargs=(list(SURVEY_CHILD_MODULES), given),
            preload=SURVEY_CHILD_MODULES,
            start_method=start_method,
        )
        say(child=pool.submit().result(timeout=120))
        for server in forkservers(os.getpid()):
            say(forkserver=threads_and_sockets(server))
        pool.close()
    elif mode == "lists":  # two pools built before the forkserver starts, one after
        watch = ["app.store.surveys", "app.store.states", "app.store.audit"]
        first, second = (
            ChildPool(
                processes=1,
                target=report,
                initializer=note,
                initargs=(watch, None),
                preload=(module,),
                start_method=start_method,
            )
            for module in watch[:2]
        )
        say(pool="first", child=first.submit().result(timeout=120))
        late: ChildPool[dict[str, Any]] = ChildPool(
            processes=1,
            target=report,
            initializer=note,
            initargs=(watch, None),
            preload=(watch[2],),
            start_method=start_method,
        )
        for name, pool in (("second", second), ("late", late)):
            say(pool=name, child=pool.submit().result(timeout=120))
        for pool in (first, second, late):
            pool.close()
    elif mode == "kill":  # two children busy in a call, then this process waits to be killed
        busy: ChildPool[dict[str, Any]] = ChildPool(
            processes=2,
            target=report,
            initializer=note,
            initargs=([], None),
            preload=("app.store.surveys",),
            start_method=start_method,
        )
        busy.submit().result(timeout=120)
        calls = [busy.submit(600.0) for _ in range(2)]
        deadline = time.monotonic() + 60
        while len(busy.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # both in their call
        say(children=busy.pids(), forkservers=forkservers(os.getpid()))
        for call in calls:
            call.result()  # never: this process is killed first
    else:
        raise SystemExit(f"unknown mode {mode}")

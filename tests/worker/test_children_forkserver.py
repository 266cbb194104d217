"""Child pools from a preloaded forkserver (:mod:`app.worker.children`), in a stand-in web
process of their own (:mod:`tests.worker.forkserver_standin`): a child finds the preloaded
modules imported before its initializer runs (a spawned child does not), the survey children's
list is whole (their start imports no further ``app`` module) and the forkserver has one thread
and no connection; pools built before the forkserver starts are all preloaded, a later one's
children import its modules themselves; a ``kill -9`` of the web process leaves neither
children nor forkserver behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.bootstrap import SURVEY_CHILD_MODULES, survey_children
from app.worker.children import START_METHOD
from tests.processes import alive
from tests.service.conftest import make_settings

pytestmark = pytest.mark.skipif(START_METHOD != "forkserver", reason="no forkserver here")

ROOT = Path(__file__).resolve().parents[2]


def standin(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603 (the stand-in, with this test's arguments)
        [sys.executable, "-c", "from tests.worker.forkserver_standin import main; main()", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def facts(*args: str) -> list[dict[str, Any]]:
    """The stand-in's lines, once it exited (successfully)."""
    proc = standin(*args)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    return [json.loads(line) for line in out.splitlines()]


def survey_given(tmp_path: Path) -> str:
    pool = survey_children(
        make_settings(f"sqlite:///{tmp_path / 'children.db'}", survey_processes=1)
    )
    assert pool is not None
    assert pool.preload == SURVEY_CHILD_MODULES
    return json.dumps(pool._initargs[0])


def test_survey_children_find_their_modules_preloaded_and_import_no_more(
    tmp_path: Path,
) -> None:
    lines = facts("survey", "forkserver", survey_given(tmp_path))
    child = lines[0]["child"]
    assert child["preloaded"] == list(SURVEY_CHILD_MODULES)
    # the list is whole: the survey child's own start imports no app module of its own
    assert child["imported by the start"] == []
    # the forkserver forks from one thread (no BLAS thread either) and holds no connection:
    # its listening socket alone
    assert [line["forkserver"] for line in lines[1:]] == [{"threads": 1, "sockets": 1}]


def test_a_spawned_child_imports_them_itself(tmp_path: Path) -> None:
    """The comparison that shows the test above can fail: no forkserver, nothing preloaded."""
    lines = facts("survey", "spawn", survey_given(tmp_path))
    child = lines[0]["child"]
    assert "app.bootstrap" not in child["preloaded"]
    assert "app.services.survey_runs" not in child["preloaded"]
    assert "app.services.survey_runs" in child["imported by the start"]
    assert len(lines) == 1  # no forkserver


def test_pools_built_before_the_forkserver_starts_are_preloaded_a_later_one_is_not() -> None:
    watch = ["app.store.surveys", "app.store.states", "app.store.audit"]
    children = {line["pool"]: line["child"] for line in facts("lists", "forkserver")}
    # the forkserver started with the first pool's first child, with both lists built so far
    assert children["first"]["preloaded"] == watch[:2]
    assert children["second"]["preloaded"] == watch[:2]
    # the later pool's children work, importing its module themselves
    assert children["late"]["preloaded"] == watch[:2]
    assert len({child["ppid"] for child in children.values()}) == 1  # one forkserver


def test_a_web_process_killed_leaves_no_children_nor_forkserver() -> None:
    proc = standin("kill", "forkserver")
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        children, servers = line["children"], line["forkservers"]
        assert len(children) == 2
        assert len(servers) == 1
        assert all(alive(pid) for pid in children + servers)
        assert all(
            int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == servers[0]
            for pid in children
        )  # the forkserver's children, not the web process's
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children + servers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in children + servers if alive(pid)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

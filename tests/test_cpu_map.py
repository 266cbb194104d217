"""The opt-in CPU map (tests/cpu_map.py): one line per test with its CPU, children's included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cpu_map import ENV, read, summary, timeline

ROOT = Path(__file__).resolve().parents[1]

#: one test that spends CPU in the pytest process, one in a child it waits for
SAMPLE = """
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_own():
    burn(0.3)

def test_child():
    code = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def run_sample(tmp_path: Path, sample: str, *, workers: int) -> Path:
    """Run ``sample`` as a test file under the CPU map (``-n workers``); the map's file."""
    (tmp_path / "test_sample.py").write_text(sample)
    out = tmp_path / "cpu.jsonl"
    # not the outer run's xdist variables (this test may run in one of its workers)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env = {
        **inherited,
        ENV: str(out),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(  # noqa: S603 - this interpreter on the test's own sample file
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.cpu_map",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            str(workers),
            "test_sample.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_each_test_gets_a_line_with_its_cpu(tmp_path: Path) -> None:
    """Under xdist, as the suite runs: the workers' test lines, a session line per process."""
    out = run_sample(tmp_path, SAMPLE, workers=2)
    tests, sessions = read(str(out))
    by_name = {t["test"]: t for t in tests}
    assert sorted(by_name) == ["test_sample.py::test_child", "test_sample.py::test_own"]
    own, child = by_name["test_sample.py::test_own"], by_name["test_sample.py::test_child"]
    assert own["cpu"] >= 0.25
    assert 0.25 <= own["call"] <= own["cpu"] + 1e-6
    assert own["children"] < 0.05
    assert child["children"] >= 0.25  # the reaped child's CPU
    assert own["wall"] >= 0.25
    for t in (own, child):  # one clock for every process's lines
        assert t["start"] < t["end"] <= main_end(out)
        assert t["end"] - t["start"] >= 0.25
    assert all(t["file"] == "test_sample.py" for t in tests)
    assert {t["worker"] for t in tests} <= {"gw0", "gw1"}
    # a session line per process: xdist's controller and its two workers
    assert sorted(s["session"] for s in sessions) == ["gw0", "gw1", "main"]
    # the controller's reaped children are the workers, with what they reaped
    main = next(s for s in sessions if s["session"] == "main")
    assert main["children"] >= own["cpu"] + child["children"]
    text = summary(tests, sessions, 5)
    assert "2 tests:" in text
    assert "test_sample.py::test_own" in text
    assert json.loads(out.read_text().splitlines()[0])  # JSON lines
    line = timeline(tests, 5)
    assert "2 tests from the first start to the last end" in line
    assert "test_sample.py::test_child" in line


def main_end(out: Path) -> float:
    """The controller's session end: after every worker's test."""
    _, sessions = read(str(out))
    return float(next(s["end"] for s in sessions if s["session"] == "main"))


#: a test whose child is forked by the process's forkserver (as the survey children are)
FORKSERVER_SAMPLE = """
import multiprocessing, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_forkserver_child():
    process = multiprocessing.get_context("forkserver").Process(target=burn, args=(0.3,))
    process.start()
    process.join()
    assert process.exitcode == 0
"""


def test_a_forkserver_child_counts_though_the_forkserver_reaps_it(tmp_path: Path) -> None:
    """The forkserver's child is not the pytest process's: its CPU comes from the forkserver."""
    out = run_sample(tmp_path, FORKSERVER_SAMPLE, workers=0)
    tests, sessions = read(str(out))
    (test,) = tests
    assert test["children"] >= 0.25  # the forked child's burn, reaped by the forkserver
    assert test["children"] >= test["forkserver"] >= 0.25
    (session,) = sessions
    assert session["children"] >= test["forkserver"]

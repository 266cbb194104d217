"""``gatekeeper serve --workers N`` forks its uvicorn workers from a parent that imported the app
(:mod:`app.webfork`), and spawns them as uvicorn does when uvicorn's seam is not the known one.

Replacement of a killed worker, SIGTERM and SIGSTOP are tests/service/test_faults.py's and
tests/service/test_metrics_multiprocess.py's; the signals a worker inherits are checked here.
"""

from __future__ import annotations

import os
import signal
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import multiproc, webfork
from tests.service.conftest import Server, start_server

ROOT = Path(__file__).resolve().parents[2]


def imported_by(log: Path) -> Counter[str]:
    """How many processes imported each module, from ``-X importtime`` lines in ``log``."""
    return Counter(
        line.split("|")[2].strip()
        for line in log.read_text().splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    )


def workers_of(server: Server) -> dict[int, bytes]:
    """The children of ``server``'s process and their command lines."""
    master = server.process.pid
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return {int(c): Path(f"/proc/{c}/cmdline").read_bytes() for c in children}


def test_the_installed_uvicorn_is_the_one_serve_forks_workers_for() -> None:
    """An upgrade of uvicorn that moves the seam falls back to spawned workers (below); this
    says so here rather than only in ``serve``'s log and its start-up time."""
    assert webfork.uvicorn_seam() is not None


@pytest.mark.slow
def test_the_workers_find_the_app_imported_by_serve(tmp_path: Path, sqlite_url: str) -> None:
    """The parent imports the app once: in the importtime lines of the parent and both workers
    no ``app`` module and none of :data:`app.webfork.WEB_MODULES` appears twice (a spawned
    worker imports them all again). The parent leaves no metrics files of its own."""
    metrics = tmp_path / "metrics"
    server = start_server(
        tmp_path,
        database_url=sqlite_url,
        redis_url=None,
        workers=2,
        BOUND_PROCESSES="0",
        PROMETHEUS_MULTIPROC_DIR=str(metrics),
        PYTHONPROFILEIMPORTTIME="1",
    )
    try:
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        children = workers_of(server)
        own = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        files = sorted(p.name for p in metrics.glob("*.db"))
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "workers forked from this process" in log
    forked = [pid for pid, cmdline in children.items() if cmdline == own]
    assert len(forked) == 2, children
    assert not [name for name in files if name.endswith(f"_{server.process.pid}.db")], files
    assert {f"gauge_livesum_{pid}.db" for pid in forked} <= set(files), files
    imported = imported_by(server.log_path)
    assert imported["app.bootstrap"] == 1  # the parent's own import: the lines are there
    twice = [
        name
        for name, n in imported.items()
        if n > 1 and (name.startswith("app.") or name in webfork.WEB_MODULES)
    ]
    assert twice == []


#: A stand-in for another uvicorn whose supervisor asks for its workers differently: the
#: workers must then be spawned as uvicorn does, and serve.
ANOTHER_UVICORN = """
import uvicorn.supervisors.multiprocess as supervisor

_asks = supervisor.get_subprocess


def get_subprocess(config, target, sockets, *, start_method="spawn"):
    return _asks(config, target, sockets)


supervisor.get_subprocess = get_subprocess
"""


@pytest.mark.slow
def test_another_uvicorns_seam_spawns_the_workers_as_before(
    tmp_path: Path, sqlite_url: str
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(ANOTHER_UVICORN))
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    server = start_server(
        tmp_path, database_url=sqlite_url, redis_url=None, workers=2, PYTHONPATH=path
    )
    try:
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        children = workers_of(server)
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "workers spawned (this uvicorn's supervisor is not the one" in log
    assert "workers forked" not in log
    assert sum(b"spawn_main" in cmdline for cmdline in children.values()) == 2, children
    assert log.count("Application startup complete") == 2
    assert server.process.returncode == 0


class _SignalledEarly(webfork.ForkedWorker):
    """Sends itself SIGTERM first thing after the fork, before the handlers are put back."""

    def run(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        super().run()


def _queued(queue: list[int]) -> Any:
    return lambda signum, _frame: queue.append(signum)


def test_a_sigterm_at_the_fork_is_not_lost_in_the_supervisors_queue() -> None:
    """A worker forked while uvicorn's supervisor queues SIGTERM (its parent's handler): one
    sent to it before its own handlers are put back is delivered after, with the default
    action (what a spawned worker does with a SIGTERM before its server starts): it dies."""
    handlers = {**webfork.handlers_now(), signal.SIGTERM: signal.SIG_DFL}
    before = signal.signal(signal.SIGTERM, _queued([]))
    try:
        early = _SignalledEarly(handlers, target=lambda: None)
        early.start()
        early.join(timeout=30)
        plain = webfork.ForkedWorker(handlers, target=lambda: None)
        plain.start()
        plain.join(timeout=30)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert early.exitcode == -signal.SIGTERM
    assert plain.exitcode == 0


def test_a_forked_worker_runs_with_the_handlers_from_before_uvicorns() -> None:
    handlers = {**webfork.handlers_now(), signal.SIGHUP: signal.SIG_DFL}
    before = signal.signal(signal.SIGHUP, _queued([]))
    try:
        worker = webfork.ForkedWorker(
            handlers,
            target=lambda: os._exit(5 if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL else 6),
        )
        worker.start()
        worker.join(timeout=30)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert worker.exitcode == 5


def test_the_parent_forgets_its_own_metrics_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(multiproc.ENV, str(tmp_path))
    mine = [f"counter_{os.getpid()}.db", f"gauge_livesum_{os.getpid()}.db"]
    others = [f"counter_{os.getpid() + 1}.db", f"histogram_1{os.getpid()}.db"]
    for name in mine + others:
        (tmp_path / name).write_bytes(b"")
    assert multiproc.forget_this_process() == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)

"""A ``gatekeeper worker`` node's exit status: non-zero whenever Celery stopped before ready.

Celery used to refuse to start as root (pickle) and sometimes exit 0 after the node had written
its heartbeat, so ``/readyz`` counted a worker that never ran. The node now announces itself
only at ``worker_ready`` and turns any stop before it into :data:`app.node.START_FAILED`.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from celery import Celery
from celery.signals import worker_ready

from app import node
from app.settings import Settings
from app.worker import fleet


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(node, "_die_with_parent", lambda: None)  # not on the test process
    return Settings(database_url="sqlite://", broker_url="redis://127.0.0.1:1/0")


@pytest.fixture
def beats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []

    class Recorded:
        def __init__(self, *_: Any, queue: str, **__: Any) -> None:
            started.append(queue)

        def stop(self) -> None:
            started.append("stopped")

    monkeypatch.setattr(node, "start_heartbeat", Recorded)
    return started


@pytest.mark.parametrize("celery_exit", [None, 0, 1])
def test_a_worker_that_stops_before_ready_exits_non_zero_without_a_heartbeat(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, beats: list[str], celery_exit: int | None
) -> None:
    def refuse(self: Celery, argv: list[str] | None = None) -> None:
        if celery_exit is not None:
            sys.exit(celery_exit)  # Celery's refusal as root exited 0 in 5 of 16 runs

    monkeypatch.setattr(Celery, "worker_main", refuse)
    with pytest.raises(SystemExit) as stopped:
        node._run_node(settings, "surveys", 1)
    assert stopped.value.code == (celery_exit or node.START_FAILED)
    assert beats == []


def test_a_ready_worker_beats_until_it_stops_and_exits_zero(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, beats: list[str]
) -> None:
    def run(self: Celery, argv: list[str] | None = None) -> None:
        worker_ready.send(sender=None)
        assert beats == ["bounds"]  # announced only once ready

    monkeypatch.setattr(Celery, "worker_main", run)
    with pytest.raises(SystemExit) as stopped:
        node._run_node(settings, "bounds", 1)
    assert stopped.value.code == 0
    assert beats == ["bounds", "stopped"]


def test_a_heartbeat_deletes_its_key_when_stopped() -> None:
    class Client:
        def __init__(self) -> None:
            self.keys: dict[str, str] = {}

        def set(self, key: str, body: str, ex: int) -> None:
            self.keys[key] = body

        def delete(self, key: str) -> None:
            self.keys.pop(key, None)

    client = Client()
    beat = fleet.Heartbeat(client, "k", "{}")
    for _ in range(100):
        if client.keys:
            break
        import time

        time.sleep(0.01)
    assert client.keys == {"k": "{}"}
    beat.stop()
    assert client.keys == {}


def test_a_workers_app_runs_its_own_handlers_whatever_app_was_made_first() -> None:
    """Celery shares tasks between the apps of a process by default: the sender-only app the
    command checks the broker with made every node's plan task fail "run only in gatekeeper
    worker"."""
    from app.worker.celery_app import PLAN_TASK, CelerySettings, SurveyHandlers, make_celery

    cfg = CelerySettings(broker_url="redis://127.0.0.1:1/0", result_url="redis://127.0.0.1:1/0")
    make_celery(cfg)  # no handlers: what a web process or the start-up check makes
    planned: list[int] = []

    def plan(survey_id: int) -> None:
        planned.append(survey_id)

    worker = make_celery(cfg, SurveyHandlers(plan=plan, run_range=lambda *_: "done"))
    make_celery(cfg)  # and one made after it
    assert worker.tasks[PLAN_TASK](7) == 0
    assert planned == [7]

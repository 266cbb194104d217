"""The Celery workers as the API sees them: alive nodes, queue depths, task statistics.

Each ``gatekeeper worker`` node writes a heartbeat key to the result Redis every
:data:`HEARTBEAT_SECONDS` that expires after :data:`HEARTBEAT_TTL`; a node is *alive* while its
key exists. A node starts its heartbeat only once Celery consumes its queue, and deletes the key
when it stops. Cheap to read at every ``/readyz``, ``/metrics`` and survey read (no broadcast
to the workers).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Celery is imported only where a broker is configured
    from celery import Celery

    from app.worker.celery_app import CelerySettings

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
HEARTBEAT_TTL = 15


@dataclass(frozen=True)
class FleetStatus:
    """What the workers look like from here (None where the broker or Redis did not answer)."""

    nodes: int | None
    processes: int | None
    queues: dict[str, int | None]
    tasks: dict[str, int]
    task_seconds: dict[str, float]


class Heartbeat:
    """A node's heartbeat: a daemon thread refreshing its key until :meth:`stop`."""

    def __init__(self, client: Any, key: str, body: str) -> None:
        self.client, self.key, self.body = client, key, body
        self._stopped = threading.Event()
        threading.Thread(target=self._beat, name="worker-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._stopped.is_set():
            try:
                self.client.set(self.key, self.body, ex=HEARTBEAT_TTL)
            except Exception as exc:  # Redis away: the node looks dead until it is back
                log.warning("worker heartbeat not written (%s)", type(exc).__name__)
            self._stopped.wait(HEARTBEAT_SECONDS)

    def stop(self) -> None:
        """Stop beating and delete the key: the node is no longer counted alive."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self.client.delete(self.key)
        except Exception as exc:  # it expires by itself
            log.warning("worker heartbeat not removed (%s)", type(exc).__name__)


def start_heartbeat(client: Any, cfg: CelerySettings, *, queue: str, concurrency: int) -> Heartbeat:
    """Announce this node as alive (call it once the node consumes its queue)."""
    node = f"{queue}@{socket.gethostname()}:{os.getpid()}"
    body = json.dumps({"queue": queue, "concurrency": concurrency})
    return Heartbeat(client, cfg.key("workers", node), body)


def broker_unreachable(celery: Celery, wait_seconds: float) -> str | None:
    """None once the broker and the result Redis answer; else, after ``wait_seconds``, why not."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with celery.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1)
            celery.backend.client.ping()
            return None
        except Exception as exc:
            if time.monotonic() >= deadline:
                kind = type(exc).__name__
                return f"the broker or the result Redis is unreachable ({kind}: {exc})"
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def alive_nodes(celery: Celery, cfg: CelerySettings, queue: str = "*") -> int | None:
    """How many nodes of ``queue`` (``bounds``, ``surveys``; any by default) are alive.

    None when the result Redis did not answer.
    """
    try:
        client = celery.backend.client
        pattern = cfg.key("workers", f"{queue}@*")
        return sum(1 for _ in client.scan_iter(match=pattern, count=1000))
    except Exception as exc:
        log.warning("worker heartbeats unavailable (%s)", type(exc).__name__)
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def queue_depths(celery: Celery, cfg: CelerySettings) -> dict[str, int | None]:
    """Messages waiting in each queue (None: the broker did not answer)."""
    depths: dict[str, int | None] = {}
    try:
        with celery.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=1.0)
            channel = conn.default_channel
            for queue in (cfg.bounds_queue, cfg.surveys_queue):
                try:
                    depths[queue] = int(channel.queue_declare(queue, passive=True).message_count)
                except Exception:  # not declared yet: nothing was ever sent to it
                    depths[queue] = 0
                    channel = conn.channel()
    except Exception as exc:
        log.warning("queue depths unavailable (%s)", type(exc).__name__)
        return {cfg.bounds_queue: None, cfg.surveys_queue: None}
    return depths


def fleet_status(celery: Celery, cfg: CelerySettings) -> FleetStatus:
    """Alive nodes and their processes, queue depths, task counts and seconds."""
    nodes: int | None = None
    processes: int | None = None
    tasks: dict[str, int] = {}
    seconds: dict[str, float] = {}
    try:
        client = celery.backend.client
        keys = list(client.scan_iter(match=cfg.key("workers", "*"), count=1000))
        bodies = [b for b in client.mget(keys) if b is not None] if keys else []
        nodes = len(bodies)
        processes = sum(int(json.loads(b)["concurrency"]) for b in bodies)
        tasks = {_text(k): int(v) for k, v in client.hgetall(cfg.key("tasks")).items()}
        seconds = {_text(k): float(v) for k, v in client.hgetall(cfg.key("task-seconds")).items()}
    except Exception as exc:
        log.warning("worker status unavailable (%s)", type(exc).__name__)
    return FleetStatus(nodes, processes, queue_depths(celery, cfg), tasks, seconds)

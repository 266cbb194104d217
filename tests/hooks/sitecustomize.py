"""Test hooks inside a server's processes: act on a submit after its commit, before its answer.

A test puts this folder on ``PYTHONPATH`` of a ``gatekeeper serve``. Python imports
``sitecustomize`` at start-up in every process of the server — uvicorn's workers included when
multiprocessing spawns them afresh; forked (``app.webfork``), they inherit the parent's patched
module. When a process imports the submit use case (``app.services.queries``), the hook wraps
its ``submit``, which returns once its transaction committed. What the wrapper does after a
submit that stored a new output (not a replay, not a reused answer) is set by the environment:

* ``GATEKEEPER_TEST_KILL_AFTER_COMMIT`` (a file path; ``tests/client/test_client_faults.py``):
  the first such submit writes the output and query id to the file, then kills its own process
  with SIGKILL. The answer is never sent, the connection drops, and uvicorn starts a new worker.
  Every later submit runs unchanged.
* ``GATEKEEPER_TEST_DELAY_AFTER_COMMIT`` (seconds; ``tests/service/test_faults.py``): every
  such submit waits that long before answering, in its request's thread (the object's lock is
  already released). A worker killed at a random moment then often holds committed submits
  whose answers were not sent: the window between a commit and its response, a few hundred
  microseconds wide otherwise, is the one the SIGKILL scenario must hit.

Without either variable nothing is patched. Rejections, replays and reused answers are never
delayed nor killed.
"""

from __future__ import annotations

import os

_MARKER = os.environ.get("GATEKEEPER_TEST_KILL_AFTER_COMMIT")
_DELAY = float(os.environ.get("GATEKEEPER_TEST_DELAY_AFTER_COMMIT") or 0)
_TARGET = "app.services.queries"

if _MARKER or _DELAY > 0:
    import importlib.abc
    import importlib.machinery
    import json
    import signal
    import sys
    import time
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any

    def _kill_once(outcome: Any, marker: str) -> None:
        """The first call writes ``outcome``'s output to ``marker`` and SIGKILLs the process."""
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # the one kill already happened
            return
        stored = {"query_id": outcome.body.query_id, "output": outcome.body.output}
        with os.fdopen(fd, "w") as file:
            json.dump({**stored, "pid": os.getpid()}, file)
        os.kill(os.getpid(), signal.SIGKILL)

    def _patch(module: ModuleType) -> None:
        submit = module.submit

        def submit_then_act(**kwargs: Any) -> Any:
            outcome = submit(**kwargs)  # committed when it returns
            if outcome.replayed or outcome.reused:
                return outcome
            if _MARKER:
                _kill_once(outcome, _MARKER)
            if _DELAY > 0:
                time.sleep(_DELAY)
            return outcome

        module.submit = submit_then_act

    class _PatchOnImport(importlib.abc.MetaPathFinder):
        """Patch the module when it is first imported (processes that never do pay nothing)."""

        def find_spec(
            self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
        ) -> importlib.machinery.ModuleSpec | None:
            if name != _TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            loader: Any = spec.loader
            execute = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                execute(module)
                _patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchOnImport())

"""Test hook: a server process that SIGKILLs itself after a submit committed, before answering.

``tests/client/test_client_faults.py`` puts this folder on ``PYTHONPATH`` of a ``gatekeeper
serve`` with ``GATEKEEPER_TEST_KILL_AFTER_COMMIT`` set to a file path. Python imports
``sitecustomize`` at start-up in every process of the server — uvicorn's workers included, which
multiprocessing spawns afresh. When a process imports the submit use case
(``app.services.queries``), the hook wraps its ``submit``, which returns once its transaction
committed: the first submit that stores a new output (not a replay) writes the output and query
id to the file, then kills its own process with SIGKILL. The answer is never sent, the
connection drops, and uvicorn starts a new worker. Every later submit runs unchanged.
"""

from __future__ import annotations

import os

_MARKER = os.environ.get("GATEKEEPER_TEST_KILL_AFTER_COMMIT")
_TARGET = "app.services.queries"

if _MARKER:
    import importlib.abc
    import importlib.machinery
    import json
    import signal
    import sys
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any

    def _patch(module: ModuleType, marker: str) -> None:
        submit = module.submit

        def submit_then_die(**kwargs: Any) -> Any:
            outcome = submit(**kwargs)  # committed when it returns
            if outcome.replayed:
                return outcome
            try:
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # the one kill already happened
                return outcome
            stored = {"query_id": outcome.body.query_id, "output": outcome.body.output}
            with os.fdopen(fd, "w") as file:
                json.dump({**stored, "pid": os.getpid()}, file)
            os.kill(os.getpid(), signal.SIGKILL)
            return outcome  # never reached

        module.submit = submit_then_die

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
                _patch(module, str(_MARKER))

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchOnImport())

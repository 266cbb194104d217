"""The ``gatekeeper`` command run in the test process, as its console script would run it.

A ``gatekeeper`` process spends about 0.6-0.8 s of CPU importing before the few milliseconds of
work most CLI tests check (issue 27 item 5, CI time). :func:`run_main` calls ``app.cli.main``
here instead, with standard input, output and error redirected; :func:`fresh_process_state`
makes a command that reads the settings and opens databases see what a new process sees and
leave nothing behind: the environment and working directory it was given (restored after), no
cached settings, the values' cipher, caches and engines of its own (every engine it created
disposed, so no database connection outlives it).

Tests of the process itself (the installed script, a closed pipe, a server that must exit) run
it as a subprocess instead.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from app import cli, crypto
from app.db import session
from app.services import snapshots
from app.settings import get_settings
from app.store import chunks


@contextlib.contextmanager
def _stderr_of_a_fresh_interpreter(err: io.TextIOBase) -> Iterator[None]:
    """Warnings and log records go to ``err`` as a fresh ``gatekeeper`` process prints them.

    Python's default warning filters (deprecations shown only for ``__main__``), and log
    records of WARNING and above, which a process without logging configuration prints to
    standard error (``logging.lastResort``): a test that asserts on standard error sees them
    as it would from the subprocess.
    """
    root = logging.getLogger()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            warnings.simplefilter("default")
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
                warnings.filterwarnings("ignore", category=category)
            warnings.filterwarnings("ignore", category=ResourceWarning)
            yield
        for item in caught:
            err.write(
                warnings.formatwarning(
                    item.message, item.category, item.filename, item.lineno, item.line
                )
            )
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _stream(data: str = "") -> io.TextIOWrapper:
    """A text stream with a binary ``buffer`` under it, as ``sys.stdin``/``stdout`` have."""
    return io.TextIOWrapper(io.BytesIO(data.encode("utf-8")), encoding="utf-8")


def _text(stream: io.TextIOWrapper) -> str:
    """What was written to ``stream`` (text and bytes), decoded as ``subprocess.run`` does."""
    stream.flush()
    raw = stream.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue().decode("utf-8").replace("\r\n", "\n")


def run_main(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``gatekeeper ARGS`` in this process: ``app.cli.main`` as the console script calls it.

    Standard input is ``stdin`` (empty when ``None``); the exit code is what the process would
    exit with, ``SystemExit`` (argparse's usage errors and ``--help``) included.
    """
    out, err = _stream(), _stream()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _stderr_of_a_fresh_interpreter(err),
    ):
        saved_stdin = sys.stdin
        sys.stdin = _stream(stdin or "")
        try:
            code: Any = cli.main(list(args))
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.stdin = saved_stdin
    if code is None:
        code = 0
    elif not isinstance(code, int):  # SystemExit("message"): printed, exit status 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(["gatekeeper", *args], code, _text(out), _text(err))


@contextlib.contextmanager
def fresh_process_state(
    env: Mapping[str, str], *, unset: tuple[str, ...] = (), cwd: Path | None = None
) -> Iterator[list[Any]]:
    """Run a command as a new process would, and leave this one as it was.

    Inside: the variables ``unset`` are removed from ``os.environ`` and ``env`` set, the working
    directory is ``cwd``, the settings are read afresh, no cipher of the values is configured,
    and the caches of histories and chunks are empty. Every engine ``app.db.session`` creates
    is recorded in the yielded list and disposed on the way out (commands that open a database
    for a single run do not all dispose it: their process exit closes it). Then the
    environment, directory, settings, cipher and caches are those of before.

    They are the process's own, not a thread's: while the command runs, a test's app serving
    from background threads sees them too (the cipher is the command's, none until it opens
    the values). The app reads no settings after it is built; a test whose app encrypts or
    decrypts values in the background during a command runs it with ``run_cli_process``.
    """
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_cipher = crypto._active
    saved_histories = snapshots.HISTORIES
    saved_chunks = dict(chunks._SHARED)
    real_create_engine = session.create_engine  # type: ignore[attr-defined]
    created: list[Any] = []

    def recording_create_engine(*args: Any, **kwargs: Any) -> Any:
        engine = real_create_engine(*args, **kwargs)
        created.append(engine)
        return engine

    try:
        for name in unset:
            os.environ.pop(name, None)
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        get_settings.cache_clear()
        crypto._active = None
        snapshots.HISTORIES = snapshots.HistoryCache()
        chunks._SHARED.clear()
        session.create_engine = recording_create_engine  # type: ignore[attr-defined]
        yield created
    finally:
        session.create_engine = real_create_engine  # type: ignore[attr-defined]
        for engine in created:
            engine.dispose()
        chunks._SHARED.clear()
        chunks._SHARED.update(saved_chunks)
        snapshots.HISTORIES = saved_histories
        crypto._active = saved_cipher
        get_settings.cache_clear()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)

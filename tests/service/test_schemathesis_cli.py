"""The schemathesis command line, every check enabled, against a live server on PostgreSQL (#11, 9).

No operation is excluded; the examples per operation are bounded (``CLI_EXAMPLES``) to keep CI
short; the in-process run (test_schemathesis.py) does 1,000 per operation. The configuration is
the in-process one, written as ``schemathesis.toml``, with every check enabled in it: the only
widenings are the documented ones of ``SEMANTIC_422`` (a schema-valid body can name a value outside
the generated domain) and ``KEPT_AFTER_DELETE`` (a cancelled survey stays readable).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import ROOT, start_thread_server
from tests.service.test_schemathesis import (
    KEPT_AFTER_DELETE,
    RUN_KEY_ID,
    SEMANTIC_422,
    STATEFUL_EXAMPLES,
    _run_key,
)

pytestmark = pytest.mark.slow
CLI_EXAMPLES = int(os.environ.get("GATEKEEPER_SCHEMATHESIS_CLI_EXAMPLES", "25"))


def config_toml(examples: int) -> str:
    """The in-process run's configuration (test_schemathesis._config) as schemathesis.toml."""
    statuses = '["2xx", "401", "403", "404", "409", "422", "429"]'
    lines = [
        # every check, as ``--checks all`` would; not that flag, which overrides the file and so
        # the per-operation ``KEPT_AFTER_DELETE`` exception below
        "[checks]",
        "enabled = true",
        "",
        "[generation]",
        f"max-examples = {examples}",
        'database = "none"',
        "",
        "[phases.stateful.generation]",
        f"max-examples = {min(examples, STATEFUL_EXAMPLES)}",
    ]
    for name in SEMANTIC_422:
        lines += [
            "",
            "[[operations]]",
            f'include-name = "{name}"',
            f"checks.positive_data_acceptance.expected-statuses = {statuses}",
            f"phases.stateful.checks.positive_data_acceptance.expected-statuses = {statuses}",
        ]
    for name in KEPT_AFTER_DELETE:
        lines += [
            "",
            "[[operations]]",
            f'include-name = "{name}"',
            "checks.use_after_free.enabled = false",
            "phases.stateful.checks.use_after_free.enabled = false",
        ]
    return "\n".join(lines) + "\n"


def test_the_command_line_with_every_check_finds_nothing(postgres_url: str, tmp_path: Path) -> None:
    key = _run_key(postgres_url)
    # the command line is what is tested, not the server's process: the app on a thread of
    # this process (which only waits for the command), as `serve --workers 1` served it
    server = start_thread_server(
        database_url=postgres_url,
        redis_url=None,
        gatekeeper_encryption_key_file=str(tmp_path / "key"),
        bound_time_limit=0.2,
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text(config_toml(CLI_EXAMPLES))
    try:
        done = subprocess.run(  # noqa: S603 - schemathesis from our venv, on loopback
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "--config-file",
                str(config),
                "run",
                f"{server.url}/openapi.json",
                "-H",
                f"Authorization: Bearer {key}",
                "--request-timeout",
                "30",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "SCHEMATHESIS_HOOKS": "tests.service.schemathesis_hooks",
                "GATEKEEPER_RUN_KEY_ID": str(RUN_KEY_ID),
                "PYTHONPATH": str(ROOT),
            },
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        server.stop()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "No issues found" in output or "passed" in output.lower(), output[-3000:]

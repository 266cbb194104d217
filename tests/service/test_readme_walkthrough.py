"""The README's curl walk-through, pasted whole into a shell, works (issue #11, 10).

Pasted on a fresh machine it used to fail: the first ``make run`` builds ``.venv`` for about
two minutes and the next line ran at once. The block is read from README.md itself, so the text
users copy is what is tested; only the port (8000 may be taken) and the database and key file
(kept out of ``./data``) are changed, through the environment ``make run`` reads.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import ROOT, _free_port


def walkthrough() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A walk-through with curl", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the walk-through has no sh block"
    return block.group(1)


@pytest.mark.parametrize("readme", ["README.md", "docs/surveys.md", "docs/dashboard.md"])
def test_every_curl_body_can_be_pasted(readme: str) -> None:
    """A placeholder (``-d '…same body…'``) made the survey block fail when pasted."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / readme).read_text(), re.S)
    bodies = [body for block in blocks for body in re.findall(r"(?:-d|--data) '([^']*)'", block)]
    for body in bodies:
        json.loads(body)  # a whole JSON document, not an ellipsis
    assert all("…" not in block for block in blocks)


def json_documents(text: str) -> list[Any]:
    """The JSON documents printed one after another (curl -s adds no newline between them)."""
    decoder, documents, at = json.JSONDecoder(), [], 0
    while True:
        start = text.find("{", at)
        if start < 0:
            return documents
        document, at = decoder.raw_decode(text, start)
        documents.append(document)


def test_the_block_waits_for_readiness_before_its_first_request() -> None:
    lines = [line for line in walkthrough().splitlines() if line and not line.startswith("#")]
    started = next(i for i, line in enumerate(lines) if line.startswith("make run &"))
    first_request = next(i for i, line in enumerate(lines) if "curl" in line and i > started)
    assert "readyz" in lines[first_request], lines[first_request]
    assert lines[first_request].startswith("until ")


@pytest.mark.slow
def test_the_walkthrough_pasted_whole_works(tmp_path: os.PathLike[str]) -> None:
    port = _free_port()
    script = walkthrough().replace("localhost:8000", f"localhost:{port}")
    env = {
        **os.environ,
        "PORT": str(port),
        "DATABASE_URL": f"sqlite:///{tmp_path}/walkthrough.db",
        "GATEKEEPER_ENCRYPTION_KEY_FILE": f"{tmp_path}/encryption.key",
        "BOUND_PROCESSES": "0",
    }
    env.pop("GATEKEEPER_BOOTSTRAP_ADMIN_KEY", None)
    out_path, err_path = Path(tmp_path) / "stdout", Path(tmp_path) / "stderr"
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        # files, not pipes: the server the block leaves running would hold a pipe open
        shell = subprocess.Popen(  # noqa: S603 - the README's own text, on loopback
            ["/bin/bash", "-c", script],
            cwd=ROOT,
            env=env,
            stdout=out_file,
            stderr=err_file,
            start_new_session=True,
        )
        try:
            shell.wait(timeout=300)
        finally:
            os.killpg(shell.pid, signal.SIGTERM)  # the server `make run &` left behind
    out, err = out_path.read_text(), err_path.read_text()
    documents = json_documents(out)
    registered, dry_run, submitted, odometer, history = documents[-5:]
    assert registered["id"] == "patient-17", (out, err[-2000:])
    assert dry_run["decision"] == "accept"
    assert submitted["output"] in ("none", "flu", "covid")
    assert odometer["accepted"] == 1
    assert odometer["budget"] == 1.0
    assert history, history

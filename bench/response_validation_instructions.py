"""Instructions spent validating and serialising a survey responses page (issue 23 item 1).

CPU time on a shared machine moves with the load; instruction counts do not. For each source
tree (this one and ``--baseline DIR``, e.g. ``git archive <commit> | tar -x -C DIR``), a child
Python process builds a 1,000-member ``SurveyResponsePage`` body (the shape the service builds:
object id, decision, reason, version, output) and runs, under ``valgrind --tool=callgrind``,
``--repeat`` times the step measured, once with the step and once without it; the difference of
the two runs' instruction totals divided by ``--repeat`` is the step's count per page, so the
interpreter's start and the imports cancel out. Steps: ``validate`` (``model_validate`` of the
dict: one pydantic-core call) and ``serialize`` (the model to JSON bytes as FastAPI serves it:
``exclude_unset``, aliases)::

    .venv/bin/python bench/response_validation_instructions.py --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MEMBERS = 1000

CHILD = """
import sys
sys.path.insert(0, {tree!r})
from app.services import schemas
items = [
    {{"object_id": f"bench-{{i:05d}}", "decision": "accepted", "reason": None, "version": 1,
      "output": i % 10}}
    for i in range({members})
]
body = {{"items": items, "next_after": items[-1]["object_id"]}}
page = schemas.SurveyResponsePage.model_validate(body)  # warm: the schema is built
serializer = schemas.SurveyResponsePage.__pydantic_serializer__
for _ in range({repeat}):
    if {step!r} == "validate":
        schemas.SurveyResponsePage.model_validate(body)
    elif {step!r} == "serialize":
        serializer.to_json(page, exclude_unset=True, by_alias=True)
"""


def instructions(tree: str, step: str, repeat: int) -> int:
    """Instructions (``Ir``) of one child process running ``step`` ``repeat`` times."""
    code = CHILD.format(tree=tree, members=MEMBERS, repeat=repeat, step=step)
    with tempfile.TemporaryDirectory() as where:
        out = Path(where, "callgrind.out")
        valgrind = shutil.which("valgrind")
        if valgrind is None:
            raise SystemExit("valgrind is not installed")
        subprocess.run(  # noqa: S603 - our own arguments
            [
                valgrind,
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-c",
                code,
            ],
            check=True,
            capture_output=True,
            env={
                **os.environ,
                "PYTHONPATH": tree,
                "OPENBLAS_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0",
            },
        )
        summary = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if summary is None:
        raise RuntimeError(f"{tree}: no instruction total in callgrind's output")
    return int(summary.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="pages validated in a run")
    parser.add_argument("--baseline", help="a source tree of an earlier commit to compare")
    args = parser.parse_args()
    trees = {"this tree": str(Path(__file__).resolve().parents[1])}
    if args.baseline:
        trees["baseline"] = args.baseline
    print(f"{'tree':<10} {'step':<10} {'instructions per page':>22} {'per member':>11}")
    for label, tree in trees.items():
        idle = instructions(tree, "none", args.repeat)
        for step in ("validate", "serialize"):
            per_page = (instructions(tree, step, args.repeat) - idle) / args.repeat
            print(f"{label:<10} {step:<10} {per_page:>22,.0f} {per_page / MEMBERS:>11,.0f}")
    print(
        f"{MEMBERS} members a page, {args.repeat} pages a run; load average: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )


if __name__ == "__main__":
    main()

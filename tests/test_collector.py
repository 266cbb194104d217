"""The serving processes' garbage collector (``app.bootstrap.tune_collector``, ``h/member``).

``gatekeeper serve``'s workers build their app with ``app_factory``, which leaves the objects
alive at that point frozen and the youngest generation collected every
``COLLECT_EVERY`` allocations instead of 700 (a survey chunk's objects are then mostly freed
before any pass sees them). Checked in a fresh interpreter: the test process keeps its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import gc, json
from app import bootstrap
before = gc.get_threshold()
app = bootstrap.app_factory()
after = gc.get_threshold()
# a reference cycle made after tuning is still collected
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
del a, b
print(json.dumps({"before": before, "after": after, "frozen": gc.get_freeze_count(),
                  "every": bootstrap.COLLECT_EVERY, "collected": gc.collect()}))
"""


def test_app_factory_freezes_the_built_process_and_collects_less_often(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'gc.db'}",
        "GATEKEEPER_ENCRYPTION_KEY_FILE": str(tmp_path / "key"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(  # noqa: S603 - this interpreter, our own script
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["before"][0] == 700  # Python's default, untouched by importing the app
    assert found["after"] == [found["every"], *found["before"][1:]]
    assert found["every"] >= 10_000
    assert found["frozen"] > 10_000  # the modules and the app: out of every pass
    assert found["collected"] >= 2

"""The serving processes' garbage collector (``app.bootstrap.tune_collector``, ``h/member``).

``gatekeeper serve``'s workers build their app with ``app_factory``, which leaves the objects
alive at that point frozen (with no full pass first) and the youngest generation collected every
``COLLECT_EVERY`` allocations instead of 700 (a survey chunk's objects are then mostly freed
before any pass sees them). Checked in a fresh interpreter: the test process keeps its own.
The app is built with the collector paused (``collector_paused``: its passes over the imports'
long-lived objects were CPU of every worker start), and it is on again once the app is built.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.bootstrap import collector_paused

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import gc, json
from app import bootstrap
before = gc.get_threshold()
build, during = bootstrap.create_app, []
def create_app():
    during.append(gc.isenabled())
    return build()
bootstrap.create_app = create_app
full_passes = gc.get_stats()[2]["collections"]
app = bootstrap.app_factory()
full_passes = gc.get_stats()[2]["collections"] - full_passes
after = gc.get_threshold()
enabled = gc.isenabled()
# a reference cycle made after tuning is still collected
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
del a, b
print(json.dumps({"before": before, "after": after, "frozen": gc.get_freeze_count(),
                  "every": bootstrap.COLLECT_EVERY, "collected": gc.collect(),
                  "during": during, "enabled": enabled, "full_passes": full_passes}))
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
    # the app was built with the collector off, and it is on again afterwards
    assert found["during"] == [False]
    assert found["enabled"] is True
    # and no full pass over the heap it built before freezing it (~0.1 s of every worker start)
    assert found["full_passes"] == 0


def test_collector_paused_restores_the_collector_as_it_found_it() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failed import")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: stays off
    finally:
        gc.enable()

"""The layers contract covers every module of ``app`` with no exceptions, and it holds."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, Any]] = config["contracts"]
    return contracts


def _layers() -> list[str]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    names: list[str] = []
    for layer in layers["layers"]:
        names += [part.strip() for part in str(layer).replace(":", "|").split("|")]
    return names


def test_every_module_of_app_is_in_a_layer() -> None:
    top = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "app").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert {f"app.{name}" for name in top} == set(_layers())


def test_no_contract_has_exceptions() -> None:
    for contract in _contracts():
        assert "ignore_imports" not in contract, contract["name"]
        assert not contract.get("unmatched_ignore_imports_alerting"), contract["name"]


def test_the_composition_root_sits_above_the_api_and_below_the_commands() -> None:
    layers = _layers()
    order = ["app.cli", "app.node", "app.bootstrap", "app.api", "app.services", "app.worker"]
    assert [layers.index(name) for name in order] == sorted(layers.index(n) for n in order)
    assert layers.index("app.engine") < layers.index("app.db") < layers.index("app.crypto")
    assert layers.index("app.engine") < layers.index("app.settings")


def test_no_module_imports_another_modules_private_names() -> None:
    """``from app.x import _name`` crosses a module's boundary (the worker once did)."""
    found = []
    for path in (ROOT / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app"):
                found += [
                    f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert found == []


def test_import_linter_keeps_every_contract() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run(  # noqa: S603 - the project's own linter on the project
        [lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_importing_the_composition_root_loads_no_metrics() -> None:
    """`gatekeeper serve` imports bootstrap to migrate before it sets up the metrics directory:
    importing app.metrics then would create multiprocess files in a directory not yet made."""
    code = "import sys, app.bootstrap; print('app.metrics' in sys.modules)"
    out = subprocess.run(  # noqa: S603 - our interpreter, our code
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"

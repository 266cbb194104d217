"""Every example in ``app/``'s docstrings runs in ``make test`` (issue 23, 5).

Nine modules carried ``>>>`` examples and three of them ran (two through ``doctest.testmod`` in
engine tests): pytest now collects ``app`` with ``--doctest-modules``. These checks keep it so —
the configuration collects ``app``, and every ``>>>`` line of a module is one the doctest finder
sees (an example in a comment or a plain string would never run).
"""

from __future__ import annotations

import doctest
import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    path for path in (ROOT / "app").rglob("*.py") if ">>>" in path.read_text(encoding="utf-8")
)


def test_pytest_collects_the_doctests_of_app() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "app" in options["testpaths"]
    assert "--doctest-modules" in options["addopts"].split()


def test_modules_with_examples_are_found() -> None:
    assert len(MODULES) >= 9


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_is_a_doctest(path: Path) -> None:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    module = importlib.import_module(name)
    found = sum(len(test.examples) for test in doctest.DocTestFinder().find(module))
    lines = path.read_text(encoding="utf-8").splitlines()
    prompts = sum(1 for line in lines if line.lstrip().startswith(">>>"))
    assert found == prompts, f"{name}: {prompts} '>>>' lines, {found} doctest examples"

"""``bench/import_validation.py`` runs and prints its table (the bench must not rot)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import import_validation  # noqa: E402


def test_a_short_run_prints_both_roads(capsys: pytest.CaptureFixture[str]) -> None:
    assert import_validation.main(["--objects", "50", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "| per line |" in out
    assert "| once per request |" in out
    assert "50 items, 2 rounds" in out

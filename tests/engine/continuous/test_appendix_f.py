"""The paper's appendix F table: every row certified within 1e-4 and consistent with a reference.

The 16 histories, the reference intervals (each row's loss certified within 1e-8 before the
search was reworked for speed) and the check are those of ``bench/appendix_f.py``, loaded from
the file so that the benchmark and this test cannot drift apart: each row's ``[lower, upper]``
is at most 1e-4 wide (``status: ok``), overlaps the reference (both hold the true loss) and each
of its ends is within 1e-4 of the reference's far end — i.e. within 1e-4 of the global optimum.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "appendix_f.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("appendix_f_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


appendix_f = _bench()


@pytest.mark.parametrize("outputs", list(itertools.product(*appendix_f.OUTPUTS)), ids=str)
def test_appendix_f_row_within_tolerance_of_the_reference(outputs: tuple[int, ...]) -> None:
    answer, _, _ = appendix_f._row(outputs)
    try:
        appendix_f.check(outputs, answer)
    except SystemExit as failed:  # the benchmark's way of stopping, with the row's numbers
        pytest.fail(str(failed))

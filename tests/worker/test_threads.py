"""One BLAS thread per service process unless the operator chose (app.worker.threads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.service.conftest import ROOT

PROBE = """
import os, sys
for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.pop(name, None)
os.environ.update(dict(a.split("=", 1) for a in sys.argv[1:]))
import numpy  # noqa: F401 - loads OpenBLAS with its default threads
from threadpoolctl import threadpool_info
from app.worker.threads import single_threaded_blas
applied = single_threaded_blas()
print(applied, max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"))
"""


def probe(*env: str) -> tuple[str, int]:
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", PROBE, *env],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    applied, threads = done.stdout.split()
    return applied, int(threads)


def test_blas_is_limited_to_one_thread_per_process() -> None:
    assert probe() == ("True", 1)


@pytest.mark.parametrize("variable", ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"])
def test_an_operators_choice_is_kept(variable: str) -> None:
    applied, threads = probe(f"{variable}=2")
    assert applied == "False"
    assert threads == 2

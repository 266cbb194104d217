"""One BLAS thread per process: the process pool, not BLAS, is the service's parallelism.

OpenBLAS (numpy's and scipy's) starts a thread per core in every process by default. The service
runs several web workers and a bound process per worker on a few cores; their BLAS threads
competed for the same cores and spun while waiting: on 2 cores, 4 web workers and 4 bound
processes spent 38.6 ms of CPU per continuous (``linear``) submit and answered 49.6 submits/s;
with one BLAS thread per process, 12.6 ms and 143 submits/s (``bench/service_load.py
--scenarios linear``, docs/benchmarks.md). Finite decisions are element-wise numpy and do not
use BLAS at all.

An operator who sets ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` keeps
that setting.
"""

from __future__ import annotations

import os

#: Variables by which an operator chooses BLAS threads; any of them set leaves BLAS alone.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_blas() -> bool:
    """Limit this process's BLAS thread pools to one thread, unless the operator chose.

    Returns whether the limit was applied.
    """
    if any(os.environ.get(name) for name in BLAS_THREAD_VARIABLES):
        return False
    # imported here: a process whose operator chose (CI's `make test` sets OPENBLAS_NUM_THREADS)
    # never loads it (about 3 ms of CPU at every web worker's and Celery worker's start)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    return True

"""The machine's memory read bandwidth, measured with the threads decode runs on: the bound of a CPU decode step,
which reads every weight byte once (`forge bench` prints decode's weight reads beside it)."""

from __future__ import annotations

import time

import numba
import numpy as np


@numba.njit(parallel=True, fastmath=True, cache=True)
def _sum(a: np.ndarray) -> float:  # pragma: no cover - compiled
    total = 0.0
    for i in numba.prange(a.shape[0]):
        total += a[i]
    return total


def read_bandwidth(threads: int, nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Bytes per second that `threads` threads read from memory: the best of `repeats` sums over `nbytes` of
    float32 (well past any cache), after one untimed pass (compilation, page faults)."""
    a = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    previous = numba.get_num_threads()
    most = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets it at import
    numba.set_num_threads(max(1, min(threads, most)))
    # A step's dynamic chunking (`begin_step`) would hand out the sum one element at a time.
    chunksize = numba.set_parallel_chunksize(0)
    try:
        _sum(a)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            _sum(a)
            best = min(best, time.perf_counter() - start)
    finally:
        numba.set_parallel_chunksize(chunksize)
        numba.set_num_threads(previous)
    return a.nbytes / best

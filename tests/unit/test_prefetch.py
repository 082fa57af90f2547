"""Which cache levels a weight prefetch asks for (kernels/simd_vectors.py), read off the LLVM IR the kernels' intrinsics
emit: a product's only or last pass over its weights keeps them out of the outer caches, a pass that the next tile
repeats keeps them everywhere."""

from __future__ import annotations

import re

import numpy as np
from numba import njit

from kernels.simd_vectors import prefetch, prefetch_once, prefetch_weights


@njit
def _partial_tile(a):
    prefetch_weights(a, 0, (0, 1, 2), 4)


@njit
def _full_tile(a):
    prefetch_weights(a, 0, (0, 1, 2, 3), 4)


@njit
def _lone_row(a):
    prefetch_once(a, 0)


@njit
def _plain(a):
    prefetch(a, 0)


def _localities(fn, *args) -> set[int]:
    """The locality operands (0: nearest cache only, 3: every level) of the prefetches in fn's IR."""
    fn(*args)
    ir = next(iter(fn.inspect_llvm().values()))
    return {int(m) for m in re.findall(r"call void @llvm\.prefetch\.p0\([^)]*?, i32 0, i32 (\d), i32 1\)", ir)}


def test_a_partial_tile_and_a_lone_row_prefetch_to_the_nearest_cache_a_full_tile_to_every_level() -> None:
    a = np.zeros(64, np.uint8)
    assert _localities(_partial_tile, a) == {0}
    assert _localities(_full_tile, a) == {3}
    assert _localities(_lone_row, a) == {0}
    assert _localities(_plain, a) == {3}

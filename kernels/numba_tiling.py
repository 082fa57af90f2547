"""How the matvec kernels (kernels/numba_linear.py, kernels/numba_linear_i8.py, kernels/numba_linear16.py) cut a
product: work items of row blocks for the parallel loop (`chunk_blocks`), a tile of activation rows (`tile_at`), and
how far ahead of the group they read the kernels ask for the weights (`PREFETCH_BYTES`). Compiled into those files'
kernels (kernels/numba_jit.py lists it in `_INLINED`)."""

from __future__ import annotations

from numba import njit

from kernels.numba_jit import JIT
from kernels.simd_vectors import tile_offsets

# Groups of one 4-row block per parallel work item (~40 blocks of a 576-wide matrix), whatever the
# number of activation rows. Handing out an item and its calls per row or tile cost a fixed time
# that small items would pay often beside little work (a one-row int8 product's is short), and
# items sized down for many rows pay it per row; larger items balance less finely between threads.
CHUNK_GROUPS = 768
# Work items a kernel thread gets of one product at most (items grow past CHUNK_GROUPS to keep to it):
# a 1B model's single-row products from DRAM ran ~10% faster in items of a sixteenth of the matrix
# than in items of 768 groups (hundreds per product); 8 still lets the other thread take over the
# work of one that loses its core to another process.
ITEMS_PER_THREAD = 8
# Weight bytes ahead of the group being read that a kernel asks the caches for (a software prefetch
# per 64 bytes of weights): the hardware prefetchers alone do not keep enough lines in flight for a
# one-row product over weights from DRAM, which then runs well below its speed from cache. About the
# memory latency times one thread's read rate; further is not better (2 KB read 4-6% slower than 1.5 KB
# on Zen 2: docs/performance.md; `scripts/matvec_bench.py --copies N` compares).
PREFETCH_BYTES = 1536


@njit(**JIT)
def chunk_blocks(ng, nb, threads):
    """Row blocks per parallel work item (of nb): at least CHUNK_GROUPS groups, and no more items than
    ITEMS_PER_THREAD for each of the launch's `threads` (numba.get_num_threads() is the caller's: asked for in
    here it would keep the kernels out of numba's on-disk cache)."""
    return max(1, CHUNK_GROUPS // ng, nb // (ITEMS_PER_THREAD * threads))


@njit(**JIT)
def tile_at(t, KX, ng, n):
    """A tile of n rows (a constant) from row t: the rows, their offsets in the flat activations (rows KX values
    apart) and in the flat per-group arrays (ng apart)."""
    return tile_offsets(t, 1, n), tile_offsets(t, KX, n), tile_offsets(t, ng, n)

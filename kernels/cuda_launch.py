"""Launch geometry and per-step work plans for the CUDA kernels: plain host code, no CuPy.

The constants mirror the #defines of kernels/cuda/*.cu (a unit test reads them from the sources).
"""

from __future__ import annotations

import numpy as np

# gemv.cu: weight rows per thread block (one per warp) and activation rows per block.
GEMV_WARPS = 4
GEMV_ROWS = 8
# gemv.cu's tiled form: weight rows per warp.
GEMV_TILE_ROWS = 2
# Products with up to this many activation rows read quantized weights in the GEMV kernels (decode and
# batched decode); above, panels of the weight are dequantized to float16 for cuBLAS (prefill).
GEMV_MAX_ROWS = 32
# paged_attention.cu: warps per block, query rows per warp in the prefill kernel, head_dim limit.
PA_WARPS = 4
PA_ROWS = 4
PA_MAX_DH = 256
# sample.cu: threads of the one block that samples a row.
SAMPLE_THREADS = 512
# Threads per block of the row-wise and elementwise kernels.
ROW_THREADS = 256
# Grid-stride kernels never need more blocks than this to fill a GPU.
MAX_BLOCKS = 4096


def gemv_geometry(n_out: int, n_rows: int) -> tuple[tuple[int, int], tuple[int]]:
    """(grid, block) of gemv_q4 / gemv_q8 for a weight of `n_out` rows times `n_rows` activation rows:
    x walks the activation rows (so blocks sharing weight rows run together), y the weight rows."""
    assert 0 < n_rows <= GEMV_MAX_ROWS and 0 < n_out <= 65535 * GEMV_WARPS
    return (-(-n_rows // GEMV_ROWS), -(-n_out // GEMV_WARPS)), (32 * GEMV_WARPS,)


def gemv_tiled_geometry(n_out: int, n_rows: int) -> tuple[tuple[int, int], tuple[int]]:
    """(grid, block) of gemv_tiled_q4 / gemv_tiled_q8: as gemv_geometry, a warp taking GEMV_TILE_ROWS weight rows."""
    per_block = GEMV_WARPS * GEMV_TILE_ROWS
    assert 0 < n_rows <= GEMV_MAX_ROWS and 0 < n_out <= 65535 * per_block
    return (-(-n_rows // GEMV_ROWS), -(-n_out // per_block)), (32 * GEMV_WARPS,)


def elementwise_blocks(n: int, threads: int = ROW_THREADS) -> int:
    """Blocks of a grid-stride kernel over n elements."""
    assert n > 0
    return min(MAX_BLOCKS, -(-n // threads))


def row_threads(n: int) -> int:
    """Threads of a one-block-per-row kernel whose rows hold n items: a multiple of 32, at most 1024."""
    return min(1024, max(32, -(-n // 32) * 32))


def panel_rows(n_out: int, k: int, scratch_values: int) -> int:
    """Weight rows dequantized at a time into a scratch of `scratch_values` float16 values (a multiple of
    64 rows when more than 64 fit: whole tiles for cuBLAS)."""
    rows = scratch_values // k
    assert rows >= 1, f"a scratch of {scratch_values} values cannot hold one row of {k}"
    if rows > 64:
        rows -= rows % 64
    return min(n_out, rows)


def attention_plan(query_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Work of one paged-attention call from the host copy of query_start [B + 1].

    Returns (decode_seqs int32 [D]: the sequences with one new row, one decode block each;
    prefill_items int32 [I, 2]: (sequence, first row) of every PA_WARPS * PA_ROWS rows of the others).
    """
    q_lens = np.diff(np.asarray(query_start, dtype=np.int64))
    decode = np.flatnonzero(q_lens == 1).astype(np.int32)
    rows = PA_WARPS * PA_ROWS
    items = [(b, r) for b in np.flatnonzero(q_lens > 1).tolist() for r in range(0, int(q_lens[b]), rows)]
    return decode, np.asarray(items, dtype=np.int32).reshape(len(items), 2)

"""Matrix-vector kernels over q4 weights in sixteen-row blocks (numba_layout `block_rows16`: the backend's choice
for q4 weights on AVX-512 VNNI without AMX): int8 activations (`matvec_i8_x16`) or float32 ones as four int8 pieces
each (`matvec_q4_split_x16`). A group's sums land one row per lane (`simd_dot.q4_x16_i8`), so its scaling is three
vector operations per sixteen rows and activation row instead of per four, and a block's results are one vector
store; activation rows in tiles of X16_TILE, then one tile of the rows left (each row count a kernel of its own, as
in kernels/numba_linear_i8.py).
"""

from __future__ import annotations

import numpy as np
from numba import literal_unroll, njit, prange

from kernels.numba_activations import quantized, split
from kernels.numba_jit import JIT
from kernels.numba_tiling import PREFETCH_BYTES, chunk_blocks, tile_at
from kernels.simd_dot import q4_x16_i8_tile, q4_x16_split_tile
from kernels.simd_scales import x16_acc_min_tile, x16_acc_tile
from kernels.simd_vectors import prefetch_weights, vstore, vzero_tile_of

# Activation rows that share each unpacked group of a 16-row block (`matvec_i8_x16`): a tile's float
# accumulators, one zmm a row, beside the group's eight unpacked weight vectors.
X16_TILE = 8
X16_REST = tuple(range(1, X16_TILE))


@njit(**JIT)
def _times(a, f):
    """a * f, a new array (a loop: a whole-array expression in a parallel kernel becomes a parallel loop)."""
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        out[i] = a[i] * f
    return out


@njit(**JIT)
def _x16_tile(w, xa, out, ts, rows, xds, b0, b1, ng, N):
    """Rows ts of the activations times the 16-row blocks b0 .. b1 - 1 of a STRIPE16 q4 weight w = (q, scale,
    minv, sym): each group is loaded and unpacked once for the tile's rows, and a block's sixteen results for a
    row are one vector store. xa = (x, xd, xsm, split): int8 values (32 a group) or, `split`, four int8 pieces
    (128 a group) at offsets rows in x, their scales and the mins' sums from xds in xd and xsm."""
    q, scale, minv, sym = w
    x, xd, xsm, split = xa
    xg = 128 if split else 32
    last = np.empty(16, dtype=np.float32)  # a ragged last block's row, before its padding is dropped
    for blk in range(b0, b1):
        a = vzero_tile_of(rows, 16)
        for g in range(ng):
            s = (blk * ng + g) * 16
            b = s * 16  # 256 bytes a group
            prefetch_weights(q, b + PREFETCH_BYTES, rows, X16_TILE)
            prefetch_weights(q, b + PREFETCH_BYTES + 64, rows, X16_TILE)
            prefetch_weights(q, b + PREFETCH_BYTES + 128, rows, X16_TILE)
            prefetch_weights(q, b + PREFETCH_BYTES + 192, rows, X16_TILE)
            if split:
                ints = q4_x16_split_tile(q, b, x, g * xg, rows)
            else:
                ints = q4_x16_i8_tile(q, b, x, g * xg, rows)
            if sym:
                a = x16_acc_tile(ints, scale, scale, s, xd, xsm, xds, g, a)
            else:
                a = x16_acc_min_tile(ints, scale, minv, s, xd, xsm, xds, g, a)
        r = blk * 16
        for i in range(len(ts)):
            if r + 16 <= N:
                vstore(out, ts[i] * N + r, a[i])
            else:
                vstore(last, 0, a[i])
                for j in range(N - r):
                    out[ts[i] * N + r + j] = last[j]


@njit(**JIT)
def _x16_chunk(w, xa, T, KX, out, b0, b1, ng, N):
    """T activation rows (KX values apart in x) in tiles of X16_TILE rows, then one tile of the rest."""
    t = 0
    while T - t >= X16_TILE:
        ts, rows, xds = tile_at(t, KX, ng, X16_TILE)
        _x16_tile(w, xa, out, ts, rows, xds, b0, b1, ng, N)
        t += X16_TILE
    for n in literal_unroll(X16_REST):
        if T - t == n:
            ts, rows, xds = tile_at(t, KX, ng, n)
            _x16_tile(w, xa, out, ts, rows, xds, b0, b1, ng, N)


@njit(parallel=True, **JIT)
def matvec_i8_x16(q, scale, minv, mf, x, out, threads):
    """`matvec_i8` over a q4 weight in STRIPE16 order (numba_layout `block_rows16`): sixteen rows a block, a
    group's sums one row per lane (`simd_dot.q4_x16_i8`); minv empty for a symmetric type (Q4_0: the scales times
    mf = -8 stand in), else the stored mins (mf = 1)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq, xd, xsum = quantized(x)
    w = (q, scale, minv, minv.shape[0] == 0)
    xa = (xq.reshape(T * K), xd.reshape(T * ng), _times(xsum.reshape(T * ng), mf), False)
    nb = (N + 15) // 16
    cb = chunk_blocks(ng * 4, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _x16_chunk(w, xa, T, K, out.reshape(T * N), c * cb, min(nb, (c + 1) * cb), ng, N)


@njit(parallel=True, **JIT)
def matvec_q4_split_x16(q, scale, minv, mf, x, out, threads):
    """`matvec_q4_split` over a q4 weight in STRIPE16 order: float32 activations as four int8 pieces each
    (`split_rows`), every product's sums exact integers, any number of rows."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xp, xs, xsum = split(x)
    w = (q, scale, minv, minv.shape[0] == 0)
    xa = (xp, xs.reshape(T * ng), _times(xsum.reshape(T * ng), mf), True)
    nb = (N + 15) // 16
    cb = chunk_blocks(ng * 4, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _x16_chunk(w, xa, T, 4 * K, out.reshape(T * N), c * cb, min(nb, (c + 1) * cb), ng, N)

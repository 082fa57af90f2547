"""Matrix-vector kernels over blocked q4/q8 weights (kernels/numba_layout.py) for decode steps, float32 activations.

    y[t, r] = sum_g scale[r, g] * (sum_j q[r, g, j] * x[t, g, j]) + min[r, g] * xsum[t, g]

Each block of four rows is read group by group, and every row keeps an 8-lane float32
accumulator (kernels/simd.py's vector type) across all groups: a group's 32 products stay in the vector,
which is scaled by the group's scale as a whole (no reduction per group), and the row is
reduced once at its end. The group sums of x (xsum) are computed once per call and shared by
all rows; spread four times (`spread4`) they line up with a block's mins, so a block's min
terms are one 8-lane FMA per two groups.

Several activation rows (batched decode, speculative verification) go through a block in tiles: a
weight group is unpacked and converted to float32 once per tile instead of once per row. Tiles of 8
(and remainders of 3 and 5-7 rows) dequantize the group first, min included, and give each row 4
FMAs (kernels/simd_dot.py's `*_acc*_tile` blocks); remainders of 2 and 4 rows sum a row's group products
and scale them afterwards (the `_dot*_tile` blocks), and a lone row goes alone.

Activation paths:
- float32 (the default): weights are converted to float32 in registers; results match a
  float64 reference to float32 rounding.
- float32 as int8 pieces (q4 on AVX-512 VNNI), and int8 ("q8" activations): kernels/numba_linear_i8.py.
- q4 weights in sixteen-row blocks (int8 activations, or float32 as pieces): kernels/numba_linear16.py.

A symmetric q4 type (Q4_0) keeps no mins: its scales stand in, times -8 (`Blocked.min_operand`,
d * sum((q - 8) x) = d * sum(q x) - 8 d * sum(x)), in the same min term (kernels/numba_block_out.py: the min terms
and the stores, which every path shares).

Each kernel asks for the weights `PREFETCH_BYTES` ahead of the group it reads (software prefetch):
the hardware prefetchers alone did not keep a one-row product over weights from DRAM busy.

Work items are chunks of row blocks handed out dynamically, so a thread that loses its core to
another process does not hold the step back; each kernel's last argument, `threads`, is the launch's
kernel threads, which bound how many items a product is cut into (`numba_tiling.chunk_blocks`). The row kernels
loop over a chunk's blocks themselves and take flat arrays with offsets: a call or an array view per
block cost as much as the block's work.
"""

from __future__ import annotations

import numpy as np
from numba import literal_unroll, njit, prange

from kernels.numba_activations import group_sums, spread4
from kernels.numba_block_out import add_mins, block_mins, store4, store_tile
from kernels.numba_jit import JIT
from kernels.numba_tiling import PREFETCH_BYTES, chunk_blocks, tile_at
from kernels.simd_dot import (
    q4_acc32_tile,
    q4_dot32,
    q4_dot32_tile,
    q8_acc16_tile,
    q8_acc32_tile,
    q8_dot16,
    q8_dot16_tile,
    q8_dot32,
    q8_dot32_tile,
)
from kernels.simd_scales import (
    f32_at,
    f32x4_at,
    splat_at,
)
from kernels.simd_vectors import (
    hsum,
    prefetch_once,
    prefetch_weights,
    tile_offsets,
    vfma_s,
    vzero,
    vzero_tile,
)

f32 = np.float32
L1_TILE_BYTES = 24 * 1024  # a wide tile's activations per span of groups

# ---- tiles: a weight group is unpacked once for several activation rows -----------------------
# Scale-after tiles (2 or 4 rows): a row-group costs 4 conversions and 4 + 1 FMAs alone, 1 + 4 + 1 per
# row in a tile of 4; one weight row at a time keeps 4 accumulators + 4 group sums in registers (AVX2
# has 16). Dequantize-first tiles (3, 5-8 rows, `_f32_wide_tile`): 4 + 4 / T FMAs per row-group, no
# mins pass; with few rows their x loads (one per FMA, across a block's four weight rows) cost more
# than the dequantization saves.


@njit(**JIT)
def _f32_tile(q, scale, minv, G, packed, xf, xs4, out, ts, rows, xds, b0, b1, ng, N):
    """Rows ts of x (at offsets rows in xf) times blocks b0 .. b1 - 1, float32 activations."""
    for blk in range(b0, b1):
        for j in range(4):
            a = vzero_tile(rows)
            for g in range(ng):
                s = (blk * ng + g) * 4 + j
                if j == 0:
                    prefetch_weights(q, s * G // (2 if packed else 1) + PREFETCH_BYTES, rows, F32_TILE)
                if packed:
                    d = q4_dot32_tile(q, s * 16, xf, g * 32, rows)
                elif G == 32:
                    d = q8_dot32_tile(q, s * 32, xf, g * 32, rows)
                else:
                    d = q8_dot16_tile(q, s * 16, xf, g * 16, rows)
                a = vfma_s(d, splat_at(scale, s), a)
            store_tile(out, ts, blk * 4 + j, N, a)
    add_mins(out, minv, xs4, ts, xds, b0, b1, ng, N)


@njit(**JIT)
def _f32_wide_tile(q, scale, minv, mf, G, packed, xf, out, t0, rows, b0, b1, ng, N):
    """`_f32_tile` for wide tiles: each weight group dequantized once (its min folded in), then one FMA per
    8 weights and row. The groups go in spans whose activations stay in L1 while a block's four weight
    rows pass over them (a tile's rows of a 1536-wide x are 48 KB)."""
    has_min = minv.shape[0] > 0
    spans = -(-(len(rows) * ng * G * 4) // L1_TILE_BYTES)
    span = -(-ng // spans)  # even spans
    for blk in range(b0, b1):
        for g0 in range(0, ng, span):
            for j in range(4):
                a = vzero_tile(rows)
                for g in range(g0, min(ng, g0 + span)):
                    s = (blk * ng + g) * 4 + j
                    if j == 0:
                        prefetch_weights(q, s * G // (2 if packed else 1) + PREFETCH_BYTES, rows, F32_TILE)
                    m = f32_at(minv, s) * mf if has_min else f32(0.0)
                    if packed:
                        a = q4_acc32_tile(q, s * 16, f32_at(scale, s), m, xf, g * 32, rows, a)
                    elif G == 32:
                        a = q8_acc32_tile(q, s * 32, f32_at(scale, s), m, xf, g * 32, rows, a)
                    else:
                        a = q8_acc16_tile(q, s * 16, f32_at(scale, s), m, xf, g * 16, rows, a)
                r = blk * 4 + j
                if r < N:
                    for i in range(len(rows)):
                        out[t0 + i, r] = hsum(a[i]) + (out[t0 + i, r] if g0 > 0 else f32(0.0))


# ---- single rows (T = 1, and a tile's odd row left over) --------------------------------------
# Each takes activation row t of flat arrays (x.ravel() ...) and blocks b0 .. b1 - 1: a row view
# (x[t]) or a call per block cost reference counting and argument passing beside ~20 groups' work.


@njit(**JIT)
def _q4_rows(q, scale, minv, x, xs4, out, t, b0, b1, ng, N):
    for blk in range(b0, b1):
        a0 = a1 = a2 = a3 = vzero()
        for g in range(ng):
            xi = (t * ng + g) * 32
            s = (blk * ng + g) * 4
            b = s * 16
            prefetch_once(q, b + PREFETCH_BYTES)
            d0, d1, d2, d3 = f32x4_at(scale, s)
            a0 = vfma_s(q4_dot32(q, b, x, xi), d0, a0)
            a1 = vfma_s(q4_dot32(q, b + 16, x, xi), d1, a1)
            a2 = vfma_s(q4_dot32(q, b + 32, x, xi), d2, a2)
            a3 = vfma_s(q4_dot32(q, b + 48, x, xi), d3, a3)
        m0, m1, m2, m3 = block_mins(minv, xs4, t * ng * 4, blk * ng * 4, ng)
        store4(out, t, blk * 4, N, hsum(a0) + m0, hsum(a1) + m1, hsum(a2) + m2, hsum(a3) + m3)


@njit(**JIT)
def _q8_rows(q, scale, minv, G, x, xs4, out, t, b0, b1, ng, N):
    for blk in range(b0, b1):
        a0 = a1 = a2 = a3 = vzero()
        for g in range(ng):
            xi = (t * ng + g) * G
            s = (blk * ng + g) * 4
            b = s * G
            prefetch_once(q, b + PREFETCH_BYTES)
            d0, d1, d2, d3 = f32x4_at(scale, s)
            if G == 32:
                prefetch_once(q, b + PREFETCH_BYTES + 64)
                a0 = vfma_s(q8_dot32(q, b, x, xi), d0, a0)
                a1 = vfma_s(q8_dot32(q, b + 32, x, xi), d1, a1)
                a2 = vfma_s(q8_dot32(q, b + 64, x, xi), d2, a2)
                a3 = vfma_s(q8_dot32(q, b + 96, x, xi), d3, a3)
            else:
                a0 = vfma_s(q8_dot16(q, b, x, xi), d0, a0)
                a1 = vfma_s(q8_dot16(q, b + 16, x, xi), d1, a1)
                a2 = vfma_s(q8_dot16(q, b + 32, x, xi), d2, a2)
                a3 = vfma_s(q8_dot16(q, b + 48, x, xi), d3, a3)
        m0, m1, m2, m3 = block_mins(minv, xs4, t * ng * 4, blk * ng * 4, ng)
        store4(out, t, blk * 4, N, hsum(a0) + m0, hsum(a1) + m1, hsum(a2) + m2, hsum(a3) + m3)


# ---- chunks of row blocks: full tiles, then one tile of the rows left -------------------------------
# The activations come flat (x.ravel(): no array made per chunk); T rows of K values. A tile's row offsets are a
# tuple (`simd_vectors.tile_offsets`), so its row count is a compile-time constant and each count compiles to a
# kernel of its own: `literal_unroll` compiles a loop body once per count in these tuples, each with its count as a
# constant, and the body whose count is the number of rows left runs.
F32_TILE = 8
F32_SCALE_AFTER = (2, 4)  # float32 rows left that sum a row's group products and scale them after (`_f32_tile`)
F32_WIDE = (3, 5, 6, 7)  # float32 rows left that dequantize first (`_f32_wide_tile`); a single row goes alone


@njit(**JIT)
def _f32_chunk(q, scale, minv, mf, G, packed, xf, T, K, xs4, out, b0, b1, ng, N):
    """T float32 activation rows in tiles of F32_TILE, then the rows left in one tile (or alone: one row)."""
    t = 0
    while T - t >= F32_TILE:
        _f32_wide_tile(q, scale, minv, mf, G, packed, xf, out, t, tile_offsets(t, K, F32_TILE), b0, b1, ng, N)
        t += F32_TILE
    r = T - t
    if r == 1:
        if packed:
            _q4_rows(q, scale, minv, xf, xs4, out, t, b0, b1, ng, N)
        else:
            _q8_rows(q, scale, minv, G, xf, xs4, out, t, b0, b1, ng, N)
    for n in literal_unroll(F32_SCALE_AFTER):
        if r == n:
            ts, rows, xds = tile_at(t, K, ng, n)
            _f32_tile(q, scale, minv, G, packed, xf, xs4, out, ts, rows, xds, b0, b1, ng, N)
    for n in literal_unroll(F32_WIDE):
        if r == n:
            _f32_wide_tile(q, scale, minv, mf, G, packed, xf, out, t, tile_offsets(t, K, n), b0, b1, ng, N)


@njit(parallel=True, **JIT)
def matvec_q4(q, scale, minv, mf, x, out, threads):
    """out [T, N] = x [T, K] times a blocked q4 weight (groups of 32, mins minv * mf), float32 activations."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xsum = np.empty((T, ng), dtype=np.float32)
    group_sums(x, 32, xsum)
    xs4, xf = spread4(xsum, mf), x.reshape(T * K)
    nb = (N + 3) // 4
    cb = chunk_blocks(ng, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _f32_chunk(q, scale, minv, mf, 32, True, xf, T, K, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


@njit(parallel=True, **JIT)
def matvec_q8(q, scale, minv, G, x, out, threads):
    """out [T, N] = x [T, K] times a blocked q8 weight (groups of G = 16 or 32), float32 activations."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // G
    xsum = np.empty((T, ng), dtype=np.float32)  # read only with mins (np.zeros here: a parallel loop of its own)
    if minv.shape[0] > 0:
        group_sums(x, G, xsum)
    xs4, xf = spread4(xsum, f32(1.0)), x.reshape(T * K)
    nb = (N + 3) // 4
    cb = chunk_blocks(ng, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _f32_chunk(q, scale, minv, f32(1.0), G, False, xf, T, K, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


@njit(**JIT)
def half_dequant(bits, is_bf16, lut, rows, out):
    """out [len(rows), cols] = the `rows` of an F16 (through the 64K-entry lut) or BF16 matrix."""
    n, cols = out.shape
    wide = out.view(np.uint32)
    for i in range(n):
        r = rows[i]
        if is_bf16:
            for j in range(cols):
                wide[i, j] = np.uint32(bits[r, j]) << np.uint32(16)
        else:
            for j in range(cols):
                out[i, j] = lut[bits[r, j]]

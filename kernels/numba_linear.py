"""Matrix-vector kernels over blocked q4/q8 weights (kernels/numba_layout.py) for decode steps.

    y[t, r] = sum_g scale[r, g] * (sum_j q[r, g, j] * x[t, g, j]) + min[r, g] * xsum[t, g]

Each block of four rows is read group by group, and every row keeps an 8-lane float32
accumulator (kernels/simd.py) across all groups: a group's 32 products stay in the vector,
which is scaled by the group's scale as a whole (no reduction per group), and the row is
reduced once at its end. The group sums of x (xsum) are computed once per call and shared by
all rows; spread four times (`spread4`) they line up with a block's mins, so a block's min
terms are one 8-lane FMA per two groups.

Several activation rows (batched decode, speculative verification) go through a block in tiles: a
weight group is unpacked and converted to float32 once per tile instead of once per row. Tiles of 8
(and remainders of 3 and 5-7 rows) dequantize the group first, min included, and give each row 4
FMAs (kernels/simd.py's `*_acc*_tile` blocks); remainders of 2 and 4 rows sum a row's group products
and scale them afterwards (the `_dot*_tile` blocks), and a lone row goes alone.

Two activation paths:
- float32 (the default): weights are converted to float32 in registers; results match a
  float64 reference to float32 rounding.
- int8 ("q8" activations, as llama.cpp does): each activation row is quantized once per call
  to int8 per 32-value block with a float32 scale (round(x * 127 / max|x|)), and each group's
  dot product is an exact integer sum (AVX2 vpmaddubsw/vpmaddwd), scaled by weight scale times
  activation scale. q4 weights go two rows to a vector (`simd.q4_pair_i8`, the activations in
  `pair_layout`): half the instructions of one row at a time. The min term still uses the exact
  float32 sums of x. Weights with groups of 16 (Q6_K, Q3_K, Q2_K) stay on the float32 path.

Each kernel asks for the weights `PREFETCH_BYTES` ahead of the group it reads (software prefetch):
the hardware prefetchers alone did not keep a one-row product over weights from DRAM busy.

Work items are chunks of row blocks handed out dynamically, so a thread that loses its core to
another process does not hold the step back. The row kernels loop over a chunk's blocks
themselves and take flat arrays with offsets: a call or an array view per block cost as much
as the block's work.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT, JIT_EXACT
from kernels.simd import (LANES, f32_at, f32x4_at, fold4, hsum, hsum_halves, pair_scales, prefetch,
                          q4_acc32_tile, q4_dot32, q4_dot32_tile, q4_pair_i8, q8_acc16_tile, q8_acc32_tile, q8_dot16,
                          q8_dot16_tile, q8_dot32, q8_dot32_i8, q8_dot32_tile, splat_at, tile_offsets, vfma, vfma_s,
                          vload, vzero, vzero8, vzero_tile)

f32 = np.float32
# Groups of one 4-row block per parallel work item (~40 blocks of a 576-wide matrix), whatever the
# number of activation rows. An item costs ~0.4 us to hand out and a few calls per row or tile:
# at 8 blocks an item (the former size) that was up to half a one-row int8 product's time, and
# items sized down for many rows made 32-row products ~1.4x slower per row. Fewer, larger items
# balance less finely between threads.
CHUNK_GROUPS = 768
L1_TILE_BYTES = 24 * 1024  # a wide tile's activations per span of groups
# Weight bytes ahead of the group being read that a kernel asks the caches for (a software prefetch
# per 64 bytes of weights). The hardware prefetchers alone left a one-row product over weights from
# DRAM (a decode step's 112 MB) at ~40% of its speed from cache: 7 against 17 GMAC/cpu-s on a Xeon;
# 2 KB ahead, 13-15 (`scripts/matvec_bench.py --copies 400`).
PREFETCH_BYTES = 2048


@njit(**JIT)
def _chunk_blocks(ng):
    """Row blocks per parallel work item."""
    return max(1, CHUNK_GROUPS // ng)


@njit(**JIT)
def group_sums(x, G, xsum):
    """x [T, K] -> xsum [T, K // G]: each group's sum."""
    T, K = x.shape
    for t in range(T):
        for g in range(K // G):
            s = f32(0.0)
            for j in range(G):
                s += x[t, g * G + j]
            xsum[t, g] = s


@njit(**JIT_EXACT)  # no FMA contraction: xq is exactly what a plain float32 model computes (tests rely on it)
def quantize_rows(x, xq, xd, xsum):
    """x [T, K] -> int8 xq [T, K] and scales xd [T, K // 32] with x ~ xd * xq per 32-block, and the
    float32 sums of x's blocks (xsum [T, K // 32])."""
    T, K = x.shape
    for t in range(T):
        for g in range(K // 32):
            amax = f32(0.0)
            s = f32(0.0)
            for j in range(32):
                v = x[t, g * 32 + j]
                amax = max(amax, abs(v))
                s += v
            inv = f32(127.0) / amax if amax > 0 else f32(0.0)
            for j in range(32):
                xq[t, g * 32 + j] = np.int8(math.floor(x[t, g * 32 + j] * inv + f32(0.5)))
            xd[t, g] = amax / f32(127.0)
            xsum[t, g] = s


@njit(**JIT)
def pair_layout(xq):
    """int8 xq [T, K] -> flat [T * 2K]: each 32-block as [x0..15, x0..15, x16..31, x16..31], the
    activation layout of `q4_pair_i8` (two weight rows' nibbles in one 32-byte vector)."""
    T, K = xq.shape
    x2 = np.empty(T * 2 * K, dtype=np.int8)
    for t in range(T):
        for g in range(K // 32):
            for h in range(2):
                for j in range(16):
                    v = xq[t, g * 32 + h * 16 + j]
                    x2[(t * K + g * 32 + h * 16) * 2 + j] = v
                    x2[(t * K + g * 32 + h * 16) * 2 + 16 + j] = v
    return x2


@njit(**JIT)
def spread4(xsum):
    """xsum [T, ng] -> flat [T * 4 ng]: each group sum four times, beside a block's four mins of that group."""
    T, ng = xsum.shape
    xs4 = np.empty(T * 4 * ng, dtype=np.float32)
    for t in range(T):
        for i in range(4 * ng):
            xs4[t * 4 * ng + i] = xsum[t, i // 4]
    return xs4


@njit(**JIT)
def _block_mins(minv, xs4, xo, base, ng):
    """sum_g min[row, g] * xsum[g] for the four rows of the block whose mins start at minv[base]
    (xs4[xo:]: `spread4` of one activation row), LANES / 4 groups per FMA."""
    if minv.shape[0] == 0:
        return f32(0.0), f32(0.0), f32(0.0), f32(0.0)
    n = ng * 4
    acc = vzero()
    i = 0
    while i + LANES <= n:
        acc = vfma(vload(minv, base + i), vload(xs4, xo + i), acc)
        i += LANES
    m0, m1, m2, m3 = fold4(acc)
    while i < n:  # groups left over, fewer than a vector's
        xs = xs4[xo + i]
        m0 += f32_at(minv, base + i) * xs
        m1 += f32_at(minv, base + i + 1) * xs
        m2 += f32_at(minv, base + i + 2) * xs
        m3 += f32_at(minv, base + i + 3) * xs
        i += 4
    return m0, m1, m2, m3


@njit(**JIT)
def _store4(out, t, r, N, y0, y1, y2, y3):
    """out[t, r .. r + 3] = y0 .. y3, up to column N (a ragged last block's padding rows are dropped)."""
    if r < N:
        out[t, r] = y0
    if r + 1 < N:
        out[t, r + 1] = y1
    if r + 2 < N:
        out[t, r + 2] = y2
    if r + 3 < N:
        out[t, r + 3] = y3


# ---- tiles: a weight group is unpacked once for several activation rows -----------------------
# Scale-after tiles (2 or 4 rows): a row-group costs 4 conversions and 4 + 1 FMAs alone, 1 + 4 + 1 per
# row in a tile of 4; one weight row at a time keeps 4 accumulators + 4 group sums in registers (AVX2
# has 16). Dequantize-first tiles (3, 5-8 rows, `_f32_wide_tile`): 4 + 4 / T FMAs per row-group, no
# mins pass; with few rows their x loads (one per FMA, across a block's four weight rows) cost more
# than the dequantization saves.

@njit(**JIT)
def _tile4(t, K):
    """Rows t .. t + 3 and their offsets in x.ravel()."""
    return (t, t + 1, t + 2, t + 3), (t * K, (t + 1) * K, (t + 2) * K, (t + 3) * K)


@njit(**JIT)
def _tile8(t, K):
    """Rows t .. t + 7 and their offsets in x.ravel()."""
    return ((t, t + 1, t + 2, t + 3, t + 4, t + 5, t + 6, t + 7),
            (t * K, (t + 1) * K, (t + 2) * K, (t + 3) * K, (t + 4) * K, (t + 5) * K, (t + 6) * K, (t + 7) * K))


@njit(**JIT)
def _tile2(t, K):
    return (t, t + 1), (t * K, (t + 1) * K)


@njit(**JIT)
def _store_tile(out, ts, r, N, a):
    """out[ts[i], r] = the sum of a[i]'s lanes (r past N: a ragged block's padding)."""
    if r < N:
        for i in range(len(ts)):
            out[ts[i], r] = hsum(a[i])


@njit(**JIT)
def _add_mins(out, minv, xs4, ts, blk, ng, N):
    """out[t, block rows] += sum_g min[row, g] * xsum[t, g] for the rows t of a tile."""
    if minv.shape[0] == 0:
        return
    for t in ts:
        m0, m1, m2, m3 = _block_mins(minv, xs4, t * ng * 4, blk * ng * 4, ng)
        r = blk * 4
        for k, m in ((0, m0), (1, m1), (2, m2), (3, m3)):
            if r + k < N:
                out[t, r + k] += m


@njit(**JIT)
def _f32_tile(q, scale, minv, G, packed, xf, xs4, out, ts, rows, b0, b1, ng, N):
    """Rows ts of x (at offsets rows in xf) times blocks b0 .. b1 - 1, float32 activations."""
    for blk in range(b0, b1):
        for j in range(4):
            a = vzero_tile(rows)
            for g in range(ng):
                s = (blk * ng + g) * 4 + j
                if j == 0:
                    prefetch(q, s * G // (2 if packed else 1) + PREFETCH_BYTES)
                if packed:
                    d = q4_dot32_tile(q, s * 16, xf, g * 32, rows)
                elif G == 32:
                    d = q8_dot32_tile(q, s * 32, xf, g * 32, rows)
                else:
                    d = q8_dot16_tile(q, s * 16, xf, g * 16, rows)
                a = vfma_s(d, splat_at(scale, s), a)
            _store_tile(out, ts, blk * 4 + j, N, a)
        _add_mins(out, minv, xs4, ts, blk, ng, N)


@njit(**JIT)
def _f32_wide_tile(q, scale, minv, G, packed, xf, out, t0, rows, b0, b1, ng, N):
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
                        prefetch(q, s * G // (2 if packed else 1) + PREFETCH_BYTES)
                    m = f32_at(minv, s) if has_min else f32(0.0)
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
            prefetch(q, b + PREFETCH_BYTES)
            d0, d1, d2, d3 = f32x4_at(scale, s)
            a0 = vfma_s(q4_dot32(q, b, x, xi), d0, a0)
            a1 = vfma_s(q4_dot32(q, b + 16, x, xi), d1, a1)
            a2 = vfma_s(q4_dot32(q, b + 32, x, xi), d2, a2)
            a3 = vfma_s(q4_dot32(q, b + 48, x, xi), d3, a3)
        m0, m1, m2, m3 = _block_mins(minv, xs4, t * ng * 4, blk * ng * 4, ng)
        _store4(out, t, blk * 4, N, hsum(a0) + m0, hsum(a1) + m1, hsum(a2) + m2, hsum(a3) + m3)


@njit(**JIT)
def _q8_rows(q, scale, minv, G, x, xs4, out, t, b0, b1, ng, N):
    for blk in range(b0, b1):
        a0 = a1 = a2 = a3 = vzero()
        for g in range(ng):
            xi = (t * ng + g) * G
            s = (blk * ng + g) * 4
            b = s * G
            prefetch(q, b + PREFETCH_BYTES)
            d0, d1, d2, d3 = f32x4_at(scale, s)
            if G == 32:
                prefetch(q, b + PREFETCH_BYTES + 64)
                a0 = vfma_s(q8_dot32(q, b, x, xi), d0, a0)
                a1 = vfma_s(q8_dot32(q, b + 32, x, xi), d1, a1)
                a2 = vfma_s(q8_dot32(q, b + 64, x, xi), d2, a2)
                a3 = vfma_s(q8_dot32(q, b + 96, x, xi), d3, a3)
            else:
                a0 = vfma_s(q8_dot16(q, b, x, xi), d0, a0)
                a1 = vfma_s(q8_dot16(q, b + 16, x, xi), d1, a1)
                a2 = vfma_s(q8_dot16(q, b + 32, x, xi), d2, a2)
                a3 = vfma_s(q8_dot16(q, b + 48, x, xi), d3, a3)
        m0, m1, m2, m3 = _block_mins(minv, xs4, t * ng * 4, blk * ng * 4, ng)
        _store4(out, t, blk * 4, N, hsum(a0) + m0, hsum(a1) + m1, hsum(a2) + m2, hsum(a3) + m3)


@njit(**JIT)
def _q4_rows_i8(q, scale, minv, x2, xd, xs4, out, t, b0, b1, ng, N):
    """int8 activations in pair layout (`pair_layout`): rows 0|1 and 2|3 of a block share one
    accumulator each, a half per row."""
    for blk in range(b0, b1):
        a01 = a23 = vzero8()
        base = blk * ng * 4
        for g in range(ng):
            s = base + g * 4
            prefetch(q, s * 16 + PREFETCH_BYTES)
            s01, s23 = pair_scales(scale, s, xd[t * ng + g])
            xi = (t * ng + g) * 64
            a01 = vfma(q4_pair_i8(q, s * 16, x2, xi), s01, a01)
            a23 = vfma(q4_pair_i8(q, s * 16 + 32, x2, xi), s23, a23)
        m0, m1, m2, m3 = _block_mins(minv, xs4, t * ng * 4, base, ng)
        y0, y1 = hsum_halves(a01)
        y2, y3 = hsum_halves(a23)
        _store4(out, t, blk * 4, N, y0 + m0, y1 + m1, y2 + m2, y3 + m3)


@njit(**JIT)
def _q8_rows_i8(q, scale, minv, xq, xd, xs4, out, t, b0, b1, ng, N):
    for blk in range(b0, b1):
        a0 = a1 = a2 = a3 = vzero8()
        for g in range(ng):
            xi = (t * ng + g) * 32
            s = (blk * ng + g) * 4
            b = s * 32
            prefetch(q, b + PREFETCH_BYTES)
            prefetch(q, b + PREFETCH_BYTES + 64)
            d = xd[t * ng + g]
            d0, d1, d2, d3 = f32x4_at(scale, s)
            a0 = vfma_s(q8_dot32_i8(q, b, xq, xi), d0 * d, a0)
            a1 = vfma_s(q8_dot32_i8(q, b + 32, xq, xi), d1 * d, a1)
            a2 = vfma_s(q8_dot32_i8(q, b + 64, xq, xi), d2 * d, a2)
            a3 = vfma_s(q8_dot32_i8(q, b + 96, xq, xi), d3 * d, a3)
        m0, m1, m2, m3 = _block_mins(minv, xs4, t * ng * 4, blk * ng * 4, ng)
        _store4(out, t, blk * 4, N, hsum(a0) + m0, hsum(a1) + m1, hsum(a2) + m2, hsum(a3) + m3)


# ---- chunks of row blocks (float32: rows in tiles of 4, then 2, then 1) -----------------------------
# The activations come flat (x.ravel(): no array made per chunk); T rows of K values.

@njit(**JIT)
def _f32_chunk(q, scale, minv, G, packed, xf, T, K, xs4, out, b0, b1, ng, N):
    t = 0
    while T - t >= 8:
        _f32_wide_tile(q, scale, minv, G, packed, xf, out, t, tile_offsets(t, K, 8), b0, b1, ng, N)
        t += 8
    r = T - t
    if r == 1:
        if packed:
            _q4_rows(q, scale, minv, xf, xs4, out, t, b0, b1, ng, N)
        else:
            _q8_rows(q, scale, minv, G, xf, xs4, out, t, b0, b1, ng, N)
    elif r == 2:
        ts, rows = _tile2(t, K)
        _f32_tile(q, scale, minv, G, packed, xf, xs4, out, ts, rows, b0, b1, ng, N)
    elif r == 3:
        _f32_wide_tile(q, scale, minv, G, packed, xf, out, t, tile_offsets(t, K, 3), b0, b1, ng, N)
    elif r == 4:
        ts, rows = _tile4(t, K)
        _f32_tile(q, scale, minv, G, packed, xf, xs4, out, ts, rows, b0, b1, ng, N)
    elif r == 5:
        _f32_wide_tile(q, scale, minv, G, packed, xf, out, t, tile_offsets(t, K, 5), b0, b1, ng, N)
    elif r == 6:
        _f32_wide_tile(q, scale, minv, G, packed, xf, out, t, tile_offsets(t, K, 6), b0, b1, ng, N)
    elif r == 7:
        _f32_wide_tile(q, scale, minv, G, packed, xf, out, t, tile_offsets(t, K, 7), b0, b1, ng, N)


@njit(**JIT)
def _i8_chunk(q, scale, minv, packed, xq, T, xd, xs4, out, b0, b1, ng, N):
    # No tiles here: the integer dot products cost little beside each row's own conversion and
    # scaling, and tiles of 4 measured no faster than one row after another.
    for t in range(T):
        if packed:
            _q4_rows_i8(q, scale, minv, xq, xd, xs4, out, t, b0, b1, ng, N)
        else:
            _q8_rows_i8(q, scale, minv, xq, xd, xs4, out, t, b0, b1, ng, N)


@njit(parallel=True, **JIT)
def matvec_q4(q, scale, minv, x, out):
    """out [T, N] = x [T, K] times a blocked q4 weight (groups of 32), float32 activations."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xsum = np.empty((T, ng), dtype=np.float32)
    group_sums(x, 32, xsum)
    xs4, xf = spread4(xsum), x.reshape(T * K)
    nb = (N + 3) // 4
    cb = _chunk_blocks(ng)
    for c in prange((nb + cb - 1) // cb):
        _f32_chunk(q, scale, minv, 32, True, xf, T, K, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


@njit(parallel=True, **JIT)
def matvec_q8(q, scale, minv, G, x, out):
    """out [T, N] = x [T, K] times a blocked q8 weight (groups of G = 16 or 32), float32 activations."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // G
    xsum = np.empty((T, ng), dtype=np.float32)  # read only with mins (np.zeros here: a parallel loop of its own)
    if minv.shape[0] > 0:
        group_sums(x, G, xsum)
    xs4, xf = spread4(xsum), x.reshape(T * K)
    nb = (N + 3) // 4
    cb = _chunk_blocks(ng)
    for c in prange((nb + cb - 1) // cb):
        _f32_chunk(q, scale, minv, G, False, xf, T, K, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


@njit(parallel=True, **JIT)
def matvec_i8(q, scale, minv, is_q4, x, out):
    """`matvec_q4` (`is_q4`) or `matvec_q8` with groups of 32, the activations quantized to int8 per
    32-block (integer dot products; q4 reads them in `pair_layout`)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq = np.empty((T, K), dtype=np.int8)
    xd = np.empty((T, ng), dtype=np.float32)
    xsum = np.empty((T, ng), dtype=np.float32)
    quantize_rows(x, xq, xd, xsum)
    xs4, xdf = spread4(xsum), xd.reshape(T * ng)
    xqf = pair_layout(xq) if is_q4 else xq.reshape(T * K)
    nb = (N + 3) // 4
    cb = _chunk_blocks(ng)
    for c in prange((nb + cb - 1) // cb):
        _i8_chunk(q, scale, minv, is_q4, xqf, T, xdf, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


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

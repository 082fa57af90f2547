"""Matrix-vector kernels over blocked q4/q8 weights (kernels/numba_layout.py) for decode steps.

    y[t, r] = sum_g scale[r, g] * (sum_j q[r, g, j] * x[t, g, j]) + min[r, g] * xsum[t, g]

Each block of four rows is read group by group, and every row keeps an 8-lane float32
accumulator (kernels/simd.py) across all groups: a group's 32 products stay in the vector,
which is scaled by the group's scale as a whole (no reduction per group), and the row is
reduced once at its end. The group sums of x (xsum) are computed once per call and shared by
all rows, so a min costs one FMA per group and row.

Several activation rows (batched decode) go through a block in tiles of 4 (then 2, then 1): a
weight group is unpacked and converted to float32 once per tile instead of once per row
(kernels/simd.py's `_tile` blocks), with one accumulator per tile row.

Two activation paths:
- float32 (the default): weights are converted to float32 in registers; results match a
  float64 reference to float32 rounding.
- int8 ("q8" activations, as llama.cpp does): each activation row is quantized once per call
  to int8 per 32-value block with a float32 scale (round(x * 127 / max|x|)), and each group's
  dot product is an exact integer sum (AVX2 vpmaddubsw/vpmaddwd), scaled by weight scale times
  activation scale. The min term still uses the exact float32 sums of x. Weights with groups
  of 16 (Q6_K, Q3_K, Q2_K) stay on the float32 path.

Work items are chunks of row blocks handed out dynamically, so a thread that loses its core to
another process does not hold the step back.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT, JIT_EXACT
from kernels.simd import (hsum, q4_dot32, q4_dot32_i8, q4_dot32_tile, q8_dot16, q8_dot16_tile, q8_dot32,
                          q8_dot32_i8, q8_dot32_tile, vfma_s, vzero, vzero_tile)

f32 = np.float32
CHUNK_BLOCKS = 8  # row blocks (of 4 rows) per parallel work item


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
def _store4(out, r, N, a0, a1, a2, a3, m0, m1, m2, m3):
    if r < N:
        out[r] = hsum(a0) + m0
    if r + 1 < N:
        out[r + 1] = hsum(a1) + m1
    if r + 2 < N:
        out[r + 2] = hsum(a2) + m2
    if r + 3 < N:
        out[r + 3] = hsum(a3) + m3


# ---- tiles: a weight group is unpacked once for 4 (or 2) activation rows ----------------------
# The float32 path is bound by the FMA units, not the unpack: a row-group costs 4 conversions and
# 4 + 1 FMAs alone, 1 + 4 + 1 per row in a tile of 4 (measured: ~0.6x a single row's time per row).
# One weight row at a time keeps 4 accumulators + 4 group sums in registers (AVX2 has 16).

@njit(**JIT)
def _tile4(t, K):
    """Rows t .. t + 3 and their offsets in x.ravel()."""
    return (t, t + 1, t + 2, t + 3), (t * K, (t + 1) * K, (t + 2) * K, (t + 3) * K)


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
def _add_mins(out, minv, xsum, ts, blk, ng, N):
    """out[t, block rows] += sum_g min[row, g] * xsum[t, g] for the rows t of a tile."""
    if minv.shape[0] == 0:
        return
    for t in ts:
        m0 = m1 = m2 = m3 = f32(0.0)
        for g in range(ng):
            s = (blk * ng + g) * 4
            xs = xsum[t, g]
            m0 += minv[s] * xs
            m1 += minv[s + 1] * xs
            m2 += minv[s + 2] * xs
            m3 += minv[s + 3] * xs
        r = blk * 4
        for k, m in ((0, m0), (1, m1), (2, m2), (3, m3)):
            if r + k < N:
                out[t, r + k] += m


@njit(**JIT)
def _f32_tile(q, scale, minv, G, packed, xf, xsum, out, ts, rows, blk, ng, N):
    """Rows ts of x (at offsets rows in xf) times block blk's four weight rows, float32 activations."""
    for j in range(4):
        a = vzero_tile(rows)
        for g in range(ng):
            s = (blk * ng + g) * 4 + j
            if packed:
                d = q4_dot32_tile(q, s * 16, xf, g * 32, rows)
            elif G == 32:
                d = q8_dot32_tile(q, s * 32, xf, g * 32, rows)
            else:
                d = q8_dot16_tile(q, s * 16, xf, g * 16, rows)
            a = vfma_s(d, scale[s], a)
        _store_tile(out, ts, blk * 4 + j, N, a)
    _add_mins(out, minv, xsum, ts, blk, ng, N)


# ---- single rows (T = 1, and a tile's odd row left over) --------------------------------------

@njit(**JIT)
def _q4_row(q, scale, minv, x, xsum, out, blk, ng, N):
    a0 = a1 = a2 = a3 = vzero()
    m0 = m1 = m2 = m3 = f32(0.0)
    for g in range(ng):
        xi = g * 32
        s = (blk * ng + g) * 4
        b = s * 16
        a0 = vfma_s(q4_dot32(q, b, x, xi), scale[s], a0)
        a1 = vfma_s(q4_dot32(q, b + 16, x, xi), scale[s + 1], a1)
        a2 = vfma_s(q4_dot32(q, b + 32, x, xi), scale[s + 2], a2)
        a3 = vfma_s(q4_dot32(q, b + 48, x, xi), scale[s + 3], a3)
        xs = xsum[g]
        m0 += minv[s] * xs
        m1 += minv[s + 1] * xs
        m2 += minv[s + 2] * xs
        m3 += minv[s + 3] * xs
    _store4(out, blk * 4, N, a0, a1, a2, a3, m0, m1, m2, m3)


@njit(**JIT)
def _q8_row(q, scale, minv, G, x, xsum, out, blk, ng, N):
    a0 = a1 = a2 = a3 = vzero()
    m0 = m1 = m2 = m3 = f32(0.0)
    has_min = minv.shape[0] > 0
    for g in range(ng):
        xi = g * G
        s = (blk * ng + g) * 4
        b = s * G
        if G == 32:
            a0 = vfma_s(q8_dot32(q, b, x, xi), scale[s], a0)
            a1 = vfma_s(q8_dot32(q, b + 32, x, xi), scale[s + 1], a1)
            a2 = vfma_s(q8_dot32(q, b + 64, x, xi), scale[s + 2], a2)
            a3 = vfma_s(q8_dot32(q, b + 96, x, xi), scale[s + 3], a3)
        else:
            a0 = vfma_s(q8_dot16(q, b, x, xi), scale[s], a0)
            a1 = vfma_s(q8_dot16(q, b + 16, x, xi), scale[s + 1], a1)
            a2 = vfma_s(q8_dot16(q, b + 32, x, xi), scale[s + 2], a2)
            a3 = vfma_s(q8_dot16(q, b + 48, x, xi), scale[s + 3], a3)
        if has_min:
            xs = xsum[g]
            m0 += minv[s] * xs
            m1 += minv[s + 1] * xs
            m2 += minv[s + 2] * xs
            m3 += minv[s + 3] * xs
    _store4(out, blk * 4, N, a0, a1, a2, a3, m0, m1, m2, m3)


@njit(**JIT)
def _q4_row_i8(q, scale, minv, xq, xd, xsum, out, blk, ng, N):
    a0 = a1 = a2 = a3 = vzero()
    m0 = m1 = m2 = m3 = f32(0.0)
    for g in range(ng):
        xi = g * 32
        s = (blk * ng + g) * 4
        b = s * 16
        d = xd[g]
        a0 = vfma_s(q4_dot32_i8(q, b, xq, xi), scale[s] * d, a0)
        a1 = vfma_s(q4_dot32_i8(q, b + 16, xq, xi), scale[s + 1] * d, a1)
        a2 = vfma_s(q4_dot32_i8(q, b + 32, xq, xi), scale[s + 2] * d, a2)
        a3 = vfma_s(q4_dot32_i8(q, b + 48, xq, xi), scale[s + 3] * d, a3)
        xs = xsum[g]
        m0 += minv[s] * xs
        m1 += minv[s + 1] * xs
        m2 += minv[s + 2] * xs
        m3 += minv[s + 3] * xs
    _store4(out, blk * 4, N, a0, a1, a2, a3, m0, m1, m2, m3)


@njit(**JIT)
def _q8_row_i8(q, scale, minv, xq, xd, xsum, out, blk, ng, N):
    a0 = a1 = a2 = a3 = vzero()
    m0 = m1 = m2 = m3 = f32(0.0)
    has_min = minv.shape[0] > 0
    for g in range(ng):
        xi = g * 32
        s = (blk * ng + g) * 4
        b = s * 32
        d = xd[g]
        a0 = vfma_s(q8_dot32_i8(q, b, xq, xi), scale[s] * d, a0)
        a1 = vfma_s(q8_dot32_i8(q, b + 32, xq, xi), scale[s + 1] * d, a1)
        a2 = vfma_s(q8_dot32_i8(q, b + 64, xq, xi), scale[s + 2] * d, a2)
        a3 = vfma_s(q8_dot32_i8(q, b + 96, xq, xi), scale[s + 3] * d, a3)
        if has_min:
            xs = xsum[g]
            m0 += minv[s] * xs
            m1 += minv[s + 1] * xs
            m2 += minv[s + 2] * xs
            m3 += minv[s + 3] * xs
    _store4(out, blk * 4, N, a0, a1, a2, a3, m0, m1, m2, m3)


# ---- chunks of row blocks (float32: rows in tiles of 4, then 2, then 1) -----------------------------

@njit(**JIT)
def _f32_chunk(q, scale, minv, G, packed, x, xsum, out, b0, b1, ng, N):
    T, K = x.shape
    xf = x.reshape(T * K)
    for blk in range(b0, b1):
        t = 0
        while T - t >= 4:
            ts, rows = _tile4(t, K)
            _f32_tile(q, scale, minv, G, packed, xf, xsum, out, ts, rows, blk, ng, N)
            t += 4
        if T - t >= 2:
            ts, rows = _tile2(t, K)
            _f32_tile(q, scale, minv, G, packed, xf, xsum, out, ts, rows, blk, ng, N)
            t += 2
        if t < T:
            if packed:
                _q4_row(q, scale, minv, x[t], xsum[t], out[t], blk, ng, N)
            else:
                _q8_row(q, scale, minv, G, x[t], xsum[t], out[t], blk, ng, N)


@njit(**JIT)
def _i8_chunk(q, scale, minv, packed, xq, xd, xsum, out, b0, b1, ng, N):
    # No tiles here: the integer dot products cost little beside each row's own conversion and
    # scaling, and tiles of 4 measured no faster than one row after another.
    for blk in range(b0, b1):
        for t in range(xq.shape[0]):
            if packed:
                _q4_row_i8(q, scale, minv, xq[t], xd[t], xsum[t], out[t], blk, ng, N)
            else:
                _q8_row_i8(q, scale, minv, xq[t], xd[t], xsum[t], out[t], blk, ng, N)


@njit(parallel=True, **JIT)
def matvec_q4(q, scale, minv, x, out):
    """out [T, N] = x [T, K] times a blocked q4 weight (groups of 32), float32 activations."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xsum = np.empty((T, ng), dtype=np.float32)
    group_sums(x, 32, xsum)
    nb = (N + 3) // 4
    for c in prange((nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS):
        _f32_chunk(q, scale, minv, 32, True, x, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


@njit(parallel=True, **JIT)
def matvec_q8(q, scale, minv, G, x, out):
    """out [T, N] = x [T, K] times a blocked q8 weight (groups of G = 16 or 32), float32 activations."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // G
    xsum = np.empty((T, ng), dtype=np.float32)
    if minv.shape[0] > 0:
        group_sums(x, G, xsum)
    nb = (N + 3) // 4
    for c in prange((nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS):
        _f32_chunk(q, scale, minv, G, False, x, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


@njit(parallel=True, **JIT)
def matvec_i8(q, scale, minv, is_q4, x, out):
    """`matvec_q4` (`is_q4`) or `matvec_q8` with groups of 32, the activations quantized to int8 per
    32-block (integer dot products)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq = np.empty((T, K), dtype=np.int8)
    xd = np.empty((T, ng), dtype=np.float32)
    xsum = np.empty((T, ng), dtype=np.float32)
    quantize_rows(x, xq, xd, xsum)
    nb = (N + 3) // 4
    for c in prange((nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS):
        _i8_chunk(q, scale, minv, is_q4, xq, xd, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


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

"""Matrix-vector kernels over blocked q4/q8 weights (kernels/numba_layout.py) for decode steps.

    y[t, r] = sum_g scale[r, g] * (sum_j q[r, g, j] * x[t, g, j]) + min[r, g] * xsum[t, g]

Each block of four rows is read group by group, and every row keeps an 8-lane float32
accumulator (kernels/simd.py) across all groups: a group's 32 products stay in the vector,
which is scaled by the group's scale as a whole (no reduction per group), and the row is
reduced once at its end. The group sums of x (xsum) are computed once per call and shared by
all rows, so a min costs one FMA per group and row.

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
from kernels.simd import hsum, q4_dot32, q4_dot32_i8, q8_dot16, q8_dot32, q8_dot32_i8, vfma_s, vzero

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


@njit(**JIT)
def _q4_chunk(q, scale, minv, x2, xsum2, out2, b0, b1, ng, N):
    for blk in range(b0, b1):
        for t in range(x2.shape[0]):
            x, xsum, out = x2[t], xsum2[t], out2[t]
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
def _q8_chunk(q, scale, minv, G, x2, xsum2, out2, b0, b1, ng, N):
    for blk in range(b0, b1):
        for t in range(x2.shape[0]):
            x, xsum, out = x2[t], xsum2[t], out2[t]
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
def _q4_chunk_i8(q, scale, minv, xq2, xd2, xsum2, out2, b0, b1, ng, N):
    for blk in range(b0, b1):
        for t in range(xq2.shape[0]):
            xq, xd, xsum, out = xq2[t], xd2[t], xsum2[t], out2[t]
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
def _q8_chunk_i8(q, scale, minv, xq2, xd2, xsum2, out2, b0, b1, ng, N):
    for blk in range(b0, b1):
        for t in range(xq2.shape[0]):
            xq, xd, xsum, out = xq2[t], xd2[t], xsum2[t], out2[t]
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
        _q4_chunk(q, scale, minv, x, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


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
        _q8_chunk(q, scale, minv, G, x, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


@njit(parallel=True, **JIT)
def matvec_q4_i8(q, scale, minv, x, out):
    """`matvec_q4` with the activations quantized to int8 per 32-block (integer dot products)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq = np.empty((T, K), dtype=np.int8)
    xd = np.empty((T, ng), dtype=np.float32)
    xsum = np.empty((T, ng), dtype=np.float32)
    quantize_rows(x, xq, xd, xsum)
    nb = (N + 3) // 4
    for c in prange((nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS):
        _q4_chunk_i8(q, scale, minv, xq, xd, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


@njit(parallel=True, **JIT)
def matvec_q8_i8(q, scale, minv, x, out):
    """`matvec_q8` (groups of 32) with the activations quantized to int8 per 32-block."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq = np.empty((T, K), dtype=np.int8)
    xd = np.empty((T, ng), dtype=np.float32)
    xsum = np.empty((T, ng), dtype=np.float32)
    quantize_rows(x, xq, xd, xsum)
    nb = (N + 3) // 4
    for c in prange((nb + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS):
        _q8_chunk_i8(q, scale, minv, xq, xd, xsum, out, c * CHUNK_BLOCKS, min(nb, (c + 1) * CHUNK_BLOCKS), ng, N)


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

"""Compiled matrix-vector kernels over q8 (int8 values) and q4 (packed nibbles) weights with
float32 group scales/mins, and the dequantizers behind the float32 GEMM path.

y[t, r] = sum_g scale[r, g] * (sum_j q[r, g, j] * x[t, g, j]) + min[r, g] * xsum[t, g]

The group sums of x (xsum) are computed once per call and shared by every output row, so a
min costs one FMA per group, not per value. Rows go four at a time, sharing each load of x;
the inner loop over one group's values is what LLVM vectorizes (int8 -> int32 -> float32,
FMA). Index arithmetic uses loop variables only: numba's negative-index wraparound on computed
indices blocks vectorization. Work is split into chunks of rows handed out dynamically, so a
thread that loses its core to another process does not hold the whole step back.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT

f32 = np.float32
u8 = np.uint8
CHUNK_ROWS = 32  # rows per parallel work item (a multiple of 4)


@njit(**JIT)
def _group_sums(x: np.ndarray, xsum: np.ndarray) -> None:
    """x [T, ng, G] -> xsum [T, ng]."""
    T, ng, G = x.shape
    for t in range(T):
        for g in range(ng):
            s = f32(0.0)
            for j in range(G):
                s += x[t, g, j]
            xsum[t, g] = s


@njit(**JIT)
def _rows4(q, scale, minv, has_min, x, xsum, out, r):
    """Four output rows r..r+3 for one activation row x [ng, G]."""
    ng, G = q.shape[1], q.shape[2]
    a0 = a1 = a2 = a3 = f32(0.0)
    for g in range(ng):
        s0 = s1 = s2 = s3 = f32(0.0)
        for j in range(G):
            xv = x[g, j]
            s0 += f32(q[r, g, j]) * xv
            s1 += f32(q[r + 1, g, j]) * xv
            s2 += f32(q[r + 2, g, j]) * xv
            s3 += f32(q[r + 3, g, j]) * xv
        a0 += scale[r, g] * s0
        a1 += scale[r + 1, g] * s1
        a2 += scale[r + 2, g] * s2
        a3 += scale[r + 3, g] * s3
        if has_min:
            xs = xsum[g]
            a0 += minv[r, g] * xs
            a1 += minv[r + 1, g] * xs
            a2 += minv[r + 2, g] * xs
            a3 += minv[r + 3, g] * xs
    out[r] = a0
    out[r + 1] = a1
    out[r + 2] = a2
    out[r + 3] = a3


@njit(**JIT)
def _row1(q, scale, minv, has_min, x, xsum, out, r):
    ng, G = q.shape[1], q.shape[2]
    a = f32(0.0)
    for g in range(ng):
        s = f32(0.0)
        for j in range(G):
            s += f32(q[r, g, j]) * x[g, j]
        a += scale[r, g] * s
        if has_min:
            a += minv[r, g] * xsum[g]
    out[r] = a


@njit(**JIT)
def _q4_rows4(q, scale, minv, x, xsum, out, r):
    """q4: byte j of group g holds value j (low nibble) and value j + 16 (high nibble)."""
    ng = q.shape[1]
    a0 = a1 = a2 = a3 = f32(0.0)
    for g in range(ng):
        s0 = s1 = s2 = s3 = f32(0.0)
        for j in range(16):
            xl = x[g, j]
            xh = x[g, j + 16]
            b = q[r, g, j]
            s0 += f32(u8(b & u8(15))) * xl + f32(u8(b >> u8(4))) * xh
            b = q[r + 1, g, j]
            s1 += f32(u8(b & u8(15))) * xl + f32(u8(b >> u8(4))) * xh
            b = q[r + 2, g, j]
            s2 += f32(u8(b & u8(15))) * xl + f32(u8(b >> u8(4))) * xh
            b = q[r + 3, g, j]
            s3 += f32(u8(b & u8(15))) * xl + f32(u8(b >> u8(4))) * xh
        xs = xsum[g]
        a0 += scale[r, g] * s0 + minv[r, g] * xs
        a1 += scale[r + 1, g] * s1 + minv[r + 1, g] * xs
        a2 += scale[r + 2, g] * s2 + minv[r + 2, g] * xs
        a3 += scale[r + 3, g] * s3 + minv[r + 3, g] * xs
    out[r] = a0
    out[r + 1] = a1
    out[r + 2] = a2
    out[r + 3] = a3


@njit(**JIT)
def _q4_row1(q, scale, minv, x, xsum, out, r):
    ng = q.shape[1]
    a = f32(0.0)
    for g in range(ng):
        s = f32(0.0)
        for j in range(16):
            b = q[r, g, j]
            s += f32(u8(b & u8(15))) * x[g, j] + f32(u8(b >> u8(4))) * x[g, j + 16]
        a += scale[r, g] * s + minv[r, g] * xsum[g]
    out[r] = a


@njit(parallel=True, **JIT)
def matvec(q, scale, minv, x, out):
    """out [T, N] = x [T, ng, G] times a q8 weight q [N, ng, G] (int8) or a q4 one [N, ng, G // 2]
    (uint8, two values a byte); scale and min [N, ng] (min [N, 0] when the type has none)."""
    N = q.shape[0]
    T, ng, G = x.shape
    packed = q.shape[2] * 2 == G
    has_min = minv.shape[1] == ng
    xsum = np.empty((T, ng), dtype=np.float32)
    _group_sums(x, xsum)
    for c in prange((N + CHUNK_ROWS - 1) // CHUNK_ROWS):
        r0 = c * CHUNK_ROWS
        r1 = min(N, r0 + CHUNK_ROWS)
        r4 = r0 + (r1 - r0) // 4 * 4
        for t in range(T):
            if packed:
                for r in range(r0, r4, 4):
                    _q4_rows4(q, scale, minv, x[t], xsum[t], out[t], r)
                for r in range(r4, r1):
                    _q4_row1(q, scale, minv, x[t], xsum[t], out[t], r)
            else:
                for r in range(r0, r4, 4):
                    _rows4(q, scale, minv, has_min, x[t], xsum[t], out[t], r)
                for r in range(r4, r1):
                    _row1(q, scale, minv, has_min, x[t], xsum[t], out[t], r)


@njit(**JIT)
def q8_dequant(q, scale, minv, rows, out):
    """out [len(rows), ng * G] = the q8 weight's `rows` in float32 (scale * q + min)."""
    ng, G = q.shape[1], q.shape[2]
    has_min = minv.shape[1] == ng
    out3 = out.reshape(rows.shape[0], ng, G)
    for i in range(rows.shape[0]):
        r = rows[i]
        for g in range(ng):
            d = scale[r, g]
            m = minv[r, g] if has_min else f32(0.0)
            for j in range(G):
                out3[i, g, j] = d * f32(q[r, g, j]) + m


@njit(**JIT)
def q4_dequant(q, scale, minv, rows, out):
    """out [len(rows), ng * 32] = the q4 weight's `rows` in float32."""
    ng = q.shape[1]
    out3 = out.reshape(rows.shape[0], ng, 32)
    for i in range(rows.shape[0]):
        r = rows[i]
        for g in range(ng):
            d = scale[r, g]
            m = minv[r, g]
            for j in range(16):
                b = q[r, g, j]
                out3[i, g, j] = d * f32(u8(b & u8(15))) + m
                out3[i, g, j + 16] = d * f32(u8(b >> u8(4))) + m


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

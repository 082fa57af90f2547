"""Activation rows prepared once per product for the matvec kernels (kernels/numba_linear.py,
kernels/numba_linear_i8.py, kernels/numba_linear16.py): the sums of their groups, int8 quantization per 32-block
(`quantize_rows`, `quantized`), float32 as four int8 pieces per value (`split_rows`, `split`), the pair layout
of the q4 int8 blocks, and group sums spread beside a block's mins. Compiled into those files' kernels
(kernels/numba_jit.py lists it in `_INLINED`)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT, JIT_EXACT

f32 = np.float32
TINY = f32(2.0**-100)  # blocks of activations all below this count as zeros in `split_rows`


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
    """x [T, K] -> int8 xq [T, K] and scales xd [T, K // 32] with x ~ xd * xq per 32-block, and the sums of
    the blocks as quantized, xd * sum(xq) (xsum [T, K // 32]: what the min term meets)."""
    T, K = x.shape
    for t in range(T):
        for g in range(K // 32):
            amax = f32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[t, g * 32 + j]))
            inv = f32(127.0) / amax if amax > 0 else f32(0.0)
            qs = np.int32(0)
            for j in range(32):
                # np.floor keeps the value float32; math.floor (an int64 result) made the loop 2x slower
                q = np.int8(np.int32(np.floor(x[t, g * 32 + j] * inv + f32(0.5))))
                xq[t, g * 32 + j] = q
                qs += np.int32(q)
            xd[t, g] = amax / f32(127.0)
            xsum[t, g] = xd[t, g] * f32(qs)


# Activation rows from which the int8 products quantize them on all their threads (`quantize_rows_parallel`): a
# prompt's rows took 2-4% of its prefill on one thread while the others waited; a few rows are not worth a second
# parallel launch.
PARALLEL_QUANTIZE_ROWS = 16


@njit(parallel=True, **JIT_EXACT)
def quantize_rows_parallel(x, xq, xd, xsum):
    """`quantize_rows` a row at a time on all the kernel threads (the same values: rows are independent)."""
    for t in prange(x.shape[0]):
        quantize_rows(x[t : t + 1], xq[t : t + 1], xd[t : t + 1], xsum[t : t + 1])


@njit(**JIT_EXACT)
def quantized(x):
    """x [T, K] -> `quantize_rows`' (xq, xd, xsum), new arrays, on all the kernel threads from PARALLEL_QUANTIZE_ROWS
    rows on."""
    T, K = x.shape
    xq = np.empty((T, K), dtype=np.int8)
    xd = np.empty((T, K // 32), dtype=np.float32)
    xsum = np.empty((T, K // 32), dtype=np.float32)
    if T >= PARALLEL_QUANTIZE_ROWS:
        quantize_rows_parallel(x, xq, xd, xsum)
    else:
        quantize_rows(x, xq, xd, xsum)
    return xq, xd, xsum


@njit(**JIT_EXACT)  # no reassociation or contraction: the pieces' remainders must be exact
def split_rows(x, xp, xs, xsum):
    """x [T, K] -> four int8 pieces per value, xp flat [T * 4K] (per 32-block: p0[0:32], p1, p2, p3), and
    s / 2^7 for a power of two s per block, xs [T, K // 32]: x = s * (p0 + p1 / 2^7 + p2 / 2^14 + p3 / 2^21) to within
    s / 2^22 (s = 2^-6 of the block's largest power of two above its max: every value within 2^3 of the
    block's max exactly, the others to 2^-27 of that max; a block under 2^-100 as zeros), and the float32
    block sums (xsum).

    x / s, its remainders and their multiples of 2^7 are exact in float32 (powers of two and
    differences of values within one of each other), so only the last piece rounds."""
    T, K = x.shape
    v = np.empty(32, dtype=np.float32)
    for t in range(T):
        for g in range(K // 32):
            amax = f32(0.0)
            sm = f32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[t, g * 32 + j]))
                sm += x[t, g * 32 + j]
            xsum[t, g] = sm
            o = (t * (K // 32) + g) * 128
            if not (amax > f32(TINY) and amax < np.inf):  # ~zeros (2^e would leave float32), or a NaN/inf for the sums
                xs[t, g] = amax * f32(0.0) if amax > f32(TINY) else f32(0.0)
                for j in range(128):
                    xp[o + j] = 0
                continue
            e = math.frexp(amax)[1] - 6  # amax / 2^e in [32, 64)
            xs[t, g] = f32(math.ldexp(1.0, e - 7))  # s / 2^7: `q4_quad_split` sums p0 * 2^7 + p1 + ...
            inv = f32(math.ldexp(1.0, -e))
            for j in range(32):
                v[j] = x[t, g * 32 + j] * inv
            for k in range(4):
                for j in range(32):
                    p = np.rint(v[j])  # the nearest integer (llvm.rint: one instruction, vectorized)
                    xp[o + k * 32 + j] = np.int8(np.int32(p))
                    v[j] = (v[j] - p) * f32(128.0)


@njit(**JIT)
def pair_layout(xq):
    """int8 xq [T, K] -> flat [T * 2K]: each 32-block as [x0..15, x0..15, x16..31, x16..31], the
    activation layout of `q4_pair_i8` (two weight rows' nibbles in one 32-byte vector). Copied as int64s, two to a
    16-byte half: byte by byte, the copy took as long as the quantization."""
    T, K = xq.shape
    x2 = np.empty(T * 2 * K, dtype=np.int8)
    src = xq.reshape(T * K).view(np.int64)
    dst = x2.view(np.int64)
    for h in range(T * K // 16):
        a = src[2 * h]
        b = src[2 * h + 1]
        dst[4 * h] = a
        dst[4 * h + 1] = b
        dst[4 * h + 2] = a
        dst[4 * h + 3] = b
    return x2


@njit(**JIT_EXACT)
def split(x):
    """x [T, K] -> `split_rows`' (xp, xs, xsum), new arrays."""
    T, K = x.shape
    xp = np.empty(T * 4 * K, dtype=np.int8)
    xs = np.empty((T, K // 32), dtype=np.float32)
    xsum = np.empty((T, K // 32), dtype=np.float32)
    split_rows(x, xp, xs, xsum)
    return xp, xs, xsum


@njit(**JIT)
def spread4(xsum, mf):
    """xsum [T, ng] times mf -> flat [T * 4 ng]: each group sum four times, beside a block's four mins of
    that group (mf: the factor of `Blocked.min_operand`, -8 where the scales stand in for the mins; a
    power of two, so the product is exact)."""
    T, ng = xsum.shape
    xs4 = np.empty(T * 4 * ng, dtype=np.float32)
    for t in range(T):
        for i in range(4 * ng):
            xs4[t * 4 * ng + i] = xsum[t, i // 4] * mf
    return xs4

"""What every matvec kernel (kernels/numba_linear.py, kernels/numba_linear_i8.py) does with a block of four weight
rows once its products are summed: the stores to `out` (a ragged last block's padding rows dropped) and the min terms,
sum_g min[row, g] * xsum[t, g] (xs4: `numba_activations.spread4` of the group sums, lined up with a block's mins).
Compiled into those files' kernels (kernels/numba_jit.py lists it in `_INLINED`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from kernels.numba_jit import JIT
from kernels.simd import LANES
from kernels.simd_scales import f32_at
from kernels.simd_vectors import (
    fold4,
    hsum,
    vadd,
    vfma,
    vload,
    vzero,
)

f32 = np.float32


@njit(inline="always", **JIT)
def block_mins(minv, xs4, xo, base, ng):
    """sum_g min[row, g] * xsum[g] for the four rows of the block whose mins start at minv[base]
    (xs4[xo:]: `spread4` of one activation row), LANES / 4 groups per FMA."""
    if minv.shape[0] == 0:
        return f32(0.0), f32(0.0), f32(0.0), f32(0.0)
    n = ng * 4
    # Four accumulators: with one, each FMA waited on the last (a 2048-wide row's 32 FMAs took their latency, ~5x
    # their throughput).
    a0 = a1 = a2 = a3 = vzero()
    i = 0
    while i + 4 * LANES <= n:
        a0 = vfma(vload(minv, base + i), vload(xs4, xo + i), a0)
        a1 = vfma(vload(minv, base + i + LANES), vload(xs4, xo + i + LANES), a1)
        a2 = vfma(vload(minv, base + i + 2 * LANES), vload(xs4, xo + i + 2 * LANES), a2)
        a3 = vfma(vload(minv, base + i + 3 * LANES), vload(xs4, xo + i + 3 * LANES), a3)
        i += 4 * LANES
    while i + LANES <= n:
        a0 = vfma(vload(minv, base + i), vload(xs4, xo + i), a0)
        i += LANES
    return _mins_tail(vadd(vadd(a0, a1), vadd(a2, a3)), minv, xs4, xo, base, ng)


@njit(inline="always", **JIT)
def _mins_tail(acc, minv, xs4, xo, base, ng):
    """A row's four min sums from its accumulated vector (lane k rows k mod 4), plus the groups past the last full
    vector (fewer than a vector's)."""
    m0, m1, m2, m3 = fold4(acc)
    n = ng * 4
    i = n // LANES * LANES
    while i < n:
        xs = xs4[xo + i]
        m0 += f32_at(minv, base + i) * xs
        m1 += f32_at(minv, base + i + 1) * xs
        m2 += f32_at(minv, base + i + 2) * xs
        m3 += f32_at(minv, base + i + 3) * xs
        i += 4
    return m0, m1, m2, m3


@njit(**JIT)
def store4(out, t, r, N, y0, y1, y2, y3):
    """out[t, r .. r + 3] = y0 .. y3, up to column N (a ragged last block's padding rows are dropped)."""
    if r < N:
        out[t, r] = y0
    if r + 1 < N:
        out[t, r + 1] = y1
    if r + 2 < N:
        out[t, r + 2] = y2
    if r + 3 < N:
        out[t, r + 3] = y3


@njit(**JIT)
def _add4(out, t, r, N, y0, y1, y2, y3):
    """out[t, r .. r + 3] += y0 .. y3, up to column N."""
    if r < N:
        out[t, r] += y0
    if r + 1 < N:
        out[t, r + 1] += y1
    if r + 2 < N:
        out[t, r + 2] += y2
    if r + 3 < N:
        out[t, r + 3] += y3


@njit(**JIT)
def store_tile(out, ts, r, N, a):
    """out[ts[i], r] = the sum of a[i]'s lanes (r past N: a ragged block's padding)."""
    if r < N:
        for i in range(len(ts)):
            out[ts[i], r] = hsum(a[i])


@njit(**JIT)
def add_mins(out, minv, xs4, ts, xds, b0, b1, ng, N):
    """out[t, block rows] += sum_g min[row, g] * xsum[t, g] for the rows t of a tile (xds: their offsets in the
    per-group arrays) and blocks b0 .. b1 - 1, once the products are stored: a pass of its own keeps the product
    loops' registers to themselves (inlined there, it made them spill), and a call a tile and chunk, not a block,
    pays the call's reference counting once."""
    if minv.shape[0] == 0:
        return
    for blk in range(b0, b1):
        for i in range(len(ts)):
            m0, m1, m2, m3 = block_mins(minv, xs4, xds[i] * 4, blk * ng * 4, ng)
            _add4(out, ts[i], blk * 4, N, m0, m1, m2, m3)

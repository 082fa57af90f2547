"""Matrix-vector kernels over blocked q4/q8 weights (kernels/numba_layout.py) for decode steps.

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
- float32 as int8 pieces (the default's q4 products on AVX-512 VNNI, `matvec_q4_split`): each 32-value
  block of an activation row becomes four int8 pieces with one power-of-two scale
  (x = s (p0 + p1 / 2^7 + p2 / 2^14 + p3 / 2^21), every value to 2^-27 of its block's max, those near
  the max exactly: below the float32 rounding of the sums they feed) and each group's products are exact
  integer sums (vpdpbusd, a block's four weight rows in one zmm). The 4-bit weights need no
  conversion to float: fewer instructions than the float path for the same float32-class result.
- int8 ("q8" activations, as llama.cpp does): each activation row is quantized once per call
  to int8 per 32-value block with a float32 scale (round(x * 127 / max|x|)), and each group's
  dot product is an exact integer sum, scaled by weight scale times activation scale. q4 weights
  take a block's four rows in one zmm on AVX-512 VNNI (`simd_dot.q4_quad_i8`: the activations' 16-byte
  halves broadcast to the four lanes), else two rows to a ymm (`simd_dot.q4_pair_i8`, the activations in
  `pair_layout`); vpdpbusd where the CPU has VNNI, AVX2 vpmaddubsw/vpmaddwd otherwise. On AVX2 without
  AVX-512 a block's four rows' sums are folded into one vector before they are converted (`q4_four_i8`,
  `q8_four_i8`): one conversion, scale and accumulator a row of activations instead of two or four, which keeps
  a tile of four rows in the 16 ymm registers (with one vector per weight row, it spilled). The min term
  uses the quantized sums (scale times the sum of a block's int8 values, as llama.cpp's q8_1 blocks
  carry): the product is then the dequantized weight times the quantized activations, whose error
  meets weights centred on zero (q - 8, or scale q + min) rather than the raw 0..15 nibbles; with
  the float32 sums instead, the default model's logits left the reference 2-3x further. Weights with
  groups of 16 (Q6_K, Q3_K, Q2_K) stay on the float32 path.
- Both integer paths take activation rows in tiles of up to I8_TILE: each weight group is loaded and
  unpacked once for the tile's rows.
- q4 weights in sixteen-row blocks (int8 activations, or float32 as pieces): kernels/numba_linear16.py.

A symmetric q4 type (Q4_0) keeps no mins: its scales stand in, times -8 (`Blocked.min_operand`,
d * sum((q - 8) x) = d * sum(q x) - 8 d * sum(x)), in the same min term.

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

from kernels.numba_activations import group_sums, pair_layout, quantize_rows, split_rows, spread4
from kernels.numba_jit import JIT
from kernels.numba_tiling import PREFETCH_BYTES, chunk_blocks, tile_at
from kernels.simd import LANES, VNNI256, VNNI512, target_has
from kernels.simd_dot import (
    q4_acc32_tile,
    q4_dot32,
    q4_dot32_tile,
    q4_four_i8_tile,
    q4_pair_i8_tile,
    q4_quad_i8_tile,
    q4_quad_split_tile,
    q8_acc16_tile,
    q8_acc32_tile,
    q8_dot16,
    q8_dot16_tile,
    q8_dot32,
    q8_dot32_i8_tile,
    q8_dot32_tile,
    q8_four_i8_tile,
)
from kernels.simd_scales import (
    f32_at,
    f32x4_at,
    four_scales,
    pair_scales,
    quad_scales,
    quad_scales4_tile,
    scale_acc_tile,
    scale_quad_acc_tile,
    splat_at,
    twice_scales,
)
from kernels.simd_vectors import (
    fold4,
    hsum,
    hsum_halves,
    hsum_quarters,
    prefetch,
    tile_offsets,
    vfma,
    vfma_s,
    vload,
    vzero,
    vzero_tile,
    vzero_tile_of,
)

f32 = np.float32
L1_TILE_BYTES = 24 * 1024  # a wide tile's activations per span of groups
# Activation rows that share each unpacked weight group on the integer paths (a tile's accumulators stay
# in registers, AVX2's 16 included); `_i8_chunk` and `_split_chunk` finish with one tile of the 1-3 left.
I8_TILE = 4
# Int8 products of several rows take a block's four rows a group in one vector of sums (`q4_four_i8`,
# `q8_four_i8`) on AVX2 without AVX-512, so that a tile's accumulators and the unpacked group stay in the 16
# registers. A lone row (decode) keeps two or four accumulators: with one, each group waited on the last one's FMA
# and a 1B decode token took 3-5% longer. q4 with VNNI (ymm) takes its two pairs of rows on `vpdpbusd`; CPUs with
# AVX-512 keep the one-vector-a-row form.
FOUR_I8 = target_has("avx2") and not VNNI256
FOUR_Q8 = target_has("avx2") and LANES == 8


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
                        prefetch(q, s * G // (2 if packed else 1) + PREFETCH_BYTES)
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
def _four_i8_block(q, scale, minv, xq, xd, xs4, out, ts, rows, xds, blk, ng, N):
    """`_i8_tile`'s q4 block `blk` on AVX2 without VNNI: its four rows' group sums in one vector a row of
    activations (`q4_four_i8`), so a tile of four rows keeps its accumulators and the unpacked group in the 16
    registers."""
    base = blk * ng * 4
    a = vzero_tile_of(rows, 8)
    for g in range(ng):
        s = base + g * 4
        prefetch(q, s * 16 + PREFETCH_BYTES)
        a = scale_acc_tile(q4_four_i8_tile(q, s * 16, xq, g * 64, rows), four_scales(scale, s), xd, xds, g, a)
    for i in range(len(ts)):
        y0, y2, y1, y3 = hsum_quarters(a[i])
        m0, m1, m2, m3 = _block_mins(minv, xs4, ts[i] * ng * 4, base, ng)
        _store4(out, ts[i], blk * 4, N, y0 + m0, y1 + m1, y2 + m2, y3 + m3)


@njit(**JIT)
def _q8_four_block(q, scale, minv, xq, xd, xs4, out, ts, rows, xds, blk, ng, N):
    """`_i8_tile`'s q8 block `blk` on AVX2: its four rows' group sums in one vector a row of activations
    (`q8_four_i8`)."""
    base = blk * ng * 4
    a = vzero_tile_of(rows, 8)
    for g in range(ng):
        s = base + g * 4
        b = s * 32
        prefetch(q, b + PREFETCH_BYTES)
        prefetch(q, b + PREFETCH_BYTES + 64)
        a = scale_acc_tile(q8_four_i8_tile(q, b, xq, g * 32, rows), twice_scales(scale, s), xd, xds, g, a)
    for i in range(len(ts)):
        y0, y1, y2, y3 = fold4(a[i])
        m0, m1, m2, m3 = _block_mins(minv, xs4, ts[i] * ng * 4, base, ng)
        _store4(out, ts[i], blk * 4, N, y0 + m0, y1 + m1, y2 + m2, y3 + m3)


@njit(**JIT)
def _q8_i8_block(q, scale, minv, xq, xd, xs4, out, ts, rows, xds, blk, ng, N):
    """`_i8_tile`'s q8 block `blk`: a row's group to a ymm."""
    base = blk * ng * 4
    a0 = a1 = a2 = a3 = vzero_tile_of(rows, 8)
    for g in range(ng):
        s = base + g * 4
        b = s * 32
        prefetch(q, b + PREFETCH_BYTES)
        prefetch(q, b + PREFETCH_BYTES + 64)
        d0, d1, d2, d3 = f32x4_at(scale, s)
        a0 = scale_acc_tile(q8_dot32_i8_tile(q, b, xq, g * 32, rows), d0, xd, xds, g, a0)
        a1 = scale_acc_tile(q8_dot32_i8_tile(q, b + 32, xq, g * 32, rows), d1, xd, xds, g, a1)
        a2 = scale_acc_tile(q8_dot32_i8_tile(q, b + 64, xq, g * 32, rows), d2, xd, xds, g, a2)
        a3 = scale_acc_tile(q8_dot32_i8_tile(q, b + 96, xq, g * 32, rows), d3, xd, xds, g, a3)
    for i in range(len(ts)):
        m0, m1, m2, m3 = _block_mins(minv, xs4, ts[i] * ng * 4, base, ng)
        _store4(out, ts[i], blk * 4, N, hsum(a0[i]) + m0, hsum(a1[i]) + m1, hsum(a2[i]) + m2, hsum(a3[i]) + m3)


@njit(**JIT)
def _i8_tile(q, scale, minv, packed, xq, xd, xs4, out, ts, rows, xds, b0, b1, ng, N):
    """Rows ts of the int8 activations (at offsets rows in xq, their scales from xds in xd) times blocks
    b0 .. b1 - 1: each weight group is loaded and unpacked once for all the tile's rows.

    q4 on AVX-512 VNNI: a block's four rows' group in one zmm (`q4_quad_i8`). Tiles of several rows, q4 on AVX2
    without VNNI and q8 on AVX2 without AVX-512: the four rows' sums in one ymm (`_four_i8_block`,
    `_q8_four_block`). Otherwise q4: rows 0|1 and 2|3 two to a ymm (`q4_pair_i8`, activations in pair layout);
    q8: a row's group to a ymm."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        if packed and VNNI512:
            a = vzero_tile_of(rows, 16)
            g = 0
            # Tiles under I8_TILE rows (single-row decode) take four groups a round: their scales in one load and
            # conversion. Full tiles share each group's scales across their rows already and gain nothing.
            while len(rows) < I8_TILE and g + 4 <= ng:
                s = base + g * 4
                sc = quad_scales4_tile(scale, s, xd, xds, g)
                prefetch(q, s * 16 + PREFETCH_BYTES)
                a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16, xq, g * 32, rows), sc, 0, a)
                prefetch(q, s * 16 + 64 + PREFETCH_BYTES)
                a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16 + 64, xq, g * 32 + 32, rows), sc, 1, a)
                prefetch(q, s * 16 + 128 + PREFETCH_BYTES)
                a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16 + 128, xq, g * 32 + 64, rows), sc, 2, a)
                prefetch(q, s * 16 + 192 + PREFETCH_BYTES)
                a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16 + 192, xq, g * 32 + 96, rows), sc, 3, a)
                g += 4
            while g < ng:
                s = base + g * 4
                prefetch(q, s * 16 + PREFETCH_BYTES)
                a = scale_acc_tile(q4_quad_i8_tile(q, s * 16, xq, g * 32, rows), quad_scales(scale, s), xd, xds, g, a)
                g += 1
            for i in range(len(ts)):
                y0, y1, y2, y3 = hsum_quarters(a[i])
                m0, m1, m2, m3 = _block_mins(minv, xs4, ts[i] * ng * 4, base, ng)
                _store4(out, ts[i], blk * 4, N, y0 + m0, y1 + m1, y2 + m2, y3 + m3)
        elif packed and FOUR_I8 and len(rows) > 1:
            _four_i8_block(q, scale, minv, xq, xd, xs4, out, ts, rows, xds, blk, ng, N)
        elif packed:
            a01 = a23 = vzero_tile_of(rows, 8)
            for g in range(ng):
                s = base + g * 4
                prefetch(q, s * 16 + PREFETCH_BYTES)
                s01, s23 = pair_scales(scale, s, f32(1.0))
                a01 = scale_acc_tile(q4_pair_i8_tile(q, s * 16, xq, g * 64, rows), s01, xd, xds, g, a01)
                a23 = scale_acc_tile(q4_pair_i8_tile(q, s * 16 + 32, xq, g * 64, rows), s23, xd, xds, g, a23)
            for i in range(len(ts)):
                y0, y1 = hsum_halves(a01[i])
                y2, y3 = hsum_halves(a23[i])
                m0, m1, m2, m3 = _block_mins(minv, xs4, ts[i] * ng * 4, base, ng)
                _store4(out, ts[i], blk * 4, N, y0 + m0, y1 + m1, y2 + m2, y3 + m3)
        elif not packed and FOUR_Q8 and len(rows) > 1:
            _q8_four_block(q, scale, minv, xq, xd, xs4, out, ts, rows, xds, blk, ng, N)
        else:
            _q8_i8_block(q, scale, minv, xq, xd, xs4, out, ts, rows, xds, blk, ng, N)


@njit(**JIT)
def _split_tile(q, scale, minv, xp, xs, xs4, out, ts, rows, xds, b0, b1, ng, N):
    """`_i8_tile`'s AVX-512 VNNI q4 path over activations in four int8 pieces (`split_rows`): float32
    activations to within float32 rounding of the products, on integer dot products."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a = vzero_tile_of(rows, 16)
        for g in range(ng):
            s = base + g * 4
            prefetch(q, s * 16 + PREFETCH_BYTES)
            a = scale_acc_tile(q4_quad_split_tile(q, s * 16, xp, g * 128, rows), quad_scales(scale, s), xs, xds, g, a)
        for i in range(len(ts)):
            y0, y1, y2, y3 = hsum_quarters(a[i])
            m0, m1, m2, m3 = _block_mins(minv, xs4, ts[i] * ng * 4, base, ng)
            _store4(out, ts[i], blk * 4, N, y0 + m0, y1 + m1, y2 + m2, y3 + m3)


# ---- chunks of row blocks: full tiles, then one tile of the rows left -------------------------------
# The activations come flat (x.ravel(): no array made per chunk); T rows of K values. A tile's row offsets are a
# tuple (`simd_vectors.tile_offsets`), so its row count is a compile-time constant and each count compiles to a
# kernel of its own: `literal_unroll` compiles a loop body once per count in these tuples, each with its count as a
# constant, and the body whose count is the number of rows left runs.
F32_TILE = 8
F32_SCALE_AFTER = (2, 4)  # float32 rows left that sum a row's group products and scale them after (`_f32_tile`)
F32_WIDE = (3, 5, 6, 7)  # float32 rows left that dequantize first (`_f32_wide_tile`); a single row goes alone
I8_REST = tuple(range(1, I8_TILE))


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
            ts, rows, _ = tile_at(t, K, ng, n)
            _f32_tile(q, scale, minv, G, packed, xf, xs4, out, ts, rows, b0, b1, ng, N)
    for n in literal_unroll(F32_WIDE):
        if r == n:
            _f32_wide_tile(q, scale, minv, mf, G, packed, xf, out, t, tile_offsets(t, K, n), b0, b1, ng, N)


@njit(**JIT)
def _i8_chunk(q, scale, minv, packed, xq, T, KX, xd, xs4, out, b0, b1, ng, N):
    """T int8 activation rows (KX values apart in xq) in tiles of I8_TILE rows, then one tile of the rest."""
    t = 0
    while T - t >= I8_TILE:
        ts, rows, xds = tile_at(t, KX, ng, I8_TILE)
        _i8_tile(q, scale, minv, packed, xq, xd, xs4, out, ts, rows, xds, b0, b1, ng, N)
        t += I8_TILE
    for n in literal_unroll(I8_REST):
        if T - t == n:
            ts, rows, xds = tile_at(t, KX, ng, n)
            _i8_tile(q, scale, minv, packed, xq, xd, xs4, out, ts, rows, xds, b0, b1, ng, N)


@njit(**JIT)
def _split_chunk(q, scale, minv, xp, T, K, xs, xs4, out, b0, b1, ng, N):
    """T rows of activation pieces (4K values a row) in tiles of I8_TILE rows, then one tile of the rest."""
    t = 0
    while T - t >= I8_TILE:
        ts, rows, xds = tile_at(t, 4 * K, ng, I8_TILE)
        _split_tile(q, scale, minv, xp, xs, xs4, out, ts, rows, xds, b0, b1, ng, N)
        t += I8_TILE
    for n in literal_unroll(I8_REST):
        if T - t == n:
            ts, rows, xds = tile_at(t, 4 * K, ng, n)
            _split_tile(q, scale, minv, xp, xs, xs4, out, ts, rows, xds, b0, b1, ng, N)


@njit(parallel=True, **JIT)
def matvec_q4_split(q, scale, minv, mf, x, out, threads):
    """`matvec_q4` on AVX-512 VNNI: the activations in four int8 pieces per value (`split_rows`), each
    group's products exact integer sums."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xp = np.empty(T * 4 * K, dtype=np.int8)
    xs = np.empty((T, ng), dtype=np.float32)
    xsum = np.empty((T, ng), dtype=np.float32)
    split_rows(x, xp, xs, xsum)
    xs4, xsf = spread4(xsum, mf), xs.reshape(T * ng)
    nb = (N + 3) // 4
    cb = chunk_blocks(ng, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _split_chunk(q, scale, minv, xp, T, K, xsf, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


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


@njit(parallel=True, **JIT)
def matvec_i8(q, scale, minv, mf, is_q4, x, out, threads):
    """`matvec_q4` (`is_q4`) or `matvec_q8` with groups of 32, the activations quantized to int8 per
    32-block (integer dot products; q4 reads them in `pair_layout`)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq = np.empty((T, K), dtype=np.int8)
    xd = np.empty((T, ng), dtype=np.float32)
    xsum = np.empty((T, ng), dtype=np.float32)
    quantize_rows(x, xq, xd, xsum)
    xs4, xdf = spread4(xsum, mf), xd.reshape(T * ng)
    pairs = is_q4 and not VNNI512
    xqf = pair_layout(xq) if pairs else xq.reshape(T * K)
    KX = 2 * K if pairs else K
    nb = (N + 3) // 4
    cb = chunk_blocks(ng, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _i8_chunk(q, scale, minv, is_q4, xqf, T, KX, xdf, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


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

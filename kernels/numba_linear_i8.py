"""Matrix-vector kernels over blocked q4/q8 weights (kernels/numba_layout.py) on integer dot products: the
activations as int8 (`matvec_i8`) or float32 as four int8 pieces (`matvec_q4_split`). kernels/numba_linear.py has the
float32 kernels and the layout they share.

- float32 as int8 pieces (the default's q4 products on AVX-512 VNNI, `matvec_q4_split`): each 32-value
  block of an activation row becomes four int8 pieces with one power-of-two scale
  (x = s (p0 + p1 / 2^7 + p2 / 2^14 + p3 / 2^21), every value to 2^-27 of its block's max, those near
  the max exactly: below the float32 rounding of the sums they feed) and each group's products are exact
  integer sums (vpdpbusd, a block's four weight rows in one zmm). The 4-bit weights need no
  conversion to float: fewer instructions than the float path for the same float32-class result.
- int8 ("q8" activations, as llama.cpp does): each activation row is quantized once per call to int8 per 32-value
  block with a float32 scale (round(x * 127 / max|x|)), and each group's dot product is an exact integer sum, scaled
  by weight scale times activation scale. q4 weights take a block's four rows in one zmm on AVX-512 VNNI
  (`simd_dot.q4_quad_i8`: the activations' 16-byte halves broadcast to the four lanes), else two rows to a ymm
  (`simd_dot.q4_pair_i8`, the activations in `pair_layout`); vpdpbusd where the CPU has VNNI, AVX2
  vpmaddubsw/vpmaddwd otherwise. On AVX2 without AVX-512 a block's four rows' sums are folded into one vector before
  they are converted (`q4_four_i8`, `q8_four_i8`): one conversion, scale and accumulator a row of activations instead
  of two or four, which keeps a tile of four rows in the 16 ymm registers (with one vector per weight row, it
  spilled). The min term uses the quantized sums (scale times the sum of a block's int8 values, as llama.cpp's q8_1
  blocks carry): the product is then the dequantized weight times the quantized activations, whose error meets weights
  centred on zero (q - 8, or scale q + min) rather than the raw 0..15 nibbles; with the float32 sums instead, the
  default model's logits left the reference 2-3x further. Weights with groups of 16 (Q6_K, Q3_K, Q2_K) stay on the
  float32 path.
- Both integer paths take activation rows in tiles of up to I8_TILE: each weight group is loaded and
  unpacked once for the tile's rows.

Each path is a function of its own that loops over a chunk's blocks itself: a call per block, with its argument
passing and reference counting, cost a 256-row product a fifth of its time. The min terms follow in one pass a tile
and chunk (`numba_block_out.add_mins`).
"""

from __future__ import annotations

import numpy as np
from numba import literal_unroll, njit, prange

from kernels.numba_activations import pair_layout, quantized, split, spread4
from kernels.numba_block_out import add_mins, store4
from kernels.numba_jit import JIT
from kernels.numba_tiling import PREFETCH_BYTES, chunk_blocks, tile_at
from kernels.simd import LANES, VNNI256, VNNI512, target_has
from kernels.simd_dot import (
    q4_four_i8_tile,
    q4_pair_i8_tile,
    q4_quad_i8_tile,
    q4_quad_split_tile,
    q8_dot32_i8_tile,
    q8_four_i8_tile,
)
from kernels.simd_scales import (
    f32x4_at,
    four_scales,
    pair_scales,
    quad_scales,
    quad_scales4_tile,
    scale_acc_tile,
    scale_quad_acc_tile,
    twice_scales,
)
from kernels.simd_vectors import (
    fold4,
    hsum,
    hsum_halves,
    hsum_quarters,
    prefetch_weights,
    vzero_tile_of,
)

f32 = np.float32
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
I8_REST = tuple(range(1, I8_TILE))  # the row counts of a last tile


@njit(**JIT)
def _quad_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N):
    """q4 on AVX-512 VNNI: a block's four rows' group in one zmm a row of activations (`q4_quad_i8`)."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a = vzero_tile_of(rows, 16)
        g = 0
        # Tiles under I8_TILE rows (single-row decode) take four groups a round: their scales in one load and
        # conversion. Full tiles share each group's scales across their rows already and gain nothing.
        while len(rows) < I8_TILE and g + 4 <= ng:
            s = base + g * 4
            sc = quad_scales4_tile(scale, s, xd, xds, g)
            prefetch_weights(q, s * 16 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16, xq, g * 32, rows), sc, 0, a)
            prefetch_weights(q, s * 16 + 64 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16 + 64, xq, g * 32 + 32, rows), sc, 1, a)
            prefetch_weights(q, s * 16 + 128 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16 + 128, xq, g * 32 + 64, rows), sc, 2, a)
            prefetch_weights(q, s * 16 + 192 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_quad_acc_tile(q4_quad_i8_tile(q, s * 16 + 192, xq, g * 32 + 96, rows), sc, 3, a)
            g += 4
        while g < ng:
            s = base + g * 4
            prefetch_weights(q, s * 16 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_acc_tile(q4_quad_i8_tile(q, s * 16, xq, g * 32, rows), quad_scales(scale, s), xd, xds, g, a)
            g += 1
        for i in range(len(ts)):
            y0, y1, y2, y3 = hsum_quarters(a[i])
            store4(out, ts[i], blk * 4, N, y0, y1, y2, y3)


@njit(**JIT)
def _four_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N):
    """q4 on AVX2 without VNNI, several rows: a block's four rows' group sums in one vector a row of activations
    (`q4_four_i8`), so a tile of four rows keeps its accumulators and the unpacked group in the 16 registers."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a = vzero_tile_of(rows, 8)
        for g in range(ng):
            s = base + g * 4
            prefetch_weights(q, s * 16 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_acc_tile(q4_four_i8_tile(q, s * 16, xq, g * 64, rows), four_scales(scale, s), xd, xds, g, a)
        for i in range(len(ts)):
            y0, y2, y1, y3 = hsum_quarters(a[i])
            store4(out, ts[i], blk * 4, N, y0, y1, y2, y3)


@njit(**JIT)
def _pair_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N):
    """q4 otherwise: rows 0|1 and 2|3 two to a ymm (`q4_pair_i8`, activations in pair layout)."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a01 = a23 = vzero_tile_of(rows, 8)
        for g in range(ng):
            s = base + g * 4
            prefetch_weights(q, s * 16 + PREFETCH_BYTES, rows, I8_TILE)
            s01, s23 = pair_scales(scale, s, f32(1.0))
            a01 = scale_acc_tile(q4_pair_i8_tile(q, s * 16, xq, g * 64, rows), s01, xd, xds, g, a01)
            a23 = scale_acc_tile(q4_pair_i8_tile(q, s * 16 + 32, xq, g * 64, rows), s23, xd, xds, g, a23)
        for i in range(len(ts)):
            y0, y1 = hsum_halves(a01[i])
            y2, y3 = hsum_halves(a23[i])
            store4(out, ts[i], blk * 4, N, y0, y1, y2, y3)


@njit(**JIT)
def _q8_four_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N):
    """q8 on AVX2 without AVX-512, several rows: a block's four rows' group sums in one vector a row of
    activations (`q8_four_i8`)."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a = vzero_tile_of(rows, 8)
        for g in range(ng):
            s = base + g * 4
            b = s * 32
            prefetch_weights(q, b + PREFETCH_BYTES, rows, I8_TILE)
            prefetch_weights(q, b + PREFETCH_BYTES + 64, rows, I8_TILE)
            a = scale_acc_tile(q8_four_i8_tile(q, b, xq, g * 32, rows), twice_scales(scale, s), xd, xds, g, a)
        for i in range(len(ts)):
            y0, y1, y2, y3 = fold4(a[i])
            store4(out, ts[i], blk * 4, N, y0, y1, y2, y3)


@njit(**JIT)
def _q8_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N):
    """q8 otherwise: a row's group to a ymm."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a0 = a1 = a2 = a3 = vzero_tile_of(rows, 8)
        for g in range(ng):
            s = base + g * 4
            b = s * 32
            prefetch_weights(q, b + PREFETCH_BYTES, rows, I8_TILE)
            prefetch_weights(q, b + PREFETCH_BYTES + 64, rows, I8_TILE)
            d0, d1, d2, d3 = f32x4_at(scale, s)
            a0 = scale_acc_tile(q8_dot32_i8_tile(q, b, xq, g * 32, rows), d0, xd, xds, g, a0)
            a1 = scale_acc_tile(q8_dot32_i8_tile(q, b + 32, xq, g * 32, rows), d1, xd, xds, g, a1)
            a2 = scale_acc_tile(q8_dot32_i8_tile(q, b + 64, xq, g * 32, rows), d2, xd, xds, g, a2)
            a3 = scale_acc_tile(q8_dot32_i8_tile(q, b + 96, xq, g * 32, rows), d3, xd, xds, g, a3)
        for i in range(len(ts)):
            store4(out, ts[i], blk * 4, N, hsum(a0[i]), hsum(a1[i]), hsum(a2[i]), hsum(a3[i]))


@njit(**JIT)
def _i8_tile(q, scale, minv, packed, xq, xd, xs4, out, ts, rows, xds, b0, b1, ng, N):
    """Rows ts of the int8 activations (at offsets rows in xq, their scales from xds in xd) times blocks
    b0 .. b1 - 1: each weight group is loaded and unpacked once for all the tile's rows. The path depends on
    the weight kind, the CPU and whether the tile has several rows (a lone row keeps two or four accumulators);
    the min terms follow for them all."""
    if packed and VNNI512:
        _quad_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N)
    elif packed and FOUR_I8 and len(rows) > 1:
        _four_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N)
    elif packed:
        _pair_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N)
    elif FOUR_Q8 and len(rows) > 1:
        _q8_four_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N)
    else:
        _q8_i8_blocks(q, scale, xq, xd, out, ts, rows, xds, b0, b1, ng, N)
    add_mins(out, minv, xs4, ts, xds, b0, b1, ng, N)


@njit(**JIT)
def _split_tile(q, scale, minv, xp, xs, xs4, out, ts, rows, xds, b0, b1, ng, N):
    """`_i8_tile`'s AVX-512 VNNI q4 path over activations in four int8 pieces (`split_rows`): float32
    activations to within float32 rounding of the products, on integer dot products."""
    for blk in range(b0, b1):
        base = blk * ng * 4
        a = vzero_tile_of(rows, 16)
        for g in range(ng):
            s = base + g * 4
            prefetch_weights(q, s * 16 + PREFETCH_BYTES, rows, I8_TILE)
            a = scale_acc_tile(q4_quad_split_tile(q, s * 16, xp, g * 128, rows), quad_scales(scale, s), xs, xds, g, a)
        for i in range(len(ts)):
            y0, y1, y2, y3 = hsum_quarters(a[i])
            store4(out, ts[i], blk * 4, N, y0, y1, y2, y3)
    add_mins(out, minv, xs4, ts, xds, b0, b1, ng, N)


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
    xp, xs, xsum = split(x)
    xs4, xsf = spread4(xsum, mf), xs.reshape(T * ng)
    nb = (N + 3) // 4
    cb = chunk_blocks(ng, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _split_chunk(q, scale, minv, xp, T, K, xsf, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)


@njit(parallel=True, **JIT)
def matvec_i8(q, scale, minv, mf, is_q4, x, out, threads):
    """`matvec_q4` (`is_q4`) or `matvec_q8` with groups of 32, the activations quantized to int8 per
    32-block (integer dot products; q4 reads them in `pair_layout`)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // 32
    xq, xd, xsum = quantized(x)
    xs4, xdf = spread4(xsum, mf), xd.reshape(T * ng)
    pairs = is_q4 and not VNNI512
    xqf = pair_layout(xq) if pairs else xq.reshape(T * K)
    KX = 2 * K if pairs else K
    nb = (N + 3) // 4
    cb = chunk_blocks(ng, nb, threads)
    for c in prange((nb + cb - 1) // cb):
        _i8_chunk(q, scale, minv, is_q4, xqf, T, KX, xdf, xs4, out, c * cb, min(nb, (c + 1) * cb), ng, N)

"""Products of many activation rows on Intel AMX tiles, exact to float32 rounding.

AMX multiplies tiles of bf16 values and adds the products up in float32 (TDPBF16PS: a 16 x 32
tile times a 32 x 16 one, 8192 multiply-adds, in ~16 cycles: ~30x the float32 FMAs of a core).
Nothing here is rounded to bf16:

- weights: a group's integers q (0..15 for q4, -128..127 for q8) are bf16 values exactly: one A tile
  (16 weight rows x the group's 32 values) with no arithmetic but a conversion;
- activations: each float32 x is split into three bf16 parts, x = hi + mid + lo, each the next 8
  significant bits of what remains (24 in all: exact), so the tiles' products are exact and only
  their float32 sums round, as in a float32 product: sum q x = sum q hi + sum q mid + sum q lo.
  (Parts below float32's normal range, |x| < ~1e-31, are dropped: AMX reads subnormals as zero.)

A tile is 32 deep, one group: per group and t-block, three tile products (one per part of x) give
P[n, t] = sum_k q[n, k] x[t, k] in an accumulator tile, which goes to memory and into the float32
result as the matrix-vector kernels do it, acc[n, t] += d[n, g] P[n, t] + m[n, g] xsum[t, g] (16
values of t a vector; xsum: the group's sum of x).

A work item is 16 weight rows and up to four t-blocks of 16 activation rows: four accumulator tiles
(tmm0-3), the weight's A tile (tmm4) and one B tile at a time (tmm7). With fewer t-blocks an item
takes several 16-row blocks of the weight (up to four accumulator tiles in all). Items go chunk of
t-blocks by chunk, so that a chunk's B tiles stay in L2 while its items pass. An item's weight rows
are one contiguous stretch of the backend's blocked layout (kernels/numba_layout.py): while it works it
prefetches the stretch of the item its thread most likely takes next (weights come from DRAM).

The activations are split once per call into B tiles (`split_rows`): tile (part, t-block, group)
holds 16 rows of 32 bf16, row kp being [x[t, 2kp], x[t, 2kp + 1] for t = 0..15] (AMX's pair layout
for B): a 16 x 16 transpose of 32-bit pairs, done in registers (`split_block`).

Inside a parallel kernel no whole-array expression (`a[:] = 0`): numba makes it a parallel loop of its
own, and with the backend's chunk size of 1 (`numba.set_parallel_chunksize`) an element a work item.

The tile instructions are kernels/simd_amx.py's (`tiles`: None for the CPU's, emulated ones otherwise): each work
item loads the tile configuration and releases the tiles when done, so a thread holds no tile state between
items.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from kernels.numba_jit import JIT
from kernels.simd_amx import (
    ACC_AT,
    add_group,
    aligned,
    amx_bf16,
    amx_config,
    amx_load,
    amx_release,
    config,
    elem_ptr,
    prefetch_group,
    store_acc,
    work_item,
    work_items,
    write_out,
    zero_acc,
)

ROWS = 16  # rows of a tile: weight rows of an A tile, activation rows (a t-block) of a B tile
GROUP = 32  # weights a group: one tile's depth (32 bf16, 64 bytes a row)
PARTS = 3  # bf16 parts of a float32 activation
TILE = ROWS * GROUP  # uint16 values a bf16 tile

CONFIG = config(dict.fromkeys(range(8), (ROWS, 64)))  # tiles 0-7 of 16 rows x 64 bytes


# ---- conversions ------------------------------------------------------------------------------

_I16, _I32, _F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()


def _q_group(packed):
    def impl(typingctx, q, qi, a, ai):
        def codegen(context, builder, sig, args):
            qa, qi_, aa, ai_ = args
            qp = elem_ptr(context, builder, q, qa, qi_, qi)
            n = 16 if packed else 32
            ld = builder.load(builder.bitcast(qp, ir.VectorType(ir.IntType(8), n).as_pointer()))
            ld.align = 1
            vi, v32 = ir.VectorType(_I32, n), ir.VectorType(_I32, 32)
            if packed:  # values 0..15: low nibbles; 16..31: high nibbles
                w = builder.zext(ld, vi)
                lo = builder.and_(w, ir.Constant(vi, [15] * n))
                hi = builder.lshr(w, ir.Constant(vi, [4] * n))
                f = builder.uitofp(
                    builder.shuffle_vector(lo, hi, ir.Constant(v32, list(range(32)))), ir.VectorType(_F32, 32)
                )
            else:
                f = builder.sitofp(builder.sext(ld, vi), ir.VectorType(_F32, 32))
            # an integer of at most 8 significant bits: its float32 bits' top half is its bf16 exactly
            w16 = builder.bitcast(f, ir.VectorType(_I16, 64))
            bits = builder.shuffle_vector(w16, w16, ir.Constant(v32, list(range(1, 64, 2))))
            dst = builder.bitcast(elem_ptr(context, builder, a, aa, ai_, ai), ir.VectorType(_I16, 32).as_pointer())
            builder.store(bits, dst).align = 2
            return context.get_dummy_value()

        return types.none(q, qi, a, ai), codegen

    impl.__name__ = "q4_bf16" if packed else "q8_bf16"
    impl.__doc__ = (
        "16 bytes of packed nibbles (0..15)" if packed else "32 int8 weights"
    ) + " at q[qi] -> 32 bf16 at a[ai], the same integers exactly."
    return intrinsic(impl)


q4_bf16 = _q_group(True)
q8_bf16 = _q_group(False)


def _transpose16(builder, rows):
    """16 vectors of 16 lanes -> the 16 columns: four rounds of interleaving row i with row i + 8."""
    v16 = ir.VectorType(_I32, 16)
    lo = ir.Constant(v16, [k // 2 + (k % 2) * 16 for k in range(16)])
    hi = ir.Constant(v16, [8 + k // 2 + (k % 2) * 16 for k in range(16)])
    for _ in range(4):
        rows = [builder.shuffle_vector(rows[i], rows[i + 8], m) for i in range(8) for m in (lo, hi)]
    return rows


@intrinsic
def split_block(typingctx, x, xi, stride, xs, oi, part):
    """16 rows of 32 float32 (row t at x[xi + t * stride]) -> three bf16 B tiles that add up to them
    exactly, at xs[oi], xs[oi + part], xs[oi + 2 part]: each part the next 8 significant bits of what
    remains (24 in all), in AMX's pair layout (tile row kp: [x[t, 2kp], x[t, 2kp + 1] for t = 0..15])."""

    def codegen(context, builder, sig, args):
        xa, xi_, st, xsa, oi_, pt = args
        v32, v16, f32v = ir.VectorType(_I32, 32), ir.VectorType(_I32, 16), ir.VectorType(_F32, 32)
        mask32 = ir.Constant(v32, [0xFFFF0000] * 32)
        even = ir.Constant(v16, list(range(0, 32, 2)))
        odd = ir.Constant(v16, list(range(1, 32, 2)))
        parts: list[list[ir.Value]] = [[], [], []]
        for t in range(ROWS):
            i = builder.add(
                context.cast(builder, xi_, xi, types.intp),
                builder.mul(context.cast(builder, st, stride, types.intp), ir.Constant(ir.IntType(64), t)),
            )
            ld = builder.load(builder.bitcast(elem_ptr(context, builder, x, xa, i, types.intp), f32v.as_pointer()))
            ld.align = 4
            f = ld
            for k in range(3):  # the top 16 bits of what remains; the third part's low 16 are zero
                bits = builder.and_(builder.bitcast(f, v32), mask32)
                pairs = builder.or_(
                    builder.lshr(builder.shuffle_vector(bits, bits, even), ir.Constant(v16, [16] * 16)),
                    builder.shuffle_vector(bits, bits, odd),
                )
                parts[k].append(pairs)
                f = builder.fsub(f, builder.bitcast(bits, f32v))
        base = context.cast(builder, oi_, oi, types.intp)
        for k in range(3):
            off = builder.add(
                base, builder.mul(context.cast(builder, pt, part, types.intp), ir.Constant(ir.IntType(64), k))
            )
            for kp, col in enumerate(_transpose16(builder, parts[k])):
                dst = elem_ptr(
                    context, builder, xs, xsa, builder.add(off, ir.Constant(ir.IntType(64), kp * GROUP)), types.intp
                )
                builder.store(col, builder.bitcast(dst, v16.as_pointer())).align = 4
        return context.get_dummy_value()

    return types.none(x, xi, stride, xs, oi, part), codegen


@njit(parallel=True, **JIT)
def split_rows(x, xs, xsum):
    """x [T, K] -> B tiles of its bf16 parts, and its groups' sums.

    xs: (3 parts, ceil(T / 16) t-blocks, K / 32 groups, 16 pair rows, 32), flat uint16, x = the
    three parts' sum exactly; rows past T are zero. xsum: (t-blocks, groups, 16), flat: each group's
    float32 sum (zero past T)."""
    T, K = x.shape
    ng = K // GROUP
    TB = (T + ROWS - 1) // ROWS
    part = TB * ng * TILE
    flat = x.reshape(T * K)
    tail = np.empty(ROWS * K, np.float32)  # the last t-block's rows, zero past T
    t0 = (TB - 1) * ROWS
    for u in range(ROWS * K):
        tail[u] = flat[t0 * K + u] if t0 * K + u < T * K else np.float32(0.0)
    for tb in prange(TB):
        for g in range(ng):
            if tb < TB - 1:
                split_block(flat, (tb * ROWS) * K + g * GROUP, K, xs, (tb * ng + g) * TILE, part)
            else:
                split_block(tail, g * GROUP, K, xs, (tb * ng + g) * TILE, part)
            for tt in range(ROWS):
                t = tb * ROWS + tt
                s = np.float32(0.0)
                if t < T:
                    for kk in range(GROUP):
                        s += x[t, g * GROUP + kk]
                xsum[(tb * ng + g) * ROWS + tt] = s


@njit(**JIT)
def _q_tile(q, packed, N4, ng, nb, g, a):
    """The 16 weight rows nb * 16 .. of group g, their integers q, as one bf16 A tile in `a` (rows
    past N4 zero)."""
    per = GROUP // 2 if packed else GROUP
    for r in range(ROWS):
        row = nb * ROWS + r
        if row < N4:
            si = (row // 4 * ng + g) * 4 + row % 4
            if packed:
                q4_bf16(q, si * per, a, r * GROUP)
            else:
                q8_bf16(q, si * per, a, r * GROUP)
        else:
            for k in range(GROUP):
                a[r * GROUP + k] = 0


@njit(**JIT)
def _dot(i, tiles, me):
    """C tile i (tmm i) += the A tile in tmm 4 times the B tile in tmm 7."""
    if i == 0:
        amx_bf16(0, 4, 7, tiles, me)
    elif i == 1:
        amx_bf16(1, 4, 7, tiles, me)
    elif i == 2:
        amx_bf16(2, 4, 7, tiles, me)
    else:
        amx_bf16(3, 4, 7, tiles, me)


@njit(parallel=True, **JIT)
def matmul_amx(q, scale, minv, mf, packed, x, out, cfg, threads, tiles):
    """out [T, N] = x [T, K] times a blocked q4 (`packed`) or q8 weight with groups of 32 (`q`: its bytes, uint8;
    `cfg`: CONFIG; `threads`: numba's thread count now, for the per-thread scratch; `tiles`: None, or emulated
    tiles (kernels/simd_amx.py)); the mins are minv * mf (`Blocked.min_operand`)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // GROUP
    N4 = (N + 3) // 4 * 4
    TB, NB, per_item, NI, TC = work_items(T, N)
    xs = aligned(PARTS * TB * ng * TILE, np.uint16)
    xsum = np.empty(TB * ng * ROWS, np.float32)
    split_rows(x, xs, xsum)
    per = GROUP // 2 if packed else GROUP  # weight bytes a row's group
    a_scr = aligned(threads * TILE, np.uint16).reshape(threads, TILE)
    scr = aligned(threads * 2 * ACC_AT, np.float32).reshape(threads, 2 * ACC_AT)
    part = TB * ng * TILE
    for item in prange(NI * TC):
        nb0, nbs, tb0, nt, n0, n1 = work_item(item, TB, NB, per_item, NI, TC, threads, ng)
        me = numba.get_thread_id()
        a, sums, acc = a_scr[me], scr[me, :ACC_AT], scr[me, ACC_AT:]  # A tile, a group's tile sums, the results
        for u in range(nbs * nt * ROWS * ROWS):
            acc[u] = 0
        amx_config(cfg, tiles, me)
        for g in range(ng):
            prefetch_group(q, scale, minv, n0, n1, per, g, ng)
            for j in range(nbs):
                _q_tile(q, packed, N4, ng, nb0 + j, g, a)
                amx_load(4, a, 0, 64, tiles, me)
                for i in range(nt):
                    c = j * nt + i
                    zero_acc(c, tiles, me)
                    b = ((tb0 + i) * ng + g) * TILE
                    for s in range(PARTS):
                        amx_load(7, xs, s * part + b, 64, tiles, me)
                        _dot(c, tiles, me)
            for c in range(nbs * nt):
                store_acc(c, sums, tiles, me)
            add_group(acc, sums, scale, minv, mf, None, xsum, nb0, nbs, tb0, nt, g, ng, N4)
        amx_release(tiles, me)
        write_out(acc, out, nb0, nbs, tb0, nt)

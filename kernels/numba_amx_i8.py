"""Products of many activation rows on Intel AMX's int8 tiles, in the int8 model (`--activations q8`).

The activations are quantized per 32-block as every int8 kernel does it (kernels/numba_activations.py
`quantize_rows`: x ~ xd * xq), and the tiles add up integer products exactly: TDPBUSD (unsigned times signed
bytes) for q4 weights, whose integers are 0..15, TDPBSSD (signed times signed) for q8 ones. So the result is
kernels/reference.py's `int8_product` to float32 rounding of the per-group terms.

A tile is one group deep (32 bytes): per group, t-block and 16 weight rows, one tile product gives
P[n, t] = sum_k q[n, k] xq[t, k] (int32), which goes to memory and into the float32 result,
acc[n, t] += d[n, g] xd[t, g] P[n, t] + m[n, g] xsum[t, g] (xsum = xd * sum(xq): the min term of the int8 model).
The float kernel (kernels/numba_amx.py) takes three bf16 products a group for the same P; here it is one, and
the B tiles are a sixth of the bytes (one byte a value, not three bf16 parts).

Tiles: the accumulators tmm0-3 (16 rows x 16 int32), the weight's A tile tmm4 (16 rows x 32 bytes), a B tile tmm7
(8 rows of 16 activation rows x 4 bytes: row k4 holds xq[t, 4 k4 .. 4 k4 + 3] for t = 0..15, AMX's layout for
B). Work items, their order and the weight prefetch are the float kernel's (kernels/simd_amx.py `work_items`).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from kernels.numba_activations import quantize_rows
from kernels.numba_jit import JIT
from kernels.simd_amx import (
    ACC_AT,
    add_group,
    aligned,
    amx_config,
    amx_load,
    amx_release,
    amx_s8s8,
    amx_u8s8,
    config,
    elem_ptr,
    prefetch_group,
    store_acc,
    work_item,
    work_items,
    write_out,
    zero_acc,
)

ROWS = 16  # weight rows of an A tile; activation rows (a t-block) of a B tile
GROUP = 32  # bytes a group: one tile's depth
A_BYTES = ROWS * GROUP
B_BYTES = GROUP // 4 * 64

CONFIG = config({0: (ROWS, 64), 1: (ROWS, 64), 2: (ROWS, 64), 3: (ROWS, 64), 4: (ROWS, GROUP), 7: (GROUP // 4, 64)})


@njit(parallel=True, **JIT)
def pack_b(x, xq, xd, xsum, xb, xdt, xst):
    """x [T, K] quantized per 32-block (`quantize_rows`: xq [T, K], xd and xsum [T, K / 32]), t-block by t-block
    in parallel, then xq -> B tiles xb, flat (t-blocks, K / 32 groups, 8 rows, 64 bytes): tile (tb, g), row k4,
    bytes 4 t .. 4 t + 3 = xq[16 tb + t, 32 g + 4 k4 ..]; xd and xsum -> xdt, xst (t-blocks, groups, 16). Zero past
    T."""
    T, K = xq.shape
    ng = K // GROUP
    TB = (T + ROWS - 1) // ROWS
    words = xq.reshape(T * K).view(np.int32)  # four bytes of a row, K / 4 a row
    bw = xb.view(np.int32)
    for tb in prange(TB):
        t0, t1 = tb * ROWS, min(T, tb * ROWS + ROWS)
        quantize_rows(x[t0:t1], xq[t0:t1], xd[t0:t1], xsum[t0:t1])
        for g in range(ng):
            for k4 in range(GROUP // 4):
                for tt in range(ROWS):
                    t = tb * ROWS + tt
                    bw[((tb * ng + g) * (GROUP // 4) + k4) * ROWS + tt] = (
                        words[t * (K // 4) + g * (GROUP // 4) + k4] if t < T else 0
                    )
            for tt in range(ROWS):
                t = tb * ROWS + tt
                xdt[(tb * ng + g) * ROWS + tt] = xd[t, g] if t < T else np.float32(0.0)
                xst[(tb * ng + g) * ROWS + tt] = xsum[t, g] if t < T else np.float32(0.0)


def _row_impl(packed):
    def impl(typingctx, q, qi, a, ai):
        def codegen(context, builder, sig, args):
            qa, qi_, aa, ai_ = args
            n = GROUP // 2 if packed else GROUP
            v8 = ir.VectorType(ir.IntType(8), n)
            ld = builder.load(builder.bitcast(elem_ptr(context, builder, q, qa, qi_, qi), v8.as_pointer()))
            ld.align = 1
            if packed:  # values 0..15: low nibbles; 16..31: high nibbles
                lo = builder.and_(ld, ir.Constant(v8, [15] * n))
                hi = builder.lshr(ld, ir.Constant(v8, [4] * n))
                ld = builder.shuffle_vector(
                    lo, hi, ir.Constant(ir.VectorType(ir.IntType(32), GROUP), list(range(GROUP)))
                )
            dst = elem_ptr(context, builder, a, aa, ai_, ai)
            builder.store(ld, builder.bitcast(dst, ld.type.as_pointer())).align = 1
            return context.get_dummy_value()

        return types.none(q, qi, a, ai), codegen

    impl.__name__ = "q4_row" if packed else "q8_row"
    impl.__doc__ = (
        "16 bytes of packed nibbles at q[qi] -> their 32 values (0..15) as bytes at a[ai]"
        if packed
        else "32 int8 weights at q[qi] -> a[ai]"
    )
    return intrinsic(impl)


q4_row = _row_impl(True)
q8_row = _row_impl(False)


@njit(**JIT)
def a_tile(q, packed, N4, ng, nb, g, a):
    """The integers of weight rows nb * 16 .. nb * 16 + 15 in group g, 32 bytes a row, into `a` (int8): q4's
    nibbles (0..15: low nibbles first, then high) or q8's bytes; rows past N4 zero."""
    for r in range(ROWS):
        row = nb * ROWS + r
        if row < N4:
            si = (row // 4 * ng + g) * 4 + row % 4
            if packed:
                q4_row(q, si * (GROUP // 2), a, r * GROUP)
            else:
                q8_row(q, si * GROUP, a, r * GROUP)
        else:
            for j in range(GROUP):
                a[r * GROUP + j] = 0


@njit(**JIT)
def _dot(i, packed, tiles, me):
    """Accumulator tile i += the A tile (tmm4: q4 nibbles, unsigned, or q8 bytes) times the B tile (tmm7)."""
    if packed:
        if i == 0:
            amx_u8s8(0, 4, 7, tiles, me)
        elif i == 1:
            amx_u8s8(1, 4, 7, tiles, me)
        elif i == 2:
            amx_u8s8(2, 4, 7, tiles, me)
        else:
            amx_u8s8(3, 4, 7, tiles, me)
    elif i == 0:
        amx_s8s8(0, 4, 7, tiles, me)
    elif i == 1:
        amx_s8s8(1, 4, 7, tiles, me)
    elif i == 2:
        amx_s8s8(2, 4, 7, tiles, me)
    else:
        amx_s8s8(3, 4, 7, tiles, me)


@njit(parallel=True, **JIT)
def matmul_amx_i8(q, scale, minv, mf, packed, x, out, cfg, threads, tiles):
    """out [T, N] = x [T, K], quantized to int8 per 32-block, times a blocked q4 (`packed`) or q8 weight with
    groups of 32 (`q`: its bytes, uint8; `cfg`: CONFIG; `threads`: numba's thread count now; `tiles`: None, or
    emulated tiles); the mins are minv * mf (`Blocked.min_operand`)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // GROUP
    N4 = (N + 3) // 4 * 4
    TB, NB, per_item, NI, TC = work_items(T, N)
    xq = np.empty((T, K), np.int8)
    xd = np.empty((T, ng), np.float32)
    xsum = np.empty((T, ng), np.float32)
    xb = aligned(TB * ng * B_BYTES, np.int8)
    xdt = np.empty(TB * ng * ROWS, np.float32)
    xst = np.empty(TB * ng * ROWS, np.float32)
    pack_b(x, xq, xd, xsum, xb, xdt, xst)
    per = GROUP // 2 if packed else GROUP
    a_scr = aligned(threads * A_BYTES, np.int8).reshape(threads, A_BYTES)
    scr = aligned(threads * 2 * ACC_AT, np.float32).reshape(threads, 2 * ACC_AT)
    for item in prange(NI * TC):
        nb0, nbs, tb0, nt, n0, n1 = work_item(item, TB, NB, per_item, NI, TC, threads, ng)
        me = numba.get_thread_id()
        a, sums, acc = a_scr[me], scr[me, :ACC_AT].view(np.int32), scr[me, ACC_AT:]
        for u in range(nbs * nt * ROWS * ROWS):
            acc[u] = 0
        amx_config(cfg, tiles, me)
        for g in range(ng):
            prefetch_group(q, scale, minv, n0, n1, per, g, ng)
            for j in range(nbs):
                a_tile(q, packed, N4, ng, nb0 + j, g, a)
                amx_load(4, a, 0, GROUP, tiles, me)
                for i in range(nt):
                    c = j * nt + i
                    zero_acc(c, tiles, me)
                    amx_load(7, xb, ((tb0 + i) * ng + g) * B_BYTES, 64, tiles, me)
                    _dot(c, packed, tiles, me)
            for c in range(nbs * nt):
                store_acc(c, sums, tiles, me)
            add_group(acc, sums, scale, minv, mf, xdt, xst, nb0, nbs, tb0, nt, g, ng, N4)
        amx_release(tiles, me)
        write_out(acc, out, nb0, nbs, tb0, nt)

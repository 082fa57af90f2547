"""Products of many activation rows on Intel AMX tiles, exact to float32 rounding.

AMX multiplies tiles of bf16 values and adds the products up in float32 (TDPBF16PS: a 16 x 32
tile times a 32 x 16 one, 8192 multiply-adds, in ~16 cycles: ~30x the float32 FMAs of a core).
Nothing here is rounded to bf16:

- activations: each float32 x is split into three bf16 parts, x = hi + mid + lo, each the next 8
  significant bits of what remains (24 in all: exact), so the tiles' products are exact and only
  their float32 sums round, as in a float32 product: sum q x = sum q hi + sum q mid + sum q lo.
  (Parts below float32's normal range, |x| < ~1e-31, are dropped: AMX reads subnormals as zero.)
- weights: a q4 value (0..15) or q8 value (-128..127) times its group's float16 scale d has at most
  11 + 4 or 11 + 8 significant bits: two or three bf16 values exactly (two or three A tiles of 16 rows
  x 32), so the groups need no scaling of their own:
  one accumulator tile adds up the whole row, out[t, n] = sum_k (d q)[n, k] x[t, k]; the mins, float16
  values too, are one more product of two bf16 parts with the groups' sums of x (also split in three).

A work item is 16 weight rows and up to four t-blocks of 16 activation rows: four accumulator tiles
(tmm0-3), the weight parts of a group (tmm4-6) and one B tile at a time (tmm7); per group and t-block,
2 x 3 (q4) or 3 x 3 (q8) tile products.

Layouts: the weight stays in the backend's blocked layout (kernels/numba_layout.py); a work item
converts its 16 rows' group to A tiles in a per-thread scratch. The activations are split once per
call into B tiles (`split_rows`): tile (part, t-block, group) holds 16 rows of 32 bf16, row kp being
[x[t, 2kp], x[t, 2kp + 1] for t = 0..15] (AMX's pair layout for B). Items go chunk of t-blocks by
chunk, so that a chunk's B tiles stay in L2 while its items pass.

Inside a parallel kernel no whole-array expression (`a[:] = 0`): numba makes it a parallel loop of its
own, and with the backend's chunk size of 1 (`numba.set_parallel_chunksize`) an element a work item
(17x slower `split_rows` at 512 rows).

Linux hands a process the tile state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, process
wide); `available()` asks once. The tile instructions are inline assembly (numba has no AMX types):
each work item loads the tile configuration and releases the tiles when done, so a thread holds
no tile state between items.
"""
from __future__ import annotations

import ctypes
import functools

import llvmlite.binding as llb
import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from kernels.numba_jit import JIT, JIT_EXACT
from kernels.simd import f32_at, target_has

llb.initialize_native_asmparser()  # numba compiles inline assembly only with LLVM's parser loaded

ROWS = 16  # rows of a tile: weight rows of an A tile, activation rows (a t-block) of a B tile
GROUP = 32  # weights a group: one tile's depth (32 bf16, 64 bytes a row)
T_CHUNK = 4  # t-blocks a work item (64 activation rows)
ACCS = 4  # accumulator tiles, tmm0-3: one per t-block and 16 weight rows of a work item
PARTS = 3  # bf16 parts of a float32
TILE = ROWS * GROUP  # uint16 values a bf16 tile

# palette 1; tiles 0-7 of 16 rows x 64 bytes
CONFIG = np.zeros(64, np.uint8)
CONFIG[0] = 1
CONFIG[16:32].view(np.uint16)[:8] = 64
CONFIG[48:56] = ROWS

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def available() -> bool:
    """Whether this process can run the AMX kernels: the compile target has AMX tiles with bf16, and
    Linux grants the process the tile state (asked once)."""
    if not (target_has("amx-tile") and target_has("amx-bf16")):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


# ---- tile instructions (inline assembly, AT&T operand order) --------------------------------------

def _asm(builder, text, operands=()):
    fty = ir.FunctionType(ir.VoidType(), [o.type for o in operands])
    constraint = ",".join(["r"] * len(operands) + ["~{memory}"])
    builder.call(ir.InlineAsm(fty, text, constraint, side_effect=True), list(operands))


def _elem_ptr(context, builder, aty, a, i, ity):
    """The address of element i (of integer type ity) of a 1-D array a (of type aty)."""
    return builder.gep(context.make_array(aty)(context, builder, a).data, [context.cast(builder, i, ity, types.intp)])


def _byte_ptr(context, builder, aty, a, i, ity):
    return builder.bitcast(_elem_ptr(context, builder, aty, a, i, ity), ir.IntType(8).as_pointer())


def _literal(*regs):
    return all(isinstance(r, types.IntegerLiteral) for r in regs)


@intrinsic
def tile_config(typingctx, cfg):
    """Load the tile configuration (`CONFIG`) on this thread."""
    def codegen(context, builder, sig, args):
        zero = context.get_constant(types.intp, 0)
        _asm(builder, "ldtilecfg ($0)", [_byte_ptr(context, builder, cfg, args[0], zero, types.intp)])
        return context.get_dummy_value()

    return types.none(cfg), codegen


@intrinsic
def tile_release(typingctx):
    """Give the thread's tile state back."""
    def codegen(context, builder, sig, args):
        _asm(builder, "tilerelease")
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def tile_zero(typingctx, reg):
    """tmm[reg] = 0 (reg a constant)."""
    if not _literal(reg):
        return None

    def codegen(context, builder, sig, args):
        _asm(builder, f"tilezero %tmm{reg.literal_value}")
        return context.get_dummy_value()

    return types.none(reg), codegen


def _tile_memory(template: str, doc: str):
    """An intrinsic (reg, a, i, stride) moving tile `reg` (a constant) from or to 16 rows of `stride`
    bytes from a[i] on: `template` is the instruction, {reg} its tile."""
    def impl(typingctx, reg, a, i, stride):
        if not _literal(reg):
            return None

        def codegen(context, builder, sig, args):
            p = _byte_ptr(context, builder, a, args[1], args[2], i)
            s = context.cast(builder, args[3], stride, types.int64)
            _asm(builder, template.format(reg=reg.literal_value), [p, s])
            return context.get_dummy_value()

        return types.none(reg, a, i, stride), codegen

    impl.__doc__ = doc
    return intrinsic(impl)


tile_load = _tile_memory("tileloadd ($0,$1,1), %tmm{reg}", "tmm[reg] = 16 rows of `stride` bytes from a[i] on.")
tile_store = _tile_memory("tilestored %tmm{reg}, ($0,$1,1)", "16 rows of `stride` bytes from a[i] on = tmm[reg].")


@intrinsic
def tile_dot(typingctx, c, a, b):
    """tmm[c] += tmm[a] times tmm[b] (bf16 pairs, float32 sums; constants)."""
    if not _literal(c, a, b):
        return None

    def codegen(context, builder, sig, args):
        _asm(builder, f"tdpbf16ps %tmm{b.literal_value}, %tmm{a.literal_value}, %tmm{c.literal_value}")
        return context.get_dummy_value()

    return types.none(c, a, b), codegen


# ---- conversions ------------------------------------------------------------------------------

_I16, _I32, _F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()


def _split_store(builder, f, ptr, parts, stride):
    """float32 vector f -> `parts` bf16 vectors, f = sum of them (exact when f has at most 8 * parts
    significant bits), stored at ptr, ptr + stride, ... (i16 pointers, stride in elements)."""
    n = f.type.count
    vi = ir.VectorType(_I32, n)
    for k in range(parts):
        hi = builder.and_(builder.bitcast(f, vi), ir.Constant(vi, [0xFFFF0000] * n))
        dst = builder.bitcast(builder.gep(ptr, [ir.Constant(_I32, k * stride)]), ir.VectorType(_I16, n).as_pointer())
        st = builder.store(builder.trunc(builder.lshr(hi, ir.Constant(vi, [16] * n)), ir.VectorType(_I16, n)), dst)
        st.align = 2
        f = builder.fsub(f, builder.bitcast(hi, f.type))


def _scaled_group(packed):
    def impl(typingctx, q, qi, d, parts, a, ai):
        if d != types.float32 or not _literal(parts):
            return None

        def codegen(context, builder, sig, args):
            qa, qi_, d_, _, aa, ai_ = args
            qp = _elem_ptr(context, builder, q, qa, qi_, qi)
            ap = _elem_ptr(context, builder, a, aa, ai_, ai)
            n = 16 if packed else 32
            ld = builder.load(builder.bitcast(qp, ir.VectorType(ir.IntType(8), n).as_pointer()))
            ld.align = 1
            vi, vf = ir.VectorType(_I32, n), ir.VectorType(_F32, n)
            if packed:  # values 0..15: low nibbles; 16..31: high nibbles
                w = builder.zext(ld, vi)
                lo = builder.uitofp(builder.and_(w, ir.Constant(vi, [15] * n)), vf)
                hi = builder.uitofp(builder.lshr(w, ir.Constant(vi, [4] * n)), vf)
                f = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
            else:
                f = builder.sitofp(builder.sext(ld, vi), vf)
            undef = ir.Constant(ir.VectorType(_F32, 32), ir.Undefined)
            dv = builder.shuffle_vector(builder.insert_element(undef, d_, ir.Constant(_I32, 0)), undef,
                                        ir.Constant(ir.VectorType(_I32, 32), [0] * 32))
            _split_store(builder, builder.fmul(f, dv), ap, parts.literal_value, TILE)
            return context.get_dummy_value()

        return types.none(q, qi, d, parts, a, ai), codegen

    impl.__name__ = "q4_scaled_bf16" if packed else "q8_scaled_bf16"
    impl.__doc__ = (("16 bytes of packed nibbles" if packed else "32 int8 weights") + " at q[qi] times d -> `parts` "
                    "rows of 32 bf16 at a[ai], a[ai + TILE], ... that add up to them (exact for d a float16 value "
                    "and parts 2 (q4) or 3 (q8)).")
    return intrinsic(impl)


q4_scaled_bf16 = _scaled_group(True)
q8_scaled_bf16 = _scaled_group(False)


@intrinsic
def f32_bits(typingctx, v):
    """The bits of a float32, as uint32."""
    if v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I32)

    return types.uint32(v), codegen


@intrinsic
def bits_f32(typingctx, u):
    """The float32 with these bits (the low 32 of an integer)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width != 32:
            v = builder.trunc(v, _I32)
        return builder.bitcast(v, _F32)

    return types.float32(u), codegen


@njit(**JIT_EXACT)
def _split3(v):
    """A float32 as three bf16 values (bits) adding up to it exactly: each the next 8 significant bits."""
    mask = np.uint32(0xFFFF0000)
    hi = f32_bits(v) & mask
    r = v - bits_f32(hi)
    mid = f32_bits(r) & mask
    lo = f32_bits(r - bits_f32(mid))  # at most 8 significant bits left: a bf16 value
    return np.uint16(hi >> 16), np.uint16(mid >> 16), np.uint16(lo >> 16)


@njit(parallel=True, **JIT_EXACT)
def split_rows(x, xs, xsum, xsb):
    """x [T, K] -> B tiles of its bf16 parts and of its groups' sums.

    xs: (3 parts, ceil(T / 16) t-blocks, K / 32 groups, 16 pair rows, 32), flat uint16, x = the
    three parts' sum exactly; rows past T are zero. xsum [t-blocks, groups, 16]: each group's float32
    sum; xsb: the same three parts of xsum as B tiles over groups (3, t-blocks, chunks of 32 groups,
    16, 32)."""
    T, K = x.shape
    ng = K // GROUP
    TB = xsum.shape[0]
    nch = (ng + GROUP - 1) // GROUP
    part, mpart = TB * ng * TILE, TB * nch * TILE
    # xsb is zeroed t-block by t-block: a whole-array `xsb[:] = 0` here would be a parallel loop of
    # its own, an element a work item
    for tb in prange(TB):
        for k in range(PARTS):
            xsb[k * mpart + tb * nch * TILE: k * mpart + (tb + 1) * nch * TILE] = 0
        for tt in range(ROWS):
            t = tb * ROWS + tt
            for g in range(ng):
                s = np.float32(0.0)
                base = (tb * ng + g) * TILE + tt * 2
                for kk in range(GROUP):
                    v = x[t, g * GROUP + kk] if t < T else np.float32(0.0)
                    s += v
                    i = base + (kk // 2) * GROUP + kk % 2
                    xs[i], xs[part + i], xs[2 * part + i] = _split3(v)
                xsum[tb, g, tt] = s
                c, gg = g // GROUP, g % GROUP
                i = (tb * nch + c) * TILE + (gg // 2) * GROUP + tt * 2 + gg % 2
                xsb[i], xsb[mpart + i], xsb[2 * mpart + i] = _split3(s)


@njit(**JIT)
def _a_tiles(q, scale, packed, parts, N4, ng, nb, g, a):
    """The 16 weight rows nb * 16 .. of group g, scaled (d q), as `parts` bf16 A tiles in `a` (rows past
    N4 zero)."""
    per = GROUP // 2 if packed else GROUP
    for r in range(ROWS):
        row = nb * ROWS + r
        if row < N4:
            si = (row // 4 * ng + g) * 4 + row % 4
            d = f32_at(scale, si)
            if packed:
                q4_scaled_bf16(q, si * per, d, 2, a, r * GROUP)
            else:
                q8_scaled_bf16(q, si * per, d, 3, a, r * GROUP)
        else:
            for k in range(parts):
                a[k * TILE + r * GROUP: k * TILE + (r + 1) * GROUP] = 0


@njit(**JIT)
def _m_tiles(minv, N4, ng, nb, c, a):
    """The mins of the 16 weight rows nb * 16 .. for groups c * 32 .. as two bf16 A tiles (a float16
    value is two bf16 exactly; groups past ng and rows past N4 zero)."""
    a[: 2 * TILE] = 0
    for r in range(ROWS):
        row = nb * ROWS + r
        if row < N4:
            for gg in range(min(GROUP, ng - c * GROUP)):
                m = f32_at(minv, (row // 4 * ng + c * GROUP + gg) * 4 + row % 4)
                a[r * GROUP + gg], a[TILE + r * GROUP + gg], _ = _split3(m)  # the third part is zero


@njit(**JIT)
def _zero(i):
    if i == 0:
        tile_zero(0)
    elif i == 1:
        tile_zero(1)
    elif i == 2:
        tile_zero(2)
    else:
        tile_zero(3)


@njit(**JIT)
def _dots(i, parts):
    """C tile i (tmm i) += each A part (tmm 4, 5, 6) times the B tile in tmm 7."""
    if i == 0:
        tile_dot(0, 4, 7)
        tile_dot(0, 5, 7)
        if parts == 3:
            tile_dot(0, 6, 7)
    elif i == 1:
        tile_dot(1, 4, 7)
        tile_dot(1, 5, 7)
        if parts == 3:
            tile_dot(1, 6, 7)
    elif i == 2:
        tile_dot(2, 4, 7)
        tile_dot(2, 5, 7)
        if parts == 3:
            tile_dot(2, 6, 7)
    else:
        tile_dot(3, 4, 7)
        tile_dot(3, 5, 7)
        if parts == 3:
            tile_dot(3, 6, 7)


@njit(**JIT)
def _store(i, p):
    if i == 0:
        tile_store(0, p, 0, 64)
    elif i == 1:
        tile_store(1, p, ROWS * ROWS, 64)
    elif i == 2:
        tile_store(2, p, 2 * ROWS * ROWS, 64)
    else:
        tile_store(3, p, 3 * ROWS * ROWS, 64)


@njit(**JIT)
def _aligned(n, dtype):
    """An empty 1-D array of n elements whose start is a multiple of 64 bytes: a tile's 64-byte rows
    then sit in one cache line each (numpy's large arrays start 32 bytes into a line)."""
    itemsize = np.empty(0, dtype).itemsize
    buf = np.empty(n + 64 // itemsize, dtype)
    skip = (-buf.ctypes.data) % 64 // itemsize
    return buf[skip: skip + n]


@njit(parallel=True, **JIT)
def matmul_amx(q, scale, minv, packed, x, out, cfg, threads):
    """out [T, N] = x [T, K] times a blocked q4 (`packed`) or q8 weight with groups of 32 and float16
    scales (and mins), on AMX tiles (`cfg`: CONFIG; `threads`: numba's thread count now, for the
    per-thread scratch)."""
    T, K = x.shape
    N = out.shape[1]
    ng = K // GROUP
    nch = (ng + GROUP - 1) // GROUP
    N4 = (N + 3) // 4 * 4
    TB = (T + ROWS - 1) // ROWS
    xs = _aligned(PARTS * TB * ng * TILE, np.uint16)
    xsum = np.empty((TB, ng, ROWS), np.float32)
    xsb = _aligned(PARTS * TB * nch * TILE, np.uint16)
    split_rows(x, xs, xsum, xsb)
    has_min = minv.shape[0] > 0
    parts = 2 if packed else 3  # d q: at most 11 + 4 (q4) or 11 + 8 (q8) significant bits
    NB = (N + ROWS - 1) // ROWS
    TC = (TB + T_CHUNK - 1) // T_CHUNK
    # Few t-blocks leave accumulators free: an item then takes several 16-row blocks of the weight, each
    # reusing the B tiles the one before just brought into L1 (up to 4 accumulator tiles in all).
    per_item = max(1, ACCS // min(T_CHUNK, TB))
    NI = (NB + per_item - 1) // per_item
    a_scr = _aligned(threads * PARTS * TILE, np.uint16).reshape(threads, PARTS * TILE)
    p_scr = _aligned(threads * ACCS * ROWS * ROWS, np.float32).reshape(threads, ACCS * ROWS * ROWS)
    part, mpart = TB * ng * TILE, TB * nch * TILE
    for item in prange(NI * TC):
        tc, nb0 = item // NI, item % NI * per_item
        nbs = min(per_item, NB - nb0)
        me = numba.get_thread_id()
        a, p = a_scr[me], p_scr[me]
        tb0 = tc * T_CHUNK
        nt = min(T_CHUNK, TB - tb0)
        tile_config(cfg)
        for c in range(nbs * nt):
            _zero(c)
        for g in range(ng):
            for j in range(nbs):
                _a_tiles(q, scale, packed, parts, N4, ng, nb0 + j, g, a)
                tile_load(4, a, 0, 64)
                tile_load(5, a, TILE, 64)
                if parts == 3:
                    tile_load(6, a, 2 * TILE, 64)
                for i in range(nt):
                    b = ((tb0 + i) * ng + g) * TILE
                    for s in range(PARTS):
                        tile_load(7, xs, s * part + b, 64)
                        _dots(j * nt + i, parts)
        if has_min:  # + sum_g m[n, g] xsum[t, g]: the mins times the group sums, as one more product
            for c in range(nch):
                for j in range(nbs):
                    _m_tiles(minv, N4, ng, nb0 + j, c, a)
                    tile_load(4, a, 0, 64)
                    tile_load(5, a, TILE, 64)
                    for i in range(nt):
                        b = ((tb0 + i) * nch + c) * TILE
                        for s in range(PARTS):
                            tile_load(7, xsb, s * mpart + b, 64)
                            _dots(j * nt + i, 2)
        for c in range(nbs * nt):
            _store(c, p)
        tile_release()
        for j in range(nbs):
            for i in range(nt):
                c = j * nt + i
                for tt in range(ROWS):
                    t = (tb0 + i) * ROWS + tt
                    if t < T:
                        for r in range(ROWS):
                            n = (nb0 + j) * ROWS + r
                            if n < N:
                                out[t, n] = p[(c * ROWS + r) * ROWS + tt]

"""Intel AMX tile instructions for the numba kernels, on the CPU's tiles or on emulated ones.

The kernels (kernels/numba_amx.py, kernels/numba_amx_i8.py) call the `amx_*` operations with two trailing
arguments, `tiles` and `me`:
- `tiles=None`: the CPU's tiles, as inline assembly (numba has no AMX types); a register number must be a constant;
- `tiles` = `soft_tiles(threads)`: each thread's emulated tile state, `tiles[me]`, in plain numba code. A CPU without
  AMX runs the kernels' whole logic this way (the tests do, slowly): the same configuration, the same loads and
  stores with their strides, and the instructions' faults as errors. An operation on a tile the configuration
  does not describe (#UD), shapes that do not fit the instruction (#GP), or memory outside the array raise
  ValueError where the CPU would kill the process.
The two are separate specializations of the same kernel (numba types `None` and an array apart), each cached on
its own; the assembly is compiled only into the first.

Linux hands a process the tile state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, process wide);
`available()` asks once.
"""

from __future__ import annotations

import ctypes
import functools

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from kernels.numba_jit import JIT
from kernels.simd import LANES, target_has
from kernels.simd_scales import f32_at
from kernels.simd_vectors import prefetch, vfma, vfma_s, vload, vscale, vstore

llb.initialize_native_asmparser()  # numba compiles inline assembly only with LLVM's parser loaded

TILES = 8  # tmm0-7
ROW_BYTES = 64  # a tile row's most bytes
MAX_ROWS = 16
CFG_AT = TILES * MAX_ROWS * ROW_BYTES  # where an emulated state keeps its configuration
SOFT_BYTES = CFG_AT + 64

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def available() -> bool:
    """Whether this process can run the AMX kernels: the compile target has AMX tiles with bf16 and int8, and
    Linux grants the process the tile state (asked once)."""
    if not all(target_has(f) for f in ("amx-tile", "amx-bf16", "amx-int8")):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


def config(shapes: dict[int, tuple[int, int]]) -> np.ndarray:
    """A tile configuration (LDTILECFG's 64 bytes, palette 1): tile -> (rows, bytes a row)."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for reg, (rows, colsb) in shapes.items():
        assert 0 < rows <= MAX_ROWS and 0 < colsb <= ROW_BYTES and colsb % 4 == 0, (reg, rows, colsb)
        cfg[16 + 2 * reg : 18 + 2 * reg] = np.array([colsb], np.uint16).view(np.uint8)
        cfg[48 + reg] = rows
    return cfg


def soft_tiles(threads: int) -> np.ndarray:
    """Emulated tile state for `threads` kernel threads (pass as `tiles`)."""
    return np.zeros((threads, SOFT_BYTES), np.uint8)


# ---- the CPU's tiles: inline assembly, AT&T operand order ----------------------------------------


def _asm(builder, text, operands=()):
    fty = ir.FunctionType(ir.VoidType(), [o.type for o in operands])
    constraint = ",".join(["r"] * len(operands) + ["~{memory}"])
    builder.call(ir.InlineAsm(fty, text, constraint, side_effect=True), list(operands))


def elem_ptr(context, builder, aty, a, i, ity):
    """The address of element i (of integer type ity) of a 1-D array a (of type aty)."""
    return builder.gep(context.make_array(aty)(context, builder, a).data, [context.cast(builder, i, ity, types.intp)])


def _byte_ptr(context, builder, aty, a, i, ity):
    return builder.bitcast(elem_ptr(context, builder, aty, a, i, ity), ir.IntType(8).as_pointer())


def _literal(*regs):
    return all(isinstance(r, types.IntegerLiteral) for r in regs)


@intrinsic
def _hw_config(typingctx, cfg):
    def codegen(context, builder, sig, args):
        zero = context.get_constant(types.intp, 0)
        _asm(builder, "ldtilecfg ($0)", [_byte_ptr(context, builder, cfg, args[0], zero, types.intp)])
        return context.get_dummy_value()

    return types.none(cfg), codegen


@intrinsic
def _hw_release(typingctx):
    def codegen(context, builder, sig, args):
        _asm(builder, "tilerelease")
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _hw_zero(typingctx, reg):
    if not _literal(reg):
        return None

    def codegen(context, builder, sig, args):
        _asm(builder, f"tilezero %tmm{reg.literal_value}")
        return context.get_dummy_value()

    return types.none(reg), codegen


def _hw_memory(template: str):
    def impl(typingctx, reg, a, i, stride):
        if not _literal(reg):
            return None

        def codegen(context, builder, sig, args):
            p = _byte_ptr(context, builder, a, args[1], args[2], i)
            s = context.cast(builder, args[3], stride, types.int64)
            _asm(builder, template.format(reg=reg.literal_value), [p, s])
            return context.get_dummy_value()

        return types.none(reg, a, i, stride), codegen

    return intrinsic(impl)


_hw_load = _hw_memory("tileloadd ($0,$1,1), %tmm{reg}")
_hw_store = _hw_memory("tilestored %tmm{reg}, ($0,$1,1)")


def _hw_dot(op: str):
    def impl(typingctx, c, a, b):
        if not _literal(c, a, b):
            return None

        def codegen(context, builder, sig, args):
            _asm(builder, f"{op} %tmm{b.literal_value}, %tmm{a.literal_value}, %tmm{c.literal_value}")
            return context.get_dummy_value()

        return types.none(c, a, b), codegen

    return intrinsic(impl)


_hw_bf16 = _hw_dot("tdpbf16ps")
_hw_u8s8 = _hw_dot("tdpbusd")
_hw_s8s8 = _hw_dot("tdpbssd")


# ---- emulated tiles: st = tiles[me], tile r at st[r * 1024:], rows 64 bytes apart; the configuration at CFG_AT --


@njit(**JIT)
def _shape(st, reg):
    """(rows, bytes a row) of tile `reg` in the loaded configuration; raises where the CPU would fault."""
    if st[CFG_AT] != 1:
        raise ValueError("AMX: a tile instruction without a loaded configuration")
    rows = np.int64(st[CFG_AT + 48 + reg])
    colsb = np.int64(st[CFG_AT + 16 + 2 * reg]) | (np.int64(st[CFG_AT + 17 + 2 * reg]) << 8)
    if rows == 0 or colsb == 0:
        raise ValueError("AMX: a tile the configuration leaves out")
    return rows, colsb


@njit(**JIT)
def _soft_config(st, cfg):
    if cfg[0] != 1:
        raise ValueError("AMX: only palette 1")
    for u in range(64):
        st[CFG_AT + u] = cfg[u]


@njit(**JIT)
def _soft_release(st):
    for u in range(64):
        st[CFG_AT + u] = 0


@njit(**JIT)
def _soft_zero(st, reg):
    rows, _ = _shape(st, reg)
    for u in range(rows * ROW_BYTES):
        st[reg * MAX_ROWS * ROW_BYTES + u] = 0


@njit(**JIT)
def _span(a, i, stride, rows, colsb):
    """`a`'s bytes, and the byte offset of a[i], checked to hold rows of `colsb` bytes `stride` apart."""
    mem = a.view(np.uint8)
    at = i * a.itemsize
    if stride < colsb or at < 0 or at + (rows - 1) * stride + colsb > mem.size:
        raise ValueError("AMX: a tile's rows reach outside the array")
    return mem, at


@njit(**JIT)
def _soft_load(st, reg, a, i, stride):
    rows, colsb = _shape(st, reg)
    mem, at = _span(a, i, stride, rows, colsb)
    base = reg * MAX_ROWS * ROW_BYTES
    for r in range(rows):
        for u in range(ROW_BYTES):
            st[base + r * ROW_BYTES + u] = mem[at + r * stride + u] if u < colsb else 0


@njit(**JIT)
def _soft_store(st, reg, a, i, stride):
    rows, colsb = _shape(st, reg)
    mem, at = _span(a, i, stride, rows, colsb)
    base = reg * MAX_ROWS * ROW_BYTES
    for r in range(rows):
        for u in range(colsb):
            mem[at + r * stride + u] = st[base + r * ROW_BYTES + u]


@njit(**JIT)
def _dot_shapes(st, c, a, b):
    """(M, K4, N): C [M, N] of 4-byte values += A [M, K4 4-byte units] times B [K4, N 4-byte units]; raises where
    TDP* would fault (#GP: shapes that do not fit, or a tile named twice)."""
    mc, nc = _shape(st, c)
    ma, ka = _shape(st, a)
    kb, nb = _shape(st, b)
    if c in (a, b) or a == b or mc != ma or nc != nb or ka // 4 != kb:
        raise ValueError("AMX: a tile product whose shapes do not fit")
    return mc, kb, nc // 4


@njit(**JIT)
def _tile_view(st, reg, dtype):
    return st[reg * MAX_ROWS * ROW_BYTES : (reg + 1) * MAX_ROWS * ROW_BYTES].view(dtype)


@njit(**JIT)
def _bf16_values(st, reg):
    """Tile `reg`'s 512 bf16 values as float32 (32 a row)."""
    bits = _tile_view(st, reg, np.uint16)
    wide = np.empty(bits.size, np.uint32)
    for u in range(bits.size):
        wide[u] = np.uint32(bits[u]) << np.uint32(16)
    return wide.view(np.float32)


@njit(**JIT)
def _soft_bf16(st, c, a, b):
    """TDPBF16PS: C (float32) += A times B, bf16 pairs (the products are exact in float32: 8 x 8 bits)."""
    m_, k4, n_ = _dot_shapes(st, c, a, b)
    cv, av, bv = _tile_view(st, c, np.float32), _bf16_values(st, a), _bf16_values(st, b)
    for m in range(m_):
        for n in range(n_):
            acc = cv[m * 16 + n]
            for k in range(k4):
                for e in range(2):
                    acc += av[m * 32 + 2 * k + e] * bv[k * 32 + 2 * n + e]
            cv[m * 16 + n] = acc


@njit(**JIT)
def _soft_i8(st, c, a, b, a_signed):
    """TDPBUSD (A unsigned) or TDPBSSD (A signed): C (int32) += A times B, bytes in fours, B signed."""
    m_, k4, n_ = _dot_shapes(st, c, a, b)
    cv, au, bv = _tile_view(st, c, np.int32), _tile_view(st, a, np.uint8), _tile_view(st, b, np.int8)
    asg = _tile_view(st, a, np.int8)
    for m in range(m_):
        for n in range(n_):
            acc = np.int32(cv[m * 16 + n])
            for k in range(4 * k4):
                av = np.int32(asg[m * 64 + k]) if a_signed else np.int32(au[m * 64 + k])
                acc += av * np.int32(bv[(k // 4) * 64 + 4 * n + k % 4])
            cv[m * 16 + n] = acc


# ---- the operations the kernels call --------------------------------------------------------------


def _hardware(tiles) -> bool:
    return isinstance(tiles, types.NoneType)


def amx_config(cfg, tiles, me):
    """Load the tile configuration `cfg` (see `config`) on this thread."""


def amx_release(tiles, me):
    """Give the thread's tile state back."""


def amx_zero(reg, tiles, me):
    """tmm[reg] = 0."""


def amx_load(reg, a, i, stride, tiles, me):
    """tmm[reg] = its rows, `stride` bytes apart, from a[i] on."""


def amx_store(reg, a, i, stride, tiles, me):
    """Its rows, `stride` bytes apart, from a[i] on = tmm[reg]."""


def amx_bf16(c, a, b, tiles, me):
    """tmm[c] += tmm[a] times tmm[b]: bf16 pairs, float32 sums (TDPBF16PS)."""


def amx_u8s8(c, a, b, tiles, me):
    """tmm[c] += tmm[a] (unsigned bytes) times tmm[b] (signed bytes), int32 sums (TDPBUSD)."""


def amx_s8s8(c, a, b, tiles, me):
    """tmm[c] += tmm[a] times tmm[b], signed bytes, int32 sums (TDPBSSD)."""


@overload(amx_config)
def _config(cfg, tiles, me):
    if _hardware(tiles):
        return lambda cfg, tiles, me: _hw_config(cfg)
    return lambda cfg, tiles, me: _soft_config(tiles[me], cfg)


@overload(amx_release)
def _release(tiles, me):
    if _hardware(tiles):
        return lambda tiles, me: _hw_release()
    return lambda tiles, me: _soft_release(tiles[me])


def _pick(tiles, regs, hw, soft):
    """An overload's implementation: the CPU's instruction where the registers are typed as constants (the
    assembly names them), the emulation where they are plain integers. numba tries constants first and then plain
    integers (`prefer_literal`), so one compiled emulation serves every register rather than one per number."""
    if _hardware(tiles):
        return hw if _literal(*regs) else None
    return None if _literal(*regs) else soft


@overload(amx_zero, prefer_literal=True)
def _zero(reg, tiles, me):
    return _pick(tiles, (reg,), lambda reg, tiles, me: _hw_zero(reg), lambda reg, tiles, me: _soft_zero(tiles[me], reg))


@overload(amx_load, prefer_literal=True)
def _load(reg, a, i, stride, tiles, me):
    return _pick(
        tiles,
        (reg,),
        lambda reg, a, i, stride, tiles, me: _hw_load(reg, a, i, stride),
        lambda reg, a, i, stride, tiles, me: _soft_load(tiles[me], reg, a, i, stride),
    )


@overload(amx_store, prefer_literal=True)
def _store(reg, a, i, stride, tiles, me):
    return _pick(
        tiles,
        (reg,),
        lambda reg, a, i, stride, tiles, me: _hw_store(reg, a, i, stride),
        lambda reg, a, i, stride, tiles, me: _soft_store(tiles[me], reg, a, i, stride),
    )


@overload(amx_bf16, prefer_literal=True)
def _bf16(c, a, b, tiles, me):
    return _pick(
        tiles,
        (c, a, b),
        lambda c, a, b, tiles, me: _hw_bf16(c, a, b),
        lambda c, a, b, tiles, me: _soft_bf16(tiles[me], c, a, b),
    )


@overload(amx_u8s8, prefer_literal=True)
def _u8s8(c, a, b, tiles, me):
    return _pick(
        tiles,
        (c, a, b),
        lambda c, a, b, tiles, me: _hw_u8s8(c, a, b),
        lambda c, a, b, tiles, me: _soft_i8(tiles[me], c, a, b, False),
    )


@overload(amx_s8s8, prefer_literal=True)
def _s8s8(c, a, b, tiles, me):
    return _pick(
        tiles,
        (c, a, b),
        lambda c, a, b, tiles, me: _hw_s8s8(c, a, b),
        lambda c, a, b, tiles, me: _soft_i8(tiles[me], c, a, b, True),
    )


# ---- shared by the tile kernels -------------------------------------------------------------------

T_CHUNK = 4  # t-blocks (16 activation rows each) a work item
ACCS = 4  # accumulator tiles, tmm0-3
# A thread's scratch: its tile sums, then its results, 64 bytes more than 4 KiB apart: at a multiple of 4 KiB the
# loads of one after stores to the other would wait on each other (4K aliasing).
ACC_AT = ACCS * MAX_ROWS * MAX_ROWS + 16


@njit(**JIT)
def work_items(T, N):
    """A product's work items: (TB t-blocks, NB 16-row weight blocks, blocks an item, NI items a chunk of t-blocks,
    TC chunks). Items go chunk by chunk, so that a chunk's B tiles stay in L2 while its items pass. Few t-blocks
    leave accumulators free: an item then takes several weight blocks, each reusing the B tiles the one before just
    brought into L1 (ACCS accumulator tiles in all)."""
    TB = (T + MAX_ROWS - 1) // MAX_ROWS
    NB = (N + MAX_ROWS - 1) // MAX_ROWS
    per_item = max(1, ACCS // min(T_CHUNK, TB))
    return TB, NB, per_item, (NB + per_item - 1) // per_item, (TB + T_CHUNK - 1) // T_CHUNK


@njit(**JIT)
def work_item(item, TB, NB, per_item, NI, TC, threads, ng):
    """(nb0, nbs, tb0, nt, n0, n1): work item `item`'s first weight block and their count, its first t-block and
    their count, and the (row, group) stretch n0 .. n1 of the item this thread most likely takes next: an item's
    weight rows are one contiguous stretch of the blocked layout (kernels/numba_layout.py), which the kernels
    prefetch a slice a group while they work (weights come from DRAM)."""
    tc, nb0 = item // NI, item % NI * per_item
    tb0 = tc * T_CHUNK
    nxt = (item + threads) % (NI * TC) % NI * per_item
    n0, n1 = nxt * MAX_ROWS * ng, min(NB, nxt + per_item) * MAX_ROWS * ng
    return nb0, min(per_item, NB - nb0), tb0, min(T_CHUNK, TB - tb0), n0, n1


@njit(**JIT)
def zero_acc(i, tiles, me):
    """Accumulator tile i (tmm0-3) = 0."""
    if i == 0:
        amx_zero(0, tiles, me)
    elif i == 1:
        amx_zero(1, tiles, me)
    elif i == 2:
        amx_zero(2, tiles, me)
    else:
        amx_zero(3, tiles, me)


@njit(**JIT)
def store_acc(i, p, tiles, me):
    """Accumulator tile i (16 rows of 16 four-byte values) to p[256 i:], 64 bytes a row."""
    if i == 0:
        amx_store(0, p, 0, 64, tiles, me)
    elif i == 1:
        amx_store(1, p, 256, 64, tiles, me)
    elif i == 2:
        amx_store(2, p, 512, 64, tiles, me)
    else:
        amx_store(3, p, 768, 64, tiles, me)


@njit(**JIT)
def prefetch_group(q, scale, minv, n0, n1, per, g, ng):
    """Prefetch the g-th of ng slices of the weight's (row, group) stretch n0 .. n1: its bytes (`per` a row's group),
    scales and mins (an item's next stretch, a slice a group, while it works on its own)."""
    prefetch_part(q, n0 * per, n1 * per, g, ng)
    prefetch_part(scale, n0, n1, g, ng)
    if minv.shape[0] > 0:
        prefetch_part(minv, n0, n1, g, ng)


@njit(**JIT)
def add_group(acc, sums, scale, minv, mf, xscale, xsum, nb0, nbs, tb0, nt, g, ng, N4):
    """acc[n, t] += d[n, g] P[n, t] (times xscale[t, g] where given) + m[n, g] xsum[t, g]: group g's tile sums P
    (`sums`: float32, or int32 from the int8 tiles, whose activations carry a scale a group) into a work item's
    results; xscale and xsum laid out (t-blocks, groups, 16), 16 values of t a tile row."""
    has_min = minv.shape[0] > 0
    for j in range(nbs):
        for r in range(MAX_ROWS):
            row = (nb0 + j) * MAX_ROWS + r
            if row < N4:
                si = (row // 4 * ng + g) * 4 + row % 4
                d = f32_at(scale, si)
                mn = f32_at(minv, si) * mf if has_min else np.float32(0.0)
                for i in range(nt):
                    for h in range(0, MAX_ROWS, LANES):  # one vector on AVX-512 (AMX CPUs); two emulated on AVX2
                        o = ((j * nt + i) * MAX_ROWS + r) * MAX_ROWS + h
                        xo = ((tb0 + i) * ng + g) * MAX_ROWS + h
                        if xscale is None:
                            v = vfma_s(vload(sums, o), d, vload(acc, o))
                        else:
                            v = vfma(vload(sums, o), vscale(vload(xscale, xo), d), vload(acc, o))
                        if has_min:
                            v = vfma_s(vload(xsum, xo), mn, v)
                        vstore(acc, o, v)


@njit(**JIT)
def write_out(acc, out, nb0, nbs, tb0, nt):
    """out[t, n] = a work item's results, acc[((j nt + i) 16 + r) 16 + tt] for n = (nb0 + j) 16 + r and
    t = (tb0 + i) 16 + tt, those inside out."""
    T, N = out.shape
    for j in range(nbs):
        for i in range(nt):
            c = j * nt + i
            for tt in range(MAX_ROWS):
                t = (tb0 + i) * MAX_ROWS + tt
                if t < T:
                    for r in range(MAX_ROWS):
                        n = (nb0 + j) * MAX_ROWS + r
                        if n < N:
                            out[t, n] = acc[(c * MAX_ROWS + r) * MAX_ROWS + tt]


@njit(**JIT)
def prefetch_part(a, start, stop, g, ng):
    """Prefetch the g-th of ng slices of a[start:stop] (cache lines of it)."""
    step = max(1, 64 // a.itemsize)
    lines = (stop - start + step - 1) // step
    for ln in range(g * lines // ng, (g + 1) * lines // ng):
        prefetch(a, start + ln * step)


@njit(**JIT)
def aligned(n, dtype):
    """An empty 1-D array of n elements whose start is a multiple of 64 bytes: a tile's 64-byte rows
    then sit in one cache line each (numpy's large arrays start 32 bytes into a line)."""
    itemsize = np.empty(0, dtype).itemsize
    buf = np.empty(n + 64 // itemsize, dtype)
    skip = (-buf.ctypes.data) % 64 // itemsize
    return buf[skip : skip + n]

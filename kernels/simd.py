"""SIMD building blocks for the numba kernels, written as LLVM vector IR (numba `@intrinsic`s).

numba has no vector types and its auto-vectorized code for a quantized dot product reduces
every 32-value group to a scalar before scaling it. Here an 8-lane float32 vector (`F32x8`, one
ymm register on AVX2) is a value numba code can hold in a variable: kernels keep one such
accumulator per output row across all groups and reduce it once per row.

Blocks (each reads a 1-D C-contiguous array at an element offset, unaligned):

- `q4_dot32(q, qi, x, xi)`: 16 bytes of packed nibbles (value j low, value j + 16 high) times
  32 float32 activations -> F32x8 partial sums (not yet reduced, not yet scaled)
- `q8_dot16`, `q8_dot32`: 16 / 32 int8 values times float32 activations -> F32x8
- `q4_dot32_i8(q, qi, xq, xi)`, `q8_dot32_i8`: the same groups times 32 int8-quantized
  activations, as exact int32 sums per lane converted to F32x8; AVX2 `vpmaddubsw`/`vpmaddwd`
  where the compile target has AVX2, plain vector IR (LLVM lowers it for any x86-64) otherwise.
  Neither saturates: |weight| <= 128, |activation| <= 127, so a pair sum stays below 2^15.
- `vzero()`, `vfma_s(v, s, acc)` (acc + v * s), `hsum(v)`.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.registry import cpu_target
from numba.extending import intrinsic, models, register_model

LANES = 8
_f32 = ir.FloatType()
_i8, _i16, _i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_vf = ir.VectorType(_f32, LANES)


class F32x8Type(types.Type):
    """Eight float32 lanes held in a register."""

    def __init__(self) -> None:
        super().__init__(name="F32x8")


F32x8 = F32x8Type()


@register_model(F32x8Type)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _vf)


def target_has(feature: str) -> bool:
    """Whether the CPU numba compiles for (the host unless NUMBA_CPU_NAME says otherwise) has `feature`."""
    features = cpu_target.target_context.codegen().magic_tuple()[2]
    return f"+{feature}" in features.split(",")


def _vec_ptr(context, builder, aryty, ary, idx, vecty):
    """Pointer to a vector of `vecty` starting at element `idx` of a 1-D array."""
    a = context.make_array(aryty)(context, builder, ary)
    p = builder.gep(a.data, [idx])
    return builder.bitcast(p, vecty.as_pointer())


def _load(builder, ptr):
    v = builder.load(ptr)
    v.align = 1  # unaligned load (vmovdqu)
    return v


def _slice(builder, v, start, n):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, n), list(range(start, start + n))))


def _concat(builder, a, b, n):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_i32, 2 * n), list(range(2 * n))))


def _call(builder, name, ret, args):
    """Call an LLVM intrinsic by its full name (e.g. "llvm.fmuladd.v8f32")."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _fmuladd(builder, a, b, c):
    return _call(builder, "llvm.fmuladd.v8f32", _vf, [a, b, c])


def _splat(builder, s, vecty):
    undef = ir.Constant(vecty, ir.Undefined)
    v = builder.insert_element(undef, s, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_i32, vecty.count), [0] * vecty.count))


def _dot_f32(builder, ints, x_ptr_base, n):
    """sum over n/8 chunks of float(ints chunk) * x chunk -> <8 x float>; ints is <n x i32>."""
    f = builder.sitofp(ints, ir.VectorType(_f32, n))
    acc = None
    for c in range(n // LANES):
        xv = _load(builder, builder.bitcast(builder.gep(x_ptr_base, [ir.Constant(_i32, c * LANES)]), _vf.as_pointer()))
        fc = _slice(builder, f, c * LANES, LANES)
        acc = builder.fmul(fc, xv) if acc is None else _fmuladd(builder, fc, xv, acc)
    return acc


def _check_flat(*arrays):
    for a in arrays:
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"):
            raise TypeError(f"simd blocks read 1-D C-contiguous arrays, got {a}")


def _x_base(context, builder, aryty, ary, idx):
    a = context.make_array(aryty)(context, builder, ary)
    return builder.gep(a.data, [idx])


@intrinsic
def q4_dot32(typingctx, q, qi, x, xi):
    """Packed 4-bit group (16 bytes at q[qi]) times x[xi : xi + 32] -> F32x8 partial sums."""
    _check_flat(q, x)

    def codegen(context, builder, sig, args):
        qa, qi_, xa, xi_ = args
        xb = _x_base(context, builder, x, xa, xi_)
        parts = []
        for half in range(2):  # values 0..15 from bytes 0..15's nibbles, in two 8-byte loads
            b = _load(builder, _vec_ptr(context, builder, q, qa, builder.add(qi_, ir.Constant(qi_.type, 8 * half)),
                                        ir.VectorType(_i8, 8)))
            w = builder.zext(b, ir.VectorType(_i32, 8))
            lo = builder.and_(w, ir.Constant(ir.VectorType(_i32, 8), [15] * 8))
            hi = builder.lshr(w, ir.Constant(ir.VectorType(_i32, 8), [4] * 8))
            parts.append((lo, 8 * half))
            parts.append((hi, 16 + 8 * half))
        acc = None
        for ints, off in parts:
            xv = _load(builder, builder.bitcast(builder.gep(xb, [ir.Constant(_i32, off)]), _vf.as_pointer()))
            fc = builder.sitofp(ints, _vf)
            acc = builder.fmul(fc, xv) if acc is None else _fmuladd(builder, fc, xv, acc)
        return acc

    return F32x8(q, qi, x, xi), codegen


def _q8_dot(n):
    def block(typingctx, q, qi, x, xi):
        _check_flat(q, x)

        def codegen(context, builder, sig, args):
            qa, qi_, xa, xi_ = args
            b = _load(builder, _vec_ptr(context, builder, q, qa, qi_, ir.VectorType(_i8, n)))
            ints = builder.sext(b, ir.VectorType(_i32, n))
            return _dot_f32(builder, ints, _x_base(context, builder, x, xa, xi_), n)

        return F32x8(q, qi, x, xi), codegen

    return block


q8_dot16 = intrinsic(_q8_dot(16))
q8_dot32 = intrinsic(_q8_dot(32))


def _madd_u8s8(builder, u, s):
    """<32 x i8> unsigned times <32 x i8> signed, sums of 4 adjacent products -> <8 x i32> (exact here)."""
    if target_has("avx2"):
        v16 = ir.VectorType(_i16, 16)
        p16 = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [u, s])
        return _call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(_i32, 8), [p16, ir.Constant(v16, [1] * 16)])
    wide = ir.VectorType(_i32, 32)
    prod = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
    acc = None
    for k in range(4):
        lanes = builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(_i32, 8), list(range(k, 32, 4))))
        acc = lanes if acc is None else builder.add(acc, lanes)
    return acc


@intrinsic
def q4_dot32_i8(typingctx, q, qi, xq, xi):
    """Packed 4-bit group (16 bytes at q[qi]) times int8 xq[xi : xi + 32] -> F32x8 of exact int sums."""
    _check_flat(q, xq)

    def codegen(context, builder, sig, args):
        qa, qi_, xa, xi_ = args
        b = _load(builder, _vec_ptr(context, builder, q, qa, qi_, ir.VectorType(_i8, 16)))
        v16 = ir.VectorType(_i8, 16)
        lo = builder.and_(b, ir.Constant(v16, [15] * 16))
        hi = builder.lshr(b, ir.Constant(v16, [4] * 16))
        u = _concat(builder, lo, hi, 16)
        s = _load(builder, _vec_ptr(context, builder, xq, xa, xi_, ir.VectorType(_i8, 32)))
        return builder.sitofp(_madd_u8s8(builder, u, s), _vf)

    return F32x8(q, qi, xq, xi), codegen


@intrinsic
def q8_dot32_i8(typingctx, q, qi, xq, xi):
    """32 int8 weights at q[qi] times int8 xq[xi : xi + 32] -> F32x8 of exact int sums."""
    _check_flat(q, xq)

    def codegen(context, builder, sig, args):
        qa, qi_, xa, xi_ = args
        v32 = ir.VectorType(_i8, 32)
        w = _load(builder, _vec_ptr(context, builder, q, qa, qi_, v32))
        s = _load(builder, _vec_ptr(context, builder, xq, xa, xi_, v32))
        if target_has("avx2"):  # |w| as unsigned, the sign moved onto x (llama.cpp's trick for vpmaddubsw)
            aw = _call(builder, "llvm.abs.v32i8", v32, [w, ir.Constant(ir.IntType(1), 0)])
            sx = _call(builder, "llvm.x86.avx2.psign.b", v32, [s, w])
            return builder.sitofp(_madd_u8s8(builder, aw, sx), _vf)
        wide = ir.VectorType(_i32, 32)
        prod = builder.mul(builder.sext(w, wide), builder.sext(s, wide))
        acc = None
        for k in range(4):
            lanes = builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(_i32, 8), list(range(k, 32, 4))))
            acc = lanes if acc is None else builder.add(acc, lanes)
        return builder.sitofp(acc, _vf)

    return F32x8(q, qi, xq, xi), codegen


@intrinsic
def vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_vf, [0.0] * LANES)

    return F32x8(), codegen


@intrinsic
def vfma_s(typingctx, v, s, acc):
    """acc + v * s (s a float32 scalar, broadcast)."""
    if not (v == F32x8 and acc == F32x8 and s == types.float32):
        return None

    def codegen(context, builder, sig, args):
        v_, s_, acc_ = args
        return _fmuladd(builder, v_, _splat(builder, s_, _vf), acc_)

    return F32x8(v, s, acc), codegen


@intrinsic
def hsum(typingctx, v):
    """The sum of the eight lanes (float32)."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        (x,) = args
        n = LANES
        while n > 1:
            n //= 2
            x = builder.fadd(_slice(builder, x, 0, n), _slice(builder, x, n, n))
        return builder.extract_element(x, ir.Constant(_i32, 0))

    return types.float32(v), codegen


__all__ = ["F32x8", "LANES", "hsum", "q4_dot32", "q4_dot32_i8", "q8_dot16", "q8_dot32", "q8_dot32_i8", "target_has",
           "vfma_s", "vzero"]

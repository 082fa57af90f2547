"""Vector basics for the numba kernels, as LLVM vector IR (numba `@intrinsic`s; kernels/simd.py has the vector
types).

- `vzero()` (F32xN), `vzero8()` (F32x8), `vzero_tile(rows)`, `vzero_tile_of(rows, lanes)`, `vzero_n(n)`:
  accumulators, one or a tuple of them;
- `vload(a, i)` (LANES values as F32xN, from float32, float16 bits or int32), `vstore(a, i, v)`;
- `vadd(a, b)`, `vfma(a, b, acc)`, `vfma_s(v, s, acc)` (acc + v * s, also element-wise over tuples; s a float32 or, over
  tuples, a splat vector), `vscale(v, s)`;
- `hsum(v)`, `hsum_halves(v)` (an F32x8's lanes 0-3, 4-7), `hsum_quarters(v)` (an F32x16's four quarters),
  `fold4(v)` (the sums of lanes k, k + 4, k + 8, ...);
- `prefetch(a, i)`; `tile_offsets(t, K, n)`: the offsets of rows t .. t + n - 1 in x.ravel(), a tuple
  (n a constant).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.simd import (
    IR_F32,
    IR_I32,
    IR_VF,
    IR_VF8,
    LANES,
    F32VecType,
    F32x8,
    F32x16,
    F32xN,
    check_flat,
    flat_ptr,
    fmuladd,
    is_vec,
    load_f32,
    load_unaligned,
    reads_as_f32,
    slice_lanes,
    splat,
    zero_tuple,
)


@intrinsic
def vzero(typingctx):
    """A zero F32xN (the float blocks' accumulator)."""

    def codegen(context, builder, sig, args):
        return ir.Constant(IR_VF, [0.0] * LANES)

    return F32xN(), codegen


@intrinsic
def vzero8(typingctx):
    """A zero F32x8 (the int8 blocks' accumulator)."""

    def codegen(context, builder, sig, args):
        return ir.Constant(IR_VF8, [0.0] * 8)

    return F32x8(), codegen


@intrinsic
def vzero_tile(typingctx, rows):
    """A zero F32xN per element of the tuple `rows` (a tile's accumulators)."""
    if not isinstance(rows, types.UniTuple):
        return None
    ret = types.UniTuple(F32xN, rows.count)

    def codegen(context, builder, sig, args):
        return zero_tuple(context, builder, ret)

    return ret(rows), codegen


@intrinsic
def vzero_tile_of(typingctx, rows, lanes):
    """A zero float vector of `lanes` (a constant: 8 or 16) lanes per element of the tuple `rows`."""
    if not (isinstance(rows, types.UniTuple) and isinstance(lanes, types.IntegerLiteral)):
        return None
    n = lanes.literal_value
    vt = F32VecType(n)
    ret = types.UniTuple(vt, rows.count)

    def codegen(context, builder, sig, args):
        return context.make_tuple(builder, ret, [ir.Constant(ir.VectorType(IR_F32, n), [0.0] * n)] * rows.count)

    return ret(rows, lanes), codegen


@intrinsic
def vzero_n(typingctx, n):
    """n (a constant) zero F32xN: the accumulators of a register tile."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    ret = types.UniTuple(F32xN, n.literal_value)

    def codegen(context, builder, sig, args):
        return zero_tuple(context, builder, ret)

    return ret(n), codegen


@intrinsic
def vload(typingctx, a, i):
    """a[i : i + LANES] as F32xN (a float32 array, float16 bits in a uint16 array, or int32 values converted)."""
    if a.dtype == types.int32:
        check_flat(a)
    elif not reads_as_f32(a):
        return None

    def codegen(context, builder, sig, args):
        aa, i_ = args
        ptr = flat_ptr(context, builder, a, aa, i_)
        if a.dtype == types.int32:
            ints = load_unaligned(builder, builder.bitcast(ptr, ir.VectorType(IR_I32, LANES).as_pointer()))
            return builder.sitofp(ints, IR_VF)
        return load_f32(builder, ptr, a.dtype, LANES)

    return F32xN(a, i), codegen


@intrinsic
def vstore(typingctx, a, i, v):
    """a[i : i + n] = v (a flat float32 array, a float vector of n lanes: F32xN, or F32x16 anywhere)."""
    check_flat(a)
    if a.dtype != types.float32 or not isinstance(v, F32VecType):
        return None

    def codegen(context, builder, sig, args):
        aa, i_, v_ = args
        st = builder.store(v_, builder.bitcast(flat_ptr(context, builder, a, aa, i_), v_.type.as_pointer()))
        st.align = 4
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def vadd(typingctx, a, b):
    """a + b, lane by lane (float vectors of one width)."""
    if not is_vec(a, b):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(*args)

    return a(a, b), codegen


@intrinsic
def vfma(typingctx, a, b, acc):
    """acc + a * b, lane by lane (float vectors of one width)."""
    if not is_vec(a, b, acc):
        return None

    def codegen(context, builder, sig, args):
        return fmuladd(builder, *args)

    return acc(a, b, acc), codegen


@intrinsic
def vfma_s(typingctx, v, s, acc):
    """acc + v * s (s a float32 scalar, broadcast); element-wise over tuples of vectors too (s a scalar
    or a vector of their width)."""
    if is_vec(v, acc) and s == types.float32:

        def codegen(context, builder, sig, args):
            v_, s_, acc_ = args
            return fmuladd(builder, v_, splat(builder, s_, v_.type), acc_)

        return acc(v, s, acc), codegen
    if not (v == acc and isinstance(v, types.UniTuple) and isinstance(v.dtype, F32VecType)):
        return None
    if s not in (types.float32, v.dtype):
        return None

    def codegen_tuple(context, builder, sig, args):
        v_, s_, acc_ = args
        sv = s_ if s == v.dtype else splat(builder, s_, ir.VectorType(IR_F32, v.dtype.lanes))
        outs = [
            fmuladd(builder, builder.extract_value(v_, i), sv, builder.extract_value(acc_, i)) for i in range(v.count)
        ]
        return context.make_tuple(builder, sig.return_type, outs)

    return v(v, s, acc), codegen_tuple


@intrinsic
def vscale(typingctx, v, s):
    """v * s (s a float32 scalar, broadcast)."""
    if not (is_vec(v) and s == types.float32):
        return None

    def codegen(context, builder, sig, args):
        v_, s_ = args
        return builder.fmul(v_, splat(builder, s_, v_.type))

    return v(v, s), codegen


@intrinsic
def hsum(typingctx, v):
    """The sum of a float vector's lanes (float32)."""
    if not is_vec(v):
        return None

    def codegen(context, builder, sig, args):
        (x,) = args
        n = v.lanes
        while n > 1:
            n //= 2
            x = builder.fadd(slice_lanes(builder, x, 0, n), slice_lanes(builder, x, n, n))
        return builder.extract_element(x, ir.Constant(IR_I32, 0))

    return types.float32(v), codegen


@intrinsic
def hsum_halves(typingctx, v):
    """(sum of lanes 0-3, sum of lanes 4-7) of an F32x8 (float32)."""
    if v != F32x8:
        return None
    ret = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        (x,) = args
        outs = []
        for h in (0, 4):
            q = slice_lanes(builder, x, h, 4)
            q = builder.fadd(slice_lanes(builder, q, 0, 2), slice_lanes(builder, q, 2, 2))
            outs.append(
                builder.fadd(
                    builder.extract_element(q, ir.Constant(IR_I32, 0)),
                    builder.extract_element(q, ir.Constant(IR_I32, 1)),
                )
            )
        return context.make_tuple(builder, ret, outs)

    return ret(v), codegen


@intrinsic
def hsum_quarters(typingctx, v):
    """(sum of lanes 0-3, 4-7, 8-11, 12-15) of an F32x16, or (lanes 0-1, 2-3, 4-5, 6-7) of an F32x8 (float32)."""
    if v not in (F32x8, F32x16):
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        (x,) = args
        if v == F32x16:
            even = ir.Constant(ir.VectorType(IR_I32, 8), list(range(0, 16, 2)))
            odd = ir.Constant(ir.VectorType(IR_I32, 8), list(range(1, 16, 2)))
            x = builder.fadd(builder.shuffle_vector(x, x, even), builder.shuffle_vector(x, x, odd))
        even4 = ir.Constant(ir.VectorType(IR_I32, 4), list(range(0, 8, 2)))
        odd4 = ir.Constant(ir.VectorType(IR_I32, 4), list(range(1, 8, 2)))
        x = builder.fadd(builder.shuffle_vector(x, x, even4), builder.shuffle_vector(x, x, odd4))
        return context.make_tuple(builder, ret, [builder.extract_element(x, ir.Constant(IR_I32, k)) for k in range(4)])

    return ret(v), codegen


@intrinsic
def fold4(typingctx, v):
    """(the sum of lanes k, k + 4, k + 8, ... for k = 0..3) of a float vector (float32)."""
    if not is_vec(v):
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        (x,) = args
        n = v.lanes
        while n > 4:
            n //= 2
            x = builder.fadd(slice_lanes(builder, x, 0, n), slice_lanes(builder, x, n, n))
        return context.make_tuple(builder, ret, [builder.extract_element(x, ir.Constant(IR_I32, k)) for k in range(4)])

    return ret(v), codegen


def _prefetch_codegen(a, locality):
    """Codegen of a software prefetch of the line holding a[i]: locality 3 keeps it in every cache level (prefetcht0),
    0 in the nearest only (prefetchnta)."""

    def codegen(context, builder, sig, args):
        aa, i_ = args[:2]
        ptr = builder.bitcast(flat_ptr(context, builder, a, aa, i_), ir.IntType(8).as_pointer())
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, IR_I32, IR_I32, IR_I32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [ptr, ir.Constant(IR_I32, 0), ir.Constant(IR_I32, locality), ir.Constant(IR_I32, 1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch(typingctx, a, i):
    """Ask the caches for the line holding a[i] (a software prefetch; no fault past the array's end)."""
    check_flat(a)
    return types.none(a, i), _prefetch_codegen(a, 3)


@intrinsic
def prefetch_once(typingctx, a, i):
    """`prefetch` of a line read once (a lone activation row's weights): to the nearest cache only (prefetchnta), so
    that a decode step's stream of weights does not push the step's other data and code out of the outer caches."""
    check_flat(a)
    return types.none(a, i), _prefetch_codegen(a, 0)


@intrinsic
def prefetch_weights(typingctx, a, i, rows, full):
    """A weight line's prefetch for a tile of `rows` (a tuple) activation rows in a kernel whose tiles hold `full`
    (a constant). A tile of fewer rows makes the product's only or last pass over these weights: `prefetch_once`.
    A full tile's weights are read again by the next tile: `prefetch`, every level keeps them."""
    check_flat(a)
    if not isinstance(rows, types.BaseTuple) or not isinstance(full, types.IntegerLiteral):
        return None
    return types.none(a, i, rows, full), _prefetch_codegen(a, 0 if len(rows) < full.literal_value else 3)


@intrinsic
def tile_offsets(typingctx, t, K, n):
    """(t * K, (t + 1) * K, ..., (t + n - 1) * K): the offsets in x.ravel() of a tile's n rows (n a constant)."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    count = n.literal_value
    ret = types.UniTuple(types.intp, count)

    def codegen(context, builder, sig, args):
        t_, k_ = (context.cast(builder, a, ty, types.intp) for a, ty in zip(args[:2], sig.args[:2]))
        outs = [builder.mul(builder.add(t_, ir.Constant(t_.type, i)), k_) for i in range(count)]
        return context.make_tuple(builder, ret, outs)

    return ret(t, K, n), codegen

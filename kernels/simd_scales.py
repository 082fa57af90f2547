"""Scale and min reads for the numba kernels, and the scaling of a group's integer sums, as LLVM vector IR (numba
`@intrinsic`s; kernels/simd.py has the vector types).

- `f32_at(a, i)` (a scale or min), `f32x4_at(a, i)` (a block's four: one vector load and conversion),
  `splat_at(a, i)` (one in every lane of an F32xN) read a float32 array, or a uint16 array of float16
  bits (the numba backend's scales where they are float16 values: half the memory; numba has no float16
  type on the CPU), converted to float32 in registers (`fpext`, F16C's vcvtph2ps; uint16 arrays only
  where `target_has("f16c")`).
- `pair_scales`, `quad_scales`, `four_scales`, `twice_scales`: a block's four scales spread to the lanes of
  `simd_dot`'s `q4_pair_i8` / `q4_quad_i8` / `q4_four_i8` / `q8_four_i8` results.
- `scale_acc_tile`, `quad_scales4_tile` + `scale_quad_acc_tile`: a tile's exact int sums of a group times
  the weight and activation scales, added to its accumulators (four groups' scales made at once for the
  latter).
- `x16_acc_tile` / `x16_acc_min_tile`: the same for a sixteen-row block's sums (`simd_dot.q4_x16_i8_tile`),
  Q4_0's scales standing in for the mins, or stored mins.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from kernels.simd import (
    IR_F16,
    IR_F32,
    IR_I16,
    IR_I32,
    IR_VF,
    IR_VF16,
    LANES,
    F32VecType,
    F32x8,
    F32x16,
    F32xN,
    check_flat,
    flat_ptr,
    fmuladd,
    load_f32,
    load_unaligned,
    reads_as_f32,
    splat,
)


@intrinsic
def f32_at(typingctx, a, i):
    """a[i] as float32 (a float32 array, or float16 bits in a uint16 array)."""
    if not reads_as_f32(a):
        return None

    def codegen(context, builder, sig, args):
        aa, i_ = args
        return load_f32(builder, flat_ptr(context, builder, a, aa, i_), a.dtype, 1)

    return types.float32(a, i), codegen


@intrinsic
def splat_at(typingctx, a, i):
    """a[i] as float32 in every lane of an F32xN (a float32 array, or float16 bits in a uint16
    array: the 16 bits are broadcast first and converted as one vector, vpbroadcastw + vcvtph2ps)."""
    if not reads_as_f32(a):
        return None

    def codegen(context, builder, sig, args):
        aa, i_ = args
        half = a.dtype == types.uint16
        ptr = flat_ptr(context, builder, a, aa, i_)
        v = splat(
            builder,
            load_unaligned(builder, builder.bitcast(ptr, (IR_I16 if half else IR_F32).as_pointer())),
            ir.VectorType(IR_I16 if half else IR_F32, LANES),
        )
        return builder.fpext(builder.bitcast(v, ir.VectorType(IR_F16, LANES)), IR_VF) if half else v

    return F32xN(a, i), codegen


@intrinsic
def f32x4_at(typingctx, a, i):
    """a[i : i + 4] as four float32 (a float32 array, or float16 bits in a uint16 array): one
    vector load and conversion for a block's four rows."""
    if not reads_as_f32(a):
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        aa, i_ = args
        v = load_f32(builder, flat_ptr(context, builder, a, aa, i_), a.dtype, 4)
        return context.make_tuple(builder, ret, [builder.extract_element(v, ir.Constant(IR_I32, k)) for k in range(4)])

    return ret(a, i), codegen


@intrinsic
def pair_scales(typingctx, scale, si, d):
    """scale[si : si + 4] times d as two F32x8: (s0 x4, s1 x4) and (s2 x4, s3 x4), the per-lane
    scales of `q4_pair_i8`'s results for rows 0|1 and 2|3 of a block."""
    if not reads_as_f32(scale) or d != types.float32:
        return None
    ret = types.UniTuple(F32x8, 2)

    def codegen(context, builder, sig, args):
        sa, si_, d_ = args
        v4 = ir.VectorType(IR_F32, 4)
        s4 = load_f32(builder, flat_ptr(context, builder, scale, sa, si_), scale.dtype, 4)
        s4 = builder.fmul(s4, splat(builder, d_, v4))
        outs = [
            builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(IR_I32, 8), [a] * 4 + [a + 1] * 4)) for a in (0, 2)
        ]
        return context.make_tuple(builder, ret, outs)

    return ret(scale, si, d), codegen


def _spread4(name, lanes, doc):
    """An intrinsic (scale, si) -> scale[si : si + 4] spread to the lanes of a vector, lane j taking scale
    si + lanes[j]: a four-row block's per-lane scales, laid out as its product's sums are."""
    vec = F32x16 if len(lanes) == 16 else F32x8

    def spread(typingctx, scale, si):
        if not reads_as_f32(scale):
            return None

        def codegen(context, builder, sig, args):
            sa, si_ = args
            s4 = load_f32(builder, flat_ptr(context, builder, scale, sa, si_), scale.dtype, 4)
            return builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(IR_I32, len(lanes)), list(lanes)))

        return vec(scale, si), codegen

    spread.__name__ = spread.__qualname__ = name
    spread.__doc__ = doc
    return intrinsic(spread)


quad_scales = _spread4(
    "quad_scales",
    [j // 4 for j in range(16)],
    "scale[si : si + 4] as an F32x16 (s0 x4, s1 x4, s2 x4, s3 x4): the per-lane scales of `q4_quad_i8`'s result.",
)
four_scales = _spread4(
    "four_scales",
    [0, 0, 2, 2, 1, 1, 3, 3],
    "scale[si : si + 4] as an F32x8 (s0, s0, s2, s2, s1, s1, s3, s3): the per-lane scales of `q4_four_i8`'s result.",
)
twice_scales = _spread4(
    "twice_scales",
    [0, 1, 2, 3] * 2,
    "scale[si : si + 4] twice as an F32x8 (s0, s1, s2, s3, s0, s1, s2, s3): the per-lane scales of `q8_four_i8`'s "
    "result.",
)


@intrinsic
def scale_acc_tile(typingctx, ints, w, xd, offs, g, accs):
    """accs[i] + ints[i] * (w * xd[offs[i] + g]) for each row i of a tile: a group's exact int sums
    (`*_i8_tile`) scaled by the weight scales `w` (one vector, or a float32 for every lane) and row i's
    activation scale."""
    if not (
        isinstance(ints, types.UniTuple)
        and isinstance(ints.dtype, F32VecType)
        and accs == ints
        and w in (ints.dtype, types.float32)
        and isinstance(offs, types.UniTuple)
        and offs.count == ints.count
    ):
        return None
    check_flat(xd)

    def codegen(context, builder, sig, args):
        ints_, w_, xa, offs_, g_, accs_ = args
        if w == types.float32:
            w_ = splat(builder, w_, ir.VectorType(IR_F32, ints.dtype.lanes))
        outs = []
        for i in range(ints.count):
            at = builder.add(
                context.cast(builder, builder.extract_value(offs_, i), offs.dtype, types.intp),
                context.cast(builder, g_, g, types.intp),
            )
            d = load_unaligned(builder, flat_ptr(context, builder, xd, xa, at))
            sc = builder.fmul(w_, splat(builder, d, w_.type))
            outs.append(fmuladd(builder, builder.extract_value(ints_, i), sc, builder.extract_value(accs_, i)))
        return context.make_tuple(builder, sig.return_type, outs)

    return accs(ints, w, xd, offs, g, accs), codegen


@intrinsic
def quad_scales4_tile(typingctx, scale, si, xd, offs, g):
    """Four groups' scales at once, for each row i of a tile: scale[si : si + 16] (a block's four rows'
    scales of groups g .. g + 3, lane 4k + r group g + k's row r) times row i's activation scales, lanes 4k ..
    4k + 3 times xd[offs[i] + g + k]. One load and conversion for four groups; `scale_quad_acc_tile` takes
    group k's lanes. The products are `quad_scales` times the activation scale, bit for bit."""
    if not (reads_as_f32(scale) and isinstance(offs, types.UniTuple)):
        return None
    check_flat(xd)
    if xd.dtype != types.float32:
        return None
    ret = types.UniTuple(F32x16, offs.count)

    def codegen(context, builder, sig, args):
        sa, si_, xa, offs_, g_ = args
        w16 = load_f32(builder, flat_ptr(context, builder, scale, sa, si_), scale.dtype, 16)
        spread = ir.Constant(ir.VectorType(IR_I32, 16), [j // 4 for j in range(16)])
        outs = []
        for i in range(offs.count):
            at = builder.add(
                context.cast(builder, builder.extract_value(offs_, i), offs.dtype, types.intp),
                context.cast(builder, g_, g, types.intp),
            )
            x4 = load_f32(builder, flat_ptr(context, builder, xd, xa, at), xd.dtype, 4)
            outs.append(builder.fmul(w16, builder.shuffle_vector(x4, x4, spread)))
        return context.make_tuple(builder, ret, outs)

    return ret(scale, si, xd, offs, g), codegen


@intrinsic
def scale_quad_acc_tile(typingctx, ints, sc, k, accs):
    """accs[i] + ints[i] * group k's scales of sc[i] (`quad_scales4_tile`), lanes 4r .. 4r + 3 times
    sc[i][4k + r]: `scale_acc_tile` with the scales of four groups made at once (k a constant, 0 .. 3)."""
    if not (
        isinstance(ints, types.UniTuple)
        and ints.dtype == F32x16
        and accs == ints
        and sc == ints
        and isinstance(k, types.IntegerLiteral)
        and 0 <= k.literal_value < 4
    ):
        return None
    kk = k.literal_value

    def codegen(context, builder, sig, args):
        ints_, sc_, _, accs_ = args
        pick = ir.Constant(ir.VectorType(IR_I32, 16), [4 * kk + j // 4 for j in range(16)])
        outs = []
        for i in range(ints.count):
            v = builder.extract_value(sc_, i)
            outs.append(
                fmuladd(
                    builder,
                    builder.extract_value(ints_, i),
                    builder.shuffle_vector(v, v, pick),
                    builder.extract_value(accs_, i),
                )
            )
        return context.make_tuple(builder, sig.return_type, outs)

    return accs(ints, sc, k, accs), codegen


def _stripe_acc_tile(with_min: bool):
    """`x16_acc_tile` (Q4_0: the scales stand in for the mins) or `x16_acc_min_tile` (stored mins)."""

    def acc_tile(typingctx, ints, scale, minv, si, xd, xsm, offs, g, accs):
        if not (
            isinstance(ints, types.UniTuple)
            and ints.dtype == F32x16
            and accs == ints
            and reads_as_f32(scale)
            and (not with_min or minv == scale)
            and isinstance(offs, types.UniTuple)
            and offs.count == ints.count
        ):
            return None
        check_flat(xd, xsm)

        def codegen(context, builder, sig, args):
            ints_, sa, ma, si_, xa, sma, offs_, g_, accs_ = args
            d16 = load_f32(builder, flat_ptr(context, builder, scale, sa, si_), scale.dtype, 16)
            m16 = load_f32(builder, flat_ptr(context, builder, minv, ma, si_), minv.dtype, 16) if with_min else None
            outs = []
            for i in range(ints.count):
                at = builder.add(
                    context.cast(builder, builder.extract_value(offs_, i), offs.dtype, types.intp),
                    context.cast(builder, g_, g, types.intp),
                )
                xdv = splat(builder, load_unaligned(builder, flat_ptr(context, builder, xd, xa, at)), IR_VF16)
                xsv = splat(builder, load_unaligned(builder, flat_ptr(context, builder, xsm, sma, at)), IR_VF16)
                acc = builder.extract_value(accs_, i)
                if with_min:  # d * xd * isum + m * xsum
                    acc = fmuladd(builder, builder.extract_value(ints_, i), builder.fmul(d16, xdv), acc)
                    acc = fmuladd(builder, m16, xsv, acc)
                else:  # d * (xd * isum - 8 xsum)
                    acc = fmuladd(builder, fmuladd(builder, builder.extract_value(ints_, i), xdv, xsv), d16, acc)
                outs.append(acc)
            return context.make_tuple(builder, sig.return_type, outs)

        return accs(ints, scale, minv, si, xd, xsm, offs, g, accs), codegen

    acc_tile.__name__ = acc_tile.__qualname__ = "x16_acc_min_tile" if with_min else "x16_acc_tile"
    acc_tile.__doc__ = (
        "accs[i] + a group's exact int sums for row i of a tile (`q4_x16_i8_tile`) scaled into float32: with "
        "scale[si : si + 16] (d, one per weight row), row i's activation scale xd[offs[i] + g] and its quantized "
        "sum times the mins' factor xsm[offs[i] + g], "
        + (
            "plus the stored mins minv[si : si + 16] times that sum: d xd isum + m xsum."
            if with_min
            else "the scales standing in for the mins (Q4_0, xsm = -8 xsum): d (xd isum + xsm); minv is unused."
        )
    )
    return intrinsic(acc_tile)


x16_acc_tile = _stripe_acc_tile(False)
x16_acc_min_tile = _stripe_acc_tile(True)

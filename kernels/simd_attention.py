"""The attention's register tiles, as LLVM vector IR (numba `@intrinsic`s; kernels/simd.py has the vector types):
one vector against several rows found through an offset table.

- `vfma_rows(v, a, offs, j, accs)`: accs[i] + v * the vector at a[offs[i] + j] (one query slice against
  several keys);
- `vfma_bcast(v, a, offs, j, accs)`: accs[i] + v * the value a[offs[i] + j], broadcast (a vector of keys
  or values against several queries);
- `vstore_rows(a, offs, j, vs)`;
- `vsum_lanes(accs)`: LANES vectors' lane sums as one vector, by a transposing tree.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.simd import IR_I32, IR_VF, LANES, F32VecType, F32xN, check_flat, flat_ptr, fmuladd, load_f32, splat


def _lane_sum_shuffles(lanes: int) -> list[tuple[list[int], list[int]]]:
    """The (low, high) shuffle masks of one level of `vsum_lanes`'s tree per group width: a vector
    whose groups of width w each hold partial sums of one input, paired with the next such vector,
    becomes one vector of groups of width w / 2 (the first's groups, then the second's)."""
    levels = []
    w = lanes
    while w > 1:
        half = w // 2
        lo = [base + g * w + i for base in (0, lanes) for g in range(lanes // w) for i in range(half)]
        levels.append((lo, [i + half for i in lo]))
        w = half
    return levels


@intrinsic
def vsum_lanes(typingctx, accs):
    """A vector whose lane i is the sum of accs[i]'s lanes (a tuple of as many float vectors as they
    have lanes): a transposing tree of shuffles and adds, lanes - 1 adds for all the sums where one
    `hsum` each would take log2(lanes) dependent steps and a scalar per sum."""
    if not (isinstance(accs, types.UniTuple) and isinstance(accs.dtype, F32VecType)):
        return None
    if accs.count != accs.dtype.lanes:
        return None
    levels = _lane_sum_shuffles(accs.count)

    def codegen(context, builder, sig, args):
        (t,) = args
        vs = [builder.extract_value(t, i) for i in range(accs.count)]
        for lo, hi in levels:
            lo_m = ir.Constant(ir.VectorType(IR_I32, len(lo)), lo)
            hi_m = ir.Constant(ir.VectorType(IR_I32, len(hi)), hi)
            vs = [
                builder.fadd(builder.shuffle_vector(a, b, lo_m), builder.shuffle_vector(a, b, hi_m))
                for a, b in zip(vs[0::2], vs[1::2])
            ]
        return vs[0]

    return accs.dtype(accs), codegen


def _offset_tile_ok(a, offs, vs) -> bool:
    """The operands of the offset-table blocks: a flat float32 array, flat int64 offsets, a tuple of F32xN."""
    check_flat(a, offs)
    return (
        isinstance(vs, types.UniTuple) and vs.dtype == F32xN and a.dtype == types.float32 and offs.dtype == types.int64
    )


def _offset_ptrs(context, builder, sig, a_pos, offs_pos, j_pos, args, count):
    """The addresses of a[offs[i] + j] for i < count (a, offs, j the arguments at those positions)."""
    j_ = context.cast(builder, args[j_pos], sig.args[j_pos], types.intp)
    offs_ary = context.make_array(sig.args[offs_pos])(context, builder, args[offs_pos])
    ptrs = []
    for i in range(count):
        o = builder.load(cgutils.gep(builder, offs_ary.data, i))
        ptrs.append(flat_ptr(context, builder, sig.args[a_pos], args[a_pos], builder.add(o, j_)))
    return ptrs


@intrinsic
def vfma_rows(typingctx, v, a, offs, j, accs):
    """accs[i] + v * a[offs[i] + j : ... + LANES] for every i: one vector (a query's slice) against the
    same slice of several rows found through an offset table (offs: 1-D int64, at least len(accs))."""
    if not (v == F32xN and _offset_tile_ok(a, offs, accs)):
        return None

    def codegen(context, builder, sig, args):
        ptrs = _offset_ptrs(context, builder, sig, 1, 2, 3, args, accs.count)
        outs = [
            fmuladd(builder, args[0], load_f32(builder, p, types.float32, LANES), builder.extract_value(args[4], i))
            for i, p in enumerate(ptrs)
        ]
        return context.make_tuple(builder, sig.return_type, outs)

    return accs(v, a, offs, j, accs), codegen


@intrinsic
def vfma_bcast(typingctx, v, a, offs, j, accs):
    """accs[i] + v * a[offs[i] + j] for every i (the scalar broadcast): one vector (a row of keys'
    values, or a V slice) against one value of several query rows found through an offset table
    (offs: 1-D int64, at least len(accs)). The register tile of a small matrix product."""
    if not (v == F32xN and _offset_tile_ok(a, offs, accs)):
        return None

    def codegen(context, builder, sig, args):
        ptrs = _offset_ptrs(context, builder, sig, 1, 2, 3, args, accs.count)
        outs = [
            fmuladd(builder, args[0], splat(builder, builder.load(p), IR_VF), builder.extract_value(args[4], i))
            for i, p in enumerate(ptrs)
        ]
        return context.make_tuple(builder, sig.return_type, outs)

    return accs(v, a, offs, j, accs), codegen


@intrinsic
def vstore_rows(typingctx, a, offs, j, vs):
    """a[offs[i] + j : ... + LANES] = vs[i] for every i (a flat float32 array; offs 1-D int64). Rows may
    repeat (a padded tile): each then gets the same values."""
    if not _offset_tile_ok(a, offs, vs):
        return None

    def codegen(context, builder, sig, args):
        for i, p in enumerate(_offset_ptrs(context, builder, sig, 0, 1, 2, args, vs.count)):
            builder.store(builder.extract_value(args[3], i), builder.bitcast(p, IR_VF.as_pointer())).align = 1
        return context.get_dummy_value()

    return types.none(a, offs, j, vs), codegen

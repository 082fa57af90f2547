"""A weight group dequantized into a float32 array in vectors, bit-equal to `Weight.dequantize` (numba
`@intrinsic`s; kernels/simd.py has the vector types): the numba backend's row dequantizers and the panels of
its BLAS products."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from kernels.simd import IR_I8, IR_I32, IR_VF, LANES, check_flat, flat_ptr, load_unaligned, splat


@intrinsic
def q4_dequant32(typingctx, q, qi, d, m, zero, out, oi):
    """out[oi : oi + 32] = d * (the packed 4-bit group at q[qi]'s values - zero) + m (flat uint8 q, float32 out;
    values 0..15 from bytes 0..15's low nibbles, 16..31 from their high ones): a product, then a sum, each
    rounded once, as `Weight.dequantize` computes scale * q + min and scale * (q - zero)."""
    check_flat(q, out)
    if out.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        qa, qi_, d_, m_, zero_, oa, oi_ = args
        qp = flat_ptr(context, builder, q, qa, qi_)
        op = flat_ptr(context, builder, out, oa, oi_)
        vi = ir.VectorType(IR_I32, LANES)
        z = splat(builder, builder.trunc(zero_, IR_I32) if zero_.type != IR_I32 else zero_, vi)
        dv, mv = splat(builder, d_, IR_VF), splat(builder, m_, IR_VF)
        bytes_ty = ir.VectorType(IR_I8, LANES).as_pointer()
        for h in range(0, 16, LANES):
            w = builder.zext(
                load_unaligned(builder, builder.bitcast(builder.gep(qp, [ir.Constant(IR_I32, h)]), bytes_ty)), vi
            )
            low = builder.and_(w, ir.Constant(vi, [15] * LANES))
            high = builder.lshr(w, ir.Constant(vi, [4] * LANES))
            for nib, at in ((low, h), (high, 16 + h)):
                v = builder.fadd(builder.fmul(builder.sitofp(builder.sub(nib, z), IR_VF), dv), mv)
                st = builder.store(v, builder.bitcast(builder.gep(op, [ir.Constant(IR_I32, at)]), IR_VF.as_pointer()))
                st.align = 4
        return context.get_dummy_value()

    return types.none(q, qi, types.float32, types.float32, types.int64, out, oi), codegen


@intrinsic
def q8_dequant16(typingctx, q, qi, d, m, out, oi):
    """out[oi : oi + 16] = d * (the 16 int8 weights at q[qi]) + m (flat int8 q, float32 out): a product, then a
    sum, each rounded once, as `Weight.dequantize` computes scale * q + min."""
    check_flat(q, out)
    if out.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        qa, qi_, d_, m_, oa, oi_ = args
        qp = flat_ptr(context, builder, q, qa, qi_)
        op = flat_ptr(context, builder, out, oa, oi_)
        dv, mv = splat(builder, d_, IR_VF), splat(builder, m_, IR_VF)
        bytes_ty = ir.VectorType(IR_I8, LANES).as_pointer()
        for h in range(0, 16, LANES):
            w = load_unaligned(builder, builder.bitcast(builder.gep(qp, [ir.Constant(IR_I32, h)]), bytes_ty))
            v = builder.fadd(builder.fmul(builder.sitofp(w, IR_VF), dv), mv)
            st = builder.store(v, builder.bitcast(builder.gep(op, [ir.Constant(IR_I32, h)]), IR_VF.as_pointer()))
            st.align = 4
        return context.get_dummy_value()

    return types.none(q, qi, types.float32, types.float32, out, oi), codegen

"""SIMD for the numba kernels, written as LLVM vector IR (numba `@intrinsic`s): the vector types, what the compile
target offers, and the IR helpers the blocks are built from.

numba has no vector types and its auto-vectorized code for a quantized dot product reduces
every 32-value group to a scalar before scaling it. Here a float32 vector held in one register
is a value numba code can hold in a variable: kernels keep one such accumulator per output row
across all groups and reduce it once per row. The float blocks' vectors are `F32xN`: 16 lanes
(`F32x16`, a zmm register) where the compile target has AVX-512, 8 (`F32x8`, a ymm register)
otherwise; `LANES` says which. The int8 blocks' results are always `F32x8`.

The blocks, by subject (each reads a 1-D C-contiguous array at an element offset, unaligned):

- `kernels/simd_dot.py`: a weight group's dot products with the activations, float and int8, for one
  activation row or a tile of rows;
- `kernels/simd_scales.py`: scale and min reads (float32, or float16 bits in uint16 arrays) and the scaling
  of a group's integer sums into float accumulators;
- `kernels/simd_vectors.py`: vector basics: zeros, loads and stores, FMA, horizontal sums, prefetch, a
  tile's row offsets;
- `kernels/simd_attention.py`: the attention's register tiles over rows found through an offset table;
- `kernels/simd_dequant.py`: a weight group dequantized into a float32 array, bit-equal to `Weight.dequantize`.

Their code is compiled into other files' kernels, so kernels/numba_jit.py's `_INLINED` names each of these
files: a cached kernel's stamp covers the blocks it inlines.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.registry import cpu_target
from numba.extending import models, register_model

# The LLVM IR types the blocks are written in (scalars here, the float vectors after LANES).
IR_F32 = ir.FloatType()
IR_F16 = ir.HalfType()
IR_I8, IR_I16, IR_I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def target_has(feature: str) -> bool:
    """Whether the CPU numba compiles for (the host unless NUMBA_CPU_NAME says otherwise) has `feature`."""
    features = cpu_target.target_context.codegen().magic_tuple()[2]
    return f"+{feature}" in features.split(",")


class F32VecType(types.Type):
    """`lanes` float32 values held in one register."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        super().__init__(name=f"F32x{lanes}")


@register_model(F32VecType)
class _F32VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(IR_F32, fe_type.lanes))


F32x8, F32x16 = F32VecType(8), F32VecType(16)
# The float blocks' width: a zmm register where the compile target has AVX-512 (half the
# instructions of ymm for the same work), a ymm register otherwise. The int8 blocks stay F32x8.
LANES = 16 if target_has("avx512f") else 8
F32xN = F32x16 if LANES == 16 else F32x8
IR_VF = ir.VectorType(IR_F32, LANES)
IR_VF8 = ir.VectorType(IR_F32, 8)
IR_VF16 = ir.VectorType(IR_F32, 16)
# Integer dot products of unsigned by signed bytes, 4 products summed into each int32 lane in one
# instruction (vpdpbusd): on zmm registers with AVX-512 VNNI (+BW for the byte operations around it),
# on ymm with AVX-512 VNNI + VL or AVX-VNNI; otherwise AVX2's vpmaddubsw + vpmaddwd (two instructions
# and a constant). Chosen from the CPU numba compiles for, so a process pinned to a narrower CPU
# (NUMBA_CPU_NAME, how the tests force each path) gets the narrower code.
VNNI512 = target_has("avx512vnni") and target_has("avx512bw")
VNNI256 = target_has("avxvnni") or (target_has("avx512vnni") and target_has("avx512vl"))


def is_vec(*ts) -> bool:
    """Whether every type is the same float vector type."""
    return isinstance(ts[0], F32VecType) and all(t == ts[0] for t in ts)


def load_unaligned(builder, ptr):
    """The value at `ptr`, read without an alignment promise: the blocks read arrays at any element offset."""
    v = builder.load(ptr)
    v.align = 1  # unaligned load (vmovdqu)
    return v


def slice_lanes(builder, v, start, n):
    """Lanes start .. start + n - 1 of the vector v, as a vector of n."""
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(IR_I32, n), list(range(start, start + n))))


def call_llvm(builder, name, ret, args):
    """Call an LLVM intrinsic by its full name (e.g. "llvm.fmuladd.v8f32")."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def fmuladd(builder, a, b, c):
    """a * b + c over float32 vectors of any width."""
    return call_llvm(builder, f"llvm.fmuladd.v{a.type.count}f32", a.type, [a, b, c])


def splat(builder, s, vecty):
    """The scalar s in every lane of a vector of type `vecty`."""
    undef = ir.Constant(vecty, ir.Undefined)
    v = builder.insert_element(undef, s, ir.Constant(IR_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(IR_I32, vecty.count), [0] * vecty.count))


def check_flat(*arrays):
    """Raise TypeError unless every array type is 1-D C-contiguous: the blocks index them by element offsets."""
    for a in arrays:
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"):
            raise TypeError(f"simd blocks read 1-D C-contiguous arrays, got {a}")


def flat_ptr(context, builder, aryty, ary, idx):
    """The address of element idx of a 1-D C-contiguous array."""
    return builder.gep(context.make_array(aryty)(context, builder, ary).data, [idx])


def reads_as_f32(a):
    """Whether `a` is a flat float32 array or a flat uint16 array of float16 bits."""
    check_flat(a)
    return a.dtype in (types.float32, types.uint16)


def load_f32(builder, ptr, dtype, n):
    """n values (n > 1: a vector) from an element pointer of a float32 or uint16 (float16 bits) array, as float32."""
    half = dtype == types.uint16
    ty = IR_F16 if half else IR_F32
    out = IR_F32
    if n > 1:
        ty, out = ir.VectorType(ty, n), ir.VectorType(IR_F32, n)
    v = load_unaligned(builder, builder.bitcast(ptr, ty.as_pointer()))
    return builder.fpext(v, out) if half else v


def zero_tuple(context, builder, ret):
    """A tuple `ret` of zero F32xN."""
    return context.make_tuple(builder, ret, [ir.Constant(IR_VF, [0.0] * LANES)] * ret.count)

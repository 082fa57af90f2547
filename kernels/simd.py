"""SIMD building blocks for the numba kernels, written as LLVM vector IR (numba `@intrinsic`s).

numba has no vector types and its auto-vectorized code for a quantized dot product reduces
every 32-value group to a scalar before scaling it. Here a float32 vector held in one register
is a value numba code can hold in a variable: kernels keep one such accumulator per output row
across all groups and reduce it once per row. The float blocks' vectors are `F32xN`: 16 lanes
(`F32x16`, a zmm register) where the compile target has AVX-512, 8 (`F32x8`, a ymm register)
otherwise; `LANES` says which. The int8 blocks' results are always `F32x8`.

Blocks (each reads a 1-D C-contiguous array at an element offset, unaligned):

- `q4_dot32(q, qi, x, xi)`: 16 bytes of packed nibbles (value j low, value j + 16 high) times
  32 float32 activations -> F32xN partial sums (not yet reduced, not yet scaled)
- `q8_dot16`, `q8_dot32`: 16 / 32 int8 values times float32 activations -> F32xN
- `q8_dot32_i8(q, qi, xq, xi)`: the same group times 32 int8-quantized activations, as exact
  int32 sums per lane converted to F32x8.
- `q4_x16_i8(q, qi, xq, xi)`: a 16-row block's packed group (256 bytes, numba_layout's STRIPE16
  order) times 32 int8 activations -> F32x16 of exact int sums, lane r row r's: eight `vpdpbusd`, each
  against four activations broadcast as one int32; `x16_acc_tile` / `x16_acc_min_tile` scale a tile's
  sums into its accumulators (Q4_0's scales standing in for the mins, or stored mins);
  `q4_x16_split` takes the activations as four int8 pieces (the float32 mode, as `q4_quad_split`).
- `q4_pair_i8(q, qi, x2, xi)`: two rows' packed 4-bit groups (32 bytes: the layout's rows 0|1 or
  2|3 of a block) times int8 activations in pair layout ([x0..15, x0..15, x16..31, x16..31]), one
  vector for both rows: lanes 0-3 row A's exact sums, 4-7 row B's. Half the instructions of one
  row at a time; `pair_scales(scale, si, d)` gives the matching per-lane scales.
  The int8 blocks use AVX2 `vpmaddubsw`/`vpmaddwd` where the compile target has AVX2, plain vector
  IR (LLVM lowers it for any x86-64) otherwise. Neither saturates: |weight| <= 128,
  |activation| <= 127, so a pair sum stays below 2^15 (the q4 pair adds two: 4 * 15 * 127).
- `q4_dot32_tile(q, qi, x, xi, rows)`, `q8_dot16_tile`, `q8_dot32_tile` unpack the weight group
  once and dots it with several activation rows (row i's group at x[rows[i] + xi]), returning a
  tuple of F32xN: the register blocking that lets a few rows share one unpack.
- `q4_acc32_tile(q, qi, d, m, x, xi, rows, accs)`, `q8_acc16_tile`, `q8_acc32_tile` dequantize the
  group first (d * q + m, one FMA per vector of weights) and add its dot product with each tile row
  to that row's accumulator in `accs`: the wide tiles' block (no scaling per row, no mins pass).
- `tile_offsets(t, K, n)`: the offsets of rows t .. t + n - 1 in x.ravel(), a tuple (n a constant).
- `f32_at(a, i)` (a scale or min), `f32x4_at(a, i)` (a block's four: one vector load and
  conversion), `splat_at(a, i)` (one in every lane of an F32xN), `vload(a, i)` (LANES of them as
  F32xN; `vstore(a, i, v)` writes them to a float32 array) read a float32 array, or a uint16 array
  of float16 bits (the numba backend's scales where they are float16 values: half the memory; numba
  has no float16 type on the CPU), converted to
  float32 in registers (`fpext`, F16C's vcvtph2ps; uint16 arrays only where `target_has("f16c")`).
- The attention's register tiles: `vfma_rows(v, a, offs, j, accs)` (accs[i] + v * the vector at
  a[offs[i] + j]: one query slice against several keys), `vfma_bcast(v, a, offs, j, accs)` (accs[i] +
  v * the value a[offs[i] + j], broadcast: a vector of keys or values against several queries),
  `vstore_rows(a, offs, j, vs)`, `vsum_lanes(accs)` (LANES vectors' lane sums as one vector, by a
  transposing tree), `vzero_n(n)` (n zero F32xN), `vscale(v, s)`.
- `vzero()` (F32xN), `vzero8()` (F32x8), `vzero_tile(rows)`, `vfma(a, b, acc)`, `vfma_s(v, s, acc)`
  (acc + v * s, also element-wise over tuples; s a float32 or, over tuples, a splat vector),
  `hsum(v)`, `hsum_halves(v)` (an F32x8's lanes 0-3, 4-7), `fold4(v)` (the sums of lanes k,
  k + 4, k + 8, ...).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.registry import cpu_target
from numba.extending import intrinsic, models, register_model

_f32 = ir.FloatType()
_f16 = ir.HalfType()
_i8, _i16, _i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


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
        super().__init__(dmm, fe_type, ir.VectorType(_f32, fe_type.lanes))


F32x8, F32x16 = F32VecType(8), F32VecType(16)
# The float blocks' width: a zmm register where the compile target has AVX-512 (half the
# instructions of ymm for the same work), a ymm register otherwise. The int8 blocks stay F32x8.
LANES = 16 if target_has("avx512f") else 8
F32xN = F32x16 if LANES == 16 else F32x8
_vf = ir.VectorType(_f32, LANES)
_vf8 = ir.VectorType(_f32, 8)
_vf16 = ir.VectorType(_f32, 16)
# Integer dot products of unsigned by signed bytes, 4 products summed into each int32 lane in one
# instruction (vpdpbusd): on zmm registers with AVX-512 VNNI (+BW for the byte operations around it),
# on ymm with AVX-512 VNNI + VL or AVX-VNNI; otherwise AVX2's vpmaddubsw + vpmaddwd (two instructions
# and a constant). Chosen from the CPU numba compiles for, so a process pinned to a narrower CPU
# (NUMBA_CPU_NAME, how the tests force each path) gets the narrower code.
VNNI512 = target_has("avx512vnni") and target_has("avx512bw")
VNNI256 = target_has("avxvnni") or (target_has("avx512vnni") and target_has("avx512vl"))


def _is_vec(*ts) -> bool:
    """Whether every type is the same float vector type."""
    return isinstance(ts[0], F32VecType) and all(t == ts[0] for t in ts)


def _load(builder, ptr):
    v = builder.load(ptr)
    v.align = 1  # unaligned load (vmovdqu)
    return v


def _slice(builder, v, start, n):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, n), list(range(start, start + n))))


def _call(builder, name, ret, args):
    """Call an LLVM intrinsic by its full name (e.g. "llvm.fmuladd.v8f32")."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _fmuladd(builder, a, b, c):
    """a * b + c over float32 vectors of any width."""
    return _call(builder, f"llvm.fmuladd.v{a.type.count}f32", a.type, [a, b, c])


def _splat(builder, s, vecty):
    undef = ir.Constant(vecty, ir.Undefined)
    v = builder.insert_element(undef, s, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_i32, vecty.count), [0] * vecty.count))


def _check_flat(*arrays):
    for a in arrays:
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"):
            raise TypeError(f"simd blocks read 1-D C-contiguous arrays, got {a}")


def _dot_parts(builder, parts, xb):
    """sum over (weight vector, offset) parts of weights * x[offset : offset + LANES] -> F32xN."""
    acc = None
    for fc, off in parts:
        xv = _load(builder, builder.bitcast(builder.gep(xb, [ir.Constant(_i32, off)]), fc.type.as_pointer()))
        acc = builder.fmul(fc, xv) if acc is None else _fmuladd(builder, fc, xv, acc)
    return acc


def _q4_f32(builder, qp):
    """A packed 4-bit group -> [(F32xN of weights, their offset in the group)]: values 0..15 from bytes 0..15's
    low nibbles, 16..31 from their high ones, in loads of LANES bytes."""
    vi = ir.VectorType(_i32, LANES)
    parts = []
    for h in range(0, 16, LANES):
        p = builder.gep(qp, [ir.Constant(_i32, h)])
        b = _load(builder, builder.bitcast(p, ir.VectorType(_i8, LANES).as_pointer()))
        w = builder.zext(b, vi)
        parts.append((builder.sitofp(builder.and_(w, ir.Constant(vi, [15] * LANES)), _vf), h))
        parts.append((builder.sitofp(builder.lshr(w, ir.Constant(vi, [4] * LANES)), _vf), 16 + h))
    return parts


def _q8_f32(n):
    def unpack(builder, qp):
        """n int8 weights -> [(F32xN of weights, their offset in the group)]."""
        b = _load(builder, builder.bitcast(qp, ir.VectorType(_i8, n).as_pointer()))
        f = builder.sitofp(builder.sext(b, ir.VectorType(_i32, n)), ir.VectorType(_f32, n))
        return [(_slice(builder, f, c * LANES, LANES), c * LANES) for c in range(n // LANES)]

    return unpack


def _dpbusd(builder, acc, u, s):
    """acc (<n x i32>) + sums of 4 adjacent products of u (<4n x i8>, unsigned) and s (signed): vpdpbusd,
    no saturation (n = 8 or 16)."""
    n = acc.type.count
    vi = ir.VectorType(_i32, n)
    return _call(
        builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", vi, [acc, builder.bitcast(u, vi), builder.bitcast(s, vi)]
    )


def _madd_u8s8(builder, u, s):
    """<32 x i8> unsigned times <32 x i8> signed, sums of 4 adjacent products -> <8 x i32> (exact here)."""
    if VNNI256:
        return _dpbusd(builder, ir.Constant(ir.VectorType(_i32, 8), [0] * 8), u, s)
    if target_has("avx2"):
        v16 = ir.VectorType(_i16, 16)
        p16 = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [u, s])
        return _call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(_i32, 8), [p16, ir.Constant(v16, [1] * 16)])
    return _sum4(
        builder, builder.mul(builder.zext(u, ir.VectorType(_i32, 32)), builder.sext(s, ir.VectorType(_i32, 32)))
    )


def _sum4(builder, prod):
    """<32 x i32> -> <8 x i32>: sums of 4 adjacent lanes."""
    acc = None
    for k in range(4):
        lanes = builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(_i32, 8), list(range(k, 32, 4))))
        acc = lanes if acc is None else builder.add(acc, lanes)
    return acc


def _load_x8(builder, xb):
    return _load(builder, builder.bitcast(xb, ir.VectorType(_i8, 32).as_pointer()))


def _q8_i8(builder, qp):
    """32 int8 weights -> dot(int8 x pointer) of exact int sums."""
    v32 = ir.VectorType(_i8, 32)
    w = _load(builder, builder.bitcast(qp, v32.as_pointer()))
    if target_has("avx2"):  # |w| as unsigned, the sign moved onto x (llama.cpp's trick for vpmaddubsw)
        aw = _call(builder, "llvm.abs.v32i8", v32, [w, ir.Constant(ir.IntType(1), 0)])
        return lambda xb: builder.sitofp(
            _madd_u8s8(builder, aw, _call(builder, "llvm.x86.avx2.psign.b", v32, [_load_x8(builder, xb), w])), _vf8
        )
    wide = ir.VectorType(_i32, 32)
    ws = builder.sext(w, wide)
    return lambda xb: builder.sitofp(_sum4(builder, builder.mul(ws, builder.sext(_load_x8(builder, xb), wide))), _vf8)


def _q4_pair_i8(builder, qp):
    """Two rows' packed 4-bit groups (32 bytes, row A then row B) -> dot(int8 x pointer, pair layout)
    of exact int sums, lanes 0-3 row A's, 4-7 row B's. The two vpmaddubsw results are added as
    int16 before one vpmaddwd (not `_madd_u8s8` twice): |sum| <= 4 * 15 * 127 < 2^15."""
    v32 = ir.VectorType(_i8, 32)
    b = _load(builder, builder.bitcast(qp, v32.as_pointer()))
    lo = builder.and_(b, ir.Constant(v32, [15] * 32))
    hi = builder.lshr(b, ir.Constant(v32, [4] * 32))

    def dot(xb):
        xa = _load_x8(builder, xb)
        xh = _load_x8(builder, builder.gep(xb, [ir.Constant(_i32, 32)]))
        if VNNI256:
            zero = ir.Constant(ir.VectorType(_i32, 8), [0] * 8)
            sums = _dpbusd(builder, _dpbusd(builder, zero, lo, xa), hi, xh)
        elif target_has("avx2"):
            v16 = ir.VectorType(_i16, 16)
            p = builder.add(
                _call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [lo, xa]),
                _call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [hi, xh]),
            )
            sums = _call(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(_i32, 8), [p, ir.Constant(v16, [1] * 16)])
        else:
            wide = ir.VectorType(_i32, 32)
            sums = _sum4(
                builder,
                builder.add(
                    builder.mul(builder.zext(lo, wide), builder.sext(xa, wide)),
                    builder.mul(builder.zext(hi, wide), builder.sext(xh, wide)),
                ),
            )
        return builder.sitofp(sums, _vf8)

    return dot


def _q4_quad_int(builder, qp):
    """A block's four rows' packed 4-bit groups (64 bytes) -> dot(int8 x pointer, acc) = acc + the exact int
    sums (<16 x i32>, lanes 4r .. 4r + 3 row r's): the low nibbles meet x[0:16] and the high ones x[16:32],
    each 16 bytes of x broadcast to the four 128-bit lanes (a broadcast load), two vpdpbusd."""
    v64 = ir.VectorType(_i8, 64)
    b = _load(builder, builder.bitcast(qp, v64.as_pointer()))
    lo = builder.and_(b, ir.Constant(v64, [15] * 64))
    hi = builder.lshr(b, ir.Constant(v64, [4] * 64))
    v16 = ir.VectorType(_i8, 16)
    rep = ir.Constant(ir.VectorType(_i32, 64), [j % 16 for j in range(64)])

    def dot(xb, acc):
        xl = _load(builder, builder.bitcast(xb, v16.as_pointer()))
        xh = _load(builder, builder.bitcast(builder.gep(xb, [ir.Constant(_i32, 16)]), v16.as_pointer()))
        xl, xh = builder.shuffle_vector(xl, xl, rep), builder.shuffle_vector(xh, xh, rep)
        if VNNI512:
            return _dpbusd(builder, _dpbusd(builder, acc, lo, xl), hi, xh)
        # plain vector IR, for any x86-64 (the kernels take these blocks only on VNNI512)
        wide = ir.VectorType(_i32, 64)
        prod = builder.add(
            builder.mul(builder.zext(lo, wide), builder.sext(xl, wide)),
            builder.mul(builder.zext(hi, wide), builder.sext(xh, wide)),
        )
        for k in range(4):
            acc = builder.add(
                acc, builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(_i32, 16), list(range(k, 64, 4))))
            )
        return acc

    return dot


def _q4_x16_int(builder, qp):
    """A 16-row block's packed 4-bit group (256 bytes, `numba_layout`'s STRIPE16 order: load j's row r at bytes
    64j + 4r .. 64j + 4r + 3, byte i's low nibble value 8j + i, its high one 8j + 4 + i) -> dot(int8 x pointer,
    acc) = acc + the exact int sums (<16 x i32>, lane r row r's). Each 64-byte load's low and high nibbles meet
    four activations broadcast as one int32 (a broadcast load): eight vpdpbusd a group for sixteen rows, no
    reduction after. AVX-512 VNNI only: the backend picks the 16-row order nowhere else."""
    if not VNNI512:
        raise TypeError("the 16-row q4 blocks need AVX-512 VNNI (kernels/numba_backend.py picks them only there)")
    v64 = ir.VectorType(_i8, 64)
    vi = ir.VectorType(_i32, 16)
    parts = []
    for j in range(4):
        b = _load(builder, builder.bitcast(builder.gep(qp, [ir.Constant(_i32, 64 * j)]), v64.as_pointer()))
        parts.append((builder.and_(b, ir.Constant(v64, [15] * 64)), 8 * j))
        parts.append((builder.lshr(b, ir.Constant(v64, [4] * 64)), 8 * j + 4))

    def dot(xb, acc):
        for w, off in parts:
            x4 = _load(builder, builder.bitcast(builder.gep(xb, [ir.Constant(_i32, off)]), _i32.as_pointer()))
            acc = _dpbusd(builder, acc, w, _splat(builder, x4, vi))
        return acc

    return dot


def _int_as_f32(int_dot):
    """An integer group block (`_q4_quad_int`, `_q4_x16_int`: dot(xb, acc) -> <16 x i32>) -> its sums from zero,
    as F32x16."""

    def unpack(builder, qp):
        dot = int_dot(builder, qp)
        zero = ir.Constant(ir.VectorType(_i32, 16), [0] * 16)
        return lambda xb: builder.sitofp(dot(xb, zero), _vf16)

    return unpack


def _int_of_pieces(int_dot):
    """An integer group block -> dot(pointer to a group's four int8 pieces of the activations, 32 bytes each:
    x = s * (p0 + p1 / 2^7 + p2 / 2^14 + p3 / 2^21)) -> F32x16, each lane's sum of q * (p0 * 2^7 + p1 + p2 / 2^7 +
    p3 / 2^14). The pieces' integer sums pair up exactly in int32 (I0 * 2^7 + I1 and I2 * 2^7 + I3, below 2^22:
    exact in float32 too) and the two pairs meet in one rounding."""

    def unpack(builder, qp):
        dot = int_dot(builder, qp)
        v16 = ir.VectorType(_i32, 16)
        zero, seven = ir.Constant(v16, [0] * 16), ir.Constant(v16, [7] * 16)

        def split_dot(xb):
            sums = []
            for k in (0, 2):
                acc = builder.shl(dot(builder.gep(xb, [ir.Constant(_i32, 32 * k)]), zero), seven)
                acc = dot(builder.gep(xb, [ir.Constant(_i32, 32 * k + 32)]), acc)
                sums.append(builder.sitofp(acc, _vf16))
            return _fmuladd(builder, sums[1], ir.Constant(_vf16, [2.0**-14] * 16), sums[0])

        return split_dot

    return unpack


def _stripe_acc_tile(with_min: bool):
    """`x16_acc_tile` (Q4_0: the scales stand in for the mins) or `x16_acc_min_tile` (stored mins)."""

    def acc_tile(typingctx, ints, scale, minv, si, xd, xsm, offs, g, accs):
        if not (
            isinstance(ints, types.UniTuple)
            and ints.dtype == F32x16
            and accs == ints
            and _reads_as_f32(scale)
            and (not with_min or minv == scale)
            and isinstance(offs, types.UniTuple)
            and offs.count == ints.count
        ):
            return None
        _check_flat(xd, xsm)

        def codegen(context, builder, sig, args):
            ints_, sa, ma, si_, xa, sma, offs_, g_, accs_ = args
            d16 = _load_f32(builder, _flat_ptr(context, builder, scale, sa, si_), scale.dtype, 16)
            m16 = _load_f32(builder, _flat_ptr(context, builder, minv, ma, si_), minv.dtype, 16) if with_min else None
            outs = []
            for i in range(ints.count):
                at = builder.add(
                    context.cast(builder, builder.extract_value(offs_, i), offs.dtype, types.intp),
                    context.cast(builder, g_, g, types.intp),
                )
                xdv = _splat(builder, _load(builder, _flat_ptr(context, builder, xd, xa, at)), _vf16)
                xsv = _splat(builder, _load(builder, _flat_ptr(context, builder, xsm, sma, at)), _vf16)
                acc = builder.extract_value(accs_, i)
                if with_min:  # d * xd * isum + m * xsum
                    acc = _fmuladd(builder, builder.extract_value(ints_, i), builder.fmul(d16, xdv), acc)
                    acc = _fmuladd(builder, m16, xsv, acc)
                else:  # d * (xd * isum - 8 xsum)
                    acc = _fmuladd(builder, _fmuladd(builder, builder.extract_value(ints_, i), xdv, xsv), d16, acc)
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


def _flat_ptr(context, builder, aryty, ary, idx):
    """The address of element idx of a 1-D C-contiguous array."""
    return builder.gep(context.make_array(aryty)(context, builder, ary).data, [idx])


def _reads_as_f32(a):
    """Whether `a` is a flat float32 array or a flat uint16 array of float16 bits."""
    _check_flat(a)
    return a.dtype in (types.float32, types.uint16)


def _load_f32(builder, ptr, dtype, n):
    """n values (n > 1: a vector) from an element pointer of a float32 or uint16 (float16 bits) array, as float32."""
    half = dtype == types.uint16
    ty = _f16 if half else _f32
    out = _f32
    if n > 1:
        ty, out = ir.VectorType(ty, n), ir.VectorType(_f32, n)
    v = _load(builder, builder.bitcast(ptr, ty.as_pointer()))
    return builder.fpext(v, out) if half else v


@intrinsic
def f32_at(typingctx, a, i):
    """a[i] as float32 (a float32 array, or float16 bits in a uint16 array)."""
    if not _reads_as_f32(a):
        return None

    def codegen(context, builder, sig, args):
        aa, i_ = args
        return _load_f32(builder, _flat_ptr(context, builder, a, aa, i_), a.dtype, 1)

    return types.float32(a, i), codegen


@intrinsic
def splat_at(typingctx, a, i):
    """a[i] as float32 in every lane of an F32xN (a float32 array, or float16 bits in a uint16
    array: the 16 bits are broadcast first and converted as one vector, vpbroadcastw + vcvtph2ps)."""
    if not _reads_as_f32(a):
        return None

    def codegen(context, builder, sig, args):
        aa, i_ = args
        half = a.dtype == types.uint16
        ptr = _flat_ptr(context, builder, a, aa, i_)
        v = _splat(
            builder,
            _load(builder, builder.bitcast(ptr, (_i16 if half else _f32).as_pointer())),
            ir.VectorType(_i16 if half else _f32, LANES),
        )
        return builder.fpext(builder.bitcast(v, ir.VectorType(_f16, LANES)), _vf) if half else v

    return F32xN(a, i), codegen


@intrinsic
def f32x4_at(typingctx, a, i):
    """a[i : i + 4] as four float32 (a float32 array, or float16 bits in a uint16 array): one
    vector load and conversion for a block's four rows."""
    if not _reads_as_f32(a):
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        aa, i_ = args
        v = _load_f32(builder, _flat_ptr(context, builder, a, aa, i_), a.dtype, 4)
        return context.make_tuple(builder, ret, [builder.extract_element(v, ir.Constant(_i32, k)) for k in range(4)])

    return ret(a, i), codegen


@intrinsic
def pair_scales(typingctx, scale, si, d):
    """scale[si : si + 4] times d as two F32x8: (s0 x4, s1 x4) and (s2 x4, s3 x4), the per-lane
    scales of `q4_pair_i8`'s results for rows 0|1 and 2|3 of a block."""
    if not _reads_as_f32(scale) or d != types.float32:
        return None
    ret = types.UniTuple(F32x8, 2)

    def codegen(context, builder, sig, args):
        sa, si_, d_ = args
        v4 = ir.VectorType(_f32, 4)
        s4 = _load_f32(builder, _flat_ptr(context, builder, scale, sa, si_), scale.dtype, 4)
        s4 = builder.fmul(s4, _splat(builder, d_, v4))
        outs = [
            builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(_i32, 8), [a] * 4 + [a + 1] * 4)) for a in (0, 2)
        ]
        return context.make_tuple(builder, ret, outs)

    return ret(scale, si, d), codegen


@intrinsic
def quad_scales(typingctx, scale, si):
    """scale[si : si + 4] as an F32x16 (s0 x4, s1 x4, s2 x4, s3 x4): the per-lane scales of
    `q4_quad_i8`'s result for a block's four rows."""
    if not _reads_as_f32(scale):
        return None

    def codegen(context, builder, sig, args):
        sa, si_ = args
        s4 = _load_f32(builder, _flat_ptr(context, builder, scale, sa, si_), scale.dtype, 4)
        return builder.shuffle_vector(s4, s4, ir.Constant(ir.VectorType(_i32, 16), [j // 4 for j in range(16)]))

    return F32x16(scale, si), codegen


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
    _check_flat(xd)

    def codegen(context, builder, sig, args):
        ints_, w_, xa, offs_, g_, accs_ = args
        if w == types.float32:
            w_ = _splat(builder, w_, ir.VectorType(_f32, ints.dtype.lanes))
        outs = []
        for i in range(ints.count):
            at = builder.add(
                context.cast(builder, builder.extract_value(offs_, i), offs.dtype, types.intp),
                context.cast(builder, g_, g, types.intp),
            )
            d = _load(builder, _flat_ptr(context, builder, xd, xa, at))
            sc = builder.fmul(w_, _splat(builder, d, w_.type))
            outs.append(_fmuladd(builder, builder.extract_value(ints_, i), sc, builder.extract_value(accs_, i)))
        return context.make_tuple(builder, sig.return_type, outs)

    return accs(ints, w, xd, offs, g, accs), codegen


@intrinsic
def quad_scales4_tile(typingctx, scale, si, xd, offs, g):
    """Four groups' scales at once, for each row i of a tile: scale[si : si + 16] (a block's four rows'
    scales of groups g .. g + 3, lane 4k + r group g + k's row r) times row i's activation scales, lanes 4k ..
    4k + 3 times xd[offs[i] + g + k]. One load and conversion for four groups; `scale_quad_acc_tile` takes
    group k's lanes. The products are `quad_scales` times the activation scale, bit for bit."""
    if not (_reads_as_f32(scale) and isinstance(offs, types.UniTuple)):
        return None
    _check_flat(xd)
    if xd.dtype != types.float32:
        return None
    ret = types.UniTuple(F32x16, offs.count)

    def codegen(context, builder, sig, args):
        sa, si_, xa, offs_, g_ = args
        w16 = _load_f32(builder, _flat_ptr(context, builder, scale, sa, si_), scale.dtype, 16)
        spread = ir.Constant(ir.VectorType(_i32, 16), [j // 4 for j in range(16)])
        outs = []
        for i in range(offs.count):
            at = builder.add(
                context.cast(builder, builder.extract_value(offs_, i), offs.dtype, types.intp),
                context.cast(builder, g_, g, types.intp),
            )
            x4 = _load_f32(builder, _flat_ptr(context, builder, xd, xa, at), xd.dtype, 4)
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
        pick = ir.Constant(ir.VectorType(_i32, 16), [4 * kk + j // 4 for j in range(16)])
        outs = []
        for i in range(ints.count):
            v = builder.extract_value(sc_, i)
            outs.append(
                _fmuladd(
                    builder,
                    builder.extract_value(ints_, i),
                    builder.shuffle_vector(v, v, pick),
                    builder.extract_value(accs_, i),
                )
            )
        return context.make_tuple(builder, sig.return_type, outs)

    return accs(ints, sc, k, accs), codegen


@intrinsic
def hsum_quarters(typingctx, v):
    """(sum of lanes 0-3, 4-7, 8-11, 12-15) of an F32x16 (float32)."""
    if v != F32x16:
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        (x,) = args
        even = ir.Constant(ir.VectorType(_i32, 8), list(range(0, 16, 2)))
        odd = ir.Constant(ir.VectorType(_i32, 8), list(range(1, 16, 2)))
        x = builder.fadd(builder.shuffle_vector(x, x, even), builder.shuffle_vector(x, x, odd))
        even4 = ir.Constant(ir.VectorType(_i32, 4), list(range(0, 8, 2)))
        odd4 = ir.Constant(ir.VectorType(_i32, 4), list(range(1, 8, 2)))
        x = builder.fadd(builder.shuffle_vector(x, x, even4), builder.shuffle_vector(x, x, odd4))
        return context.make_tuple(builder, ret, [builder.extract_element(x, ir.Constant(_i32, k)) for k in range(4)])

    return ret(v), codegen


@intrinsic
def vzero_tile_of(typingctx, rows, lanes):
    """A zero float vector of `lanes` (a constant: 8 or 16) lanes per element of the tuple `rows`."""
    if not (isinstance(rows, types.UniTuple) and isinstance(lanes, types.IntegerLiteral)):
        return None
    n = lanes.literal_value
    vt = F32VecType(n)
    ret = types.UniTuple(vt, rows.count)

    def codegen(context, builder, sig, args):
        return context.make_tuple(builder, ret, [ir.Constant(ir.VectorType(_f32, n), [0.0] * n)] * rows.count)

    return ret(rows, lanes), codegen


@intrinsic
def vload(typingctx, a, i):
    """a[i : i + LANES] as F32xN (a float32 array, or float16 bits in a uint16 array)."""
    if not _reads_as_f32(a):
        return None

    def codegen(context, builder, sig, args):
        aa, i_ = args
        return _load_f32(builder, _flat_ptr(context, builder, a, aa, i_), a.dtype, LANES)

    return F32xN(a, i), codegen


@intrinsic
def vstore(typingctx, a, i, v):
    """a[i : i + n] = v (a flat float32 array, a float vector of n lanes: F32xN, or F32x16 anywhere)."""
    _check_flat(a)
    if a.dtype != types.float32 or not isinstance(v, F32VecType):
        return None

    def codegen(context, builder, sig, args):
        aa, i_, v_ = args
        st = builder.store(v_, builder.bitcast(_flat_ptr(context, builder, a, aa, i_), v_.type.as_pointer()))
        st.align = 4
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def q4_dequant32(typingctx, q, qi, d, m, zero, out, oi):
    """out[oi : oi + 32] = d * (the packed 4-bit group at q[qi]'s values - zero) + m (flat uint8 q, float32 out;
    values 0..15 from bytes 0..15's low nibbles, 16..31 from their high ones): a product, then a sum, each
    rounded once, as `Weight.dequantize` computes scale * q + min and scale * (q - zero)."""
    _check_flat(q, out)
    if out.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        qa, qi_, d_, m_, zero_, oa, oi_ = args
        qp = _flat_ptr(context, builder, q, qa, qi_)
        op = _flat_ptr(context, builder, out, oa, oi_)
        vi = ir.VectorType(_i32, LANES)
        z = _splat(builder, builder.trunc(zero_, _i32) if zero_.type != _i32 else zero_, vi)
        dv, mv = _splat(builder, d_, _vf), _splat(builder, m_, _vf)
        bytes_ty = ir.VectorType(_i8, LANES).as_pointer()
        for h in range(0, 16, LANES):
            w = builder.zext(_load(builder, builder.bitcast(builder.gep(qp, [ir.Constant(_i32, h)]), bytes_ty)), vi)
            low = builder.and_(w, ir.Constant(vi, [15] * LANES))
            high = builder.lshr(w, ir.Constant(vi, [4] * LANES))
            for nib, at in ((low, h), (high, 16 + h)):
                v = builder.fadd(builder.fmul(builder.sitofp(builder.sub(nib, z), _vf), dv), mv)
                st = builder.store(v, builder.bitcast(builder.gep(op, [ir.Constant(_i32, at)]), _vf.as_pointer()))
                st.align = 4
        return context.get_dummy_value()

    return types.none(q, qi, types.float32, types.float32, types.int64, out, oi), codegen


@intrinsic
def q8_dequant16(typingctx, q, qi, d, m, out, oi):
    """out[oi : oi + 16] = d * (the 16 int8 weights at q[qi]) + m (flat int8 q, float32 out): a product, then a
    sum, each rounded once, as `Weight.dequantize` computes scale * q + min."""
    _check_flat(q, out)
    if out.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        qa, qi_, d_, m_, oa, oi_ = args
        qp = _flat_ptr(context, builder, q, qa, qi_)
        op = _flat_ptr(context, builder, out, oa, oi_)
        dv, mv = _splat(builder, d_, _vf), _splat(builder, m_, _vf)
        bytes_ty = ir.VectorType(_i8, LANES).as_pointer()
        for h in range(0, 16, LANES):
            w = _load(builder, builder.bitcast(builder.gep(qp, [ir.Constant(_i32, h)]), bytes_ty))
            v = builder.fadd(builder.fmul(builder.sitofp(w, _vf), dv), mv)
            st = builder.store(v, builder.bitcast(builder.gep(op, [ir.Constant(_i32, h)]), _vf.as_pointer()))
            st.align = 4
        return context.get_dummy_value()

    return types.none(q, qi, types.float32, types.float32, out, oi), codegen


@intrinsic
def vfma(typingctx, a, b, acc):
    """acc + a * b, lane by lane (float vectors of one width)."""
    if not _is_vec(a, b, acc):
        return None

    def codegen(context, builder, sig, args):
        return _fmuladd(builder, *args)

    return acc(a, b, acc), codegen


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
            q = _slice(builder, x, h, 4)
            q = builder.fadd(_slice(builder, q, 0, 2), _slice(builder, q, 2, 2))
            outs.append(
                builder.fadd(
                    builder.extract_element(q, ir.Constant(_i32, 0)), builder.extract_element(q, ir.Constant(_i32, 1))
                )
            )
        return context.make_tuple(builder, ret, outs)

    return ret(v), codegen


@intrinsic
def fold4(typingctx, v):
    """(the sum of lanes k, k + 4, k + 8, ... for k = 0..3) of a float vector (float32)."""
    if not _is_vec(v):
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        (x,) = args
        n = v.lanes
        while n > 4:
            n //= 2
            x = builder.fadd(_slice(builder, x, 0, n), _slice(builder, x, n, n))
        return context.make_tuple(builder, ret, [builder.extract_element(x, ir.Constant(_i32, k)) for k in range(4)])

    return ret(v), codegen


def _blocks(name, unpack, doc, vec=F32xN):
    """A group block for one activation row and its tile form for several: the weight group is
    unpacked once and dotted with every row of the tile.

    - `one(q, qi, x, xi)` -> vec (F32xN, or F32x8 for the int8 blocks)
    - `tile(q, qi, x, xi, rows)` -> UniTuple(vec, len(rows)): row i's group at x[rows[i] + xi]
    """

    def one(typingctx, q, qi, x, xi):
        _check_flat(q, x)

        def codegen(context, builder, sig, args):
            qa, qi_, xa, xi_ = args
            return unpack(builder, _flat_ptr(context, builder, q, qa, qi_))(_flat_ptr(context, builder, x, xa, xi_))

        return vec(q, qi, x, xi), codegen

    def tile(typingctx, q, qi, x, xi, rows):
        _check_flat(q, x)
        if not (isinstance(rows, types.UniTuple) and isinstance(rows.dtype, types.Integer)):
            raise TypeError(f"rows must be a tuple of integers, got {rows}")

        def codegen(context, builder, sig, args):
            qa, qi_, xa, xi_, rows_ = args
            dot = unpack(builder, _flat_ptr(context, builder, q, qa, qi_))
            outs = []
            for i in range(rows.count):
                r = context.cast(builder, builder.extract_value(rows_, i), rows.dtype, xi)
                outs.append(dot(_flat_ptr(context, builder, x, xa, builder.add(xi_, r))))
            return context.make_tuple(builder, sig.return_type, outs)

        return types.UniTuple(vec, rows.count)(q, qi, x, xi, rows), codegen

    one.__name__ = one.__qualname__ = name
    tile.__name__ = tile.__qualname__ = name + "_tile"
    one.__doc__ = doc
    tile.__doc__ = doc + " Tile form: one result per activation row offset in `rows`."
    return intrinsic(one), intrinsic(tile)


def _f32_dot(unpack):
    """An unpacker of float weight parts -> an unpacker of dot(x pointer)."""

    def dot_of(builder, qp):
        parts = unpack(builder, qp)
        return lambda xb: _dot_parts(builder, parts, xb)

    return dot_of


def _dequant_tile(name, unpack, doc):
    """`acc_tile(q, qi, d, m, x, xi, rows, accs)` -> accs + (d * w + m) * x for every row of the tile:
    the group's weights dequantized once (one FMA per LANES), then one FMA per LANES weights and row (no scaling
    per row, no separate pass for the mins). A row's group is summed apart and then added to its
    accumulator: the accumulator's dependency chain is one add a group, not four FMAs (which would
    leave a tile of a few rows waiting on FMA latency)."""

    def acc_tile(typingctx, q, qi, d, m, x, xi, rows, accs):
        _check_flat(q, x)
        if not (isinstance(rows, types.UniTuple) and isinstance(rows.dtype, types.Integer)):
            raise TypeError(f"rows must be a tuple of integers, got {rows}")
        if d != types.float32 or m != types.float32 or accs != types.UniTuple(F32xN, rows.count):
            return None

        def codegen(context, builder, sig, args):
            qa, qi_, d_, m_, xa, xi_, rows_, accs_ = args
            dv, mv = _splat(builder, d_, _vf), _splat(builder, m_, _vf)
            weights = [
                (_fmuladd(builder, f, dv, mv), off)
                for f, off in unpack(builder, _flat_ptr(context, builder, q, qa, qi_))
            ]
            outs = []
            for i in range(rows.count):
                xb = _flat_ptr(
                    context,
                    builder,
                    x,
                    xa,
                    builder.add(xi_, context.cast(builder, builder.extract_value(rows_, i), rows.dtype, xi)),
                )
                outs.append(builder.fadd(builder.extract_value(accs_, i), _dot_parts(builder, weights, xb)))
            return context.make_tuple(builder, sig.return_type, outs)

        return accs(q, qi, d, m, x, xi, rows, accs), codegen

    acc_tile.__name__ = acc_tile.__qualname__ = name
    acc_tile.__doc__ = doc + " " + (_dequant_tile.__doc__ or "")
    return intrinsic(acc_tile)


_F32_DOC = " times float32 x[xi : xi + n] -> F32xN partial sums (not yet reduced, not yet scaled)."
_I8_DOC = " times int8 xq[xi : xi + 32] -> F32x8 of exact int sums."
q4_dot32, q4_dot32_tile = _blocks(
    "q4_dot32", _f32_dot(_q4_f32), "Packed 4-bit group (16 bytes at q[qi], n = 32)" + _F32_DOC
)
q8_dot16, q8_dot16_tile = _blocks("q8_dot16", _f32_dot(_q8_f32(16)), "16 int8 weights at q[qi]" + _F32_DOC)
q8_dot32, q8_dot32_tile = _blocks("q8_dot32", _f32_dot(_q8_f32(32)), "32 int8 weights at q[qi]" + _F32_DOC)
q4_acc32_tile = _dequant_tile("q4_acc32_tile", _q4_f32, "Packed 4-bit group (16 bytes at q[qi]).")
q8_acc16_tile = _dequant_tile("q8_acc16_tile", _q8_f32(16), "16 int8 weights at q[qi].")
q8_acc32_tile = _dequant_tile("q8_acc32_tile", _q8_f32(32), "32 int8 weights at q[qi].")
q4_quad_split, q4_quad_split_tile = _blocks(
    "q4_quad_split",
    _int_of_pieces(_q4_quad_int),
    "A block's four rows' packed 4-bit groups (64 bytes at q[qi], AVX-512 VNNI only) "
    "times a group's four int8 activation pieces (128 bytes at x[xi]) -> F32x16, lanes 4r .. 4r + 3 row r's "
    "(not yet scaled: times s / 2^7).",
    F32x16,
)
q8_dot32_i8, q8_dot32_i8_tile = _blocks("q8_dot32_i8", _q8_i8, "32 int8 weights at q[qi]" + _I8_DOC, F32x8)
q4_quad_i8, q4_quad_i8_tile = _blocks(
    "q4_quad_i8",
    _int_as_f32(_q4_quad_int),
    "A block's four rows' packed 4-bit groups (64 bytes at q[qi], AVX-512 VNNI only) times "
    "int8 activations (32 bytes at x[xi]) -> F32x16 of exact int sums, lanes 4r .. 4r + 3 row r's.",
    F32x16,
)
q4_x16_i8, q4_x16_i8_tile = _blocks(
    "q4_x16_i8",
    _int_as_f32(_q4_x16_int),
    "A 16-row block's packed 4-bit groups (256 bytes at q[qi], `numba_layout` STRIPE16 order) times int8 "
    "activations (32 bytes at x[xi]) -> F32x16 of exact int sums, lane r row r's (not yet scaled).",
    F32x16,
)
q4_x16_split, q4_x16_split_tile = _blocks(
    "q4_x16_split",
    _int_of_pieces(_q4_x16_int),
    "A 16-row block's packed 4-bit groups (256 bytes at q[qi], STRIPE16 order) times a group's four int8 "
    "activation pieces (128 bytes at x[xi]) -> F32x16, lane r row r's (not yet scaled: times s / 2^7).",
    F32x16,
)
q4_pair_i8, q4_pair_i8_tile = _blocks(
    "q4_pair_i8",
    _q4_pair_i8,
    "Rows A and B's packed 4-bit groups (32 bytes at q[qi]) times int8 "
    "activations in pair layout (64 bytes at x[xi]: [x0..15, x0..15, x16..31, x16..31]) -> F32x8 of "
    "exact int sums, lanes 0-3 row A's, lanes 4-7 row B's (not yet reduced, not yet scaled).",
    F32x8,
)


@intrinsic
def prefetch(typingctx, a, i):
    """Ask the caches for the line holding a[i] (a software prefetch; no fault past the array's end)."""
    _check_flat(a)

    def codegen(context, builder, sig, args):
        aa, i_ = args
        ptr = builder.bitcast(_flat_ptr(context, builder, a, aa, i_), ir.IntType(8).as_pointer())
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, _i32, _i32, _i32]), "llvm.prefetch.p0"
        )
        builder.call(fn, [ptr, ir.Constant(_i32, 0), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])
        return context.get_dummy_value()

    return types.none(a, i), codegen


@intrinsic
def vzero(typingctx):
    """A zero F32xN (the float blocks' accumulator)."""

    def codegen(context, builder, sig, args):
        return ir.Constant(_vf, [0.0] * LANES)

    return F32xN(), codegen


@intrinsic
def vzero8(typingctx):
    """A zero F32x8 (the int8 blocks' accumulator)."""

    def codegen(context, builder, sig, args):
        return ir.Constant(_vf8, [0.0] * 8)

    return F32x8(), codegen


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


def _zeros(context, builder, ret):
    """A tuple `ret` of zero F32xN."""
    return context.make_tuple(builder, ret, [ir.Constant(_vf, [0.0] * LANES)] * ret.count)


@intrinsic
def vzero_tile(typingctx, rows):
    """A zero F32xN per element of the tuple `rows` (a tile's accumulators)."""
    if not isinstance(rows, types.UniTuple):
        return None
    ret = types.UniTuple(F32xN, rows.count)

    def codegen(context, builder, sig, args):
        return _zeros(context, builder, ret)

    return ret(rows), codegen


@intrinsic
def vfma_s(typingctx, v, s, acc):
    """acc + v * s (s a float32 scalar, broadcast); element-wise over tuples of vectors too (s a scalar
    or a vector of their width)."""
    if _is_vec(v, acc) and s == types.float32:

        def codegen(context, builder, sig, args):
            v_, s_, acc_ = args
            return _fmuladd(builder, v_, _splat(builder, s_, v_.type), acc_)

        return acc(v, s, acc), codegen
    if not (v == acc and isinstance(v, types.UniTuple) and isinstance(v.dtype, F32VecType)):
        return None
    if s not in (types.float32, v.dtype):
        return None

    def codegen_tuple(context, builder, sig, args):
        v_, s_, acc_ = args
        sv = s_ if s == v.dtype else _splat(builder, s_, ir.VectorType(_f32, v.dtype.lanes))
        outs = [
            _fmuladd(builder, builder.extract_value(v_, i), sv, builder.extract_value(acc_, i)) for i in range(v.count)
        ]
        return context.make_tuple(builder, sig.return_type, outs)

    return v(v, s, acc), codegen_tuple


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
            lo_m = ir.Constant(ir.VectorType(_i32, len(lo)), lo)
            hi_m = ir.Constant(ir.VectorType(_i32, len(hi)), hi)
            vs = [
                builder.fadd(builder.shuffle_vector(a, b, lo_m), builder.shuffle_vector(a, b, hi_m))
                for a, b in zip(vs[0::2], vs[1::2])
            ]
        return vs[0]

    return accs.dtype(accs), codegen


@intrinsic
def vzero_n(typingctx, n):
    """n (a constant) zero F32xN: the accumulators of a register tile."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    ret = types.UniTuple(F32xN, n.literal_value)

    def codegen(context, builder, sig, args):
        return _zeros(context, builder, ret)

    return ret(n), codegen


def _offset_tile_ok(a, offs, vs) -> bool:
    """The operands of the offset-table blocks: a flat float32 array, flat int64 offsets, a tuple of F32xN."""
    _check_flat(a, offs)
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
        ptrs.append(_flat_ptr(context, builder, sig.args[a_pos], args[a_pos], builder.add(o, j_)))
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
            _fmuladd(builder, args[0], _load_f32(builder, p, types.float32, LANES), builder.extract_value(args[4], i))
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
            _fmuladd(builder, args[0], _splat(builder, builder.load(p), _vf), builder.extract_value(args[4], i))
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
            builder.store(builder.extract_value(args[3], i), builder.bitcast(p, _vf.as_pointer())).align = 1
        return context.get_dummy_value()

    return types.none(a, offs, j, vs), codegen


@intrinsic
def vscale(typingctx, v, s):
    """v * s (s a float32 scalar, broadcast)."""
    if not (_is_vec(v) and s == types.float32):
        return None

    def codegen(context, builder, sig, args):
        v_, s_ = args
        return builder.fmul(v_, _splat(builder, s_, v_.type))

    return v(v, s), codegen


@intrinsic
def hsum(typingctx, v):
    """The sum of a float vector's lanes (float32)."""
    if not _is_vec(v):
        return None

    def codegen(context, builder, sig, args):
        (x,) = args
        n = v.lanes
        while n > 1:
            n //= 2
            x = builder.fadd(_slice(builder, x, 0, n), _slice(builder, x, n, n))
        return builder.extract_element(x, ir.Constant(_i32, 0))

    return types.float32(v), codegen


__all__ = [
    "F32VecType",
    "F32x8",
    "F32x16",
    "F32xN",
    "LANES",
    "VNNI256",
    "VNNI512",
    "f32_at",
    "f32x4_at",
    "splat_at",
    "fold4",
    "hsum",
    "hsum_halves",
    "hsum_quarters",
    "pair_scales",
    "prefetch",
    "q4_acc32_tile",
    "q4_dot32",
    "q4_dot32_tile",
    "q4_pair_i8",
    "q4_pair_i8_tile",
    "q4_quad_i8",
    "q4_quad_i8_tile",
    "q4_quad_split",
    "q4_quad_split_tile",
    "q4_x16_i8",
    "q4_x16_i8_tile",
    "q4_x16_split",
    "q4_x16_split_tile",
    "q8_dot32_i8_tile",
    "quad_scales",
    "scale_acc_tile",
    "vzero_tile_of",
    "q8_acc16_tile",
    "q8_acc32_tile",
    "q8_dot16",
    "q8_dot16_tile",
    "q8_dot32",
    "q8_dot32_i8",
    "q8_dot32_tile",
    "target_has",
    "tile_offsets",
    "q4_dequant32",
    "q8_dequant16",
    "vfma",
    "vfma_bcast",
    "vfma_rows",
    "vfma_s",
    "vscale",
    "vsum_lanes",
    "vload",
    "vstore",
    "vstore_rows",
    "vzero",
    "vzero8",
    "vzero_n",
    "vzero_tile",
    "x16_acc_min_tile",
    "x16_acc_tile",
]

"""A weight group's dot products with the activations, as LLVM vector IR (numba `@intrinsic`s; kernels/simd.py
has the vector types). Each block reads 1-D C-contiguous arrays at element offsets, unaligned.

- `q4_dot32(q, qi, x, xi)`: 16 bytes of packed nibbles (value j low, value j + 16 high) times
  32 float32 activations -> F32xN partial sums (not yet reduced, not yet scaled)
- `q8_dot16`, `q8_dot32`: 16 / 32 int8 values times float32 activations -> F32xN
- `q8_dot32_i8(q, qi, xq, xi)`: the same group times 32 int8-quantized activations, as exact
  int32 sums per lane converted to F32x8.
- `q4_x16_i8(q, qi, xq, xi)`: a 16-row block's packed group (256 bytes, numba_layout's STRIPE16
  order) times 32 int8 activations -> F32x16 of exact int sums, lane r row r's: eight `vpdpbusd`, each
  against four activations broadcast as one int32 (kernels/simd_scales.py's `x16_acc_tile` /
  `x16_acc_min_tile` scale a tile's sums into its accumulators); `q4_x16_split` takes the activations as
  four int8 pieces (the float32 mode, as `q4_quad_split`).
- `q4_quad_i8`, `q4_quad_split`: a block's four rows' packed groups in one zmm (AVX-512 VNNI), lanes
  4r .. 4r + 3 row r's; against int8 activations, or against the four int8 pieces of float32 ones.
- `q4_pair_i8(q, qi, x2, xi)`: two rows' packed 4-bit groups (32 bytes: the layout's rows 0|1 or
  2|3 of a block) times int8 activations in pair layout ([x0..15, x0..15, x16..31, x16..31]), one
  vector for both rows: lanes 0-3 row A's exact sums, 4-7 row B's. Half the instructions of one
  row at a time; `simd_scales.pair_scales(scale, si, d)` gives the matching per-lane scales.
  The int8 blocks use AVX2 `vpmaddubsw`/`vpmaddwd` where the compile target has AVX2, plain vector
  IR (LLVM lowers it for any x86-64) otherwise. Neither saturates: |weight| <= 128,
  |activation| <= 127, so a pair sum stays below 2^15 (the q4 pair adds two: 4 * 15 * 127).
- `q4_dot32_tile(q, qi, x, xi, rows)`, `q8_dot16_tile`, `q8_dot32_tile` (and every block's `_tile`
  form) unpack the weight group once and dot it with several activation rows (row i's group at
  x[rows[i] + xi]), returning a tuple of vectors: the register blocking that lets a few rows share one unpack.
- `q4_acc32_tile(q, qi, d, m, x, xi, rows, accs)`, `q8_acc16_tile`, `q8_acc32_tile` dequantize the
  group first (d * q + m, one FMA per vector of weights) and add its dot product with each tile row
  to that row's accumulator in `accs`: the wide tiles' block (no scaling per row, no mins pass).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from kernels.simd import (
    IR_F32,
    IR_I8,
    IR_I16,
    IR_I32,
    IR_VF,
    IR_VF8,
    IR_VF16,
    LANES,
    VNNI256,
    VNNI512,
    F32x8,
    F32x16,
    F32xN,
    call_llvm,
    check_flat,
    flat_ptr,
    fmuladd,
    load_unaligned,
    slice_lanes,
    splat,
    target_has,
)


def _dot_parts(builder, parts, xb):
    """sum over (weight vector, offset) parts of weights * x[offset : offset + LANES] -> F32xN."""
    acc = None
    for fc, off in parts:
        xv = load_unaligned(builder, builder.bitcast(builder.gep(xb, [ir.Constant(IR_I32, off)]), fc.type.as_pointer()))
        acc = builder.fmul(fc, xv) if acc is None else fmuladd(builder, fc, xv, acc)
    return acc


def _q4_f32(builder, qp):
    """A packed 4-bit group -> [(F32xN of weights, their offset in the group)]: values 0..15 from bytes 0..15's
    low nibbles, 16..31 from their high ones, in loads of LANES bytes."""
    vi = ir.VectorType(IR_I32, LANES)
    parts = []
    for h in range(0, 16, LANES):
        p = builder.gep(qp, [ir.Constant(IR_I32, h)])
        b = load_unaligned(builder, builder.bitcast(p, ir.VectorType(IR_I8, LANES).as_pointer()))
        w = builder.zext(b, vi)
        parts.append((builder.sitofp(builder.and_(w, ir.Constant(vi, [15] * LANES)), IR_VF), h))
        parts.append((builder.sitofp(builder.lshr(w, ir.Constant(vi, [4] * LANES)), IR_VF), 16 + h))
    return parts


def _q8_f32(n):
    def unpack(builder, qp):
        """n int8 weights -> [(F32xN of weights, their offset in the group)]."""
        b = load_unaligned(builder, builder.bitcast(qp, ir.VectorType(IR_I8, n).as_pointer()))
        f = builder.sitofp(builder.sext(b, ir.VectorType(IR_I32, n)), ir.VectorType(IR_F32, n))
        return [(slice_lanes(builder, f, c * LANES, LANES), c * LANES) for c in range(n // LANES)]

    return unpack


def _dpbusd(builder, acc, u, s):
    """acc (<n x i32>) + sums of 4 adjacent products of u (<4n x i8>, unsigned) and s (signed): vpdpbusd,
    no saturation (n = 8 or 16)."""
    n = acc.type.count
    vi = ir.VectorType(IR_I32, n)
    return call_llvm(
        builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", vi, [acc, builder.bitcast(u, vi), builder.bitcast(s, vi)]
    )


def _madd_u8s8(builder, u, s):
    """<32 x i8> unsigned times <32 x i8> signed, sums of 4 adjacent products -> <8 x i32> (exact here)."""
    if VNNI256:
        return _dpbusd(builder, ir.Constant(ir.VectorType(IR_I32, 8), [0] * 8), u, s)
    if target_has("avx2"):
        v16 = ir.VectorType(IR_I16, 16)
        p16 = call_llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [u, s])
        return call_llvm(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(IR_I32, 8), [p16, ir.Constant(v16, [1] * 16)])
    return _sum4(
        builder, builder.mul(builder.zext(u, ir.VectorType(IR_I32, 32)), builder.sext(s, ir.VectorType(IR_I32, 32)))
    )


def _sum4(builder, prod):
    """<32 x i32> -> <8 x i32>: sums of 4 adjacent lanes."""
    acc = None
    for k in range(4):
        lanes = builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(IR_I32, 8), list(range(k, 32, 4))))
        acc = lanes if acc is None else builder.add(acc, lanes)
    return acc


def _load_x8(builder, xb):
    return load_unaligned(builder, builder.bitcast(xb, ir.VectorType(IR_I8, 32).as_pointer()))


def _q8_i8(builder, qp):
    """32 int8 weights -> dot(int8 x pointer) of exact int sums."""
    v32 = ir.VectorType(IR_I8, 32)
    w = load_unaligned(builder, builder.bitcast(qp, v32.as_pointer()))
    if target_has("avx2"):  # |w| as unsigned, the sign moved onto x (llama.cpp's trick for vpmaddubsw)
        aw = call_llvm(builder, "llvm.abs.v32i8", v32, [w, ir.Constant(ir.IntType(1), 0)])
        return lambda xb: builder.sitofp(
            _madd_u8s8(builder, aw, call_llvm(builder, "llvm.x86.avx2.psign.b", v32, [_load_x8(builder, xb), w])),
            IR_VF8,
        )
    wide = ir.VectorType(IR_I32, 32)
    ws = builder.sext(w, wide)
    return lambda xb: builder.sitofp(_sum4(builder, builder.mul(ws, builder.sext(_load_x8(builder, xb), wide))), IR_VF8)


def _q4_pair_i8(builder, qp):
    """Two rows' packed 4-bit groups (32 bytes, row A then row B) -> dot(int8 x pointer, pair layout)
    of exact int sums, lanes 0-3 row A's, 4-7 row B's. The two vpmaddubsw results are added as
    int16 before one vpmaddwd (not `_madd_u8s8` twice): |sum| <= 4 * 15 * 127 < 2^15."""
    v32 = ir.VectorType(IR_I8, 32)
    b = load_unaligned(builder, builder.bitcast(qp, v32.as_pointer()))
    lo = builder.and_(b, ir.Constant(v32, [15] * 32))
    hi = builder.lshr(b, ir.Constant(v32, [4] * 32))

    def dot(xb):
        xa = _load_x8(builder, xb)
        xh = _load_x8(builder, builder.gep(xb, [ir.Constant(IR_I32, 32)]))
        if VNNI256:
            zero = ir.Constant(ir.VectorType(IR_I32, 8), [0] * 8)
            sums = _dpbusd(builder, _dpbusd(builder, zero, lo, xa), hi, xh)
        elif target_has("avx2"):
            v16 = ir.VectorType(IR_I16, 16)
            p = builder.add(
                call_llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [lo, xa]),
                call_llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [hi, xh]),
            )
            sums = call_llvm(
                builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(IR_I32, 8), [p, ir.Constant(v16, [1] * 16)]
            )
        else:
            wide = ir.VectorType(IR_I32, 32)
            sums = _sum4(
                builder,
                builder.add(
                    builder.mul(builder.zext(lo, wide), builder.sext(xa, wide)),
                    builder.mul(builder.zext(hi, wide), builder.sext(xh, wide)),
                ),
            )
        return builder.sitofp(sums, IR_VF8)

    return dot


def _q8_four_i8(builder, qp):
    """A block's four rows' int8 groups (128 bytes, row after row) -> dot(int8 x pointer) of exact int sums as
    F32x8, lane r and r + 4 row r's: each row's eight int32 partial sums (`vpmaddubsw` with llama.cpp's sign
    trick, `vpmaddwd`), the four rows folded into one vector by three `vphaddd`, so a row of activations takes one
    conversion, scale and accumulator for the block, not four."""
    v32 = ir.VectorType(IR_I8, 32)
    v8 = ir.VectorType(IR_I32, 8)
    rows = []
    for r in range(4):
        w = load_unaligned(builder, builder.bitcast(builder.gep(qp, [ir.Constant(IR_I32, 32 * r)]), v32.as_pointer()))
        rows.append((w, call_llvm(builder, "llvm.abs.v32i8", v32, [w, ir.Constant(ir.IntType(1), 0)])))

    def dot(xb):
        x = _load_x8(builder, xb)
        s = [_madd_u8s8(builder, aw, call_llvm(builder, "llvm.x86.avx2.psign.b", v32, [x, w])) for w, aw in rows]
        h01 = call_llvm(builder, "llvm.x86.avx2.phadd.d", v8, [s[0], s[1]])
        h23 = call_llvm(builder, "llvm.x86.avx2.phadd.d", v8, [s[2], s[3]])
        return builder.sitofp(call_llvm(builder, "llvm.x86.avx2.phadd.d", v8, [h01, h23]), IR_VF8)

    return dot


def _q4_four_i8(builder, qp):
    """A block's four rows' packed 4-bit groups (64 bytes: rows 0|1, then 2|3, as `_q4_pair_i8` reads them) ->
    dot(int8 x pointer, pair layout) of exact int sums as F32x8, lanes (0, 1) row 0's, (2, 3) row 2's, (4, 5) row
    1's, (6, 7) row 3's (AVX2 without VNNI). One conversion, scale and accumulator a row of activations for all
    four weight rows, not two: `vphaddw` adds the two pairs' int16 sums (each |sum| <= 2 * 4 * 15 * 127 < 2^15)
    before the one `vpmaddwd`."""
    v32 = ir.VectorType(IR_I8, 32)
    v16 = ir.VectorType(IR_I16, 16)
    halves = []
    for off in (0, 32):
        b = load_unaligned(builder, builder.bitcast(builder.gep(qp, [ir.Constant(IR_I32, off)]), v32.as_pointer()))
        halves.append((builder.and_(b, ir.Constant(v32, [15] * 32)), builder.lshr(b, ir.Constant(v32, [4] * 32))))

    def dot(xb):
        xa = _load_x8(builder, xb)
        xh = _load_x8(builder, builder.gep(xb, [ir.Constant(IR_I32, 32)]))
        pairs = [
            builder.add(
                call_llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [lo, xa]),
                call_llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [hi, xh]),
            )
            for lo, hi in halves
        ]
        both = call_llvm(builder, "llvm.x86.avx2.phadd.w", v16, pairs)
        ones = ir.Constant(v16, [1] * 16)
        sums = call_llvm(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(IR_I32, 8), [both, ones])
        return builder.sitofp(sums, IR_VF8)

    return dot


def _q4_quad_int(builder, qp):
    """A block's four rows' packed 4-bit groups (64 bytes) -> dot(int8 x pointer, acc) = acc + the exact int
    sums (<16 x i32>, lanes 4r .. 4r + 3 row r's): the low nibbles meet x[0:16] and the high ones x[16:32],
    each 16 bytes of x broadcast to the four 128-bit lanes (a broadcast load), two vpdpbusd."""
    v64 = ir.VectorType(IR_I8, 64)
    b = load_unaligned(builder, builder.bitcast(qp, v64.as_pointer()))
    lo = builder.and_(b, ir.Constant(v64, [15] * 64))
    hi = builder.lshr(b, ir.Constant(v64, [4] * 64))
    v16 = ir.VectorType(IR_I8, 16)
    rep = ir.Constant(ir.VectorType(IR_I32, 64), [j % 16 for j in range(64)])

    def dot(xb, acc):
        xl = load_unaligned(builder, builder.bitcast(xb, v16.as_pointer()))
        xh = load_unaligned(builder, builder.bitcast(builder.gep(xb, [ir.Constant(IR_I32, 16)]), v16.as_pointer()))
        xl, xh = builder.shuffle_vector(xl, xl, rep), builder.shuffle_vector(xh, xh, rep)
        if VNNI512:
            return _dpbusd(builder, _dpbusd(builder, acc, lo, xl), hi, xh)
        # plain vector IR, for any x86-64 (the kernels take these blocks only on VNNI512)
        wide = ir.VectorType(IR_I32, 64)
        prod = builder.add(
            builder.mul(builder.zext(lo, wide), builder.sext(xl, wide)),
            builder.mul(builder.zext(hi, wide), builder.sext(xh, wide)),
        )
        for k in range(4):
            acc = builder.add(
                acc, builder.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(IR_I32, 16), list(range(k, 64, 4))))
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
    v64 = ir.VectorType(IR_I8, 64)
    vi = ir.VectorType(IR_I32, 16)
    parts = []
    for j in range(4):
        b = load_unaligned(builder, builder.bitcast(builder.gep(qp, [ir.Constant(IR_I32, 64 * j)]), v64.as_pointer()))
        parts.append((builder.and_(b, ir.Constant(v64, [15] * 64)), 8 * j))
        parts.append((builder.lshr(b, ir.Constant(v64, [4] * 64)), 8 * j + 4))

    def dot(xb, acc):
        for w, off in parts:
            x4 = load_unaligned(
                builder, builder.bitcast(builder.gep(xb, [ir.Constant(IR_I32, off)]), IR_I32.as_pointer())
            )
            acc = _dpbusd(builder, acc, w, splat(builder, x4, vi))
        return acc

    return dot


def _int_as_f32(int_dot):
    """An integer group block (`_q4_quad_int`, `_q4_x16_int`: dot(xb, acc) -> <16 x i32>) -> its sums from zero,
    as F32x16."""

    def unpack(builder, qp):
        dot = int_dot(builder, qp)
        zero = ir.Constant(ir.VectorType(IR_I32, 16), [0] * 16)
        return lambda xb: builder.sitofp(dot(xb, zero), IR_VF16)

    return unpack


def _int_of_pieces(int_dot):
    """An integer group block -> dot(pointer to a group's four int8 pieces of the activations, 32 bytes each:
    x = s * (p0 + p1 / 2^7 + p2 / 2^14 + p3 / 2^21)) -> F32x16, each lane's sum of q * (p0 * 2^7 + p1 + p2 / 2^7 +
    p3 / 2^14). The pieces' integer sums pair up exactly in int32 (I0 * 2^7 + I1 and I2 * 2^7 + I3, below 2^22:
    exact in float32 too) and the two pairs meet in one rounding."""

    def unpack(builder, qp):
        dot = int_dot(builder, qp)
        v16 = ir.VectorType(IR_I32, 16)
        zero, seven = ir.Constant(v16, [0] * 16), ir.Constant(v16, [7] * 16)

        def split_dot(xb):
            sums = []
            for k in (0, 2):
                acc = builder.shl(dot(builder.gep(xb, [ir.Constant(IR_I32, 32 * k)]), zero), seven)
                acc = dot(builder.gep(xb, [ir.Constant(IR_I32, 32 * k + 32)]), acc)
                sums.append(builder.sitofp(acc, IR_VF16))
            return fmuladd(builder, sums[1], ir.Constant(IR_VF16, [2.0**-14] * 16), sums[0])

        return split_dot

    return unpack


def _blocks(name, unpack, doc, vec=F32xN):
    """A group block for one activation row and its tile form for several: the weight group is
    unpacked once and dotted with every row of the tile.

    - `one(q, qi, x, xi)` -> vec (F32xN, or F32x8 for the int8 blocks)
    - `tile(q, qi, x, xi, rows)` -> UniTuple(vec, len(rows)): row i's group at x[rows[i] + xi]
    """

    def one(typingctx, q, qi, x, xi):
        check_flat(q, x)

        def codegen(context, builder, sig, args):
            qa, qi_, xa, xi_ = args
            return unpack(builder, flat_ptr(context, builder, q, qa, qi_))(flat_ptr(context, builder, x, xa, xi_))

        return vec(q, qi, x, xi), codegen

    def tile(typingctx, q, qi, x, xi, rows):
        check_flat(q, x)
        if not (isinstance(rows, types.UniTuple) and isinstance(rows.dtype, types.Integer)):
            raise TypeError(f"rows must be a tuple of integers, got {rows}")

        def codegen(context, builder, sig, args):
            qa, qi_, xa, xi_, rows_ = args
            dot = unpack(builder, flat_ptr(context, builder, q, qa, qi_))
            outs = []
            for i in range(rows.count):
                r = context.cast(builder, builder.extract_value(rows_, i), rows.dtype, xi)
                outs.append(dot(flat_ptr(context, builder, x, xa, builder.add(xi_, r))))
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
        check_flat(q, x)
        if not (isinstance(rows, types.UniTuple) and isinstance(rows.dtype, types.Integer)):
            raise TypeError(f"rows must be a tuple of integers, got {rows}")
        if d != types.float32 or m != types.float32 or accs != types.UniTuple(F32xN, rows.count):
            return None

        def codegen(context, builder, sig, args):
            qa, qi_, d_, m_, xa, xi_, rows_, accs_ = args
            dv, mv = splat(builder, d_, IR_VF), splat(builder, m_, IR_VF)
            weights = [
                (fmuladd(builder, f, dv, mv), off) for f, off in unpack(builder, flat_ptr(context, builder, q, qa, qi_))
            ]
            outs = []
            for i in range(rows.count):
                xb = flat_ptr(
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
q8_four_i8, q8_four_i8_tile = _blocks(
    "q8_four_i8",
    _q8_four_i8,
    "A block's four rows' int8 groups (128 bytes at q[qi], AVX2) times int8 activations (32 bytes at x[xi]) -> "
    "F32x8 of exact int sums, lanes r and r + 4 row r's (not yet reduced, not yet scaled).",
    F32x8,
)
q4_four_i8, q4_four_i8_tile = _blocks(
    "q4_four_i8",
    _q4_four_i8,
    "A block's four rows' packed 4-bit groups (64 bytes at q[qi], AVX2 without VNNI) times int8 activations in "
    "pair layout (64 bytes at x[xi]) -> F32x8 of exact int sums, lanes (0, 1) row 0's, (2, 3) row 2's, (4, 5) row "
    "1's, (6, 7) row 3's (not yet reduced, not yet scaled).",
    F32x8,
)
q4_pair_i8, q4_pair_i8_tile = _blocks(
    "q4_pair_i8",
    _q4_pair_i8,
    "Rows A and B's packed 4-bit groups (32 bytes at q[qi]) times int8 "
    "activations in pair layout (64 bytes at x[xi]: [x0..15, x0..15, x16..31, x16..31]) -> F32x8 of "
    "exact int sums, lanes 0-3 row A's, lanes 4-7 row B's (not yet reduced, not yet scaled).",
    F32x8,
)

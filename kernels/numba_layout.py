"""The numba backend's private layout of q4/q8 weights: rows in blocks of four.

A `Weight` [N, K] with groups of G values (kernels/weight.py) becomes, with N4 = N rounded up
to a multiple of 4 (zero rows pad the last block):

    data   [N4 / 4, K / G, 4, bytes per group]   q4: uint8, G / 2 bytes a group; q8: int8, G
    scale  [N4 / 4, K / G, 4]                    float32, or float16 bits (uint16)
    min    [N4 / 4, K / G, 4]                    as scale, or empty when the type has none

A symmetric 4-bit type (GGUF Q4_0: d * (q - 8)) keeps no mins (`zero` = 8): the kernels take the
scales in their place with the factor -8 (`Blocked.min_operand`), d * sum((q - 8) x) = d * sum(q x) - 8 d * sum(x),
so the weight is the file's 18 bytes a group, not 20.

all flat. The matrix-vector kernels take four rows at a time, group by group, so they read each
array front to back as one stream; in the GGUF order the same walk is four short streams per
block of rows, which the hardware prefetchers do not follow (half the speed from DRAM).

Scales and mins are stored as float16 where every one of a weight's is a float16 value
(`half_exact`: GGUF Q4_0, Q4_1 and Q8_0 always, their d and m are float16 in the file; not
K-quants' d * sc products) and the CPU converts float16 in registers (F16C): the same values in
half the memory. The kernels read both dtypes through `kernels.simd`'s readers (`f32_at`,
`f32x4_at`, `splat_at`, `vload`); a weight's scales and mins share one dtype (one compiled
specialization per dtype).
The public `Weight` stays as it is (other backends upload it); only this backend repacks.

q4 weights on AVX-512 VNNI without AMX (NumbaBackend chooses) are blocked sixteen rows at a time instead
(`block_rows16`, `Blocked.stripe` 16), so that one vpdpbusd multiplies sixteen rows' four values by four
broadcast activations and a group's sums land one row per lane (kernels/numba_linear16.py `matvec_i8_x16`,
`matvec_q4_split_x16`):

    data   [N16 / 16, K / 32, 4, 16, 4]   uint8: group g's load j, row r, byte i holds values
                                          8j + i (low nibble) and 8j + 4 + i (high nibble)
    scale  [N16 / 16, K / 32, 16]         float32, or float16 bits
    min    [N16 / 16, K / 32, 16]         as scale, or empty

The same bytes as the four-row order, in another order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kernels.numba_jit import JIT_EXACT
from kernels.simd_dequant import q4_dequant32, q8_dequant16
from kernels.simd_scales import f32_at
from kernels.weight import Weight

ROWS = 4  # rows per block
STRIPE16 = 16  # rows per block of `block_rows16`
f32 = np.float32


@dataclass(slots=True)
class Blocked:
    """A q4/q8 weight in row blocks (see the module docstring)."""

    kind: str  # "q4" | "q8"
    rows: int
    cols: int
    group: int
    data: np.ndarray
    scale: np.ndarray  # float32, or uint16: float16 bits
    min: np.ndarray  # as scale; size 0 when the type has no offset
    zero: int = 0  # 8: a symmetric q4 type, its mins -8 * scale (not stored)
    stripe: int = ROWS  # rows per block: ROWS, or STRIPE16 (`block_rows16`)

    @property
    def groups(self) -> int:
        return self.cols // self.group

    @property
    def has_min(self) -> bool:
        return self.min.size > 0 or self.zero > 0

    def min_operand(self) -> tuple[np.ndarray, np.float32]:
        """(array, factor) whose product is the mins the kernels add: the stored mins (factor 1), or
        for a symmetric type its scales times -zero."""
        return (self.scale, f32(-self.zero)) if self.zero else (self.min, f32(1.0))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.scale.nbytes + self.min.nbytes


def _blocks(a: np.ndarray, per_group: int, rows: int = ROWS) -> np.ndarray:
    """[N, ng * per_group] -> flat [N' / rows, ng, rows, per_group], zero rows appended up to N' (N rounded up to
    a multiple of `rows`)."""
    n = a.shape[0]
    n4 = -(-n // rows) * rows
    if n4 != n:
        a = np.concatenate([a, np.zeros((n4 - n, a.shape[1]), a.dtype)])
    ng = a.shape[1] // per_group
    return np.ascontiguousarray(a.reshape(n4 // rows, rows, ng, per_group).transpose(0, 2, 1, 3)).reshape(-1)


def half_exact(w: Weight) -> bool:
    """Whether every scale and min of a q4/q8 weight is a float16 value (converts back unchanged)."""
    parts = [a for a in (w.scales, w.mins) if a is not None]
    if all(a.dtype == np.float16 for a in parts):
        return True
    with np.errstate(over="ignore"):  # beyond float16's range: inf, unequal
        return all(np.array_equal(a.astype(np.float16).astype(a.dtype), a) for a in parts)


def block_rows(w: Weight, half: bool = False) -> Blocked:
    """Repack a q4/q8 weight into row blocks (a copy; `w` may be dropped afterwards); scales and
    mins as float16 bits when `half` (the caller checked `half_exact`)."""
    if w.kind not in ("q4", "q8"):
        raise ValueError(f"only q4/q8 weights are blocked, got {w.kind}")
    assert w.kind == "q8" or w.mins is not None or w.zero, "a q4 weight always has an offset (kernels/weight.py)"
    assert w.group in ((32,) if w.kind == "q4" else (16, 32)), f"{w.kind} in groups of {w.group} (kernels/weight.py)"
    rows, cols = w.shape
    per_group = w.group // 2 if w.kind == "q4" else w.group
    dtype = np.float16 if half else np.float32

    def vec(a: np.ndarray | None) -> np.ndarray:
        out = _blocks(a, 1).astype(dtype, copy=False) if a is not None else np.empty(0, dtype)
        return out.view(np.uint16) if half else out

    return Blocked(w.kind, rows, cols, w.group, _blocks(w.data, per_group), vec(w.scales), vec(w.mins), w.zero)


def block_rows16(w: Weight, half: bool = False) -> Blocked:
    """Repack a q4 weight (groups of 32) sixteen rows to a block in STRIPE16 order (the module docstring); a copy,
    scales and mins as float16 bits when `half`."""
    if w.kind != "q4":
        raise ValueError(f"only q4 weights take the 16-row order, got {w.kind}")
    rows, cols = w.shape
    n16 = -(-rows // STRIPE16) * STRIPE16
    data = np.zeros(n16 // STRIPE16 * (cols // 32) * 256, dtype=np.uint8)
    _pack16(w.data, rows, cols // 32, data)
    dtype = np.float16 if half else np.float32

    def vec(a: np.ndarray | None) -> np.ndarray:
        out = _blocks(a, 1, STRIPE16).astype(dtype, copy=False) if a is not None else np.empty(0, dtype)
        return out.view(np.uint16) if half else out

    return Blocked("q4", rows, cols, 32, data, vec(w.scales), vec(w.mins), w.zero, STRIPE16)


@njit(**JIT_EXACT)
def _pack16(src, rows, ng, out):
    """src [rows, ng * 16] packed groups (`Weight` q4: value j low nibble, j + 16 high) -> out in STRIPE16 order."""
    for r in range(rows):
        blk, lane = r // STRIPE16, r % STRIPE16
        for g in range(ng):
            base = (blk * ng + g) * 256 + lane * 4
            for v in range(0, 32, 8):  # values v .. v + 7: one load's four bytes of this row
                for i in range(4):
                    lo, hi = v + i, v + 4 + i
                    a = (src[r, g * 16 + lo % 16] >> (4 * (lo // 16))) & 15
                    b = (src[r, g * 16 + hi % 16] >> (4 * (hi // 16))) & 15
                    out[base + (v // 8) * 64 + i] = a | (b << 4)


@njit(**JIT_EXACT)
def dequant_rows16(data, scale, minv, zero, rows, out):
    """`dequant_rows` of a STRIPE16 q4 weight: out [len(rows), K] = scale * q + min, or scale * (q - zero)."""
    K = out.shape[1]
    ng = K // 32
    has_min = minv.shape[0] > 0
    for i in range(rows.shape[0]):
        blk, lane = rows[i] // STRIPE16, rows[i] % STRIPE16
        for g in range(ng):
            s = (blk * ng + g) * STRIPE16 + lane
            d = f32_at(scale, s)
            m = f32_at(minv, s) if has_min else f32(0.0)
            base = (blk * ng + g) * 256 + lane * 4
            for v in range(32):
                byte = data[base + (v // 8) * 64 + v % 4]
                q = (byte >> (4 * ((v // 4) % 2))) & 15
                if zero:
                    out[i, g * 32 + v] = d * f32(np.int32(q) - zero)
                else:
                    out[i, g * 32 + v] = d * f32(q) + m


@njit(**JIT_EXACT)
def dequant_rows(data, scale, minv, packed, G, zero, rows, out):
    """out [len(rows), K] = the blocked weight's `rows` in float32 (scale * q + min, or scale * (q - zero)
    for a symmetric q4 type: `Weight.dequantize`'s arithmetic), q4 (groups of 32) when `packed`, else q8
    (groups of 16 or 32); in vectors (`simd_dequant.q4_dequant32`, `simd_dequant.q8_dequant16`)."""
    K = out.shape[1]
    ng = K // G
    per = G // 2 if packed else G
    has_min = minv.shape[0] > 0
    flat = out.reshape(-1)
    for i in range(rows.shape[0]):
        blk, lane = rows[i] // 4, rows[i] % 4
        for g in range(ng):
            s = (blk * ng + g) * 4 + lane
            d = f32_at(scale, s)
            m = f32_at(minv, s) if has_min else f32(0.0)
            b = s * per
            o = i * K + g * G
            if packed:
                q4_dequant32(data, b, d, m, zero, flat, o)
            else:
                for h in range(0, G, 16):
                    q8_dequant16(data, b + h, d, m, flat, o + h)

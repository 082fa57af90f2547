"""GGML tensor types: NumPy block splitting (int8 values + float32 group scales) and dequantization.

Block layouts follow ggml-common.h. Each splitter computes scales and mins with the float
operations of llama.cpp's gguf-py reference (`gguf.quants`), so dequantized values are
bit-identical to it; tests check that on random blocks and on the default model. Work is done
in chunks of blocks so the temporaries stay in cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernels.weight import Weight

_CHUNK_VALUES = 1 << 17  # values per chunk: keeps each chunk's temporaries around 0.5-2 MB


@dataclass(frozen=True, slots=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


# Every GGML type id we can name (so errors say "IQ2_XXS", not "16"); only some are supported.
GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in [
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(2, "Q4_0", 32, 18),
        GGMLType(3, "Q4_1", 32, 20),
        GGMLType(6, "Q5_0", 32, 22),
        GGMLType(7, "Q5_1", 32, 24),
        GGMLType(8, "Q8_0", 32, 34),
        GGMLType(9, "Q8_1", 32, 40),
        GGMLType(10, "Q2_K", 256, 84),
        GGMLType(11, "Q3_K", 256, 110),
        GGMLType(12, "Q4_K", 256, 144),
        GGMLType(13, "Q5_K", 256, 176),
        GGMLType(14, "Q6_K", 256, 210),
        GGMLType(15, "Q8_K", 256, 292),
        GGMLType(16, "IQ2_XXS", 256, 66),
        GGMLType(17, "IQ2_XS", 256, 74),
        GGMLType(18, "IQ3_XXS", 256, 98),
        GGMLType(19, "IQ1_S", 256, 50),
        GGMLType(20, "IQ4_NL", 32, 18),
        GGMLType(21, "IQ3_S", 256, 110),
        GGMLType(22, "IQ2_S", 256, 82),
        GGMLType(23, "IQ4_XS", 256, 136),
        GGMLType(24, "I8", 1, 1),
        GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4),
        GGMLType(27, "I64", 1, 8),
        GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", 256, 56),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(34, "TQ1_0", 256, 54),
        GGMLType(35, "TQ2_0", 256, 66),
        GGMLType(39, "MXFP4", 32, 17),
    ]
}


def type_name(type_id: int) -> str:
    t = GGML_TYPES.get(type_id)
    return t.name if t else f"unknown type id {type_id}"


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block (n, type_size) -> (n, 1) float32."""
    return b.view(np.float16)[:, at // 2 : at // 2 + 1].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2, k): low nibbles, then high nibbles."""
    return np.stack([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


# Every block type splits into small integers q (int8, one per value), a float32 scale per group
# of values and, for the types with an offset, a float32 min per group: value = scale * q + min.
# The scales and mins are computed with the float operations of gguf-py's reference, and
# scale * q is exact for every type but Q6_K (where the reference rounds the same product),
# so `scale * q + min` is bit-identical to `gguf.quants.dequantize`.
Split = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


def _q4_0(b: np.ndarray) -> Split:
    q = _nibbles(b[:, 2:18]).reshape(len(b), 32).view(np.int8) - np.int8(8)
    return q, _f16(b, 0), None


def _q4_1(b: np.ndarray) -> Split:
    return _nibbles(b[:, 4:20]).reshape(len(b), 32).view(np.int8), _f16(b, 0), _f16(b, 2)


def _q5_bits(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 5-bit values (n, 32): low nibbles + bit j of the little-endian u32 qh."""
    high = np.unpackbits(qh, axis=1, bitorder="little")  # (n, 32): bit j of qh -> value j
    return _nibbles(qs).reshape(len(qs), 32) | (high << np.uint8(4))


def _q5_0(b: np.ndarray) -> Split:
    return _q5_bits(b[:, 2:6], b[:, 6:22]).view(np.int8) - np.int8(16), _f16(b, 0), None


def _q5_1(b: np.ndarray) -> Split:
    return _q5_bits(b[:, 4:8], b[:, 8:24]).view(np.int8), _f16(b, 0), _f16(b, 2)


def _q8_0(b: np.ndarray) -> Split:
    return b[:, 2:34].view(np.int8), _f16(b, 0), None


def _q2_k(b: np.ndarray) -> Split:
    n = len(b)
    scales, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b, 80), _f16(b, 82)
    shift = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((qs.reshape(n, 2, 1, 32) >> shift) & np.uint8(3)).reshape(n, 256)
    return q.view(np.int8), d * (scales & np.uint8(0x0F)), -(dmin * (scales >> np.uint8(4)))


def _q3_k(b: np.ndarray) -> Split:
    n = len(b)
    hmask, qs, sc = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = _f16(b, 108)
    # 16 six-bit scales: low 4 bits from bytes 0-7 (both nibbles), high 2 bits from bytes 8-11.
    low = _nibbles(sc[:, 0:8]).reshape(n, 16)
    high = (sc[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    scales = ((low | ((high & np.uint8(3)) << np.uint8(4))).view(np.int8) - np.int8(32)).astype(np.float32)
    ql = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    qh = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & np.uint8(1)
    # the high bit *subtracts* 4 when it is clear
    q = ql.reshape(n, 256).view(np.int8) - ((qh.reshape(n, 256) ^ np.uint8(1)) << np.uint8(2)).view(np.int8)
    return q, d * scales, None


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = np.concatenate([d & np.uint8(0x3F), (md & np.uint8(0x0F)) | ((d >> np.uint8(2)) & np.uint8(0x30))], axis=1)
    mins = np.concatenate([m & np.uint8(0x3F), (md >> np.uint8(4)) | ((m >> np.uint8(2)) & np.uint8(0x30))], axis=1)
    return scale, mins


def _q4_k(b: np.ndarray) -> Split:
    n = len(b)
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _nibbles(b[:, 16:144].reshape(n * 4, 32)).reshape(n, 256)
    return q.view(np.int8), _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q5_k(b: np.ndarray) -> Split:
    n = len(b)
    sc, mn = _k_scale_min(b[:, 4:16])
    qh = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    q = _nibbles(b[:, 48:176].reshape(n * 4, 32)).reshape(n, 8, 32) | (qh << np.uint8(4))
    return q.reshape(n, 256).view(np.int8), _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q6_k(b: np.ndarray) -> Split:
    n = len(b)
    ql, qh, scales = b[:, 0:128], b[:, 128:192], b[:, 192:208].view(np.int8)
    low = _nibbles(ql.reshape(n * 2, 64)).reshape(n, 8, 32)
    high = (
        (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    ).reshape(n, 8, 32)
    q = (low | (high << np.uint8(4))).view(np.int8) - np.int8(32)
    return q.reshape(n, 256), _f16(b, 208) * scales, None


# type id -> (splitter, values per scale group)
_BLOCK_FNS: dict[int, tuple[Callable[[np.ndarray], Split], int]] = {
    2: (_q4_0, 32),
    3: (_q4_1, 32),
    6: (_q5_0, 32),
    7: (_q5_1, 32),
    8: (_q8_0, 32),
    10: (_q2_k, 16),
    11: (_q3_k, 16),
    12: (_q4_k, 32),
    13: (_q5_k, 32),
    14: (_q6_k, 16),
}
_FOUR_BIT = frozenset({2, 3, 12})  # Q4_0, Q4_1, Q4_K: packed two values a byte
_FLOAT_TYPES: dict[int, np.dtype] = {0: np.dtype("<f4"), 1: np.dtype("<f2"), 30: np.dtype("<u2")}  # 30: BF16, raw bits
SUPPORTED_TYPES: frozenset[int] = frozenset(_BLOCK_FNS) | frozenset(_FLOAT_TYPES)


def nbytes_of(type_id: int, n_values: int) -> int:
    """Bytes that `n_values` values of this type occupy (n_values a multiple of its block size)."""
    t = GGML_TYPES[type_id]
    return n_values // t.block_size * t.type_size


def _check(raw: np.ndarray, type_id: int, shape: tuple[int, ...]) -> tuple[GGMLType, np.ndarray]:
    if type_id not in SUPPORTED_TYPES:
        raise ValueError(f"unsupported tensor type {type_name(type_id)}")
    t = GGML_TYPES[type_id]
    n_values = int(np.prod(shape, dtype=np.int64))
    if n_values % t.block_size:
        raise ValueError(f"{n_values} values is not a whole number of {t.name} blocks of {t.block_size}")
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != nbytes_of(type_id, n_values):
        raise ValueError(f"{t.name} tensor of shape {shape} needs {nbytes_of(type_id, n_values)} bytes, got {raw.size}")
    return t, raw


def split(raw: np.ndarray, type_id: int, shape: tuple[int, int]) -> Weight:
    """Raw bytes of a block-quantized [rows, cols] tensor -> a q4 (4-bit types) or q8 Weight.

    Raises ValueError for a float or unsupported type, or a byte count that does not match `shape`.
    """
    t, raw = _check(raw, type_id, shape)
    if type_id not in _BLOCK_FNS:
        raise ValueError(f"{t.name} is not a block-quantized type")
    rows, cols = shape
    fn, group = _BLOCK_FNS[type_id]
    blocks = raw.reshape(-1, t.type_size)
    per_block = t.block_size // group
    q = np.empty((len(blocks), t.block_size), dtype=np.int8)
    scale = np.empty((len(blocks), per_block), dtype=np.float32)
    mins = None
    step = max(1, _CHUNK_VALUES // t.block_size)
    for i in range(0, len(blocks), step):
        bq, bs, bm = fn(blocks[i : i + step])
        q[i : i + step] = bq
        scale[i : i + step] = bs
        if bm is not None:
            if mins is None:
                mins = np.empty_like(scale)
            mins[i : i + step] = bm
    ng = cols // group
    w = Weight(
        "q8", q.reshape(rows, cols), scale.reshape(rows, ng), None if mins is None else mins.reshape(rows, ng), group
    )
    return w.to_q4() if type_id in _FOUR_BIT else w


def dequantize(raw: np.ndarray, type_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw little-endian tensor bytes (any uint8 array/view, e.g. an mmap slice) -> a new C-contiguous float32
    array of `shape`.

    Raises ValueError for an unsupported type or a byte count that does not match `shape`.
    """
    t, raw = _check(raw, type_id, shape)
    if type_id in _FLOAT_TYPES:
        src = raw.view(_FLOAT_TYPES[type_id])
        if type_id == 30:
            return (src.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)
        return src.astype(np.float32).reshape(shape)  # astype copies, even for F32
    n_values = raw.size // t.type_size * t.block_size
    return split(raw, type_id, (1, n_values)).dequantize().reshape(shape)


# Types whose blocks the kernels read as they are: (bytes before the values, scale at, min at or None, kind).
# Q4_0's nibbles are q + 8 (zero point 8, no mins), Q4_1's q, Q8_0's int8 q.
_AS_STORED = {2: (2, 0, None, "q4"), 3: (4, 0, 2, "q4"), 8: (2, 0, None, "q8")}


def _as_stored(raw: np.ndarray, type_id: int, shape: tuple[int, int]) -> Weight:
    """Q4_0/Q4_1/Q8_0 bytes -> a Weight of the same bytes: the values copied out of the blocks, the
    float16 scales (and mins) kept float16 (no int8 or float32 intermediate the size of the matrix)."""
    t, raw = _check(raw, type_id, shape)
    rows, cols = shape
    head, at_d, at_m, kind = _AS_STORED[type_id]
    blocks = raw.reshape(rows, cols // t.block_size, t.type_size)
    half = lambda at: np.ascontiguousarray(blocks[:, :, at : at + 2]).view(np.float16).reshape(rows, -1)
    data = np.ascontiguousarray(blocks[:, :, head:]).reshape(rows, -1)
    if kind == "q8":
        return Weight("q8", data.view(np.int8), half(at_d), None, 32)
    return Weight("q4", data, half(at_d), None if at_m is None else half(at_m), 32, zero=8 if at_m is None else 0)


def gguf_weight(raw: np.ndarray, type_id: int, shape: tuple[int, int]) -> Weight:
    """A GGUF matrix's bytes -> a Weight: Q4_0/Q4_1/Q8_0 as stored, other block types split to q4/q8,
    F16/BF16/F32 copied as they are."""
    if type_id in _AS_STORED:
        return _as_stored(raw, type_id, shape)
    if type_id in _BLOCK_FNS:
        return split(raw, type_id, shape)
    _check(raw, type_id, shape)
    data = np.array(np.asarray(raw, dtype=np.uint8).view(_FLOAT_TYPES[type_id]).reshape(shape))
    return Weight({0: "f32", 1: "f16", 30: "bf16"}[type_id], data)

"""`Weight`: one [rows, cols] matrix (HF orientation, out x in) as the CPU kernels read it.

Block-quantized GGUF types are repacked once at load into two kinds, each with a float32
scale and (optionally) a float32 min per group of values: value = scale * q + min.

- "q4": 4-bit types (Q4_0, Q4_1, Q4_K), groups of 32, two values a byte: byte j of a group
  holds value j in its low nibble and value j + 16 in its high one (GGML's Q4_0 order), so a
  group's 16 bytes meet x[0:16] and x[16:32]. 6 bits a value with the scales (GGUF Q4_1: 5).
- "q8": every other block type (Q5_0/1, Q8_0, Q2_K, Q3_K, Q5_K, Q6_K), one int8 value a byte,
  groups of 16 or 32.

scale * q + min reproduces `gguf.quants.dequantize` bit for bit (see engine/loader/quant.py).
F16 and BF16 stay 16-bit, F32 stays F32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("q4", "q8", "f32", "f16", "bf16")


@dataclass(slots=True)
class Weight:
    kind: str  # one of KINDS
    data: np.ndarray  # q4: uint8 [rows, cols // 2]; q8: int8; f32: float32; f16: float16; bf16: uint16 (raw bits)
    scale: np.ndarray | None = None  # q4/q8: float32 [rows, cols // group]
    min: np.ndarray | None = None  # float32 [rows, cols // group]; None: no offset (q4 always has one)
    group: int = 0  # q4/q8: values per scale

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown weight kind {self.kind!r}")
        if self.data.ndim != 2:
            raise ValueError(f"a weight is 2-D, got shape {self.data.shape}")

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.data.shape
        return (rows, cols * 2) if self.kind == "q4" else (rows, cols)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.data, self.scale, self.min) if a is not None)

    def dequantize(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """float32 [rows, cols] (all rows, or the selected ones): the reference the kernels match."""
        data = self.data[rows]
        if self.kind == "f32":
            return np.array(data, dtype=np.float32)
        if self.kind == "f16":
            return data.astype(np.float32)
        if self.kind == "bf16":
            return (data.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if self.kind == "q4":
            data = unpack_q4(data)
        n, cols = data.shape
        out = np.multiply(data.reshape(n, cols // self.group, self.group), self.scale[rows][:, :, None], dtype=np.float32)
        if self.min is not None:
            out += self.min[rows][:, :, None]
        return out.reshape(n, cols)

    def take_rows(self, rows: np.ndarray) -> "Weight":
        """The weight with its rows reordered/selected (e.g. undoing llama.cpp's Q/K permutation)."""
        pick = lambda a: None if a is None else np.ascontiguousarray(a[rows])  # noqa: E731
        return Weight(self.kind, pick(self.data), pick(self.scale), pick(self.min), self.group)


    def to_q8(self) -> "Weight":
        """A q4 weight with one value a byte (exact)."""
        assert self.kind == "q4"
        return Weight("q8", unpack_q4(self.data).view(np.int8), self.scale, self.min, self.group)

    def to_q4(self) -> "Weight":
        """A q8 weight of 4-bit values in groups of 32 packed two a byte (exact: q in -8..7
        without a min becomes q + 8 with min -8 * scale)."""
        assert self.kind == "q8" and self.group == 32
        q, mins = self.data, self.min
        if mins is None:
            q = q + np.int8(8)
            mins = self.scale * np.float32(-8)
        return Weight("q4", pack_q4(q.view(np.uint8)), self.scale, mins, 32)


def pack_q4(values: np.ndarray) -> np.ndarray:
    """uint8 values 0..15 [rows, cols] -> [rows, cols // 2]: per group of 32, byte j = v[j] | v[j + 16] << 4."""
    rows, cols = values.shape
    v = values.reshape(rows, cols // 32, 2, 16)
    return (v[:, :, 0] | (v[:, :, 1] << np.uint8(4))).reshape(rows, cols // 2)


def unpack_q4(packed: np.ndarray) -> np.ndarray:
    """Inverse of `pack_q4`: uint8 [rows, cols // 2] -> uint8 values [rows, cols]."""
    rows, half = packed.shape
    b = packed.reshape(rows, half // 16, 1, 16)
    return np.concatenate([b & np.uint8(15), b >> np.uint8(4)], axis=2).reshape(rows, half * 2)


def concat_rows(parts: list[Weight]) -> Weight:
    """Stack weights with equal cols along rows (fused QKV, gate/up).

    Quantized parts of different kinds, groups or offsets unify exactly (q4 unpacks to q8,
    scales repeat to the finer group, a missing min is zero); a float kind mixed with another
    kind gives f32.
    """
    kinds = {p.kind for p in parts}
    if kinds == {"q4"}:
        return Weight("q4", np.concatenate([p.data for p in parts]), np.concatenate([p.scale for p in parts]),
                      np.concatenate([p.min for p in parts]), 32)
    if kinds == {"q4", "q8"}:
        parts = [p.to_q8() if p.kind == "q4" else p for p in parts]
        kinds = {"q8"}
    if kinds == {"q8"}:
        group = min(p.group for p in parts)
        scale, mins = [], []
        has_min = any(p.min is not None for p in parts)
        for p in parts:
            rep = p.group // group
            scale.append(np.repeat(p.scale, rep, axis=1))
            if has_min:
                mins.append(np.zeros_like(scale[-1]) if p.min is None else np.repeat(p.min, rep, axis=1))
        return Weight("q8", np.concatenate([p.data for p in parts]), np.concatenate(scale),
                      np.concatenate(mins) if has_min else None, group)
    if len(kinds) == 1:
        return Weight(parts[0].kind, np.concatenate([p.data for p in parts]))
    return Weight("f32", np.concatenate([p.dequantize() for p in parts]))


def quantize_q8_0(w: np.ndarray) -> Weight:
    """float [rows, cols] (cols a multiple of 32) -> q8 with llama.cpp's Q8_0 rounding (f16 scales)."""
    rows, cols = w.shape
    if cols % 32:
        raise ValueError(f"Q8_0 needs a multiple of 32 columns, got {cols}")
    q = np.empty((rows, cols), dtype=np.int8)
    scale = np.empty((rows, cols // 32), dtype=np.float32)
    step = max(1, (1 << 20) // cols)
    for r in range(0, rows, step):
        blocks = np.asarray(w[r : r + step], dtype=np.float32).reshape(-1, cols // 32, 32)
        d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q[r : r + step] = np.rint(blocks * inv[:, :, None]).reshape(len(blocks), cols)
        scale[r : r + step] = d
    return Weight("q8", q, scale, None, 32)

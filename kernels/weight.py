"""`Weight`: one [rows, cols] matrix (HF orientation, out x in) as the CPU kernels read it.

Block-quantized GGUF types become two kinds, each with a scale and (optionally) a min per group
of values: value = scale * q + min.

- "q4": 4-bit types (Q4_0, Q4_1, Q4_K), groups of 32, two values a byte: byte j of a group
  holds value j in its low nibble and value j + 16 in its high one (GGML's Q4_0 order, so Q4_0
  and Q4_1 blocks' bytes are taken as they are), and a group's 16 bytes meet x[0:16] and x[16:32].
  A symmetric type (Q4_0: d * (q - 8)) keeps no mins: `zero` = 8 says value = scale * (q - 8).
- "q8": every other block type (Q5_0/1, Q8_0, Q2_K, Q3_K, Q5_K, Q6_K), one int8 value a byte,
  groups of 16 or 32.

Scales and mins stay float16 where the file stores them so (Q4_0, Q4_1, Q8_0): a loaded weight of
those types holds exactly the file's bytes; the `scale` and `min` properties read float32 either way.
The values reproduce `gguf.quants.dequantize` bit for bit (see engine/loader/quant.py).
F16 and BF16 stay 16-bit, F32 stays F32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("q4", "q8", "f32", "f16", "bf16")


@dataclass(slots=True, init=False)
class Weight:
    """`scale` and `min` read as float32 whatever is stored: `scales`/`mins` keep the file's float16
    where it has them (GGUF Q4_0, Q4_1, Q8_0), and a symmetric 4-bit type (Q4_0: value = d * (q - 8))
    stores no mins at all (`zero` = 8; `min` then reads -8 * scale). So a loaded weight holds no more
    bytes than the file, and a consumer that wants plain float32 arrays still gets them."""

    kind: str  # one of KINDS
    data: np.ndarray  # q4: uint8 [rows, cols // 2]; q8: int8; f32: float32; f16: float16; bf16: uint16 (raw bits)
    scales: np.ndarray | None  # q4/q8: [rows, cols // group], float32 or float16 as stored
    mins: np.ndarray | None  # as scales; None: no stored offset
    group: int  # q4/q8: values per scale
    zero: int  # q4 only: 8 for a symmetric type (value = scale * (q - 8), no mins stored), else 0

    def __init__(
        self,
        kind: str,
        data: np.ndarray,
        scale: np.ndarray | None = None,
        min: np.ndarray | None = None,
        group: int = 0,
        zero: int = 0,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown weight kind {kind!r}")
        if data.ndim != 2:
            raise ValueError(f"a weight is 2-D, got shape {data.shape}")
        if zero and (kind != "q4" or min is not None):
            raise ValueError("only a q4 weight without mins has a zero point")
        self.kind, self.data, self.scales, self.mins, self.group, self.zero = kind, data, scale, min, group, zero

    @property
    def scale(self) -> np.ndarray | None:
        """float32 [rows, cols // group] (the stored array itself where it is float32)."""
        s = self.scales
        return s if s is None or s.dtype == np.float32 else s.astype(np.float32)

    @property
    def min(self) -> np.ndarray | None:
        """float32 [rows, cols // group]: value = scale * q + min; None: no offset (a q4 weight always has one)."""
        if self.zero:
            s = self.scale
            assert s is not None, "a q4 weight with a zero point has scales"
            return s * np.float32(-self.zero)
        m = self.mins
        return m if m is None or m.dtype == np.float32 else m.astype(np.float32)

    @property
    def scale_dtype(self) -> np.dtype | None:
        """The stored scales' dtype (float32 or float16); None for a float kind, which has no scales."""
        return None if self.scales is None else self.scales.dtype

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.data.shape
        return (rows, cols * 2) if self.kind == "q4" else (rows, cols)

    @property
    def nbytes(self) -> int:
        """The bytes held: for GGUF Q4_0, Q4_1 and Q8_0 exactly the file's."""
        return sum(a.nbytes for a in (self.data, self.scales, self.mins) if a is not None)

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
            if self.zero:
                data = data.view(np.int8) - np.int8(self.zero)
        n, cols = data.shape
        assert self.scales is not None, "a q4/q8 weight has scales"
        scale = self.scales[rows].astype(np.float32, copy=False)
        out = np.multiply(data.reshape(n, cols // self.group, self.group), scale[:, :, None], dtype=np.float32)
        if self.mins is not None:
            out += self.mins[rows].astype(np.float32, copy=False)[:, :, None]
        return out.reshape(n, cols)

    def take_rows(self, rows: np.ndarray) -> Weight:
        """The weight with its rows reordered/selected (e.g. undoing llama.cpp's Q/K permutation)."""
        pick = lambda a: None if a is None else np.ascontiguousarray(a[rows])
        return Weight(
            self.kind, np.ascontiguousarray(self.data[rows]), pick(self.scales), pick(self.mins), self.group, self.zero
        )

    def to_q8(self) -> Weight:
        """A q4 weight with one value a byte (exact)."""
        assert self.kind == "q4"
        q = unpack_q4(self.data).view(np.int8)
        if self.zero:
            return Weight("q8", q - np.int8(self.zero), self.scales, None, self.group)
        return Weight("q8", q, self.scales, self.mins, self.group)

    def to_q4(self) -> Weight:
        """A q8 weight of 4-bit values in groups of 32 packed two a byte (exact: q in -8..7
        without a min becomes q + 8 with zero point 8)."""
        assert self.kind == "q8" and self.group == 32
        if self.mins is None:
            return Weight("q4", pack_q4((self.data + np.int8(8)).view(np.uint8)), self.scales, None, 32, zero=8)
        return Weight("q4", pack_q4(self.data.view(np.uint8)), self.scales, self.mins, 32)


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
        if len({(p.zero, p.mins is None, p.scale_dtype) for p in parts}) == 1:  # as stored
            mins = None if parts[0].mins is None else np.concatenate([p.mins for p in parts])
            return Weight(
                "q4",
                np.concatenate([p.data for p in parts]),
                np.concatenate([p.scales for p in parts]),
                mins,
                32,
                parts[0].zero,
            )
        return Weight(
            "q4",
            np.concatenate([p.data for p in parts]),
            np.concatenate([p.scale for p in parts]),
            np.concatenate([p.min for p in parts]),
            32,
        )
    if kinds == {"q4", "q8"}:
        parts = [p.to_q8() if p.kind == "q4" else p for p in parts]
        kinds = {"q8"}
    if kinds == {"q8"}:
        group = min(p.group for p in parts)
        if len({(p.group, p.mins is None, p.scale_dtype) for p in parts}) == 1:  # as stored
            mins = None if parts[0].mins is None else np.concatenate([p.mins for p in parts])
            return Weight(
                "q8", np.concatenate([p.data for p in parts]), np.concatenate([p.scales for p in parts]), mins, group
            )
        scale: list[np.ndarray] = []
        min_parts: list[np.ndarray] = []
        has_min = any(p.min is not None for p in parts)
        for p in parts:
            rep = p.group // group
            s = p.scale
            assert s is not None, "a q8 weight has scales"
            scale.append(np.repeat(s, rep, axis=1))
            if has_min:
                min_parts.append(np.zeros_like(scale[-1]) if p.min is None else np.repeat(p.min, rep, axis=1))
        return Weight(
            "q8",
            np.concatenate([p.data for p in parts]),
            np.concatenate(scale),
            np.concatenate(min_parts) if has_min else None,
            group,
        )
    if len(kinds) == 1:
        return Weight(parts[0].kind, np.concatenate([p.data for p in parts]))
    return Weight("f32", np.concatenate([p.dequantize() for p in parts]))


def quantize_q8_0(w: np.ndarray) -> Weight:
    """float [rows, cols] (cols a multiple of 32) -> q8 with llama.cpp's Q8_0 rounding (float16 scales, kept
    float16: the bytes a Q8_0 file would hold)."""
    rows, cols = w.shape
    if cols % 32:
        raise ValueError(f"Q8_0 needs a multiple of 32 columns, got {cols}")
    q = np.empty((rows, cols), dtype=np.int8)
    scale = np.empty((rows, cols // 32), dtype=np.float16)
    step = max(1, (1 << 20) // cols)
    for r in range(0, rows, step):
        blocks = np.asarray(w[r : r + step], dtype=np.float32).reshape(-1, cols // 32, 32)
        d = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q[r : r + step] = np.rint(blocks * inv[:, :, None]).reshape(len(blocks), cols)
        scale[r : r + step] = d
    return Weight("q8", q, scale, None, 32)

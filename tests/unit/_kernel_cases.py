"""Weights for the kernel tests of every backend: a random weight of each GGML block type beside gguf-py's
dequantization of it, and float weights. Imported by the numba and the CuPy tests alike, so it imports
neither backend (a GPU machine's numba may not match the pins)."""

from __future__ import annotations

import gguf
import numpy as np
from test_dequant import QUANTIZED, random_blocks

from engine.loader.quant import GGML_TYPES, gguf_weight
from kernels.weight import Weight

__all__ = ["NAMES", "QUANTIZED", "float_weight", "quantized"]
NAMES = {t: GGML_TYPES[t].name for t in GGML_TYPES}


def quantized(type_id: int, rows: int, cols: int, rng: np.random.Generator) -> tuple[Weight, np.ndarray]:
    """A random [rows, cols] weight of a GGML block type and gguf-py's float32 dequantization of it."""
    t = GGML_TYPES[type_id]
    raw = random_blocks(type_id, rows, cols // t.block_size, rng)
    raw[-1] = raw[0]  # random_blocks leaves the last block's scales random (maybe NaN): not wanted here
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(type_id)).reshape(rows, cols)
    return gguf_weight(raw, type_id, (rows, cols)), want


def float_weight(kind: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[Weight, np.ndarray]:
    """A random [rows, cols] F32, F16 or BF16 weight as the loader makes it, and its float32 values."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    type_id = {"f32": 0, "f16": 1, "bf16": 30}[kind]
    raw = (
        x.astype(np.float16) if kind == "f16" else (x.view(np.uint32) >> 16).astype(np.uint16) if kind == "bf16" else x
    )
    w = gguf_weight(raw.view(np.uint8), type_id, (rows, cols))
    return w, w.dequantize()

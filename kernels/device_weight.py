"""How a loaded `Weight` sits in GPU memory (kernels/cupy_backend.py).

q4 and q8 weights go over unchanged: the packed values and their group scales (+ mins) as stored, float16 where
the file has them so (GGUF Q4_0, Q4_1, Q8_0: the device holds exactly the file's bytes, and a Q4_0 weight no mins
but its zero point 8), float32 otherwise (K-quants' d * sc products). F16 stays float16 and F32 float32.
BF16 becomes float16, which holds every bfloat16 value of magnitude 2^-14 .. 65504 exactly (smaller
ones lose low bits, below 2^-24 they flush to zero); a matrix with larger values stays float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.weight import Weight

F16_MAX = float(np.finfo(np.float16).max)
QUANTIZED = ("q4", "q8")


@dataclass(slots=True)
class DeviceWeight:
    """A [rows, cols] weight on the device: `kind` is q4, q8, f16 or f32; arrays as `Weight` stores them (`scale`
    and `min` are its `scales` and `mins`: float32 or float16, one dtype for both; `zero` as in `Weight`)."""

    kind: str
    data: Any
    scale: Any = None
    min: Any = None
    group: int = 0
    zero: int = 0

    @property
    def nbytes(self) -> int:
        """Device bytes of the weight: a GGUF Q4_0, Q4_1 or Q8_0 weight's are the file's."""
        return sum(int(a.nbytes) for a in (self.data, self.scale, self.min) if a is not None)

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.data.shape
        return (rows, cols * 2) if self.kind == "q4" else (rows, cols)


def device_layout(w: Weight) -> Weight:
    """The host weight in the layout the device keeps (q4/q8/f16/f32), checked against what the kernels need."""
    rows, cols = w.shape
    if w.kind == "q4" and cols % 32:
        raise ValueError(f"a q4 weight needs a multiple of 32 columns, got {cols}")
    if w.kind == "q8" and (w.group % 16 or cols % w.group):
        raise ValueError(
            f"a q8 weight needs groups of a multiple of 16 values dividing its {cols} columns, got {w.group}"
        )
    if w.mins is not None and w.mins.dtype != w.scale_dtype:  # the kernels take one dtype for both
        return Weight(w.kind, w.data, w.scale, w.min, w.group)
    if w.kind != "bf16":
        return w
    values = w.dequantize()
    if values.size and float(np.abs(values).max()) > F16_MAX:
        return Weight("f32", values)
    return Weight("f16", values.astype(np.float16))

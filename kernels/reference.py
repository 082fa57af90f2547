"""What a product route should compute, in float64 NumPy: the exact product of the activations and the
weight as dequantized, or the int8 model (activations quantized per 32-block, as the int8 kernels and
llama.cpp's q8_1 do). The start-up gate (kernels/gate.py) and the kernel tests compare against these.
"""

from __future__ import annotations

import numpy as np

from kernels.weight import Weight, unpack_q4


def exact_product(x: np.ndarray, w: Weight) -> np.ndarray:
    """x [T, K] times the weight [N, K] as dequantized, in float64."""
    return x.astype(np.float64) @ w.dequantize().T.astype(np.float64)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The int8 mode's activations: int8 values and float32 scales per 32-block (round half up, scale amax/127)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.floor(blocks * inv[:, :, None] + np.float32(0.5)).astype(np.int8)
    return xq.reshape(x.shape), (amax / np.float32(127)).astype(np.float32)


def int8_product(x: np.ndarray, w: Weight) -> np.ndarray:
    """y = sum_g (scale * xd) * integer dot(q, xq) + min * xd * sum(xq), the int8 kernels' arithmetic in float64:
    the weight as dequantized times the activations as quantized (the min term too, as llama.cpp's q8_1 sums).
    Groups of 32 only."""
    assert w.group == 32 and w.scale is not None, "int8 activations go with groups of 32"
    xq, xd = quantize_activations(x)
    q = (unpack_q4(w.data) if w.kind == "q4" else w.data).astype(np.int64)
    n, k = q.shape
    dots = np.einsum("ngj,tgj->tng", q.reshape(n, k // 32, 32), xq.reshape(-1, k // 32, 32).astype(np.int64))
    y = ((w.scale[None] * xd[:, None]).astype(np.float64) * dots).sum(axis=2)
    if w.min is not None:
        sums = xd * xq.reshape(-1, k // 32, 32).sum(axis=2, dtype=np.int32).astype(np.float32)
        y += sums.astype(np.float64) @ w.min.T.astype(np.float64)
    return y

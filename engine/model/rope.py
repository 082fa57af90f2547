"""Rotary position embedding frequencies (HF conventions, float32 like transformers); the backends
turn them into cos/sin tables (`rope_cos_sin`)."""

from __future__ import annotations

import math

import numpy as np


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """inv_freq [head_dim // 2] float32 for the rope type in `scaling` (None: default)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
    scaling = scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32)
    if rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"unsupported rope scaling type {rope_type!r}")

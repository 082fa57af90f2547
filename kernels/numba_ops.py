"""Compiled small ops: RMSNorm (with the residual add fused), RoPE fused with the K/V write,
SiLU-and-multiply. float32 in and out.

All are serial over short vectors in decode (a parallel launch costs more than the work) and
parallel over token rows when a prefill brings many.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kernels.numba_jit import JIT
from kernels.numba_math import exp32

f32 = np.float32
PARALLEL_ROWS = 64  # below this many token rows the ops run on the calling thread


@njit(**JIT)
def _norm_row(x, w, eps, out):
    ss = f32(0.0)
    for j in range(x.shape[0]):
        ss += x[j] * x[j]
    inv = f32(1.0) / math.sqrt(ss / f32(x.shape[0]) + f32(eps))
    for j in range(x.shape[0]):
        out[j] = x[j] * inv * w[j]


@njit(**JIT)
def _add_norm_row(x, residual, w, eps, out):
    for j in range(x.shape[0]):
        residual[j] += x[j]
    _norm_row(residual, w, eps, out)


@njit(**JIT)
def add_rms_norm_serial(x, residual, w, eps, out):
    """residual += x; out = rms_norm(residual) * w, row by row ([T, D])."""
    for t in range(x.shape[0]):
        _add_norm_row(x[t], residual[t], w, eps, out[t])


@njit(parallel=True, **JIT)
def add_rms_norm_parallel(x, residual, w, eps, out):
    for t in prange(x.shape[0]):
        _add_norm_row(x[t], residual[t], w, eps, out[t])


@njit(**JIT)
def rms_norm_serial(x, w, eps, out):
    for t in range(x.shape[0]):
        _norm_row(x[t], w, eps, out[t])


@njit(**JIT)
def _rope_row(x, cos, sin):
    """Rotate-half RoPE of one head x [Dh] in place; cos/sin [Dh // 2]."""
    half = cos.shape[0]
    for j in range(half):
        a = x[j]
        b = x[j + half]
        x[j] = a * cos[j] - b * sin[j]
        x[j + half] = b * cos[j] + a * sin[j]


@njit(**JIT)
def _rope_write_row(qkv, cos, sin, H, Hkv, Dh, k_flat, v_flat, slot):
    for h in range(H + Hkv):  # q heads, then k heads
        _rope_row(qkv[h * Dh : (h + 1) * Dh], cos, sin)
    k0, v0 = H * Dh, (H + Hkv) * Dh
    for h in range(Hkv):
        for j in range(Dh):
            k_flat[slot, h, j] = qkv[k0 + h * Dh + j]
            v_flat[slot, h, j] = qkv[v0 + h * Dh + j]


@njit(parallel=True, **JIT)
def rope_write_kv(qkv, cos, sin, H, Hkv, k_cache, v_cache, slots):
    """qkv [T, (H + 2 Hkv) * Dh]: RoPE on the q and k heads in place, then k and v to their cache slots."""
    T = qkv.shape[0]
    nb, bs, _, Dh = k_cache.shape
    k_flat = k_cache.reshape(nb * bs, Hkv, Dh)
    v_flat = v_cache.reshape(nb * bs, Hkv, Dh)
    if T < PARALLEL_ROWS:
        for t in range(T):
            _rope_write_row(qkv[t], cos[t], sin[t], H, Hkv, Dh, k_flat, v_flat, slots[t])
    else:
        for t in prange(T):
            _rope_write_row(qkv[t], cos[t], sin[t], H, Hkv, Dh, k_flat, v_flat, slots[t])


@njit(error_model="numpy", **JIT)  # no zero-division check: a branch that blocks vectorizing
def _silu_mul_row(gu, out):
    f = out.shape[0]
    for j in range(f):
        g = gu[j]
        sg = g / (f32(1.0) + exp32(-g)) if g > f32(-88.0) else f32(0.0)  # exp32 saturates at e^88
        out[j] = sg * gu[f + j]


@njit(parallel=True, **JIT)
def silu_mul(gate_up, out):
    """gate_up [T, 2F] = [gate | up] -> out [T, F] = silu(gate) * up."""
    T = gate_up.shape[0]
    if T < PARALLEL_ROWS:
        for t in range(T):
            _silu_mul_row(gate_up[t], out[t])
    else:
        for t in prange(T):
            _silu_mul_row(gate_up[t], out[t])

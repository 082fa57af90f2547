"""NumPy backend: the reference ops and the product's CPU path (float32, OpenBLAS matmuls)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from kernels import gate, host_ops
from kernels.attention_meta import AttentionMetadata
from kernels.host_ops import Scratch, prefill_operands, prefill_tile, softmax_unnormalized
from kernels.weight import Weight

# Softmax scratch per prefill tile is bounded to about this many float32 scores.
_TILE_SCORES = 1 << 22
# Prefill query tile: small enough that causally hidden keys are mostly skipped, big enough for GEMM.
_PREFILL_TILE_ROWS = 128
# Decode scores via one block-diagonal GEMM per sequence up to this many kv heads (see _decode_group).
_BLOCK_DIAG_MAX_KV_HEADS = 4


class NumpyBackend(host_ops.CpuHostOps):
    """All ops on host numpy arrays in float32. Heavy work goes through np.matmul (BLAS).

    paged_attention reuses scratch buffers kept on the instance (sized by the largest batch seen),
    so use one instance per thread.
    """

    name = "numpy"
    xp: ModuleType = np
    kv_dtype = np.float32
    choice = ""  # get_backend says what it chose and why
    blas_threads: int | None = None  # None: as many as the engine's threads

    def __init__(self) -> None:
        self._scratch = Scratch()

    def warm_up(self, progress: Callable[[int, int, str], None] | None = None) -> None:
        """Nothing to compile."""

    def check_routes(self) -> list[gate.RouteCheck]:
        """The reference's own products against float64 (kernels/gate.py)."""
        return gate.check_products(self, gate.BOUND)

    def begin_step(self, rows: int | None = None) -> None:
        """Called at the start of every forward, on the thread that runs it; `rows`: the step's
        activation rows, when the caller will report its time to `end_step`."""

    def end_step(self, seconds: float) -> None:
        """The wall time of the step that `begin_step(rows)` began (backends that tune use it)."""

    # ---- weights --------------------------------------------------------
    def prepare_linear(self, w: Weight) -> np.ndarray:
        """A weight as `linear` takes it: dequantized, float32, input-major [K, N]."""
        return self.asarray(np.ascontiguousarray(w.dequantize().T))

    def prepare_embedding(self, w: Weight) -> np.ndarray:
        """An embedding table as `embedding` takes it: float32 [V, D]."""
        return self.asarray(w.dequantize())

    # ---- elementwise / norms --------------------------------------------
    def embedding(self, table: np.ndarray, ids: Any) -> np.ndarray:
        """table [V, D], ids [T] -> float32 [T, D]."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"embedding ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise ValueError(f"embedding ids out of range [0, {table.shape[0]}): min {ids.min()} max {ids.max()}")
        return np.take(table, ids, axis=0).astype(np.float32, copy=False)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """x [T, D] float32 -> x / sqrt(mean(x^2) + eps) * weight."""
        _check_2d("rms_norm", x, weight)
        ms = np.einsum("ij,ij->i", x, x)
        ms *= 1.0 / x.shape[1]
        ms += eps
        np.sqrt(ms, out=ms)
        out = x / ms[:, None]
        out *= weight
        return out

    def add_rms_norm(
        self, x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Fused residual add: new_residual = x + residual; returns (rms_norm(new_residual), new_residual)."""
        if x.shape != residual.shape:
            raise ValueError(f"add_rms_norm: x {x.shape} and residual {residual.shape} differ")
        new_residual = x + residual
        return self.rms_norm(new_residual, weight, eps), new_residual

    def linear(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """x [T, K] @ weight [K, N] (+ bias [N]) -> [T, N].

        Weights are stored input-major ([K, N], C-contiguous): OpenBLAS streams them 10-25%
        faster than the [N, K] layout at the row counts of decoding.
        """
        if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[0]:
            raise ValueError(f"linear: x {x.shape} does not match weight {weight.shape} ([K, N], x [T, K])")
        if x.dtype != np.float32 or weight.dtype != np.float32:
            raise ValueError(f"linear: x and weight must be float32, got {x.dtype} and {weight.dtype}")
        out = np.matmul(x, weight)
        if bias is not None:
            if bias.shape != (weight.shape[1],):
                raise ValueError(f"linear: bias {bias.shape} should be ({weight.shape[1]},)")
            out += bias
        return out

    def rope_write_kv(
        self,
        qkv: Any,
        cos: Any,
        sin: Any,
        num_heads: int,
        num_kv_heads: int,
        k_cache: Any,
        v_cache: Any,
        slot_mapping: Any,
    ) -> Any:
        """qkv [T, (H + 2 Hkv) * Dh]: RoPE on q and k, k and v into the cache; returns q [T, H, Dh]."""
        T, Dh = qkv.shape[0], k_cache.shape[3]
        q_end, k_end = num_heads * Dh, (num_heads + num_kv_heads) * Dh
        q = self.rope(qkv[:, :q_end].reshape(T, num_heads, Dh), cos, sin)
        k = self.rope(qkv[:, q_end:k_end].reshape(T, num_kv_heads, Dh), cos, sin)
        self.write_kv(k_cache, v_cache, k, qkv[:, k_end:].reshape(T, num_kv_heads, Dh), slot_mapping)
        return q

    def silu_mul(self, gate_up: np.ndarray) -> np.ndarray:
        """gate_up [T, 2F] = [gate | up] -> silu(gate) * up [T, F]."""
        if gate_up.ndim != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"silu_mul: gate_up must be [T, 2F], got {gate_up.shape}")
        f = gate_up.shape[1] // 2
        gate, up = gate_up[:, :f], gate_up[:, f:]
        # silu(g) = g / (1 + exp(-g)); exp overflows to inf for g < -88, giving the exact limit -0.
        out = np.negative(gate)
        with np.errstate(over="ignore"):
            np.exp(out, out=out)
        out += 1.0
        np.divide(gate, out, out=out)
        out *= up
        return out

    def paged_attention(
        self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, meta: AttentionMetadata, scale: float
    ) -> np.ndarray:
        """Causal attention of each sequence's new queries over its whole paged context.

        q [T, H, Dh]; q head h reads kv head h // (H // Hkv). Query j of seq b's n new tokens sits at
        position context_lens[b] - n + j and sees positions <= that. Returns [T, H, Dh] float32.
        """
        if meta.plan is None:  # validate and plan once per step; every layer reuses it
            meta.plan = host_ops.attention_plan(q.shape, k_cache.shape, meta)
        tables, ctx, qs, decode_groups, prefills = meta.plan
        out = np.empty(q.shape, dtype=np.float32)
        for seqs, nblk in decode_groups:
            self._decode_group(q, k_cache, v_cache, tables, ctx, qs, seqs, nblk, scale, out)
        for b in prefills:
            self._prefill(q, k_cache, v_cache, tables[b], int(ctx[b]), int(qs[b]), int(qs[b + 1]), scale, out)
        return out

    def _decode_group(
        self,
        q: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        tables: np.ndarray,
        ctx: np.ndarray,
        qs: np.ndarray,
        seqs: np.ndarray,
        nblk: int,
        scale: float,
        out: np.ndarray,
    ) -> None:
        B = seqs.size
        _, bs, Hkv, Dh = k_cache.shape
        H = q.shape[1]
        G = H // Hkv
        L = nblk * bs
        bt = tables[seqs, :nblk]
        k = np.take(k_cache, bt, axis=0, out=self._scratch.get("k", (B, nblk, bs, Hkv, Dh)), mode="clip")
        v = np.take(v_cache, bt, axis=0, out=self._scratch.get("v", (B, nblk, bs, Hkv, Dh)), mode="clip")
        rows = qs[seqs]
        q4 = q[rows].reshape(B, Hkv, G, Dh)
        q4 *= scale
        p = self._scratch.get("p", (B, H, L))
        if Hkv <= _BLOCK_DIAG_MAX_KV_HEADS:
            # One GEMM per sequence over all kv heads: [L, Hkv*Dh] @ block-diagonal [Hkv*Dh, H].
            # It does Hkv times the useful flops but beats Hkv thin GEMMs per sequence on small Hkv.
            qbd = self._scratch.get("qbd", (B, Hkv, Dh, Hkv, G))
            qbd.fill(0.0)
            for i in range(Hkv):
                qbd[:, i, :, i, :] = q4[:, i].transpose(0, 2, 1)
            s = np.matmul(k.reshape(B, L, Hkv * Dh), qbd.reshape(B, Hkv * Dh, H))  # [B, L, H]
            np.copyto(p, s.transpose(0, 2, 1))
        else:
            np.matmul(q4, k.reshape(B, L, Hkv, Dh).transpose(0, 2, 3, 1), out=p.reshape(B, Hkv, G, L))
        if ctx[seqs].min() < L:
            pad = np.arange(L)[None, :] >= ctx[seqs][:, None]
            np.copyto(p, -np.inf, where=pad[:, None, :])
        softmax_unnormalized(p)
        denom = p.sum(axis=-1, keepdims=True)  # [B, H, 1]
        if Hkv <= _BLOCK_DIAG_MAX_KV_HEADS:
            o = np.matmul(p, v.reshape(B, L, Hkv * Dh)).reshape(B, Hkv, G, Hkv, Dh)  # [B, H, Hkv*Dh], keep diagonal
            o4 = np.empty((B, Hkv, G, Dh), dtype=np.float32)
            for i in range(Hkv):
                o4[:, i] = o[:, i, :, i, :]
        else:
            o4 = np.matmul(p.reshape(B, Hkv, G, L), v.reshape(B, L, Hkv, Dh).transpose(0, 2, 1, 3))
        o3 = o4.reshape(B, H, Dh)
        o3 /= denom
        out[rows] = o3

    def _prefill(
        self,
        q: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        table: np.ndarray,
        c: int,
        r0: int,
        r1: int,
        scale: float,
        out: np.ndarray,
    ) -> None:
        """One sequence with n > 1 new tokens over its c-token context, query rows tiled causally."""
        ops = prefill_operands(self._scratch, q, k_cache, v_cache, table, c, r0, r1, scale)
        tile = max(16, min(_PREFILL_TILE_ROWS, _TILE_SCORES // (q.shape[1] * c)))
        for i0 in range(0, r1 - r0, tile):
            i1 = min(r1 - r0, i0 + tile)
            prefill_tile(ops, i0, i1, out, self._scratch.get("s", ops.scores_shape(i0, i1)))


def _check_2d(op: str, x: np.ndarray, weight: np.ndarray) -> None:
    d = weight.shape[0]
    if weight.ndim != 1 or weight.dtype != np.float32:
        raise ValueError(f"{op}: weight must be a 1-D float32 vector, got shape {weight.shape} dtype {weight.dtype}")
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{op}: x must be [T, {d}] to match the weight, got {x.shape}")
    if x.dtype != np.float32:
        raise ValueError(f"{op}: x must be float32, got {x.dtype}")

"""CuPy backend: the same ops as NumpyBackend on an NVIDIA GPU.

Elementwise ops, norms, RoPE, the KV-cache scatter and paged attention are CUDA kernels from
kernels/cuda/*.cu (cupy.RawModule, compiled by NVRTC on first use); linear is cuBLAS via
cupy.matmul; embedding is CuPy fancy indexing. float32 throughout.

Importing this module needs neither CuPy nor a GPU; constructing CupyBackend needs both.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kernels.attention_meta import AttentionMetadata
from kernels.numpy_backend import NumpyBackend, apply_token_bitmask as host_apply_token_bitmask

CUDA_DIR = Path(__file__).with_name("cuda")
_NORM_THREADS = 256
_ROW_THREADS = 256
_ATTN_THREADS = 128  # PA_WARPS * 32 in paged_attention.cu
_ATTN_MAX_HEAD_DIM = 256  # PA_MAX_DH in paged_attention.cu


class CupyBackend:
    """All ops on cupy arrays on the current CUDA device."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy  # deferred: the module must import on machines without CuPy

        self.xp = cupy
        self._cp = cupy
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)

    # ---- kernels ------------------------------------------------------------
    def _kernel(self, file: str, name: str) -> Any:
        """cupy.RawKernel `name` from kernels/cuda/`file` (compiled once, on first use)."""
        key = (file, name)
        fn = self._functions.get(key)
        if fn is None:
            module = self._modules.get(file)
            if module is None:
                source = (CUDA_DIR / file).read_text()
                module = self._modules[file] = self._cp.RawModule(code=source, options=("--std=c++17",))
            fn = self._functions[key] = module.get_function(name)
        return fn

    def _f32(self, a: Any, what: str) -> Any:
        if a.dtype != np.float32:
            raise ValueError(f"{what} must be float32, got {a.dtype}")
        return self._cp.ascontiguousarray(a)

    # ---- transfers ----------------------------------------------------------
    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """Host (or device) data -> cupy array."""
        return self._cp.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return self._cp.asnumpy(a)

    def synchronize(self) -> None:
        """Wait for all queued GPU work."""
        self._cp.cuda.get_current_stream().synchronize()

    def empty_kv_cache(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: Any = np.float32) -> Any:
        """[num_blocks, block_size, Hkv, Dh] zero-filled."""
        if min(num_blocks, block_size, num_kv_heads, head_dim) <= 0:
            raise ValueError(
                f"kv cache dims must be positive: num_blocks={num_blocks} block_size={block_size} "
                f"num_kv_heads={num_kv_heads} head_dim={head_dim}"
            )
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"the cupy backend keeps the KV cache in float32, got dtype {np.dtype(dtype)}")
        return self._cp.zeros((num_blocks, block_size, num_kv_heads, head_dim), dtype=np.float32)

    # The composed ops are the NumPy backend's (they only call this backend's own ops); weights
    # are dequantized to float32 on the host at load time, then copied to the device.
    blas_threads = NumpyBackend.blas_threads
    begin_step = NumpyBackend.begin_step
    prepare_linear = NumpyBackend.prepare_linear
    prepare_embedding = NumpyBackend.prepare_embedding
    rope_write_kv = NumpyBackend.rope_write_kv

    # ---- elementwise / norms ------------------------------------------------
    def embedding(self, table: Any, ids: Any) -> Any:
        """table [V, D], ids [T] -> float32 [T, D]."""
        ids = self._cp.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"embedding ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        return self._cp.take(table, ids, axis=0).astype(np.float32, copy=False)

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        """x [T, D] float32 -> x / sqrt(mean(x^2) + eps) * weight."""
        _check_2d("rms_norm", x, weight.shape[0])
        x, weight = self._f32(x, "rms_norm x"), self._f32(weight, "rms_norm weight")
        out = self._cp.empty_like(x)
        if x.shape[0]:
            self._kernel("rms_norm.cu", "rms_norm_f32")(
                (x.shape[0],), (_NORM_THREADS,), (x, weight, out, np.int32(x.shape[1]), np.float32(eps))
            )
        return out

    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        """new_residual = x + residual; returns (rms_norm(new_residual), new_residual)."""
        if x.shape != residual.shape:
            raise ValueError(f"add_rms_norm: x {x.shape} and residual {residual.shape} differ")
        _check_2d("add_rms_norm", x, weight.shape[0])
        x, residual = self._f32(x, "add_rms_norm x"), self._f32(residual, "add_rms_norm residual")
        weight = self._f32(weight, "add_rms_norm weight")
        out, new_residual = self._cp.empty_like(x), self._cp.empty_like(x)
        if x.shape[0]:
            self._kernel("rms_norm.cu", "add_rms_norm_f32")(
                (x.shape[0],), (_NORM_THREADS,),
                (x, residual, weight, out, new_residual, np.int32(x.shape[1]), np.float32(eps)),
            )
        return out, new_residual

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        """x [T, K] @ weight [K, N] (+ bias [N]) -> [T, N] via cuBLAS."""
        if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[0]:
            raise ValueError(f"linear: x {x.shape} does not match weight {weight.shape} ([K, N], x [T, K])")
        out = self._cp.matmul(x, weight)
        if bias is not None:
            if bias.shape != (weight.shape[1],):
                raise ValueError(f"linear: bias {bias.shape} should be ({weight.shape[1]},)")
            out += bias
        return out

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        """Rotate-half RoPE on x [T, H, Dh] (may be a strided view, last dim contiguous); in place, returns x."""
        if x.ndim != 3 or x.shape[2] % 2:
            raise ValueError(f"rope: x must be [T, H, Dh] with even Dh, got {x.shape}")
        if x.dtype != np.float32 or x.strides[2] != 4:
            raise ValueError(f"rope: x must be float32 with a contiguous last dim, got {x.dtype} strides {x.strides}")
        T, H, Dh = x.shape
        half = Dh // 2
        if cos.shape != (T, half) or sin.shape != cos.shape:
            raise ValueError(f"rope: cos {cos.shape} / sin {sin.shape} should be ({T}, {half})")
        cos, sin = self._f32(cos, "rope cos"), self._f32(sin, "rope sin")
        if T:
            self._kernel("rope.cu", "rope_neox_f32")(
                (T,), (min(1024, _round_up(H * half, 32)),),
                (x, cos, sin, np.int32(H), np.int32(half), np.int64(x.strides[0] // 4), np.int64(x.strides[1] // 4)),
            )
        return x

    def silu_mul(self, gate_up: Any) -> Any:
        """gate_up [T, 2F] = [gate | up] -> silu(gate) * up [T, F]."""
        if gate_up.ndim != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"silu_mul: gate_up must be [T, 2F], got {gate_up.shape}")
        if gate_up.dtype != np.float32 or gate_up.strides[1] != 4:
            gate_up = self._f32(gate_up, "silu_mul gate_up")
        T, F = gate_up.shape[0], gate_up.shape[1] // 2
        out = self._cp.empty((T, F), dtype=np.float32)
        n = T * F
        if n:
            blocks = min(65535, -(-n // _ROW_THREADS))
            self._kernel("silu_mul.cu", "silu_mul_f32")(
                (blocks,), (_ROW_THREADS,), (gate_up, out, np.int32(F), np.int64(gate_up.strides[0] // 4), np.int64(n))
            )
        return out

    def argmax_rows(self, logits: Any) -> np.ndarray:
        """[T, V] -> host int64 [T] (first maximum per row)."""
        return self._cp.asnumpy(self._cp.argmax(logits, axis=-1))

    def apply_token_bitmask(self, logits: Any, bitmask: Any) -> None:
        """Set logits [R, V] to -inf where the bit of their token in bitmask (int32 [R, W]) is 0, in place.

        Host logits (what the model returns today) are masked on the host, device logits by the kernel."""
        if isinstance(logits, np.ndarray):
            host_apply_token_bitmask(logits, bitmask)
            return
        if logits.ndim != 2 or logits.dtype != np.float32 or logits.strides[1] != 4:
            raise ValueError(f"apply_token_bitmask: logits must be float32 [R, V] with contiguous rows, got {logits.dtype} {logits.shape}")
        R, V = logits.shape
        if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[0] != R:
            raise ValueError(f"apply_token_bitmask: bitmask must be int32 [{R}, W], got {bitmask.dtype} {bitmask.shape}")
        bitmask = self._cp.ascontiguousarray(bitmask)
        if R and V:
            self._kernel("token_bitmask.cu", "apply_token_bitmask_f32")(
                (-(-V // _ROW_THREADS), R), (_ROW_THREADS,),
                (logits, bitmask, np.int32(V), np.int32(bitmask.shape[1]), np.int64(logits.strides[0] // 4)),
            )

    # ---- KV cache + attention -----------------------------------------------
    def write_kv(self, k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
        """Scatter k, v [T, Hkv, Dh] into the caches at flat slots slot_mapping [T]."""
        nb, bs, hkv, dh = k_cache.shape
        if v_cache.shape != k_cache.shape:
            raise ValueError(f"write_kv: k_cache {k_cache.shape} and v_cache {v_cache.shape} differ")
        if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
            raise ValueError("write_kv: the caches must be C-contiguous")
        T = slot_mapping.shape[0]
        if k.shape != (T, hkv, dh) or v.shape != (T, hkv, dh):
            raise ValueError(f"write_kv: k {k.shape} / v {v.shape} should be ({T}, {hkv}, {dh}) for {T} slots")
        if k.strides[2] != 4 or k.dtype != np.float32:
            k = self._f32(k, "write_kv k")
        if v.strides[2] != 4 or v.dtype != np.float32:
            v = self._f32(v, "write_kv v")
        slots = self._cp.ascontiguousarray(self._cp.asarray(slot_mapping, dtype=np.int64))
        if T:
            self._kernel("kv_cache.cu", "write_kv_f32")(
                (T,), (min(1024, _round_up(hkv * dh, 32)),),
                (k, v, k_cache, v_cache, slots, np.int64(nb * bs), np.int32(hkv), np.int32(dh),
                 np.int64(k.strides[0] // 4), np.int64(k.strides[1] // 4),
                 np.int64(v.strides[0] // 4), np.int64(v.strides[1] // 4)),
            )

    def paged_attention(self, q: Any, k_cache: Any, v_cache: Any, meta: AttentionMetadata, scale: float) -> Any:
        """Causal attention of each sequence's new queries over its whole paged context (see NumpyBackend)."""
        T, H, Dh = q.shape
        nb, bs, Hkv, dh = k_cache.shape
        if dh != Dh or H % Hkv:
            raise ValueError(f"paged_attention: q {q.shape} does not fit cache {k_cache.shape} (Dh equal, H divisible by Hkv)")
        if Dh > _ATTN_MAX_HEAD_DIM:
            raise ValueError(f"paged_attention: head_dim {Dh} exceeds the kernel's limit {_ATTN_MAX_HEAD_DIM}")
        if q.dtype != np.float32 or q.strides[2] != 4:
            q = self._f32(q, "paged_attention q")
        cp = self._cp
        query_start = cp.ascontiguousarray(cp.asarray(meta.query_start, dtype=np.int32))
        context_lens = cp.ascontiguousarray(cp.asarray(meta.context_lens, dtype=np.int32))
        tables = cp.ascontiguousarray(cp.asarray(meta.block_tables, dtype=np.int32))
        B = context_lens.shape[0]
        if query_start.shape != (B + 1,) or tables.ndim != 2 or tables.shape[0] != B:
            raise ValueError(
                f"paged_attention: metadata shapes disagree: query_start {query_start.shape}, "
                f"context_lens {context_lens.shape}, block_tables {tables.shape}"
            )
        if meta.query_start_host is not None and int(meta.query_start_host[-1]) != T:
            raise ValueError(f"paged_attention: query_start does not cover {T} query rows")
        if tables.shape[1] * bs < meta.max_context:
            raise ValueError(f"paged_attention: block_tables {tables.shape} too small for context_lens up to {meta.max_context}")
        out = cp.empty((T, H, Dh), dtype=np.float32)
        if T:
            self._kernel("paged_attention.cu", "paged_attention_f32")(
                (T, H), (_ATTN_THREADS,),
                (out, q, k_cache, v_cache, query_start, context_lens, tables,
                 np.int32(B), np.int32(H), np.int32(Hkv), np.int32(Dh), np.int32(bs), np.int32(tables.shape[1]),
                 np.int64(q.strides[0] // 4), np.int64(q.strides[1] // 4), np.float32(scale)),
            )
        return out


def _round_up(n: int, m: int) -> int:
    return max(m, -(-n // m) * m)


def _check_2d(op: str, x: Any, d: int) -> None:
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{op}: x must be [T, {d}] to match the weight, got {x.shape}")

"""CuPy backend: the forward pass on an NVIDIA GPU, with the NumPy backend's op semantics.

Weights stay as the loader hands them over (kernels/device_weight.py): q4/q8 values and their group
scales in device memory, float16 where the file has them so (the kernels' `_hs` forms read those).
Products with up to GEMV_MAX_ROWS activation rows (decode) read them in GEMV kernels that dequantize
in registers; with more rows (prefill) panels of the weight are
dequantized into a float16 scratch and multiplied by cuBLAS (float16 inputs, float32 accumulation
and result), as float16 weights are directly. Activations and the residual stream are float32, the
KV cache is float16. Norms, RoPE, SiLU, the embedding gather, the KV write and paged attention are
CUDA kernels from kernels/cuda/*.cu (cupy.RawModule, compiled by NVRTC: `compile_kernels` at load).

All work goes to one stream of the backend's (`begin_step` makes it current on the calling thread),
so that eager steps and CUDA graph replays (`capture_graph`) are ordered. It is a blocking stream:
work queued on the legacy default stream by another thread (weight uploads) is ordered with it too.

Importing this module needs neither CuPy nor a GPU; constructing CupyBackend needs both.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kernels.attention_meta import AttentionMetadata
from kernels.cublas_gemm import gemm_f16
from kernels.cuda_launch import (
    GEMV_MAX_ROWS,
    PA_MAX_DH,
    PA_WARPS,
    ROW_THREADS,
    SAMPLE_THREADS,
    attention_plan,
    elementwise_blocks,
    gemv_geometry,
    gemv_tiled_geometry,
    panel_rows,
    row_threads,
)
from kernels.device_weight import QUANTIZED, DeviceWeight, device_layout
from kernels.gate import RouteCheck, check_products
from kernels.row_sampling import TABLE
from kernels.weight import Weight

log = logging.getLogger("forge.kernels")
CUDA_DIR = Path(__file__).with_name("cuda")
# Every kernel the backend launches -> its source in kernels/cuda (a unit test checks both ways).
KERNELS = {
    "rms_norm_f32": "rms_norm.cu",
    "add_rms_norm_f32": "rms_norm.cu",
    "rope_cos_sin_f32": "rope.cu",
    "rope_neox_f32": "rope.cu",
    "rope_write_kv_f16": "rope.cu",
    "silu_mul_f32": "silu_mul.cu",
    "write_kv_f16": "kv_cache.cu",
    "q4_rows_f32": "dequant.cu",
    "q4_rows_f16": "dequant.cu",
    "q8_rows_f32": "dequant.cu",
    "q8_rows_f16": "dequant.cu",
    "q4_rows_f32_hs": "dequant.cu",
    "q4_rows_f16_hs": "dequant.cu",
    "q8_rows_f32_hs": "dequant.cu",
    "q8_rows_f16_hs": "dequant.cu",
    "gemv_q4": "gemv.cu",
    "gemv_q8": "gemv.cu",
    "gemv_q4_hs": "gemv.cu",
    "gemv_q8_hs": "gemv.cu",
    "gemv_tiled_q4": "gemv.cu",
    "gemv_tiled_q8": "gemv.cu",
    "gemv_tiled_q4_hs": "gemv.cu",
    "gemv_tiled_q8_hs": "gemv.cu",
    "paged_attention_decode_f16": "paged_attention.cu",
    "paged_attention_prefill_f16": "paged_attention.cu",
    "apply_token_bitmask_f32": "token_bitmask.cu",
    "sample_rows_f32": "sample.cu",
    "logprobs_f32": "logprobs.cu",
}
# float16 values of the scratch that prefill products dequantize weight panels into (32 MiB).
PANEL_VALUES = 1 << 24
# The widest load a kernel makes (float4 / uint4): arrays read that way must start on a multiple of it.
VECTOR_BYTES = 16


@dataclass(slots=True)
class CapturedGraph:
    """A CUDA graph and the memory pool its capture allocated from: the graph holds raw addresses in that pool,
    so the pool must live as long as the graph and serve nothing else."""

    graph: Any  # cupy.cuda.graph.Graph
    pool: Any  # cupy.cuda.MemoryPool


class CupyBackend:
    """All ops on cupy arrays on the current CUDA device."""

    name = "cupy"
    kv_dtype = np.float16
    # Decode steps of at most this many rows are captured as CUDA graphs: CuPy refuses cuBLAS calls while a
    # stream captures, and products of more rows than this go through cuBLAS (engine/decode_graphs.py).
    graph_max_rows = GEMV_MAX_ROWS
    choice = ""  # get_backend says what it chose and why
    blas_threads: int | None = None  # host BLAS is only used by the sampler here

    def __init__(self) -> None:
        import cupy  # deferred: the module must import on machines without CuPy

        self.xp = self._cp = cupy
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Any] = {}
        dev = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.stream = cupy.cuda.Stream(non_blocking=False)
        self._capture_stream = cupy.cuda.Stream(non_blocking=True)
        # Allocated once, so that CUDA graphs may hold its address.
        self._panel = cupy.empty(PANEL_VALUES, dtype=np.float16)
        self._shared: tuple[Weight, DeviceWeight] | None = None
        self.gemv = "gemv_tiled"  # the GEMV route: "gemv_tiled", or "gemv" once the start-up gate retired it

    # ---- kernels ------------------------------------------------------------
    def _kernel(self, name: str) -> Any:
        """The cupy.RawKernel `name` (its source file compiles once, on first use)."""
        fn = self._functions.get(name)
        if fn is None:
            file = KERNELS[name]
            module = self._modules.get(file)
            if module is None:
                code = (CUDA_DIR / file).read_text()
                module = self._modules[file] = self._cp.RawModule(code=code, options=("--std=c++17", f"-I{CUDA_DIR}"))
            fn = self._functions[name] = module.get_function(name)
        return fn

    def compile_kernels(self, progress: Callable[[int, int, str], None] | None = None) -> None:
        """Compile (or load from CuPy's cache) every source now rather than at the first request."""
        files = sorted(set(KERNELS.values()))
        for i, file in enumerate(files, 1):
            if progress:
                progress(i, len(files), file)
            for name in (k for k, f in KERNELS.items() if f == file):
                self._kernel(name)

    def warm_up(self, progress: Callable[[int, int, str], None] | None = None) -> None:
        """Compile every CUDA source now, so the first request does not wait on NVRTC."""
        self.compile_kernels(progress)

    def check_routes(self) -> list[RouteCheck]:
        """The parity gate's products (kernels/gate.py): without it passing, `auto` does not choose the GPU.

        The tiled GEMV kernels come first; if one of their products fails, the plain ones replace them (with a
        warning naming both), and the checks are those of the plain route."""
        checks = check_products(self)
        failed = [c for c in checks if not c.ok and c.rows <= GEMV_MAX_ROWS]
        if failed and self.gemv == "gemv_tiled":
            self.gemv = "gemv"
            log.warning("kernel route gemv_tiled failed its check (%s); using gemv instead", failed[0])
            checks = [replace(c, replaced_by="gemv") for c in failed] + check_products(self)
        return checks

    def _f32(self, a: Any, what: str, aligned: bool = False) -> Any:
        """`a` as contiguous float32; with `aligned`, also starting on a 16-byte boundary (a copy if a contiguous view
        does not): kernels that read it in 16-byte vectors (gemv.cu's float4 loads of x) need that."""
        if a.dtype != np.float32:
            raise ValueError(f"{what} must be float32, got {a.dtype}")
        a = self._cp.ascontiguousarray(a)
        return a.copy() if aligned and a.data.ptr % VECTOR_BYTES else a

    # ---- transfers, stream, graphs -------------------------------------------
    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """Host (or device) data -> cupy array (no copy when it already is one of that dtype)."""
        return self._cp.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return self._cp.asnumpy(a, stream=self.stream)

    def upload(self, dst: Any, src: np.ndarray) -> None:
        """Copy host data into a device array of the same shape and dtype (on the backend's stream)."""
        dst.set(src, stream=self.stream)

    def synchronize(self) -> None:
        """Wait for all work queued on the backend's stream."""
        self.stream.synchronize()

    def begin_step(self, rows: int | None = None) -> None:
        """Make the backend's stream current on the calling thread (the engine's step thread)."""
        self.stream.use()

    def end_step(self, seconds: float) -> None:
        """Nothing to tune: `seconds` only timed the launches (the GPU runs asynchronously)."""

    def capture_graph(self, fn: Callable[[], Any]) -> tuple[CapturedGraph, Any]:
        """Run `fn` once, then capture a second run into a CUDA graph: returns (graph, what the captured run returned).

        `fn` must read its inputs from device arrays that outlive the graph and must not copy between host and
        device; `replay(graph)` then redoes its work on the same buffers. Memory that `fn` allocates, in the warm-up
        run too (the attention plan it leaves in its metadata), comes from a pool of this capture's own, which the
        returned graph holds: its replays write their scratch again, so no other capture and no other allocation
        may ever be handed those addresses (with one pool for all graphs, the next capture's plan was carved from
        the last one's scratch). The price: graphs hold the sum of their peak scratch, not the largest (a decode
        step's activations and logits per bucket). Warm-up and capture run on a non-blocking stream of their own
        (a blocking one would tie the capture to the legacy stream); CuPy's pools keep free memory per stream, so
        the warm-up fills the arena the capture then draws from. Raises if CUDA refuses the capture.
        """
        cp, capture = self._cp, self._capture_stream
        pool = cp.cuda.MemoryPool()
        self.stream.synchronize()  # the capture stream is not ordered with the backend's
        with cp.cuda.using_allocator(pool.malloc), capture:
            fn()  # loads every kernel, and fills the pool, outside the capture
            capture.synchronize()
            capture.begin_capture()
            try:
                out = fn()
            except BaseException:
                with contextlib.suppress(Exception):  # the capture is void; keep fn's error
                    capture.end_capture()
                raise
            graph = capture.end_capture()
        return CapturedGraph(graph, pool), out

    def replay(self, graph: CapturedGraph) -> None:
        graph.graph.launch(self.stream)

    # ---- weights ----------------------------------------------------------------
    def prepare_linear(self, w: Weight) -> DeviceWeight:
        """The weight in device memory, quantized types unchanged (kernels/device_weight.py).

        Right after `prepare_embedding` of the same Weight (tied embeddings) the device copy is shared."""
        shared, self._shared = self._shared, None
        if shared is not None and shared[0] is w:
            return shared[1]
        d = device_layout(w)
        put = lambda a: None if a is None else self._cp.asarray(np.ascontiguousarray(a))
        return DeviceWeight(d.kind, put(d.data), put(d.scales), put(d.mins), d.group, d.zero)

    def prepare_embedding(self, w: Weight) -> DeviceWeight:
        dev = self.prepare_linear(w)
        self._shared = (w, dev)
        return dev

    def empty_kv_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: Any = np.float16
    ) -> Any:
        """[num_blocks, block_size, Hkv, Dh] float16, zero-filled."""
        if min(num_blocks, block_size, num_kv_heads, head_dim) <= 0:
            raise ValueError(
                f"kv cache dims must be positive: num_blocks={num_blocks} block_size={block_size} "
                f"num_kv_heads={num_kv_heads} head_dim={head_dim}"
            )
        if np.dtype(dtype) != np.float16:
            raise ValueError(f"the cupy backend keeps the KV cache in float16, got dtype {np.dtype(dtype)}")
        return self._cp.zeros((num_blocks, block_size, num_kv_heads, head_dim), dtype=np.float16)

    # ---- linear + embedding -------------------------------------------------------
    def linear(self, x: Any, w: DeviceWeight, bias: Any = None) -> Any:
        """x [T, K] float32 times the weight [N, K] -> float32 [T, N] (+ bias [N])."""
        N, K = w.shape
        if x.ndim != 2 or x.shape[1] != K:
            raise ValueError(f"linear: x {x.shape} does not match the weight {w.shape} ([N, K], x [T, K])")
        gemv = w.kind in QUANTIZED and x.shape[0] <= GEMV_MAX_ROWS
        x = self._f32(x, "linear x", aligned=gemv)  # GEMV rows: K is a multiple of 16, so every row is aligned too
        T, cp = x.shape[0], self._cp
        if gemv:
            out = cp.empty((T, N), dtype=np.float32)
            if T:
                grid, block = (gemv_tiled_geometry if self.gemv == "gemv_tiled" else gemv_geometry)(N, T)
                last = np.int32(w.zero if w.kind == "q4" else w.group)
                self._kernel(f"{self.gemv}_{w.kind}{_scales(w)}")(
                    grid, block, (out, x, w.data, w.scale, w.min, np.int32(T), np.int32(N), np.int32(K), last)
                )
        elif w.kind in QUANTIZED:
            out = cp.empty((T, N), dtype=np.float32)
            x16 = x.astype(np.float16)
            step = panel_rows(N, K, self._panel.size)
            for n0 in range(0, N, step):
                panel = self._panel[: min(step, N - n0) * K].reshape(-1, K)
                self._dequantize(w, panel, n0, None)
                gemm_f16(cp, x16, panel, out[:, n0 : n0 + panel.shape[0]])
        elif w.kind == "f16":
            out = cp.empty((T, N), dtype=np.float32)
            gemm_f16(cp, x.astype(np.float16), w.data, out)
        else:
            out = cp.matmul(x, w.data.T)
        if bias is not None:
            if bias.shape != (N,):
                raise ValueError(f"linear: bias {bias.shape} should be ({N},)")
            out += bias
        return out

    def embedding(self, table: DeviceWeight, ids: Any) -> Any:
        """Rows `ids` [T] of the table, float32 [T, D] (quantized rows bit-equal to Weight.dequantize)."""
        ids = self._cp.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"embedding ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        if table.kind not in QUANTIZED:
            return self._cp.take(table.data, ids, axis=0).astype(np.float32, copy=False)
        out = self._cp.empty((ids.shape[0], table.shape[1]), dtype=np.float32)
        self._dequantize(table, out, 0, self._cp.ascontiguousarray(ids, dtype=np.int64))
        return out

    def _dequantize(self, w: DeviceWeight, out: Any, row0: int, ids: Any) -> None:
        """out [R, K] (float32 or float16) = weight rows ids (int64 [R]), or row0 .. row0 + R - 1 when ids is None."""
        R, K = out.shape
        if not R:
            return
        kernel = self._kernel(f"{w.kind}_rows_{'f16' if out.dtype == np.float16 else 'f32'}{_scales(w)}")
        args = (out, w.data, w.scale, w.min, ids, np.int64(row0), np.int64(w.shape[0]), np.int32(R), np.int32(K))
        if w.kind == "q4":  # a thread per packed byte
            kernel((elementwise_blocks(R * K // 2),), (ROW_THREADS,), args + (np.int32(w.zero),))
        else:
            kernel((elementwise_blocks(R * K),), (ROW_THREADS,), args + (np.int32(w.group),))

    # ---- norms, RoPE, SiLU ----------------------------------------------------------
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        """x [T, D] float32 -> x / sqrt(mean(x^2) + eps) * weight."""
        _check_2d("rms_norm", x, weight.shape[0])
        x, weight = self._f32(x, "rms_norm x"), self._f32(weight, "rms_norm weight")
        out = self._cp.empty_like(x)
        if x.shape[0]:
            self._kernel("rms_norm_f32")(
                (x.shape[0],), (ROW_THREADS,), (x, weight, out, np.int32(x.shape[1]), np.float32(eps))
            )
        return out

    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        """residual += x in place (the caller owns it); returns (rms_norm(residual), residual)."""
        if x.shape != residual.shape:
            raise ValueError(f"add_rms_norm: x {x.shape} and residual {residual.shape} differ")
        _check_2d("add_rms_norm", x, weight.shape[0])
        if residual.dtype != np.float32 or not residual.flags.c_contiguous:
            raise ValueError(f"add_rms_norm: residual must be contiguous float32, got {residual.dtype}")
        x, weight = self._f32(x, "add_rms_norm x"), self._f32(weight, "add_rms_norm weight")
        out = self._cp.empty_like(x)
        if x.shape[0]:
            self._kernel("add_rms_norm_f32")(
                (x.shape[0],), (ROW_THREADS,), (x, residual, weight, out, np.int32(x.shape[1]), np.float32(eps))
            )
        return out, residual

    def rope_cos_sin(self, inv_freq: Any, positions: Any) -> tuple[Any, Any]:
        """cos, sin float32 [T, len(inv_freq)] at angles positions[t] * inv_freq[j], computed on the device."""
        positions = self._cp.ascontiguousarray(self._cp.asarray(positions, dtype=np.int64))
        inv_freq = self._f32(inv_freq, "rope inv_freq")
        T, half = positions.shape[0], inv_freq.shape[0]
        cos, sin = (self._cp.empty((T, half), dtype=np.float32) for _ in range(2))
        if T:
            self._kernel("rope_cos_sin_f32")(
                (elementwise_blocks(T * half),),
                (ROW_THREADS,),
                (cos, sin, positions, inv_freq, np.int32(T), np.int32(half)),
            )
        return cos, sin

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
            self._kernel("rope_neox_f32")(
                (T,),
                (row_threads(H * half),),
                (x, cos, sin, np.int32(H), np.int32(half), np.int64(x.strides[0] // 4), np.int64(x.strides[1] // 4)),
            )
        return x

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
        """qkv [T, (H + 2 Hkv) * Dh]: RoPE on q (in place) and k, k and v into the float16 caches; returns
        q [T, H, Dh]."""
        T, Dh = qkv.shape[0], k_cache.shape[3]
        H, Hkv = num_heads, num_kv_heads
        if qkv.ndim != 2 or qkv.shape[1] != (H + 2 * Hkv) * Dh or Dh % 2:
            raise ValueError(f"rope_write_kv: qkv {qkv.shape} should be [T, {(H + 2 * Hkv) * Dh}] (even head_dim)")
        if qkv.dtype != np.float32 or qkv.strides[1] != 4:
            raise ValueError(
                f"rope_write_kv: qkv must be float32 with contiguous rows, got {qkv.dtype} strides {qkv.strides}"
            )
        num_slots = self._check_caches("rope_write_kv", k_cache, v_cache, Hkv)
        half = Dh // 2
        if cos.shape != (T, half) or sin.shape != cos.shape:
            raise ValueError(f"rope_write_kv: cos {cos.shape} / sin {sin.shape} should be ({T}, {half})")
        cos, sin = self._f32(cos, "rope cos"), self._f32(sin, "rope sin")
        slots = self._slots(slot_mapping, T)
        if T:
            self._kernel("rope_write_kv_f16")(
                (T,),
                (row_threads((H + Hkv) * half),),
                (
                    qkv,
                    cos,
                    sin,
                    k_cache,
                    v_cache,
                    slots,
                    np.int64(num_slots),
                    np.int32(H),
                    np.int32(Hkv),
                    np.int32(Dh),
                    np.int64(qkv.strides[0] // 4),
                ),
            )
        return qkv[:, : H * Dh].reshape(T, H, Dh)

    def silu_mul(self, gate_up: Any) -> Any:
        """gate_up [T, 2F] = [gate | up] -> silu(gate) * up [T, F]."""
        if gate_up.ndim != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"silu_mul: gate_up must be [T, 2F], got {gate_up.shape}")
        if gate_up.dtype != np.float32 or gate_up.strides[1] != 4:
            gate_up = self._f32(gate_up, "silu_mul gate_up")
        T, F = gate_up.shape[0], gate_up.shape[1] // 2
        out = self._cp.empty((T, F), dtype=np.float32)
        if T * F:
            self._kernel("silu_mul_f32")(
                (elementwise_blocks(T * F),),
                (ROW_THREADS,),
                (gate_up, out, np.int32(F), np.int64(gate_up.strides[0] // 4), np.int64(T * F)),
            )
        return out

    def argmax_rows(self, logits: Any) -> tuple[np.ndarray, np.ndarray]:
        """[T, V] -> host (int64 [T] first maximum per row, float32 [T] its logit): all that greedy
        sampling copies back."""
        return self.to_numpy(self._cp.argmax(logits, axis=-1)), self.to_numpy(logits.max(axis=-1))

    def sample_rows(self, logits: Any, table: np.ndarray) -> np.ndarray:
        """Each row's token (host int64 [R], -1 where a row has no usable token) from device logits [R, V] and a
        host sampling table (kernels/row_sampling.py), sampled on the device (sample.cu): the table goes up and
        the ids come back, the logits stay."""
        if logits.ndim != 2 or logits.dtype != np.float32 or logits.strides[1] != 4:
            raise ValueError(
                f"sample_rows: logits must be float32 [R, V] with contiguous rows, got {logits.dtype} {logits.shape}"
            )
        R, V = logits.shape
        if table.shape != (R, len(TABLE)) or table.dtype != np.float64:
            raise ValueError(f"sample_rows: table must be float64 [{R}, {len(TABLE)}], got {table.dtype} {table.shape}")
        out = self._cp.empty(R, dtype=np.int64)
        if R:
            self._kernel("sample_rows_f32")(
                (R,),
                (SAMPLE_THREADS,),
                (logits, self.asarray(table), out, np.int32(V), np.int64(logits.strides[0] // 4)),
            )
        return self.to_numpy(out)

    def logprob_rows(
        self, logits: Any, rows: np.ndarray, tokens: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Log-softmax of device logits rows `rows` (host int64 [W]) at `tokens` (int64 [W]) and at their min(n, V)
        best tokens (logprobs.cu), on the host: float64 [W], ids int64 [W, n], float64 [W, n]."""
        if logits.ndim != 2 or logits.dtype != np.float32 or logits.strides[1] != 4:
            raise ValueError(
                f"logprob_rows: logits must be float32 [R, V] with contiguous rows, got {logits.dtype} {logits.shape}"
            )
        W, V = rows.shape[0], logits.shape[1]
        if tokens.shape != (W,):
            raise ValueError(f"logprob_rows: {tokens.shape} tokens for {W} rows")
        n, cp = min(n, V), self._cp
        chosen, ids, values = cp.empty(W, np.float64), cp.empty((W, n), np.int64), cp.empty((W, n), np.float64)
        if W:
            self._kernel("logprobs_f32")(
                (W,),
                (ROW_THREADS,),
                (
                    logits,
                    self.asarray(rows, np.int64),
                    self.asarray(tokens, np.int64),
                    chosen,
                    ids,
                    values,
                    np.int32(n),
                    np.int32(V),
                    np.int64(logits.strides[0] // 4),
                ),
            )
        return self.to_numpy(chosen), self.to_numpy(ids), self.to_numpy(values)

    def apply_token_bitmask(self, logits: Any, bitmask: Any) -> None:
        """Set device logits [R, V] to -inf where the bit of their token in bitmask (int32 [R, W], host or
        device) is 0, in place; columns past 32 * W too."""
        if logits.ndim != 2 or logits.dtype != np.float32 or logits.strides[1] != 4:
            raise ValueError(
                "apply_token_bitmask: logits must be float32 [R, V] with contiguous rows, "
                f"got {logits.dtype} {logits.shape}"
            )
        R, V = logits.shape
        if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[0] != R:
            raise ValueError(
                f"apply_token_bitmask: bitmask must be int32 [{R}, W], got {bitmask.dtype} {bitmask.shape}"
            )
        bitmask = self._cp.ascontiguousarray(self._cp.asarray(bitmask))
        if R and V:
            self._kernel("apply_token_bitmask_f32")(
                (-(-V // ROW_THREADS), R),
                (ROW_THREADS,),
                (logits, bitmask, np.int32(V), np.int32(bitmask.shape[1]), np.int64(logits.strides[0] // 4)),
            )

    # ---- KV cache + attention -----------------------------------------------------
    def _check_caches(self, op: str, k_cache: Any, v_cache: Any, num_kv_heads: int) -> int:
        """Validate the float16 cache pair; returns its number of slots."""
        nb, bs, hkv, dh = k_cache.shape
        if v_cache.shape != k_cache.shape or hkv != num_kv_heads:
            raise ValueError(f"{op}: caches {k_cache.shape} / {v_cache.shape} do not match {num_kv_heads} kv heads")
        if k_cache.dtype != np.float16 or v_cache.dtype != np.float16:
            raise ValueError(f"{op}: the caches must be float16, got {k_cache.dtype} / {v_cache.dtype}")
        if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
            raise ValueError(f"{op}: the caches must be C-contiguous")
        if k_cache.data.ptr % VECTOR_BYTES or v_cache.data.ptr % VECTOR_BYTES:  # attention reads K in 16-byte vectors
            raise ValueError(f"{op}: the caches must start on a {VECTOR_BYTES}-byte boundary")
        return nb * bs

    def _slots(self, slot_mapping: Any, T: int) -> Any:
        slots = self._cp.ascontiguousarray(self._cp.asarray(slot_mapping, dtype=np.int64))
        if slots.shape != (T,):
            raise ValueError(f"slot_mapping {slots.shape} should be ({T},)")
        return slots

    def write_kv(self, k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
        """Scatter float32 k, v [T, Hkv, Dh] into the float16 caches at flat slots slot_mapping [T]."""
        hkv, dh = k_cache.shape[2:]
        num_slots = self._check_caches("write_kv", k_cache, v_cache, hkv)
        T = slot_mapping.shape[0]
        if k.shape != (T, hkv, dh) or v.shape != (T, hkv, dh):
            raise ValueError(f"write_kv: k {k.shape} / v {v.shape} should be ({T}, {hkv}, {dh}) for {T} slots")
        if k.strides[2] != 4 or k.dtype != np.float32:
            k = self._f32(k, "write_kv k")
        if v.strides[2] != 4 or v.dtype != np.float32:
            v = self._f32(v, "write_kv v")
        slots = self._slots(slot_mapping, T)
        if T:
            self._kernel("write_kv_f16")(
                (T,),
                (row_threads(hkv * dh),),
                (
                    k,
                    v,
                    k_cache,
                    v_cache,
                    slots,
                    np.int64(num_slots),
                    np.int32(hkv),
                    np.int32(dh),
                    np.int64(k.strides[0] // 4),
                    np.int64(k.strides[1] // 4),
                    np.int64(v.strides[0] // 4),
                    np.int64(v.strides[1] // 4),
                ),
            )

    def paged_attention(self, q: Any, k_cache: Any, v_cache: Any, meta: AttentionMetadata, scale: float) -> Any:
        """Causal attention of each sequence's new queries over its whole paged context (see NumpyBackend).

        Decode rows and prefill rows go to their own kernels; the split is planned once a step from the host
        copy of query_start and kept in meta.plan for every layer (and every CUDA graph replay)."""
        T, H, Dh = q.shape
        nb, bs, Hkv, dh = k_cache.shape
        if dh != Dh or H % Hkv:
            raise ValueError(
                f"paged_attention: q {q.shape} does not fit cache {k_cache.shape} (Dh equal, H divisible by Hkv)"
            )
        if Dh % 8 or Dh > PA_MAX_DH:
            raise ValueError(f"paged_attention: head_dim {Dh} must be a multiple of 8 up to {PA_MAX_DH}")
        self._check_caches("paged_attention", k_cache, v_cache, Hkv)
        if q.dtype != np.float32 or q.strides[2] != 4:
            q = self._f32(q, "paged_attention q")
        if meta.plan is None:
            meta.plan = self._plan(T, bs, meta)
        decode, items = meta.plan
        tables = meta.block_tables
        out = self._cp.empty((T, H, Dh), dtype=np.float32)
        common = (
            meta.query_start,
            meta.context_lens,
            tables,
            np.int32(H),
            np.int32(Hkv),
            np.int32(Dh),
            np.int32(bs),
            np.int32(tables.shape[1]),
            np.int64(q.strides[0] // 4),
            np.int64(q.strides[1] // 4),
            np.float32(scale),
        )
        if decode.shape[0]:
            self._kernel("paged_attention_decode_f16")(
                (decode.shape[0], H), (32 * PA_WARPS,), (out, q, k_cache, v_cache, decode) + common
            )
        if items.shape[0]:
            self._kernel("paged_attention_prefill_f16")(
                (items.shape[0], H), (32 * PA_WARPS,), (out, q, k_cache, v_cache, items) + common
            )
        return out

    def _plan(self, T: int, block_size: int, meta: AttentionMetadata) -> tuple[Any, Any]:
        qs = meta.host_query_start()
        B = qs.shape[0] - 1
        if qs[-1] != T:
            raise ValueError(f"paged_attention: query_start {qs.tolist()} does not cover {T} query rows")
        for name in ("query_start", "context_lens", "block_tables"):
            a = getattr(meta, name)
            if a.dtype != np.int32 or not a.flags.c_contiguous:
                raise ValueError(f"paged_attention: meta.{name} must be contiguous int32, got {a.dtype}")
        tables = meta.block_tables
        if meta.context_lens.shape != (B,) or tables.ndim != 2 or tables.shape[0] != B:
            raise ValueError(
                f"paged_attention: metadata shapes disagree: query_start {qs.shape}, "
                f"context_lens {meta.context_lens.shape}, block_tables {tables.shape}"
            )
        if tables.shape[1] * block_size < meta.max_context:
            raise ValueError(
                f"paged_attention: block_tables {tables.shape} too small for context_lens up to {meta.max_context}"
            )
        decode, items = attention_plan(qs)
        return self._cp.asarray(decode), self._cp.asarray(items)


def _scales(w: DeviceWeight) -> str:
    """The suffix of the kernels that read `w`'s scales and mins: "_hs" for float16 ones, "" for float32."""
    return "_hs" if w.scale.dtype == np.float16 else ""


def _check_2d(op: str, x: Any, d: int) -> None:
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"{op}: x must be [T, {d}] to match the weight, got {x.shape}")

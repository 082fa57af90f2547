"""Compute backends with one face: numba (compiled CPU kernels over quantized weights, the CPU
path), NumPy (float32 reference) and CuPy (CUDA kernels).

    backend = get_backend("auto" | "numba" | "numpy" | "cupy", threads=None, activations="f32")

All offer: asarray, to_numpy, upload, synchronize, begin_step, prepare_linear, prepare_embedding,
empty_kv_cache (of dtype `kv_dtype`), embedding, rms_norm, add_rms_norm, linear, rope_cos_sin, rope,
rope_write_kv, silu_mul, argmax_rows, sample_rows, logprob_rows, apply_token_bitmask, write_kv, paged_attention,
warm_up. CuPy adds capture_graph / replay (`GraphBackend`: CUDA graphs, engine/decode_graphs.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from kernels.attention_meta import AttentionMetadata, build_attention_metadata
from kernels.gate import RouteCheck
from kernels.numpy_backend import NumpyBackend
from kernels.weight import Weight

log = logging.getLogger("forge.kernels")

__all__ = [
    "ACTIVATIONS",
    "AttentionMetadata",
    "Backend",
    "BackendUnavailable",
    "NumpyBackend",
    "RouteCheck",
    "build_attention_metadata",
    "check_activations",
    "cupy_unavailable_reason",
    "get_backend",
    "resolve_backend",
]

# Activations of the matrix products: float32 everywhere, or int8 per 32-block ("q8", numba only).
ACTIVATIONS = ("f32", "q8")


def check_activations(activations: str, backend: str) -> None:
    """Raise ValueError unless `activations` is one of ACTIVATIONS and `backend` (a name, or "auto"
    before it is resolved) can run it: only numba quantizes activations."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    if activations != "f32" and backend not in ("numba", "auto"):
        raise ValueError(
            f"activations {activations!r} need the numba backend; the {backend} backend computes in "
            "float32 (use --activations f32 or --backend numba)"
        )


class Backend(Protocol):
    """What the model sees; arrays are numpy or cupy arrays according to the backend."""

    name: str
    xp: Any
    kv_dtype: Any  # the KV cache's dtype: float32 on the CPU, float16 on the GPU
    choice: str  # set by get_backend: which backend, and why

    @property
    def blas_threads(self) -> int | None:
        """Host BLAS threads the step loop allows (None: the engine's threads)."""
        ...

    def asarray(self, a: Any, dtype: Any = None) -> Any: ...
    def to_numpy(self, a: Any) -> np.ndarray: ...
    def upload(self, dst: Any, src: np.ndarray) -> None: ...
    def synchronize(self) -> None: ...
    def begin_step(self, rows: int | None = None) -> None: ...
    def end_step(self, seconds: float) -> None: ...
    def warm_up(self, progress: Callable[[int, int, str], None] | None = None) -> None:
        """Compile (or load from a cache) every kernel the model will run, after its weights are prepared;
        `progress(i, n, what)` before each of n stages. A no-op where nothing compiles ahead."""

    def prepare_linear(self, w: Weight) -> Any: ...
    def prepare_embedding(self, w: Weight) -> Any: ...
    def empty_kv_cache(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: Any) -> Any: ...
    def embedding(self, table: Any, ids: Any) -> Any: ...
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any: ...
    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]: ...
    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any: ...
    def rope_cos_sin(self, inv_freq: Any, positions: Any) -> tuple[Any, Any]: ...
    def rope(self, x: Any, cos: Any, sin: Any) -> Any: ...
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
    ) -> Any: ...
    def silu_mul(self, gate_up: Any) -> Any: ...
    def argmax_rows(self, logits: Any) -> tuple[np.ndarray, np.ndarray]: ...
    def sample_rows(self, logits: Any, table: np.ndarray) -> np.ndarray: ...
    def logprob_rows(
        self, logits: Any, rows: np.ndarray, tokens: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def apply_token_bitmask(self, logits: Any, bitmask: Any) -> None: ...
    def write_kv(self, k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None: ...
    def paged_attention(self, q: Any, k_cache: Any, v_cache: Any, meta: AttentionMetadata, scale: float) -> Any: ...
    def check_routes(self) -> list[RouteCheck]:
        """The start-up parity gate (kernels/gate.py): run each matrix-product route this backend will use on
        small shapes against the NumPy reference, after `warm_up`. numba retires a route that fails (the next one
        takes its products); the checks are returned for the start-up log, /admin and the metrics."""
        ...


class GraphBackend(Backend, Protocol):
    """A backend that also captures its work as graphs and replays them (CuPy's CUDA graphs,
    engine/decode_graphs.py)."""

    def capture_graph(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        """Run `fn` once, then capture a second run: (the graph, what the captured run returned)."""
        ...

    def replay(self, graph: Any) -> None: ...


class BackendUnavailable(RuntimeError):
    """The backend asked for cannot run on this machine."""


@functools.cache  # the machine does not change under a process: probe once (start-up asks up to three times)
def cupy_unavailable_reason() -> str | None:
    """None when CuPy imports, sees a CUDA device and really runs a tiny kernel; else why not."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken install raising anything else
        return f"cupy is not importable ({type(e).__name__}: {e}; install Forge's `gpu` extra)"
    try:
        if not cupy.cuda.is_available():
            return "cupy imports but sees no CUDA device"
        probe = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f", "forge_probe")
        got = probe(cupy.arange(4, dtype=cupy.float32)).get()
        if not np.array_equal(got, np.arange(4, dtype=np.float32) * 2):
            return f"a CUDA probe kernel returned wrong values {got.tolist()}"
    except Exception as e:
        return f"a CUDA probe kernel failed ({type(e).__name__}: {e})"
    return None


def resolve_backend(name: str = "auto") -> tuple[str, str]:
    """(the backend `name` means on this machine, why): "auto" is cupy when a GPU is really usable, else numba.

    Raises BackendUnavailable for "cupy" without a usable GPU, ValueError for an unknown name. Cheap
    enough to call before loading a model, so that a wrong choice fails at once.
    """
    if name in ("numpy", "numba"):
        return name, "asked for by name"
    if name not in ("auto", "cupy"):
        raise ValueError(f"unknown kernel backend {name!r}: expected 'auto', 'numba', 'numpy' or 'cupy'")
    reason = cupy_unavailable_reason()
    if reason is None:
        return "cupy", "asked for by name" if name == "cupy" else "auto: a CUDA GPU is usable"
    if name == "cupy":
        raise BackendUnavailable(f"kernel backend 'cupy' is not usable here: {reason}")
    return "numba", f"auto: no usable GPU, {reason}"


def get_backend(name: str = "auto", threads: int | None = None, activations: str = "f32") -> Backend:
    """The backend `name` resolves to (see resolve_backend); its `choice` says which and why, as logged.

    `threads`: worker threads of the numba kernels (default: the cores this process may use).
    `activations`: see ACTIVATIONS; "q8" is refused (ValueError) unless the backend is numba.
    """
    kind, why = resolve_backend(name)
    check_activations(activations, kind)
    backend: Backend
    if kind == "numpy":
        backend, what = NumpyBackend(), "numpy (float32 reference)"
    elif kind == "numba":
        from kernels.numba_backend import NumbaBackend, configure_process  # imports numba: only when wanted

        configure_process()
        numba_kernels = NumbaBackend(threads, activations)
        what = f"numba with {numba_kernels.threads} threads on {numba_kernels.caps.label}" + (
            ", int8 activations" if activations == "q8" else ""
        )
        backend = numba_kernels
    else:
        from kernels.cupy_backend import CupyBackend

        cupy_kernels = CupyBackend()
        what = f"cupy on {cupy_kernels.device_name}"
        backend = cupy_kernels
        failed = [c for c in backend.check_routes() if not c.ok]
        if failed:  # the parity gate: a GPU whose products are wrong serves nothing
            detail = f"its products failed the parity check ({'; '.join(map(str, failed[:3]))})"
            if name == "cupy":
                raise BackendUnavailable(f"kernel backend 'cupy' on {cupy_kernels.device_name}: {detail}")
            log.warning("kernels: not using the GPU: %s", detail)
            return _with_choice(get_backend("numba", threads, activations), f"auto: the GPU's {detail}")
    return _with_choice(backend, why, what)


def _with_choice(backend: Backend, why: str, what: str | None = None) -> Backend:
    backend.choice = f"{what or backend.choice.split(' (')[0]} ({why})"
    log.info("kernels: using %s", backend.choice)
    return backend

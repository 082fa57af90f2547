"""Numba backend: the CPU path. Weights stay quantized (kernels/weight.py) and the hot ops are
compiled kernels (kernels/numba_*.py); the host ops it shares with the NumPy reference come from
kernels/host_ops.py.

Which kernel a matrix product runs is a value, `route(rows, weight)` (kernels/routes.py: the policy, from the
CPU's capabilities as a value, kernels/cpu.py); `linear` only dispatches on it, and `check_routes` (at model
load, kernels/gate.py) runs each route the model will use against the NumPy reference and retires one that
fails. Matrix-vector kernels read the quantized weight directly (decode, batched decode, speculative
verification, short prompts); AMX tiles take products of many rows where the CPU has them
(kernels/numba_amx.py, exact to float32 rounding; kernels/numba_amx_i8.py with int8 activations); longer prompts
otherwise go to panels: each worker thread dequantizes one panel of the weight into a float32 scratch that stays in
cache and multiplies it with single-threaded OpenBLAS, robust where OpenBLAS's own threads collapse (20x slower with
other processes on the cores). With int8 activations (`activations="q8"`) products take the int8 kernels, prompts
included.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from kernels import ACTIVATIONS, gate, host_ops, numba_amx, routes, simd_amx
from kernels.attention_meta import AttentionMetadata
from kernels.cpu import CpuCaps
from kernels.host_ops import Scratch, prefill_operands, prefill_tile
from kernels.huge_pages import HugePageArena
from kernels.numba_amx_i8 import CONFIG as AMX_I8_CONFIG
from kernels.numba_amx_i8 import matmul_amx_i8
from kernels.numba_attention import paged_attention as paged_attention_kernel
from kernels.numba_attention import paged_attention_serial
from kernels.numba_layout import STRIPE16, Blocked, block_rows, block_rows16, dequant_rows, dequant_rows16, half_exact
from kernels.numba_linear import half_dequant, matvec_q4, matvec_q8
from kernels.numba_linear16 import matvec_i8_x16, matvec_q4_split_x16
from kernels.numba_linear_i8 import matvec_i8, matvec_q4_split
from kernels.numba_ops import (
    PARALLEL_ROWS,
    add_rms_norm_parallel,
    add_rms_norm_serial,
    rms_norm_serial,
)
from kernels.numba_ops import rope_write_kv as rope_write_kv_kernel
from kernels.numba_ops import (
    silu_mul as silu_mul_kernel,
)
from kernels.routes import Form, Route
from kernels.thread_tuner import ThreadTuner
from kernels.weight import Weight

log = logging.getLogger("forge.kernels")

# Attention steps under this many query-key dot products run on the calling thread (on 2 cores the two
# tie at ~2,000: docs/performance.md).
SERIAL_ATTENTION_DOTS = 1 << 11
# A sequence with at least this many new rows in a step (a long prompt chunk) takes its attention from
# BLAS products in tiles of this many query rows, the workers taking tiles. Below it the compiled
# kernel's register tiles are faster (2-5x at 64-128 rows); from about here the two tie
# (docs/performance.md), and the BLAS tiles' share-out keeps both cores busy on one long sequence.
BLAS_ATTENTION_ROWS = 256
BLAS_TILE_ROWS = 64  # query rows per BLAS tile: enough tiles for the workers to share out
# float32 values per dequantized weight panel (1 MiB: L2-sized, and enough panels to share out).
PANEL_VALUES = 1 << 18
# Up to this many activation rows a panel's product runs as W_panel @ x^T (x^T copied once a product),
# beyond it as x @ W_panel^T: OpenBLAS blocks a short x better as the right operand (49-64 rows: 13%
# faster on two Zen 4 cores), a tall one better as the left (256 rows: 6%).
TRANSPOSED_PANEL_MAX_ROWS = 128


def configure_process() -> None:
    """The process-wide settings this backend's kernels want, made once before the first backend is
    built (kernels.get_backend calls it; idempotent). Not an import side effect: importing the module
    leaves the process as it was."""
    # 'workqueue', numba's fallback layer, aborts the process when two Python threads launch parallel
    # kernels at once (two engines in one process); 'omp' (GNU libgomp, there wherever gcc is) and
    # 'tbb' do not. Takes effect at the first parallel launch.
    numba.config.THREADING_LAYER = "threadsafe"  # type: ignore[attr-defined]  # numba.config sets it via globals()
    # Idle kernel threads spin this many rounds (tens of microseconds) before they sleep: long enough
    # to stay awake across the small serial ops between a step's parallel launches, short enough to
    # sleep between steps. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) made every launch wake a thread
    # (and the launch waits for it): two threads were no faster than one. Spinning is what hurts when
    # another process takes a core; the ThreadTuner then drops to fewer threads.
    # Read by libgomp when the first parallel kernel loads it; a value set by the user wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
    # This backend's workers call OpenBLAS side by side (panels, prefill attention), one thread each.
    threadpool_limits(limits=NumbaBackend.blas_threads, user_api="blas")


@dataclass(slots=True, weakref_slot=True)
class Linear:
    """A weight prepared for `NumbaBackend.linear`: q4/q8 repacked in row blocks (`blocked`), other
    kinds as the loader gave them (`weight`)."""

    shape: tuple[int, int]
    blocked: Blocked | None = None
    weight: Weight | None = None
    form: Form = field(init=False)  # what the routes see of this weight (kernels/routes.py)

    def __post_init__(self) -> None:
        b = self.blocked
        if b is None:
            self.form = Form(self.plain.kind)
        else:
            self.form = Form(b.kind, b.group, b.scale.dtype == np.uint16, b.stripe, b.min.size > 0, b.zero)

    @property
    def kind(self) -> str:
        return self.blocked.kind if self.blocked is not None else self.plain.kind

    @property
    def plain(self) -> Weight:
        """The unblocked weight, for a kind `block_rows` does not repack (a Linear holds one of the two)."""
        assert self.weight is not None, "a blocked Linear has no plain weight"
        return self.weight


def _on_tiles(kernel: Callable[..., None], cfg: np.ndarray, tiles: np.ndarray | None) -> Kernel:
    """An AMX kernel as a blocked route's kernel, on the CPU's tiles (`tiles` None) or emulated ones."""

    def run(b: Blocked, x: np.ndarray, out: np.ndarray, threads: int) -> None:
        # q8's bytes as uint8, as q4's (one compiled kernel for both); the real team size, whichever thread calls:
        # it sizes one scratch per kernel thread
        minv, mf = b.min_operand()
        q = b.data.view(np.uint8)
        kernel(q, b.scale, minv, mf, b.kind == "q4", x, out, cfg, numba.get_num_threads(), tiles)

    return run


# The blocked routes' kernels (kernels/routes.py): (weight, contiguous x, out, threads) -> out filled.
Kernel = Callable[[Blocked, np.ndarray, np.ndarray, int], None]
BLOCKED_KERNELS: dict[str, Kernel] = {
    "matvec_q4": lambda b, x, out, t: matvec_q4(b.data, b.scale, *b.min_operand(), x, out, t),
    "matvec_q4_split": lambda b, x, out, t: matvec_q4_split(b.data, b.scale, *b.min_operand(), x, out, t),
    "matvec_q8": lambda b, x, out, t: matvec_q8(b.data, b.scale, b.min, b.group, x, out, t),
    "matvec_i8": lambda b, x, out, t: matvec_i8(b.data, b.scale, *b.min_operand(), b.kind == "q4", x, out, t),
    # b.min: empty for Q4_0, whose factor is -8
    "x16_i8": lambda b, x, out, t: matvec_i8_x16(b.data, b.scale, b.min, b.min_operand()[1], x, out, t),
    "x16_split": lambda b, x, out, t: matvec_q4_split_x16(b.data, b.scale, b.min, b.min_operand()[1], x, out, t),
}
AMX_KERNELS = {"amx_tiles": (numba_amx.matmul_amx, numba_amx.CONFIG), "amx_i8": (matmul_amx_i8, AMX_I8_CONFIG)}
assert set(BLOCKED_KERNELS) | set(AMX_KERNELS) == set(routes.BLOCKED_KERNELS)


def split_attention(q_shape: tuple[int, ...], cache_shape: tuple[int, ...], meta: AttentionMetadata) -> tuple:
    """The step's sequences: those with at least BLAS_ATTENTION_ROWS new rows (`long`: tiles of
    BLAS products in the workers), the others for the compiled kernel (`short`: None when that is
    every sequence, else their rows and their own query starts, contexts and tables)."""
    tables, ctx, qs, q_lens = host_ops.attention_inputs(q_shape, cache_shape, meta)
    dots = int(np.dot(q_lens, ctx)) * q_shape[1]
    kernel = paged_attention_serial if dots < SERIAL_ATTENTION_DOTS else paged_attention_kernel
    is_long = q_lens >= BLAS_ATTENTION_ROWS
    long = np.flatnonzero(is_long)
    if not long.size:
        return tables, ctx, qs, kernel, long, None
    keep = np.flatnonzero(~is_long)
    rows = np.concatenate([np.arange(qs[b], qs[b + 1]) for b in keep]) if keep.size else np.empty(0, np.int64)
    s_qs = np.concatenate([[0], np.cumsum(q_lens[keep])]).astype(qs.dtype)
    return tables, ctx, qs, kernel, long, (rows, s_qs, ctx[keep], np.ascontiguousarray(tables[keep]))


def _blocked(w: Weight, half: bool, caps: CpuCaps, arena: HugePageArena) -> Blocked:
    """A q4/q8 weight in the row blocks its routes read (routes.stripe_for: sixteen rows for q4 on AVX-512 VNNI
    without AMX, where the sixteen-row kernels take every product; four elsewhere), its arrays in `arena`."""
    b = (block_rows16 if routes.stripe_for(w.kind, caps) == STRIPE16 else block_rows)(w, half)
    b.data, b.scale, b.min = (arena.copy(a) for a in (b.data, b.scale, b.min))
    return b


class NumbaBackend(host_ops.CpuHostOps):
    """Compiled CPU kernels over quantized weights; `threads` parallel workers per kernel.

    `activations="q8"` quantizes the activations of products over groups of 32 to int8 (kernels/routes.py says
    where; kernels/numba_linear_i8.py how); the default "f32" keeps them float32. `caps`: the CPU capabilities the
    routes are chosen for (detected by default; a narrower value makes the backend take the routes of a CPU with
    less, which run here too). `emulate_amx`: the AMX routes run on emulated tiles (kernels/simd_amx.py), so a CPU
    without AMX runs their whole logic as an AMX CPU would, slowly (tests; `caps` may then include `amx`). Build it
    through kernels.get_backend, which makes the process-wide settings first (`configure_process`)."""

    name = "numba"
    xp: ModuleType = np
    kv_dtype = np.float32
    choice = ""  # get_backend says what it chose and why
    blas_threads = 1  # BLAS runs inside this backend's own workers, one thread each

    def __init__(
        self,
        threads: int | None = None,
        activations: str = "f32",
        caps: CpuCaps | None = None,
        emulate_amx: bool = False,
    ) -> None:
        self._scratch = Scratch()  # the stepping thread's attention scratch
        assert activations in ACTIVATIONS, activations  # checked for users in kernels.get_backend
        self.activations = activations
        most: int = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets it via globals()
        self.threads = max(1, min(threads or len(os.sched_getaffinity(0)), most))
        self.tuner = ThreadTuner(self.threads)
        self.active_threads = self.threads  # this step's
        self._step_rows: int | None = None
        # Kernels launched from this thread (loading, `warm_up`) run on it alone until it calls
        # `begin_step`: only the thread that runs the steps should lead a team of kernel threads.
        # libgomp keeps a team per launching thread, and once it manages more threads than there are
        # cores it cuts their spinning short (to ~100 rounds): with a second team, idle since
        # warm-up, the step thread's every launch would wait for a wake-up (tens of microseconds
        # instead of a couple, a hundred-odd launches a step).
        numba.set_num_threads(1)
        self._lut: np.ndarray | None = None
        # The stepping thread works beside these (`_share_out`): threads - 1 of them.
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="forge-gemm") if self.threads > 1 else None
        self._local = threading.local()  # each worker's (the stepping thread's too) panel and attention scores scratch
        # The weight most recently prepared and its result, both weakly held: a tied embedding and
        # LM head (prepare_embedding then prepare_linear of one Weight) share one repacked copy.
        self._recent: tuple[weakref.ref, weakref.ref] | None = None
        self._arena = HugePageArena()  # the blocked weights, which decode streams from memory every step
        here = CpuCaps.detect()
        if emulate_amx:
            here = replace(here, amx=True)
        self.caps = here if caps is None else caps
        if not self.caps.within(here):
            raise ValueError(f"this CPU lacks {', '.join(self.caps.missing(here))}: its kernels cannot run here")
        self.scale_dtypes: set[np.dtype] = set()  # those of the weights prepared so far (warm_up compiles for them)
        self.forms: set[Form] = set()  # those of the weights prepared so far (the gate checks their routes)
        # Kernels that failed their check (`check_routes`): their products take the next route (routes.fallback).
        self.retired: dict[str, str] = {}
        self._routes: dict[tuple[Form, int], Route] = {}  # route() by weight form and rows
        self.route_checks: list[gate.RouteCheck] = []
        self.kernels = dict(BLOCKED_KERNELS)  # per backend: a test plants a wrong kernel in one
        tiles = simd_amx.soft_tiles(most) if emulate_amx else None
        self.kernels.update({name: _on_tiles(kernel, cfg, tiles) for name, (kernel, cfg) in AMX_KERNELS.items()})

    def begin_step(self, rows: int | None = None) -> None:
        """Bind the calling thread's kernel threads (thread-local in numba) and dynamic chunking. A step
        of `rows` activation rows whose time `end_step` reports runs on the tuner's choice; without
        `rows`, on all threads."""
        self._step_rows = rows
        self.active_threads = self.threads if rows is None else self.tuner.choose(rows)
        numba.set_num_threads(self.active_threads)
        numba.set_parallel_chunksize(1)

    def end_step(self, seconds: float) -> None:
        """The wall time of the step `begin_step(rows)` began."""
        if self._step_rows is not None:
            self.tuner.record(self._step_rows, self.active_threads, seconds)
            self._step_rows = None

    def bind_loading_thread(self) -> None:
        """Call first on a thread other than the builder's that prepares weights or warms up (a background
        compile): its kernels run on it alone, as on the builder's (numba's thread count is per thread)."""
        numba.set_num_threads(1)

    def warm_up(self, progress: Callable[[int, int, str], None] | None = None) -> None:
        """Compile (or load from the on-disk cache) every kernel signature the model uses, with progress.

        Run it after the model's weights are prepared: the blocked kernels compile for the scale dtypes
        those have (`scale_dtypes`; float32 when none). The arrays mirror the model's dtypes
        and layouts (tests check that a real forward adds no new compilation after this).
        """
        rng = np.random.default_rng(0)
        # scales that are float16 values, so that either layout can hold them
        q8 = Weight("q8", rng.integers(-8, 8, (8, 64), dtype=np.int8), np.full((8, 2), 0.5, np.float32), None, 32)
        # groups of 16: the float path even with q8 activations
        q8_16 = Weight("q8", q8.data, np.full((8, 4), 0.25, np.float32), None, 16)
        with_min = Weight("q8", q8.data, q8.scale, q8.scale, 32)
        parts = (q8, with_min, q8.to_q4(), with_min.to_q4(), q8_16)
        arena = HugePageArena()  # the model's weights' arena holds nothing of these
        weights = [
            Linear(w.shape, _blocked(w, dtype == np.uint16, self.caps, arena))
            for dtype in sorted(self.scale_dtypes or {np.dtype(np.float32)}, key=str)
            for w in parts
        ]
        few, many = rng.random((2, 64), dtype=np.float32), rng.random((PARALLEL_ROWS, 64), dtype=np.float32)
        kv = np.zeros((2, 4, 1, 8), dtype=np.float32)
        qkv = np.ones((2, 24), np.float32)
        cos, sin = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("matvec", lambda: [self.linear(few, w) for w in weights]),
            ("dequantize", lambda: [self.linear(many, w) for w in weights]),
            ("rms_norm", lambda: (self.rms_norm(few, few[0], 1e-5), self.add_rms_norm(few, few.copy(), few[0], 1e-5))),
            ("rms_norm (many rows)", lambda: self.add_rms_norm(many, many.copy(), few[0], 1e-5)),
            ("rope + kv write", lambda: self.rope_write_kv(qkv, cos, sin, 1, 1, kv, kv.copy(), np.array([0, 1]))),
            ("silu_mul", lambda: self.silu_mul(few)),
            (
                "attention",
                lambda: [
                    kernel(
                        np.ones((2, 1, 8), np.float32),
                        kv,
                        kv,
                        np.array([0, 2]),
                        np.array([2]),
                        np.zeros((1, 1), np.int32),
                        np.float32(1.0),
                        np.empty((2, 1, 8), np.float32),
                    )
                    for kernel in (paged_attention_kernel, paged_attention_serial)
                ],
            ),
        ]
        for i, (name, run) in enumerate(steps, 1):
            if progress:
                progress(i, len(steps), name)
            run()

    # ---- weights ---------------------------------------------------------------
    def prepare_linear(self, w: Weight) -> Linear:
        if self._recent is not None and self._recent[0]() is w.data and (lin := self._recent[1]()) is not None:
            return lin
        if w.kind in ("q4", "q8"):
            blocked = _blocked(w, self.caps.f16c and half_exact(w), self.caps, self._arena)
            lin = Linear(w.shape, blocked)
            self.scale_dtypes.add(blocked.scale.dtype)
        else:
            lin = Linear(w.shape, weight=w)
        self.forms.add(lin.form)
        self._recent = (weakref.ref(w.data), weakref.ref(lin))
        return lin

    def prepare_embedding(self, w: Weight) -> Linear:
        return self.prepare_linear(w)

    def dequantize_rows(self, lin: Linear, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out [len(rows), K] = the weight's `rows` (int64) in float32."""
        b = lin.blocked
        if b is not None and b.stripe == STRIPE16:
            dequant_rows16(b.data, b.scale, b.min, b.zero, rows, out)
        elif b is not None:
            dequant_rows(b.data, b.scale, b.min, b.kind == "q4", b.group, b.zero, rows, out)
        elif (w := lin.plain).kind == "f32":
            np.take(w.data, rows, axis=0, out=out)
        else:
            half_dequant(w.data.view(np.uint16), w.kind == "bf16", self._f16_table(), rows, out)
        return out

    def _f16_table(self) -> np.ndarray:
        if self._lut is None:
            self._lut = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
        return self._lut

    # ---- ops -------------------------------------------------------------------
    def embedding(self, table: Linear, ids: Any) -> np.ndarray:
        ids = np.asarray(ids)
        n = table.shape[0]
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"embedding ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"embedding ids out of range [0, {n}): min {ids.min()} max {ids.max()}")
        return self.dequantize_rows(table, ids.astype(np.int64), np.empty((ids.size, table.shape[1]), dtype=np.float32))

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        out = np.empty_like(x)
        rms_norm_serial(x, weight, eps, out)
        return out

    def add_rms_norm(
        self, x: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """In place on `residual` (residual += x), which the caller owns; returns (norm, residual)."""
        out = np.empty_like(x)
        fn = add_rms_norm_serial if x.shape[0] < PARALLEL_ROWS else add_rms_norm_parallel
        fn(x, residual, weight, eps, out)
        return out, residual

    def route(self, rows: int, w: Linear) -> Route:
        """The route a product of `rows` activation rows with `w` takes here: the policy's (kernels/routes.py), or
        where a kernel was retired by its check, the next route that was not."""
        key = (w.form, rows)
        if (cached := self._routes.get(key)) is not None:  # a step asks for the same few, hundreds of times
            return cached
        r: Route | None = routes.route(rows, w.form, self.caps, self.activations)
        while r is not None and r.kernel in self.retired:
            r = routes.fallback(r)
        if r is None:
            raise RuntimeError(f"every route of a {w.form.label} product failed its check: {self.retired}")
        self._routes[key] = r
        return r

    def retire(self, kernel: str, why: str) -> None:
        """Take `kernel` out of service: its products take the next route from now on (routes.fallback)."""
        self.retired[kernel] = why
        self._routes.clear()

    def linear(
        self, x: np.ndarray, w: Linear, bias: np.ndarray | None = None, route: Route | None = None
    ) -> np.ndarray:
        """x [T, K] times the weight [N, K] -> [T, N] (+ bias), on `route` (default: `self.route(T, w)`)."""
        r = route or self.route(x.shape[0], w)
        if r.kernel == "blas":
            out = x @ w.plain.data.T
        elif r.kernel == "panels":
            out = self._panels_gemm(x, w)
        else:
            b = w.blocked
            assert b is not None and b.stripe == r.stripe, (r, w.form)
            out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
            # The SIMD blocks read rows as flat arrays. `active_threads` sizes the matvec kernels' work items, a
            # hint (asking numba.get_num_threads() takes a lock each time).
            self.kernels[r.kernel](b, np.ascontiguousarray(x), out, self.active_threads)
        if bias is not None:
            out += bias
        return out

    def check_routes(self) -> list[gate.RouteCheck]:
        """Run each route the prepared weights will take once on small shapes against the NumPy reference; retire
        a kernel that fails (its products take the next route, with a warning naming both). Call after
        `warm_up`; returns the checks (also kept in `route_checks`)."""
        self.route_checks = gate.check_numba_routes(self)
        return self.route_checks

    def _panels_gemm(self, x: np.ndarray, w: Linear) -> np.ndarray:
        T, K = x.shape
        N = w.shape[0]
        out = np.empty((T, N), dtype=np.float32)
        step = max(16, PANEL_VALUES // K)
        workers = 1 if self._pool is None else self.active_threads
        if workers > 1:
            # Equal panels, a multiple of the workers in number: none waits while another does a short last one
            # (docs/performance.md, "Measured effects of design choices").
            panels = -(-N // step)
            step = -(-N // (-(-panels // workers) * workers))
        xt = np.ascontiguousarray(x.T) if T <= TRANSPOSED_PANEL_MAX_ROWS else None

        def panel(r0: int) -> None:
            n = min(step, N - r0)
            scratch = self._thread_scratch("panel", step * K)
            wd = self.dequantize_rows(w, np.arange(r0, r0 + n, dtype=np.int64), scratch[: n * K].reshape(n, K))
            if xt is None:
                np.matmul(x, wd.T, out=out[:, r0 : r0 + n])
            else:
                part = self._thread_scratch("panel_out", step * T)[: n * T].reshape(n, T)
                np.matmul(wd, xt, out=part)
                out[:, r0 : r0 + n] = part.T

        starts = range(0, N, step)
        if workers == 1 or len(starts) == 1:
            for r0 in starts:
                panel(r0)
        else:
            self._share_out(panel, starts, workers)
        return out

    def _share_out(self, work: Callable[[Any], None], items: Sequence[Any], workers: int) -> None:
        """`work(item)` for every item, on this thread and `workers` - 1 pool threads: each takes the next item
        when it is done with one (a worker that loses its core does fewer), one hand-off per worker rather than a
        future per item."""
        assert self._pool is not None
        pending = iter(items)  # next() on it is one step under the GIL: no item is taken twice

        def drain() -> None:
            for item in pending:
                work(item)

        helpers = [self._pool.submit(drain) for _ in range(workers - 1)]
        try:
            drain()
        finally:
            for f in helpers:
                f.result()

    def _thread_scratch(self, name: str, size: int) -> np.ndarray:
        """The calling worker's float32 scratch `name`, at least `size` values (kept between calls)."""
        buf = getattr(self._local, name, None)
        if buf is None or buf.size < size:
            buf = np.empty(size, dtype=np.float32)
            setattr(self._local, name, buf)
        return buf

    def rope_write_kv(
        self,
        qkv: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        num_heads: int,
        num_kv_heads: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        slot_mapping: np.ndarray,
    ) -> np.ndarray:
        rope_write_kv_kernel(qkv, cos, sin, num_heads, num_kv_heads, k_cache, v_cache, slot_mapping)
        T, Dh = qkv.shape[0], k_cache.shape[3]
        return qkv[:, : num_heads * Dh].reshape(T, num_heads, Dh)

    def silu_mul(self, gate_up: np.ndarray) -> np.ndarray:
        out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=np.float32)
        silu_mul_kernel(gate_up, out)
        return out

    def paged_attention(
        self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, meta: AttentionMetadata, scale: float
    ) -> np.ndarray:
        if meta.plan is None:  # validate and size once per step; every layer reuses it
            meta.plan = split_attention(q.shape, k_cache.shape, meta)
        tables, ctx, qs, kernel, long, short = meta.plan
        out = np.empty(q.shape, dtype=np.float32)
        for b in long:
            self._blas_prefill(q, k_cache, v_cache, tables[b], int(ctx[b]), int(qs[b]), int(qs[b + 1]), scale, out)
        if short is None:
            kernel(np.ascontiguousarray(q), k_cache, v_cache, qs, ctx, tables, np.float32(scale), out)
        elif short[0].size:
            rows, s_qs, s_ctx, s_tables = short
            part = np.empty((rows.size, *q.shape[1:]), dtype=np.float32)
            kernel(q[rows], k_cache, v_cache, s_qs, s_ctx, s_tables, np.float32(scale), part)
            out[rows] = part
        return out

    def _blas_prefill(
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
        """One long prefill's attention: the NumPy reference's tiles of BLAS products, handed out to the
        workers largest first (a causal tile's cost grows with its last row)."""
        ops = prefill_operands(self._scratch, q, k_cache, v_cache, table, c, r0, r1, scale)
        n = r1 - r0
        spans = [(i0, min(n, i0 + BLAS_TILE_ROWS)) for i0 in range(0, n, BLAS_TILE_ROWS)][::-1]

        def run(span: tuple[int, int]) -> None:
            shape = ops.scores_shape(*span)
            size = int(np.prod(shape))
            scratch = self._thread_scratch("scores", size)  # the first tile a worker takes is its largest
            prefill_tile(ops, *span, out, scratch[:size].reshape(shape))

        if self._pool is None or self.active_threads == 1:
            for span in spans:
                run(span)
        else:
            self._share_out(run, spans, self.active_threads)

"""Numba backend: the CPU path. Weights stay quantized (kernels/weight.py) and the hot ops are
compiled kernels (kernels/numba_*.py); the host ops it shares with the NumPy reference come from
kernels/host_ops.py.

Matrix products with up to MATVEC_MAX_ROWS activation rows (decode, batched decode, speculative verification,
short prompts) read the quantized weight directly in a parallel numba kernel. On a CPU with AMX,
products of 12 rows or more run on its tiles instead (kernels/numba_amx.py, exact to float32
rounding). Otherwise, with more rows (prefill) each worker thread takes panels
of the weight, dequantizes one into a float32 scratch that stays in cache and multiplies it with
single-threaded OpenBLAS: faster there than anything numba emits for float32 GEMM, and robust
where OpenBLAS's own threads collapse (20x slower with other processes on the cores). With int8
activations (`activations="q8"`) every product, prompts included, runs on the int8 kernels. On AVX-512
VNNI without AMX, q4 weights are blocked sixteen rows at a time and every product of theirs, prompts
included, runs on the sixteen-row kernels in either mode (`_stripe16`: faster there than the panels).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from kernels import ACTIVATIONS, host_ops, numba_amx
from kernels.attention_meta import AttentionMetadata
from kernels.host_ops import Scratch, prefill_operands, prefill_tile
from kernels.numba_attention import paged_attention as paged_attention_kernel
from kernels.numba_attention import paged_attention_serial
from kernels.numba_layout import STRIPE16, Blocked, block_rows, block_rows16, dequant_rows, dequant_rows16, half_exact
from kernels.numba_linear import (
    half_dequant,
    matvec_i8,
    matvec_i8_x16,
    matvec_q4,
    matvec_q4_split,
    matvec_q4_split_x16,
    matvec_q8,
)
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
from kernels.simd import VNNI512, target_has
from kernels.thread_tuner import ThreadTuner
from kernels.weight import Weight

log = logging.getLogger("forge.kernels")

# Activation rows up to which products read the quantized weight directly (above: panels + BLAS).
# The matvec kernels cost about linearly in rows (tiles share each weight group's unpacking); the
# panels pay a fixed dequantization per call and then run at BLAS speed, so they win from some row
# count on; `scripts/matvec_bench.py --rows` measures where (docs/performance.md has the figures).
MATVEC_MAX_ROWS = 40
# Products of at least this many rows run on AMX tiles where the CPU has them (kernels/numba_amx.py;
# weights with groups of 32 and float16 scales: GGUF Q4_0, Q4_1, Q8_0). A tile holds 16 activation
# rows: with fewer than about 12 the tile's unused rows cost as much as the matvec kernels' work, so
# those keep the smaller products (`scripts/matvec_bench.py --rows` on an AMX CPU finds the crossing).
AMX_MIN_ROWS = 12
# With `--activations q8` every product takes int8 activations, prompts included, as llama.cpp's do; only
# where the CPU has AMX, products of more rows than this keep the float32-class tiles they ran on before
# prompts went int8 (int8 against AMX tiles is not measured: no AMX CPU was at hand).
INT8_AMX_MAX_ROWS = 32
# float32 activations times q4 weights go as int8 pieces on AVX-512 VNNI (kernels/numba_linear.py
# `matvec_q4_split`: integer dot products, float32 precision) in every product the matvec kernels take.
SPLIT_MAX_ROWS = MATVEC_MAX_ROWS
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

    @property
    def kind(self) -> str:
        return self.blocked.kind if self.blocked is not None else self.plain.kind

    @property
    def plain(self) -> Weight:
        """The unblocked weight, for a kind `block_rows` does not repack (a Linear holds one of the two)."""
        assert self.weight is not None, "a blocked Linear has no plain weight"
        return self.weight


class NumbaBackend(host_ops.CpuHostOps):
    """Compiled CPU kernels over quantized weights; `threads` parallel workers per kernel.

    `activations="q8"` quantizes the activations of every product to int8 (see
    kernels/numba_linear.py); the default "f32" keeps them float32. Build it through
    kernels.get_backend, which makes the process-wide settings first (`configure_process`)."""

    name = "numba"
    xp: ModuleType = np
    kv_dtype = np.float32
    choice = ""  # get_backend says what it chose and why
    blas_threads = 1  # BLAS runs inside this backend's own workers, one thread each

    def __init__(self, threads: int | None = None, activations: str = "f32") -> None:
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
        # Scales and mins as float16 where exact (kernels/numba_layout.py), if the CPU converts them.
        self.half_scales = target_has("f16c")
        self.amx = numba_amx.available()  # AMX tiles for products of AMX_MIN_ROWS rows or more
        self.scale_dtypes: set[np.dtype] = set()  # those of the weights prepared so far (warm_up compiles for them)

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
        weights = [
            Linear(w.shape, (block_rows16 if self._stripe16(w) else block_rows)(w, half=dtype == np.uint16))
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
            half = self.half_scales and half_exact(w)
            blocked = block_rows16(w, half) if self._stripe16(w) else block_rows(w, half)
            lin = Linear(w.shape, blocked)
            self.scale_dtypes.add(blocked.scale.dtype)
        else:
            lin = Linear(w.shape, weight=w)
        self._recent = (weakref.ref(w.data), weakref.ref(lin))
        return lin

    def _stripe16(self, w: Weight) -> bool:
        """Whether a weight is blocked sixteen rows at a time (kernels/numba_layout.py `block_rows16`): q4 on
        AVX-512 VNNI, in either activation mode (`matvec_i8_x16`, `matvec_q4_split_x16`: a group's sums one row
        per lane, a third of the four-row kernels' scaling work, any row count). Not on AMX CPUs, whose long
        products keep the tiles that read the four-row order."""
        return w.kind == "q4" and VNNI512 and not self.amx

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

    def linear(self, x: np.ndarray, w: Linear, bias: np.ndarray | None = None) -> np.ndarray:
        """x [T, K] times the weight [N, K] -> [T, N] (+ bias)."""
        T = x.shape[0]
        b = w.blocked
        amx = b is not None and self._on_amx(b, T)
        int8 = self.activations == "q8" and b is not None and b.group == 32 and not (amx and T > INT8_AMX_MAX_ROWS)
        if w.kind == "f32":
            out = x @ w.plain.data.T
        elif b is None or (T > MATVEC_MAX_ROWS and not amx and not int8 and b.stripe != STRIPE16):
            out = self._panels_gemm(x, w)
        else:
            out = np.empty((T, w.shape[0]), dtype=np.float32)
            x = np.ascontiguousarray(x)  # the SIMD blocks read rows as flat arrays
            minv, mf = b.min_operand()
            # sizes the matvec kernels' work items, a hint (asking numba.get_num_threads() takes a lock each time)
            threads = self.active_threads
            if b.stripe == STRIPE16:
                kernel = matvec_i8_x16 if int8 else matvec_q4_split_x16
                kernel(b.data, b.scale, b.min, mf, x, out, threads)  # b.min: empty for Q4_0, whose mf is -8
            elif int8:
                matvec_i8(b.data, b.scale, minv, mf, b.kind == "q4", x, out, threads)
            elif amx:
                # the real count, whichever thread calls: it sizes one scratch per kernel thread
                teams = numba.get_num_threads()
                numba_amx.matmul_amx(b.data, b.scale, minv, mf, b.kind == "q4", x, out, numba_amx.CONFIG, teams)
            elif b.kind == "q4" and VNNI512 and T <= SPLIT_MAX_ROWS:
                matvec_q4_split(b.data, b.scale, minv, mf, x, out, threads)
            elif b.kind == "q4":
                matvec_q4(b.data, b.scale, minv, mf, x, out, threads)
            else:
                matvec_q8(b.data, b.scale, b.min, b.group, x, out, threads)
        if bias is not None:
            out += bias
        return out

    def _on_amx(self, b: Blocked, rows: int) -> bool:
        """Whether a product of `rows` activation rows runs on AMX tiles: enough rows, and a weight with
        groups of 32 (one tile deep) and float16 scales (GGUF Q4_0/Q4_1/Q8_0: what the tiles were
        measured and tested on)."""
        return self.amx and rows >= AMX_MIN_ROWS and b.group == 32 and b.scale.dtype == np.uint16

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
            meta.plan = self._attention_plan(q.shape, k_cache.shape, meta)
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

    def _attention_plan(self, q_shape: tuple[int, ...], cache_shape: tuple[int, ...], meta: AttentionMetadata) -> tuple:
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

"""Single-thread matrix-vector throughput of the numba backend on the default model's shapes.

    .venv/bin/python scripts/matvec_bench.py [--activations f32|q8] [--copies 30]
    .venv/bin/python scripts/matvec_bench.py --rows [--activations q8] [--shape llama-3.2-1b]
    .venv/bin/python scripts/matvec_bench.py --per-row [--activations q8]
    .venv/bin/python scripts/matvec_bench.py --shape llama-3.2-1b [--activations q8] [--per-row]


Times `backend.linear` for one activation row on one kernel thread with `time.thread_time()`
(CPU time of the calling thread: robust on a shared machine) and prints GMAC per CPU-second.
`--copies N` cycles through N distinct copies of each weight so that, as in a real decode
(112 MB of weights a token), they come from DRAM rather than the caches; `--copies 1` measures
cache-resident weights.

`--rows [--activations q8]` instead times products of 1 to 512 activation rows on all cores (wall clock)
every way the backend can take them: the matvec kernels over the four-row order, dequantized panels + BLAS
(float32 only), the sixteen-row order's kernels (`x16`: q4 on AVX-512 VNNI, where the backend picks them
without AMX) and AMX tiles where the CPU has them (from AMX_MIN_ROWS rows): where they cross are
`kernels/routes.py`'s MATVEC_MAX_ROWS and AMX_MIN_ROWS, and what the sixteen-row order gains.

`--per-row` prints, single-thread CPU time, what a product of T = 2, 3, 4, 5, 8, 9, 32 activation rows
costs relative to T products of one row (cache-resident weights): speculative verification of k
drafts is a product of 1 + k rows.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kernels import numba_backend
from kernels.numba_backend import Linear, NumbaBackend
from kernels.numba_layout import block_rows, block_rows16, half_exact
from kernels.routes import AMX_MIN_ROWS, Route
from kernels.weight import Weight, pack_q4

# name -> the products of one decode step (fused q/k/v and gate/up, as the model runs them): the default
# model's (Q4_1 matrices, a Q8_0 head) and a Llama-3.2-1B's as a Q4_0 file has them (a tied Q4_0 head).
SHAPE_SETS = {
    "smollm2-135m": [
        ("q4 qkv", "q4", 960, 576),
        ("q4 o", "q4", 576, 576),
        ("q4 gate_up", "q4", 3072, 576),
        ("q4 down", "q4", 576, 1536),
        ("q8 head", "q8", 49152, 576),
    ],
    "llama-3.2-1b": [
        ("q4_0 qkv", "q4_0", 3072, 2048),
        ("q4_0 o", "q4_0", 2048, 2048),
        ("q4_0 gate_up", "q4_0", 16384, 2048),
        ("q4_0 down", "q4_0", 2048, 8192),
        ("q4_0 head", "q4_0", 49152, 2048),
    ],
}
SHAPES = SHAPE_SETS["smollm2-135m"]
COPIES_BYTES = 256 << 20  # weights cycled through per measurement: well beyond the last-level cache


def weight(kind: str, n: int, k: int, rng: np.random.Generator) -> Weight:
    """Scales and mins are float16 values, as in GGUF Q4_1 / Q8_0 (the backend stores them as float16)."""
    g = k // 32
    vec = lambda: rng.random((n, g), dtype=np.float32).astype(np.float16).astype(np.float32)
    if kind == "q4":
        return Weight("q4", pack_q4(rng.integers(0, 16, (n, k), dtype=np.uint8)), vec(), vec(), 32)
    if kind == "q4_0":  # symmetric: d * (q - 8), no mins
        return Weight("q8", rng.integers(-8, 8, (n, k), dtype=np.int8), vec(), None, 32).to_q4()
    return Weight("q8", rng.integers(-127, 128, (n, k), dtype=np.int8), vec(), None, 32)


def rows_sweep(rng: np.random.Generator, activations: str) -> None:
    be = NumbaBackend(activations=activations)
    be.begin_step()
    int8 = activations == "q8"
    for name, kind, n, k in SHAPES:
        w = weight(kind, n, k, rng)
        half = be.caps.f16c and half_exact(w)
        four = Linear(w.shape, block_rows(w, half))
        # (name, weight, route): each route forced (the panels are float32 in either mode)
        if int8:
            matvec = Route("matvec_i8", "int8", 4)
        elif w.kind == "q4":
            matvec = Route("matvec_q4_split", "pieces", 4) if be.caps.vnni512 else Route("matvec_q4", "f32", 4)
        else:
            matvec = Route("matvec_q8", "f32", 4)
        ways = [("matvec", four, matvec), ("panels", four, Route("panels", "f32", 4))]
        if w.kind == "q4" and be.caps.vnni512:  # the sixteen-row order the backend picks there without AMX
            x16 = Route("x16_i8", "int8", 16) if int8 else Route("x16_split", "pieces", 16)
            ways.append(("x16", Linear(w.shape, block_rows16(w, half)), x16))
        if be.caps.amx:  # the float tiles in either mode (int8's fallback), the int8 tiles with int8 activations
            ways.append(("amx", four, Route("amx_tiles", "f32", 4)))
            ways += [("amx_i8", four, Route("amx_i8", "int8", 4))] if int8 else []
        for rows in (1, 8, 12, 16, 32, 48, 64, 128, 256, 512):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            took = {}
            for way, lin, r in ways:
                if r.kernel.startswith("amx") and rows < AMX_MIN_ROWS:
                    continue
                be.linear(x, lin, route=r)
                best = float("inf")
                for _ in range(3 if n * k > 10_000_000 else 10):
                    t = time.perf_counter()
                    be.linear(x, lin, route=r)
                    best = min(best, time.perf_counter() - t)
                took[way] = best
            cells = "".join(f"  {way} {took[way] * 1e3:8.2f} ms" for way in took)
            ratios = [f"{way}/matvec {took[way] / took['matvec']:.2f}" for way in took if way != "matvec"]
            print(f"{name:12s} rows {rows:3d}{cells}  " + "  ".join(ratios))


def timed(be: NumbaBackend, x: np.ndarray, lin, repeats: int) -> float:
    """Best single-thread CPU seconds of one product."""
    be.linear(x, lin)
    reps = max(1, 200_000_000 // (x.shape[0] * lin.shape[0] * lin.shape[1]))
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        for _ in range(reps):
            be.linear(x, lin)
        best = min(best, (time.thread_time() - t) / reps)
    return best


def per_row(be: NumbaBackend, rng: np.random.Generator, repeats: int) -> None:
    for name, kind, n, k in SHAPES[:4]:
        lin = be.prepare_linear(weight(kind, n, k, rng))
        x = rng.standard_normal((32, k)).astype(np.float32)
        one = timed(be, x[:1], lin, repeats)
        cells = [f"T={t}: {timed(be, x[:t], lin, repeats) / (t * one):.2f}" for t in (2, 3, 4, 5, 8, 9, 32)]
        print(f"{name:12s} {n:6d}x{k:<5d} one row {one * 1e3:6.3f} ms  per row, relative:  " + "  ".join(cells))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--activations", default="f32")
    p.add_argument("--copies", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", action="store_true", help="every way to take a product of 1..512 activation rows")
    p.add_argument("--per-row", action="store_true", help="a T-row product's cost relative to T one-row products")
    p.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPE_SETS))
    args = p.parse_args()
    numba_backend.configure_process()  # as kernels.get_backend does before building the backend
    global SHAPES
    SHAPES = SHAPE_SETS[args.shape]
    rng = np.random.default_rng(0)
    if args.rows:
        rows_sweep(rng, args.activations)
        return
    be = NumbaBackend(1, **({"activations": args.activations} if args.activations != "f32" else {}))
    be.begin_step()
    if args.per_row:
        per_row(be, rng, args.repeats)
        return
    for name, kind, n, k in SHAPES:
        w = weight(kind, n, k, rng)
        first = be.prepare_linear(w)
        # enough distinct copies that they come from DRAM (--copies 1: from the caches)
        copies = max(1, min(args.copies, COPIES_BYTES // first.blocked.nbytes))
        lins = [first] + [be.prepare_linear(w.take_rows(np.arange(n))) for _ in range(copies - 1)]
        x = rng.standard_normal((1, k)).astype(np.float32)
        reps = max(1, 60 // copies) if n * k < 10_000_000 else 3
        for lin in lins:
            be.linear(x, lin)
        best = float("inf")
        for _ in range(args.repeats):
            t = time.thread_time()
            for _ in range(reps):
                for lin in lins:
                    be.linear(x, lin)
            best = min(best, (time.thread_time() - t) / (reps * copies))
        gbs = first.blocked.nbytes / best / 1e9
        print(
            f"{name:12s} {n:6d}x{k:<5d} copies {copies:2d}  {best * 1e3:7.3f} ms  {n * k / best / 1e9:6.2f} GMAC/cpu-s"
            f"  {gbs:5.1f} GB/cpu-s"
        )


if __name__ == "__main__":
    main()

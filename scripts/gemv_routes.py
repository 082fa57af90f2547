"""Time the CuPy backend's two GEMV routes (gemv_tiled, gemv) on Llama-shaped Q4_0 and Q8_0 weights.

    python scripts/gemv_routes.py [--repeat 50]

Needs a CUDA GPU and CuPy. For each weight shape (rows x K of an 8B layer's products and Llama 3's output head)
and activation row count (1: decode, 8 and 32: batched decode), prints the median time of one product over
CUDA events, the weight bytes it read per second, and the tiled route's error against the plain one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.gate import sample_weight
from kernels.routes import Form

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
FORMS = {"Q4_0": Form("q4", 32, True, 4, False, 8), "Q8_0": Form("q8", 32, True, 4)}
ROWS = (1, 8, 32)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args()
    import cupy as cp

    from kernels.cupy_backend import CupyBackend

    be = CupyBackend()
    be.begin_step()
    rng = np.random.default_rng(0)
    print(f"{be.device_name}: median of {args.repeat} products after 5 warm-ups")
    print(
        f"{'form':5} {'N x K':>13} {'rows':>4} | {'tiled us':>9} {'GB/s':>6} | {'plain us':>9} {'GB/s':>6} | rel diff"
    )
    for label, form in FORMS.items():
        for n, k in SHAPES:
            w = sample_weight(form, rng, n, k)
            dev = be.prepare_linear(w)
            nbytes = dev.nbytes
            for rows in ROWS:
                x = be.asarray(rng.standard_normal((rows, k)).astype(np.float32))
                out, times = {}, {}
                for route in ("gemv_tiled", "gemv"):
                    be.gemv = route
                    for _ in range(5):
                        be.linear(x, dev)
                    samples = []
                    for _ in range(args.repeat):
                        start, end = cp.cuda.Event(), cp.cuda.Event()
                        start.record(be.stream)
                        out[route] = be.linear(x, dev)
                        end.record(be.stream)
                        end.synchronize()
                        samples.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
                    times[route] = float(np.median(samples))
                a, b = (be.to_numpy(out[r]).astype(np.float64) for r in ("gemv_tiled", "gemv"))
                diff = float(np.linalg.norm(a - b) / np.linalg.norm(b))
                gbs = {r: nbytes / times[r] / 1e3 for r in times}
                print(
                    f"{label:5} {f'{n}x{k}':>13} {rows:>4} | {times['gemv_tiled']:9.1f} {gbs['gemv_tiled']:6.0f} |"
                    f" {times['gemv']:9.1f} {gbs['gemv']:6.0f} | {diff:.1e}"
                )
            del dev
    return 0


if __name__ == "__main__":
    sys.exit(main())

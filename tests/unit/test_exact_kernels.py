"""The exact kernels (kernels/numba_jit.py's JIT_EXACT: the activations' int8 quantization, the dequantizers) keep
their own compile flags whoever compiles them first. numba compiles a callee that leaves `fastmath` unset with its
first caller's flags and keeps that machine code for every later caller: called first from a kernel under JIT, the
quantization took its "arcp" (amax / 127 as amax * (1 / 127)) and left the NumPy model by an ulp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# In a fresh process and an empty kernel cache: a fast-math kernel compiles the exact ones as its callees first,
# then each is called on its own and compared with its NumPy model.
_CHECK = """
import numpy as np
from numba import njit

from kernels import numba_activations as A
from kernels.numba_jit import JIT
from kernels.reference import quantize_activations


@njit(**dict(JIT, cache=False))
def fast_caller(x, xq, xd, xsum):
    A.quantize_rows_parallel(x, xq, xd, xsum)
    A.quantize_rows(x, xq, xd, xsum)


rng = np.random.default_rng(0)
rows, k = 64, 256
x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
want_q, want_d = quantize_activations(x)
bufs = np.empty(x.shape, np.int8), np.empty((rows, k // 32), np.float32), np.empty((rows, k // 32), np.float32)
fast_caller(x, *bufs)
for quantize in (A.quantize_rows_parallel, A.quantize_rows):
    xq, xd, xsum = (np.zeros_like(b) for b in bufs)
    quantize(x, xq, xd, xsum)
    print(quantize.__name__, int((xq != want_q).sum()), int((xd != want_d).sum()))
"""


def test_the_quantization_keeps_its_exact_flags_when_a_fast_math_kernel_compiles_it_first(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # name, int8 values off the model, scales off the model: none of either, for both
    assert done.stdout.split() == ["quantize_rows_parallel", "0", "0", "quantize_rows", "0", "0"], done.stdout

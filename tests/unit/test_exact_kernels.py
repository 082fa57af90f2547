"""The exact kernels (kernels/numba_jit.py's JIT_EXACT: the activations' int8 quantization and float32 pieces, the
dequantizers) keep their own compile flags whoever compiles them first. numba compiles a callee that leaves
`fastmath` unset with its first caller's flags and keeps that machine code for every later caller: called first from
a kernel under JIT, the quantization took its "arcp" (amax / 127 as amax * (1 / 127)) and left the NumPy model by an
ulp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# In a fresh process and an empty kernel cache: a fast-math kernel compiles the exact ones as its callees first (or
# not, argv[1] == "alone"), then each is called on its own: the quantization's mismatches against its NumPy model,
# and a digest of the float32 pieces.
_CHECK = """
import hashlib
import sys

import numpy as np
from numba import njit

from kernels import numba_activations as A
from kernels.numba_jit import JIT
from kernels.reference import quantize_activations


@njit(**dict(JIT, cache=False))
def fast_caller(x, xq, xd, xsum):
    A.quantize_rows_parallel(x, xq, xd, xsum)
    A.quantize_rows(x, xq, xd, xsum)
    return A.split(x)


rng = np.random.default_rng(0)
rows, k = 64, 256
x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
want_q, want_d = quantize_activations(x)
bufs = np.empty(x.shape, np.int8), np.empty((rows, k // 32), np.float32), np.empty((rows, k // 32), np.float32)
if sys.argv[1] != "alone":
    fast_caller(x, *bufs)
lines = []
for quantize in (A.quantize_rows_parallel, A.quantize_rows):
    xq, xd, xsum = (np.zeros_like(b) for b in bufs)
    quantize(x, xq, xd, xsum)
    lines.append(f"{quantize.__name__} {int((xq != want_q).sum())} {int((xd != want_d).sum())}")
digest = hashlib.sha256(b"".join(a.tobytes() for a in A.split(x))).hexdigest()
print(" ".join(lines), digest)
"""


def _run(tmp_path: Path, order: str) -> list[str]:
    """The check's words, in a fresh process over an empty kernel cache of its own."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / order))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, order], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_the_exact_kernels_keep_their_flags_when_a_fast_math_kernel_compiles_them_first(tmp_path: Path) -> None:
    first = _run(tmp_path, "fast-caller-first")
    alone = _run(tmp_path, "alone")
    # name, int8 values off the model, scales off the model: none of either, for both
    assert first[:6] == ["quantize_rows_parallel", "0", "0", "quantize_rows", "0", "0"], first
    assert alone[:6] == first[:6]
    assert first[6] == alone[6]  # the float32 pieces, byte for byte

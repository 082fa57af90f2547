"""Compile options shared by every numba kernel, and their on-disk cache's freshness."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Self

from numba.core import caching

# Reassociation and FMA contraction let LLVM vectorize reductions; infinities and NaNs stay
# legal (no "ninf"/"nnan") and library calls stay exact (no "afn"; kernels/numba_math.py has the
# vectorizable float32 exp). `cache=True` keeps the machine code on disk next to the sources (__pycache__), so
# only the first start on a machine compiles; `nogil` lets two engines run in two threads.
JIT = dict(cache=True, fastmath={"nsz", "arcp", "contract", "reassoc"}, nogil=True)
# For dequantization and the activations' quantization, which must equal their NumPy models bit for bit: no FMA
# contraction, no reciprocals. `fastmath=False` said outright: numba compiles a callee that leaves fastmath unset
# with its first caller's flags (`inherit_if_not_set`), so called first from a kernel under JIT, these took its
# "arcp" and "contract" (amax / 127 became amax * (1 / 127), one ulp off in ~5% of blocks) and kept them for every
# later caller, cache included.
JIT_EXACT = dict(cache=True, fastmath=False, nogil=True)

_HERE = os.path.dirname(os.path.abspath(__file__))
# Modules compiled into other files' kernels (intrinsics, helpers they call): every module of numba code that
# another one imports (tests/unit/test_inlined_stamp.py checks), or its changes would leave cached kernels stale.
_INLINED = (
    "simd.py",
    "simd_amx.py",
    "simd_attention.py",
    "simd_dequant.py",
    "simd_dot.py",
    "simd_scales.py",
    "simd_vectors.py",
    "numba_math.py",
    "numba_activations.py",
    "numba_block_out.py",
    "numba_tiling.py",
)


def _inlined_digest() -> bytes:
    """The `_INLINED` modules' and this file's bytes: the compile options above shape every kernel's machine code
    as much as its source does."""
    h = hashlib.sha256()
    for name in (*_INLINED, os.path.basename(__file__)):
        with open(os.path.join(_HERE, name), "rb") as f:
            h.update(f.read())
    return h.digest()


class _InlinedStamp(caching._SourceFileBackedLocatorMixin):
    """A cache locator for this package's kernels whose stamp also covers the `_INLINED` modules and the compile
    options: numba stamps a cache entry with its own source file only, and would load stale machine code after an
    upgrade that changed only the blocks inlined into it or the options. Its base is the mixin both locators below
    start with, so `super()` is typed; in their MRO the concrete locator still comes next."""

    @classmethod
    def from_function(cls, py_func: Callable[..., object], py_file: str) -> Self | None:
        if os.path.dirname(os.path.abspath(py_file)) != _HERE:
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self) -> tuple[object, bytes]:
        return (super().get_source_stamp(), _inlined_digest())


class _UserDirLocator(_InlinedStamp, caching.UserProvidedCacheLocator):
    """NUMBA_CACHE_DIR when set."""


class _InTreeLocator(_InlinedStamp, caching.InTreeCacheLocator):
    """kernels/__pycache__ otherwise (numba's default place)."""


for _cls in (_InTreeLocator, _UserDirLocator):
    if _cls not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, _cls)

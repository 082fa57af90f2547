"""Whether the numba kernels are already compiled for a model on this machine, told cheaply before building
anything: a stamp file written next to numba's own cache after a successful warm-up and parity gate.

The stamp's name is a digest of what makes numba's cached machine code valid (every kernel source file, numba and
Python versions, the CPU LLVM compiles for) and of what chooses the signatures compiled (the model file, its
quantization and the activations). It lives in numba's cache folder, so clearing that cache (or pointing
NUMBA_CACHE_DIR at an empty folder) clears the stamp too. A stamp that is missing when the cache is warm costs a
quick start on the reference backend; one present when the cache is cold costs the blocking compile of old.
"""

from __future__ import annotations

import hashlib
import os
import platform

_HERE = os.path.dirname(os.path.abspath(__file__))


def cache_dir() -> str:
    """numba's cache folder for this package's kernels: NUMBA_CACHE_DIR when set, else kernels/__pycache__."""
    import numba

    return numba.config.CACHE_DIR or os.path.join(_HERE, "__pycache__")  # type: ignore[attr-defined]


def stamp_path(model_key: str) -> str:
    """The stamp file for `model_key` (what the model is: path, size, quantization, activations)."""
    import llvmlite.binding as llvm
    import numba

    h = hashlib.sha256()
    for name in sorted(os.listdir(_HERE)):
        if name.endswith(".py"):
            with open(os.path.join(_HERE, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    cpu = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
    features = os.environ.get("NUMBA_CPU_FEATURES") or llvm.get_host_cpu_features().flatten()
    for part in (numba.__version__, platform.python_version(), cpu, features, model_key):
        h.update(str(part).encode() + b"\0")
    return os.path.join(cache_dir(), f"forge-compiled-{h.hexdigest()[:24]}.stamp")


def is_compiled(model_key: str) -> bool:
    """Whether a warm-up for `model_key` finished here with the kernels as they are now."""
    return os.path.exists(stamp_path(model_key))


def mark_compiled(model_key: str) -> None:
    """Record that the kernels for `model_key` are compiled (after warm-up and the parity gate passed). An
    unwritable cache folder only means the next start compiles in the background again."""
    path = stamp_path(model_key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("compiled\n")
    except OSError:
        pass

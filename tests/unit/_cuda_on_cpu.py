"""kernels/cuda/*.cu built for the CPU with g++ (tests/unit/cuda_on_cpu/cuda_on_cpu.h) and launched on numpy
arrays: the kernels' own source, run without a GPU. Used by the CuPy stand-in (_cupy_stand_in.py).

Each source gets a launcher per extern "C" kernel, generated from its signature; the shared library is
built once per source text (cached under the temp directory) with -O1.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

from kernels.nvrtc import CUDA_DIR

SHIM = Path(__file__).with_name("cuda_on_cpu")
SCALARS = {"int": ctypes.c_int32, "long long": ctypes.c_int64, "float": ctypes.c_float}


def signatures(code: str) -> dict[str, list[tuple[str, bool, str]]]:
    """kernel -> [(C type, is pointer, name)] of each extern "C" kernel's parameters."""
    out = {}
    for kernel, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', code):
        parsed = []
        for p in params.split(","):
            words = re.sub(r"\b(const|__restrict__)\b", " ", p).replace("*", " * ").split()
            parsed.append((" ".join(w for w in words[:-1] if w != "*"), "*" in words, words[-1]))
        out[kernel] = parsed
    return out


def unavailable_reason() -> str | None:
    return None if shutil.which("g++") else "g++ is not installed (it builds the CUDA sources for the CPU)"


def _launchers(code: str) -> str:
    """Per kernel: its arguments as a struct, a body that calls it, and `emu_<kernel>` that launches the body."""
    out = []
    for kernel, params in signatures(code).items():
        types = [f"{t}{'*' if p else ''}" for t, p, _ in params]
        fields = " ".join(f"{t} a{i};" for i, t in enumerate(types))
        unpack = ", ".join(f"*({t}*)argv[{i}]" for i, t in enumerate(types))
        call = ", ".join(f"a->a{i}" for i in range(len(params)))
        out.append(
            f"struct args_{kernel} {{ {fields} }};\n"
            f"static void body_{kernel}(void* p) {{ auto* a = (args_{kernel}*)p; {kernel}({call}); }}\n"
            f'extern "C" void emu_{kernel}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, void** argv) {{\n'  # noqa: E501
            f"    args_{kernel} args{{{unpack}}};\n"
            f"    emu::launch(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, body_{kernel}, &args);\n}}\n"
        )
    return "\n".join(out)


@cache
def _library(code: str) -> ctypes.CDLL:
    shim = "".join(p.read_text() for p in sorted(SHIM.iterdir()))
    key = hashlib.sha256((shim + code).encode()).hexdigest()[:16]
    build = Path(tempfile.gettempdir()) / "forge-cuda-on-cpu" / key
    lib = build / "kernels.so"
    if not lib.exists():
        build.mkdir(parents=True, exist_ok=True)
        src = build / "kernels.cpp"
        src.write_text(code + "\n" + _launchers(code))
        tmp = build / f"kernels.{id(code)}.so"
        subprocess.run(
            [
                "g++",
                "-std=c++17",
                "-O1",
                "-U_FORTIFY_SOURCE",
                "-shared",
                "-fPIC",
                "-w",
                "-include",
                str(SHIM / "cuda_on_cpu.h"),
                f"-I{SHIM}",
                f"-I{CUDA_DIR}",
                "-o",
                str(tmp),
                str(src),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        tmp.rename(lib)  # atomic: a concurrent build never loads half a file
    return ctypes.CDLL(str(lib))


class Kernel:
    """One kernel of a source built for the CPU; called like a cupy.RawKernel with numpy arrays."""

    def __init__(self, code: str, name: str) -> None:
        self.name, self.params = name, signatures(code)[name]
        self._fn = getattr(_library(code), f"emu_{name}")

    def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
        keep = []
        for (ctype, pointer, _), arg in zip(self.params, args):
            if pointer:
                assert arg is None or (
                    isinstance(arg, np.ndarray) and arg.flags.c_contiguous or arg.strides[-1] == arg.itemsize
                )
                keep.append(ctypes.c_void_p(None if arg is None else arg.ctypes.data))
            else:
                keep.append(SCALARS[ctype](arg))
        argv = (ctypes.c_void_p * len(keep))(*(ctypes.cast(ctypes.pointer(k), ctypes.c_void_p) for k in keep))
        g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        self._fn(*(ctypes.c_uint(v) for v in g + b), argv)

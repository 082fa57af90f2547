"""Compile-check CUDA sources with NVRTC, without a GPU and without CuPy.

NVRTC comes from the `nvidia-cuda-nvrtc-cu12` wheel and is called through ctypes; headers such as
cuda_fp16.h come from the `nvidia-cuda-runtime-cu12` wheel. The target is given explicitly because
there is no device to ask: real architectures (sm_80: A100, sm_90: H100), so that ptxas runs too and
its resource report (`--ptxas-options=-v`: registers, spills, shared memory) can be checked.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import lru_cache
from pathlib import Path

ARCHS = ("sm_80", "sm_90")  # the GPUs Forge targets
DEFAULT_ARCH = "sm_90"
CUDA_DIR = Path(__file__).with_name("cuda")


class NvrtcUnavailable(RuntimeError):
    """The NVRTC wheel (or its library) is not installed."""


class CompileError(RuntimeError):
    """NVRTC rejected a source; the message carries NVRTC's log."""

    def __init__(self, path: str, log: str) -> None:
        super().__init__(f"NVRTC failed to compile {path}:\n{log}")
        self.path = path
        self.log = log


def _wheel_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    base = _wheel_dir("nvidia.cuda_nvrtc")
    path = base / "lib" / "libnvrtc.so.12" if base else None
    if path is None or not path.exists():
        raise NvrtcUnavailable("libnvrtc.so.12 not found: install the nvidia-cuda-nvrtc-cu12 wheel")
    lib = ctypes.CDLL(str(path))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_char_p),
    ]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return lib


def available() -> bool:
    """True when the NVRTC library can be loaded."""
    try:
        _lib()
    except (NvrtcUnavailable, OSError):
        return False
    return True


def version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_lib().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def include_dirs() -> list[Path]:
    """The CUDA runtime wheel's headers plus kernels/cuda itself."""
    dirs = [CUDA_DIR]
    runtime = _wheel_dir("nvidia.cuda_runtime")
    if runtime and (runtime / "include").is_dir():
        dirs.append(runtime / "include")
    return dirs


def _check(status: int, what: str) -> None:
    if status != 0:
        msg = _lib().nvrtcGetErrorString(status).decode(errors="replace")
        raise RuntimeError(f"{what} returned {status} ({msg})")


def compile_source(
    source: str, name: str = "source.cu", arch: str = DEFAULT_ARCH, options: tuple[str, ...] = ()
) -> str:
    """Compile CUDA source text for `arch`; returns NVRTC's log (warnings, ptxas reports).
    Raises CompileError with the log."""
    lib = _lib()
    prog = ctypes.c_void_p()
    _check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None), "nvrtcCreateProgram"
    )
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *(f"-I{d}" for d in include_dirs()), *options]
        argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(max(size.value, 1))
        _check(lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace").strip()
        if status != 0:
            err = lib.nvrtcGetErrorString(status).decode(errors="replace")
            raise CompileError(name, log or err)
        return log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_check(path: str | Path, arch: str = DEFAULT_ARCH, options: tuple[str, ...] = ()) -> str:
    """Compile one .cu file under NVRTC and return its log; raise CompileError with the log if it is rejected."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source not found: {path}")
    return compile_source(path.read_text(), path.name, arch, options)


def cuda_sources() -> list[Path]:
    """Every kernels/cuda/*.cu file, sorted."""
    return sorted(CUDA_DIR.glob("*.cu"))

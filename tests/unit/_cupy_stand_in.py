"""A NumPy stand-in for CuPy, to run the CuPy backend's host code on a machine without a GPU.

Arrays are numpy arrays (a subclass with CuPy's `set`). RawModule reads the extern "C" signatures of
its source, and every launch is checked against them (argument count, pointer element types, scalar
types, grid and block limits) and recorded. Kernels compute nothing (fresh memory reads as zeros). Stream capture is modelled to enforce what CUDA forbids while capturing (host <-> device
copies) and what CupyBackend promises (allocations come from the graphs' own pool); a replayed graph
records its kernel launches again.
"""
from __future__ import annotations

import contextlib
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

POINTEE = {"float": np.float32, "__half": np.float16, "int": np.int32, "long long": np.int64,
           "unsigned char": np.uint8, "signed char": np.int8}
SCALAR = {"int": np.int32, "long long": np.int64, "float": np.float32}


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


class StandInArray(np.ndarray):
    """What cupy.ndarray offers beyond numpy that the backend uses."""

    def set(self, src: np.ndarray, stream: Any = None) -> None:
        _STATE.forbid_transfer("ndarray.set")
        assert src.shape == self.shape and src.dtype == self.dtype, (src.shape, src.dtype, self.shape, self.dtype)
        np.copyto(self, src)


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple


@dataclass
class _State:
    launches: list[Launch] = field(default_factory=list)
    capturing: list[Launch] | None = None  # launches of the graph being captured
    allocator: Any = None

    def forbid_transfer(self, what: str) -> None:
        if self.capturing is not None:
            raise RuntimeError(f"{what}: a host <-> device copy while a stream is capturing")

    def allocated(self) -> None:
        if self.capturing is not None and not isinstance(getattr(self.allocator, "__self__", None), MemoryPool):
            raise RuntimeError("an allocation outside the graph pool while capturing")


_STATE = _State()


def _device(a: np.ndarray) -> StandInArray:
    _STATE.allocated()
    return a.view(StandInArray)


class Kernel:
    def __init__(self, name: str, params: list[tuple[str, bool, str]]) -> None:
        self.name, self.params = name, params

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        assert len(args) == len(self.params), f"{self.name}: {len(args)} arguments for {len(self.params)} parameters"
        for (ctype, pointer, pname), arg in zip(self.params, args):
            where = f"{self.name}({pname})"
            if pointer:
                assert arg is None or isinstance(arg, StandInArray), f"{where}: a device array or None, got {type(arg).__name__}"
                assert arg is None or arg.dtype == POINTEE[ctype], f"{where}: {ctype}* given {arg.dtype}"
            else:
                assert type(arg) is SCALAR[ctype], f"{where}: {ctype} given {type(arg).__name__}"
        assert 1 <= len(grid) <= 3 and all(isinstance(g, int) and g >= 1 for g in grid), f"{self.name}: grid {grid}"
        assert grid[0] < 2**31 and all(g <= 65535 for g in grid[1:]), f"{self.name}: grid {grid}"
        threads = int(np.prod(block))
        assert 32 <= threads <= 1024 and threads % 32 == 0, f"{self.name}: block {block} (whole warps, at most 1024)"
        launch = Launch(self.name, tuple(grid), tuple(block), tuple(args))
        _STATE.launches.append(launch)
        if _STATE.capturing is not None:
            _STATE.capturing.append(launch)


class RawModule:
    def __init__(self, code: str, options: tuple = ()) -> None:
        self.kernels = signatures(code)

    def get_function(self, name: str) -> Kernel:
        return Kernel(name, self.kernels[name])


class Graph:
    def __init__(self, launches: list[Launch]) -> None:
        self.launches = launches

    def launch(self, stream: Any = None) -> None:
        _STATE.launches.extend(self.launches)


class Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        pass

    def use(self) -> "Stream":
        return self

    def synchronize(self) -> None:
        _STATE.forbid_transfer("synchronize")

    def begin_capture(self) -> None:
        assert _STATE.capturing is None
        _STATE.capturing = []

    def end_capture(self) -> Graph:
        graph, _STATE.capturing = Graph(_STATE.capturing), None
        return graph

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class MemoryPool:
    def malloc(self, nbytes: int) -> None:
        raise AssertionError("the stand-in allocates through numpy")


@contextlib.contextmanager
def using_allocator(allocator: Any):
    previous, _STATE.allocator = _STATE.allocator, allocator
    try:
        yield
    finally:
        _STATE.allocator = previous


def asarray(a: Any, dtype: Any = None) -> StandInArray:
    if isinstance(a, StandInArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    _STATE.forbid_transfer("asarray from the host")
    return _device(np.array(a, dtype=dtype))


def ascontiguousarray(a: Any, dtype: Any = None) -> StandInArray:
    if not isinstance(a, StandInArray):
        _STATE.forbid_transfer("ascontiguousarray from the host")
    return np.ascontiguousarray(a, dtype=dtype).view(StandInArray)


def asnumpy(a: Any, stream: Any = None) -> np.ndarray:
    _STATE.forbid_transfer("asnumpy")
    return np.array(a)


def module() -> types.ModuleType:
    """A fresh `cupy` stand-in (launch records cleared)."""
    _STATE.launches.clear()
    _STATE.capturing, _STATE.allocator = None, None
    cp = types.ModuleType("cupy")
    cp.RawModule, cp.asarray, cp.ascontiguousarray, cp.asnumpy = RawModule, asarray, ascontiguousarray, asnumpy
    # Fresh memory reads as zeros (the kernels leave their outputs as they were).
    for name, fn in (("empty", np.zeros), ("zeros", np.zeros), ("empty_like", np.zeros_like), ("take", np.take),
                     ("matmul", np.matmul), ("argmax", np.argmax)):
        setattr(cp, name, lambda *a, _fn=fn, **k: _device(np.asarray(_fn(*a, **k))))
    device = types.SimpleNamespace(id=0)
    cp.cuda = types.SimpleNamespace(
        Device=lambda: device, Stream=Stream, MemoryPool=MemoryPool, using_allocator=using_allocator,
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"CuPy stand-in (no GPU)"}),
    )
    cp.launches = _STATE.launches
    return cp


def install(monkeypatch: Any) -> types.ModuleType:
    """Make `import cupy` give a fresh stand-in for the rest of the test."""
    cp = module()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return cp

"""A NumPy stand-in for CuPy, to run the CuPy backend's host code on a machine without a GPU.

Arrays are numpy arrays (a subclass with CuPy's `set`). RawModule reads the extern "C" signatures of
its source, and every launch is checked against them (argument count, pointer element types, scalar
types, grid and block limits) and recorded. With `execute=True` the kernels then run on the CPU
(_cuda_on_cpu.py: the same CUDA source, built with g++) and fresh memory is filled with 0xFF bytes
(NaN as floats, -1 as integers) so that unwritten outputs show; otherwise kernels compute nothing and
fresh memory reads as zeros. Stream capture (without execution) is modelled to enforce what CUDA
forbids while capturing (host <-> device copies) and what CupyBackend promises (allocations come from
the graphs' own pool); a replayed graph records its kernel launches again.

A CUDA graph holds raw addresses, not arrays: it keeps nothing alive. So records here hold launch arguments
weakly, a capture notes every allocation made before it that its work touches (kernel arguments, and CuPy's
own work: indexing, ufuncs, astype, cuBLAS pointers), and replaying a graph after one of those was freed
raises, where a GPU would silently read or write memory that may belong to something else by then.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import _cuda_on_cpu
import numpy as np

POINTEE = {
    "float": np.float32,
    "double": np.float64,
    "__half": np.float16,
    "int": np.int32,
    "long long": np.int64,
    "unsigned char": np.uint8,
    "signed char": np.int8,
}
SCALAR = {"int": np.int32, "long long": np.int64, "float": np.float32}
# (kernel, pointer parameter) -> the alignment in bytes its vector loads need (uint4 / float4: 16, __half2: 4).
ALIGNED = {
    ("gemv_q4", "x"): 16,
    ("gemv_q4", "data"): 16,
    ("gemv_q8", "x"): 16,
    ("gemv_q8", "data"): 16,
    ("paged_attention_decode_f16", "k_cache"): 16,
    ("paged_attention_decode_f16", "v_cache"): 4,
    ("paged_attention_prefill_f16", "k_cache"): 16,
    ("paged_attention_prefill_f16", "v_cache"): 4,
}


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns a's memory (an allocation): the end of its chain of bases."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class StandInArray(np.ndarray):
    """What cupy.ndarray offers beyond numpy that the backend uses; CuPy's own work on it (indexing, ufuncs,
    astype) is noted as a use while a stream captures."""

    def __array_finalize__(self, obj: Any) -> None:
        _STATE.born(self)

    @property
    def data(self) -> Any:  # cupy: a MemoryPointer to the first element (a raw address: cuBLAS reads it)
        _STATE.use(self)
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def set(self, src: np.ndarray, stream: Any = None) -> None:
        _STATE.forbid_transfer("ndarray.set")
        assert src.shape == self.shape and src.dtype == self.dtype, (src.shape, src.dtype, self.shape, self.dtype)
        np.copyto(self, src)

    def __getitem__(self, index: Any) -> Any:
        _STATE.use(self, index)
        return super().__getitem__(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        _STATE.use(self, index, value)
        super().__setitem__(index, value)

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        _STATE.use(self)
        return super().astype(*args, **kwargs)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out", ())
        _STATE.use(inputs, out)
        plain = lambda a: a.view(np.ndarray) if isinstance(a, StandInArray) else a
        if out:
            kwargs["out"] = tuple(plain(o) for o in out)
        result = getattr(ufunc, method)(*(plain(a) for a in inputs), **kwargs)
        if out:
            return out[0] if len(out) == 1 else out
        wrap = lambda r: r.view(StandInArray) if isinstance(r, np.ndarray) else r
        return tuple(wrap(r) for r in result) if isinstance(result, tuple) else wrap(result)


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
    execute: bool = False
    # Every live allocation seen -> (serial of its first sighting, a weak reference that forgets it when freed).
    births: dict[int, tuple[int, Any]] = field(default_factory=dict)
    serial: int = 0
    capture_from: int = 0  # allocations with a serial from here on were made by the capture under way
    external: dict[int, tuple[Any, str]] = field(default_factory=dict)  # what the capture uses that it did not allocate

    def forbid_transfer(self, what: str) -> None:
        if self.capturing is not None:
            raise RuntimeError(f"{what}: a host <-> device copy while a stream is capturing")

    def allocated(self) -> None:
        if self.capturing is not None and not isinstance(getattr(self.allocator, "__self__", None), MemoryPool):
            raise RuntimeError("an allocation outside the graph pool while capturing")

    def born(self, a: np.ndarray) -> None:
        root = _root(a)
        key = id(root)
        if key not in self.births:
            self.serial += 1
            self.births[key] = (self.serial, weakref.ref(root, lambda _, key=key: self.births.pop(key, None)))

    def use(self, *objs: Any) -> None:
        """Note the allocations behind `objs` (arrays, or tuples of them) that the capture under way did not make."""
        if self.capturing is None:
            return
        for obj in objs:
            if isinstance(obj, tuple):
                self.use(*obj)
            elif isinstance(obj, np.ndarray):
                root = _root(obj)
                born = self.births.get(id(root))
                if (born is None or born[0] < self.capture_from) and id(root) not in self.external:
                    self.external[id(root)] = (weakref.ref(root), f"{root.dtype} {list(root.shape)}")


_STATE = _State()


def _device(a: np.ndarray) -> StandInArray:
    _STATE.allocated()
    return a.view(StandInArray)


def _fresh(fill: Any) -> Any:
    """np.empty-like allocation: poisoned when kernels execute, else zeros."""

    def alloc(*a: Any, **k: Any) -> StandInArray:
        out = fill(*a, **k)
        if _STATE.execute:
            out.view(np.uint8).fill(0xFF)
        return _device(out)

    return alloc


class Kernel:
    def __init__(self, code: str, name: str) -> None:
        self.name, self.params = name, _cuda_on_cpu.signatures(code)[name]
        assert {p for k, p in ALIGNED if k == name} <= {p for _, _, p in self.params}, (
            f"{name}: ALIGNED names no parameter"
        )
        self.run = _cuda_on_cpu.Kernel(code, name) if _STATE.execute else None

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        assert len(args) == len(self.params), f"{self.name}: {len(args)} arguments for {len(self.params)} parameters"
        for (ctype, pointer, pname), arg in zip(self.params, args):
            where = f"{self.name}({pname})"
            if pointer:
                assert arg is None or isinstance(arg, StandInArray), (
                    f"{where}: a device array or None, got {type(arg).__name__}"
                )
                assert arg is None or arg.dtype == POINTEE[ctype], f"{where}: {ctype}* given {arg.dtype}"
                align = ALIGNED.get((self.name, pname), 1)
                assert arg is None or arg.ctypes.data % align == 0, f"{where}: vector loads need {align}-byte alignment"
            else:
                assert type(arg) is SCALAR[ctype], f"{where}: {ctype} given {type(arg).__name__}"
        assert 1 <= len(grid) <= 3 and all(isinstance(g, int) and g >= 1 for g in grid), f"{self.name}: grid {grid}"
        assert grid[0] < 2**31 and all(g <= 65535 for g in grid[1:]), f"{self.name}: grid {grid}"
        threads = int(np.prod(block))
        assert 32 <= threads <= 1024 and threads % 32 == 0, f"{self.name}: block {block} (whole warps, at most 1024)"
        # Recorded with weak references to the arrays: a launch (or a graph) keeps no memory alive on a GPU.
        launch = Launch(
            self.name,
            tuple(grid),
            tuple(block),
            tuple(weakref.proxy(a) if isinstance(a, np.ndarray) else a for a in args),
        )
        _STATE.launches.append(launch)
        if _STATE.capturing is not None:
            _STATE.use(args)
            _STATE.capturing.append(launch)
        elif self.run is not None:  # a captured launch runs when its graph is replayed
            self.run(grid, block, args)


class RawModule:
    def __init__(self, code: str, options: tuple = ()) -> None:
        self.code = code

    def get_function(self, name: str) -> Kernel:
        return Kernel(self.code, name)


class Graph:
    def __init__(self, launches: list[Launch], uses: list[tuple[Any, str]]) -> None:
        self.launches = launches
        self.uses = uses  # (weak reference, description) of each allocation made before the capture that it touches

    def launch(self, stream: Any = None) -> None:
        freed = [what for ref, what in self.uses if ref() is None]
        if freed:
            raise RuntimeError(
                f"replaying a CUDA graph whose buffers were freed after capture: {', '.join(freed)} "
                "(a graph holds their addresses, not the arrays: keep them alive as long as the graph)"
            )
        _STATE.launches.extend(self.launches)


class Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        pass

    def use(self) -> Stream:
        return self

    def synchronize(self) -> None:
        _STATE.forbid_transfer("synchronize")

    def begin_capture(self) -> None:
        # Work outside the kernels (numpy here, CuPy's own kernels on a GPU) would run now, not at replay.
        if _STATE.execute:
            raise NotImplementedError("the stand-in does not capture graphs when kernels execute")
        assert _STATE.capturing is None
        _STATE.capturing, _STATE.external, _STATE.capture_from = [], {}, _STATE.serial + 1

    def end_capture(self) -> Graph:
        graph = Graph(_STATE.capturing, list(_STATE.external.values()))
        _STATE.capturing, _STATE.external = None, {}
        return graph

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class MemoryPool:
    def malloc(self, nbytes: int) -> None:
        raise AssertionError("the stand-in allocates through numpy")


_CUDA_TYPES = {2: np.float16, 0: np.float32}  # cudaDataType: CUDA_R_16F, CUDA_R_32F


def _column_major(ptr: int, dtype: Any, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major [rows, cols] matrix with leading dimension ld at address ptr, as a numpy view."""
    item = np.dtype(dtype).itemsize
    flat = np.ctypeslib.as_array((ctypes.c_byte * ((ld * (cols - 1) + rows) * item)).from_address(ptr)).view(dtype)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))


def gemm_ex(
    handle: Any,
    transa: int,
    transb: int,
    m: int,
    n: int,
    k: int,
    alpha: int,
    A: int,
    a_type: int,
    lda: int,
    B: int,
    b_type: int,
    ldb: int,
    beta: int,
    C: int,
    c_type: int,
    ldc: int,
    compute: int,
    algo: int,
) -> None:
    """cublasGemmEx in numpy: C [m, n] = alpha op(A) op(B) + beta C, column-major, float32 arithmetic."""
    assert compute == 68  # CUBLAS_COMPUTE_32F
    if _STATE.capturing is not None:  # captured work only runs at replay, which the stand-in does not model
        return
    scalar = lambda p: float(ctypes.c_float.from_address(p).value)
    op_a = _column_major(A, _CUDA_TYPES[a_type], *((k, m) if transa else (m, k)), lda)
    op_b = _column_major(B, _CUDA_TYPES[b_type], *((n, k) if transb else (k, n)), ldb)
    op_a, op_b = (op_a.T if transa else op_a), (op_b.T if transb else op_b)
    c = _column_major(C, _CUDA_TYPES[c_type], m, n, ldc)
    product = scalar(alpha) * (op_a.astype(np.float32) @ op_b.astype(np.float32))
    c[...] = product if scalar(beta) == 0 else product + scalar(beta) * c  # beta 0: C is not read (cuBLAS)


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


def module(execute: bool = False) -> types.ModuleType:
    """A fresh `cupy` stand-in (launch records cleared); `execute`: run the kernels on the CPU."""
    _STATE.launches.clear()
    _STATE.capturing, _STATE.allocator, _STATE.execute = None, None, execute
    cp = types.ModuleType("cupy")
    cp.RawModule, cp.asarray, cp.ascontiguousarray, cp.asnumpy = RawModule, asarray, ascontiguousarray, asnumpy
    cp.empty, cp.empty_like = _fresh(np.zeros), _fresh(np.zeros_like)
    for name, fn in (
        ("zeros", np.zeros),
        ("full", np.full),
        ("take", np.take),
        ("matmul", np.matmul),
        ("argmax", np.argmax),
    ):
        setattr(cp, name, lambda *a, _fn=fn, **k: _STATE.use(a, tuple(k.values())) or _device(np.asarray(_fn(*a, **k))))
    device = types.SimpleNamespace(id=0)
    cp.cuda = types.SimpleNamespace(
        Device=lambda: device,
        Stream=Stream,
        MemoryPool=MemoryPool,
        using_allocator=using_allocator,
        runtime=types.SimpleNamespace(
            getDeviceProperties=lambda i: {"name": b"CuPy stand-in (no GPU)"}, CUDA_R_16F=2, CUDA_R_32F=0
        ),
        cublas=types.SimpleNamespace(
            gemmEx=gemm_ex, CUBLAS_OP_N=0, CUBLAS_OP_T=1, CUBLAS_COMPUTE_32F=68, CUBLAS_GEMM_DEFAULT_TENSOR_OP=99
        ),
        get_cublas_handle=lambda: 1,
    )
    cp.launches = _STATE.launches
    return cp


def install(monkeypatch: Any, execute: bool = False) -> types.ModuleType:
    """Make `import cupy` give a fresh stand-in for the rest of the test."""
    cp = module(execute)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return cp

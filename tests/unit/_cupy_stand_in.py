"""A NumPy stand-in for CuPy, to run the CuPy backend's host code on a machine without a GPU.

Arrays are numpy arrays (a subclass with CuPy's `set`). RawModule reads the extern "C" signatures of
its source, and every launch is checked against them (argument count, pointer element types, scalar
types, grid and block limits, pointers into device memory) and recorded. With `execute=True` the kernels
then run on the CPU (_cuda_on_cpu.py: the same CUDA source, built with g++) and fresh memory is filled
with 0xFF bytes (NaN as floats, -1 as integers) so that unwritten outputs show; otherwise kernels compute
nothing and fresh memory reads as zeros.

Device memory is CuPy's: every array lives in a block of a `MemoryPool` (the default one, or the pool
`using_allocator` names), sizes rounded up to 512 bytes, and a block freed when its array is collected goes
back to its pool, which hands it out again (best fit: the smallest free block that holds the request, split,
neighbours merged on free). So, as on a GPU, memory that one array let go of is soon another's.

Stream capture is modelled to enforce what CUDA forbids while capturing (host <-> device copies) and what
CupyBackend promises (allocations come from a pool set for the capture). Nothing runs while capturing, as on
a GPU: the capture records each kernel launch and each piece of CuPy's own work (indexing, ufuncs, astype,
copies, cuBLAS) against the addresses it used, and a replay redoes them there, on whatever those addresses
hold by then.

A CUDA graph holds raw addresses, not arrays: it keeps nothing alive. So records here hold launch arguments
weakly, a capture notes every allocation made before it that its work touches and the blocks it allocated
itself (its scratch, which its replays write again), and a replay raises where a GPU would silently read or
write memory that may belong to something else by then: after a buffer it uses was freed, after its pool
was freed, or when its scratch is now (part of) another live array.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import sys
import types
import weakref
from collections.abc import Callable
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
    ("gemv_q4_hs", "x"): 16,
    ("gemv_q4_hs", "data"): 16,
    ("gemv_q8_hs", "x"): 16,
    ("gemv_q8_hs", "data"): 16,
    ("gemv_tiled_q4", "x"): 16,
    ("gemv_tiled_q8", "x"): 16,
    ("gemv_tiled_q4_hs", "x"): 16,
    ("gemv_tiled_q8_hs", "x"): 16,
    ("gemv_tiled_q4", "data"): 16,
    ("gemv_tiled_q8", "data"): 16,
    ("gemv_tiled_q4_hs", "data"): 16,
    ("gemv_tiled_q8_hs", "data"): 16,
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
        return _result(lambda a, i: a[i], (self, index), super().__getitem__(_plain(index)), self)

    def __setitem__(self, index: Any, value: Any) -> None:
        _STATE.use(self, index, value)
        _STATE.record(lambda a, i, v: a.__setitem__(i, v), (self, index, value))
        super().__setitem__(_plain(index), _plain(value))

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        _STATE.use(self)
        fn = lambda a: a.astype(*args, **kwargs)
        return _result(fn, (self,), fn(self.view(np.ndarray)), self)

    def copy(self, order: str = "C") -> Any:  # type: ignore[override]
        _STATE.use(self)
        return _result(lambda a: a.copy(order), (self,), self.view(np.ndarray).copy(order))

    def reshape(self, *args: Any, **kwargs: Any) -> Any:  # a copy where no view has the shape
        fn = lambda a: a.reshape(*args, **kwargs)
        return _result(fn, (self,), fn(self.view(np.ndarray)), self)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out", ())
        _STATE.use(inputs, out)
        fn = getattr(ufunc, method)
        if out:
            _STATE.record(lambda ins, kw: fn(*ins, **kw), (inputs, kwargs))
            fn(*_plain(inputs), **_plain(kwargs))
            return out[0] if len(out) == 1 else out
        result = fn(*_plain(inputs), **_plain(kwargs))
        if isinstance(result, tuple):  # (no backend op makes several outputs)
            return tuple(
                _result(lambda ins, kw, i=i: fn(*ins, **kw)[i], (inputs, kwargs), r) for i, r in enumerate(result)
            )
        return _result(lambda ins, kw: fn(*ins, **kw), (inputs, kwargs), result)


def _plain(obj: Any) -> Any:
    """obj with every StandInArray in it (tuples, lists, dicts) seen as a plain numpy array."""
    if isinstance(obj, StandInArray):
        return obj.view(np.ndarray)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_plain(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _result(fn: Callable[..., Any], args: tuple, value: Any, source: np.ndarray | None = None) -> Any:
    """What CuPy's op `fn(*args)` gives: a view of `source` as it is, a new array in device memory otherwise
    (recorded while a stream captures, so that a replay computes it again into that memory)."""
    if not isinstance(value, np.ndarray):
        return value
    if source is not None and _root(value) is _root(source):
        return value if isinstance(value, StandInArray) else value.view(StandInArray)
    out = _place(value)
    _STATE.record(fn, args, out)
    return out


def _place(value: np.ndarray) -> StandInArray:
    """A copy of a host-computed array in a block of device memory."""
    out = _alloc(value.shape, value.dtype)
    np.copyto(out.view(np.ndarray), value)
    return out


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
    steps: list[Callable[[], None]] = field(default_factory=list)  # the capture's work, as a replay redoes it
    scratch: list[tuple[Any, int, int]] = field(default_factory=list)  # (pool, address, size) the capture allocated
    pool: Any = None  # the default memory pool
    allocations: dict[int, str] = field(default_factory=dict)  # id of every live allocation's root -> what it is

    def forbid_transfer(self, what: str) -> None:
        if self.capturing is not None:
            raise RuntimeError(f"{what}: a host <-> device copy while a stream is capturing")

    def current_pool(self) -> MemoryPool:
        pool = getattr(self.allocator, "__self__", None)
        if self.capturing is not None and not isinstance(pool, MemoryPool):
            raise RuntimeError("an allocation outside the graph pool while capturing")
        return pool if isinstance(pool, MemoryPool) else self.pool

    def record(self, fn: Callable[..., Any], args: tuple, out: np.ndarray | None = None) -> None:
        """While capturing: note `fn(*args)` (into `out`, if given) as a step a replay redoes at the same addresses."""
        if self.capturing is None:
            return
        where, into = _at_replay(args), None if out is None else _at_replay(out)

        def step() -> None:
            value = fn(*where())
            if into is not None:
                np.copyto(into(), value)

        self.steps.append(step)

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
                    what = self.allocations.get(id(root), f"{root.dtype} {list(root.shape)}")
                    self.external[id(root)] = (weakref.ref(root), what)


_STATE = _State()


def _alloc(shape: Any, dtype: Any) -> StandInArray:
    """An array in a new block of the current pool; the block goes back to the pool when the array is collected."""
    pool = _STATE.current_pool()
    dtype = np.dtype(dtype)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    block = pool.malloc(nbytes)
    root = np.frombuffer(memoryview(block.chunk)[block.offset : block.offset + block.size], dtype=np.uint8)
    _STATE.born(root)
    serial = _STATE.births[id(root)][0]
    what = f"{dtype} {list(shape)}"
    pool.note(block.address, serial, what)
    _STATE.allocations[id(root)] = what
    weakref.finalize(root, _freed, pool, block.address, id(root))
    if _STATE.capturing is not None:
        _STATE.scratch.append((pool, block.address, block.size))
    return root[:nbytes].view(dtype).reshape(shape).view(StandInArray)


def _freed(pool: MemoryPool, address: int, key: int) -> None:
    _STATE.allocations.pop(key, None)
    pool.free(address)


def _device(a: np.ndarray) -> StandInArray:
    return _place(np.asarray(a))


def _fresh(shape_of: Callable[..., tuple[Any, Any]]) -> Any:
    """np.empty-like allocation: poisoned when kernels execute, else zeros."""

    def alloc(*a: Any, **k: Any) -> StandInArray:
        out = _alloc(*shape_of(*a, **k))
        out.view(np.ndarray).view(np.uint8).fill(0xFF if _STATE.execute else 0)
        return out

    return alloc


def _at_replay(obj: Any) -> Callable[[], Any]:
    """How a replay sees `obj`: device arrays (in tuples, lists, dicts) by their address, as a graph holds them."""
    if isinstance(obj, StandInArray):
        ptr, dtype, shape, strides = obj.ctypes.data, obj.dtype, obj.shape, obj.strides
        return lambda: _at(ptr, dtype, shape, strides)
    if isinstance(obj, (tuple, list)):
        parts, kind = [_at_replay(o) for o in obj], type(obj)
        return lambda: kind(p() for p in parts)
    if isinstance(obj, dict):
        items = {k: _at_replay(v) for k, v in obj.items()}
        return lambda: {k: p() for k, p in items.items()}
    return lambda: obj


def _at(ptr: int, dtype: np.dtype, shape: tuple, strides: tuple) -> np.ndarray:
    """The array of that layout at raw address `ptr` (whatever memory it is by now)."""
    assert all(st >= 0 for st in strides), strides
    size = sum((n - 1) * st for n, st in zip(shape, strides)) + dtype.itemsize if all(shape) else 0
    if not size:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, buffer=(ctypes.c_byte * size).from_address(ptr), strides=strides)


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
                assert arg is None or id(_root(arg)) in _STATE.allocations, f"{where}: not in device memory"
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
        if _STATE.capturing is not None:  # it runs when its graph is replayed
            _STATE.use(args)
            _STATE.capturing.append(launch)
            if self.run is not None:
                _STATE.record(lambda *a: self.run(grid, block, a), args)
        elif self.run is not None:
            self.run(grid, block, args)


class RawModule:
    def __init__(self, code: str, options: tuple = ()) -> None:
        self.code = code

    def get_function(self, name: str) -> Kernel:
        return Kernel(self.code, name)


class Graph:
    def __init__(self, launches: list[Launch], uses: list[tuple[Any, str]], steps: list, scratch: list, serials: tuple):
        self.launches = launches
        self.uses = uses  # (weak reference, description) of each allocation made before the capture that it touches
        self.steps = steps  # the capture's work in order, at the addresses it used
        # (weak reference to the pool, address, size) of each block the capture allocated: its replays write them.
        self.scratch = [(weakref.ref(pool), address, size) for pool, address, size in scratch]
        self.serials = serials  # the allocation serials of the capture: first, last

    def launch(self, stream: Any = None) -> None:
        freed = [what for ref, what in self.uses if ref() is None]
        if freed:
            raise RuntimeError(
                f"replaying a CUDA graph whose buffers were freed after capture: {', '.join(freed)} "
                "(a graph holds their addresses, not the arrays: keep them alive as long as the graph)"
            )
        if any(pool() is None for pool, _, _ in self.scratch):
            raise RuntimeError("replaying a CUDA graph whose memory pool was freed: keep the pool as long as the graph")
        for pool, address, size in self.scratch:
            taken = pool().taken(address, size, self.serials)
            if taken:
                raise RuntimeError(
                    f"replaying a CUDA graph writes its scratch, which is now {taken}, allocated after its capture "
                    "from the same pool (a graph's pool must serve no other capture or allocation)"
                )
        _STATE.launches.extend(self.launches)
        for step in self.steps:
            step()


class Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        pass

    def use(self) -> Stream:
        return self

    def synchronize(self) -> None:
        _STATE.forbid_transfer("synchronize")

    def begin_capture(self) -> None:
        assert _STATE.capturing is None
        _STATE.capturing, _STATE.external, _STATE.capture_from = [], {}, _STATE.serial + 1
        _STATE.steps, _STATE.scratch = [], []

    def end_capture(self) -> Graph:
        assert _STATE.capturing is not None
        graph = Graph(
            _STATE.capturing,
            list(_STATE.external.values()),
            _STATE.steps,
            _STATE.scratch,
            (_STATE.capture_from, _STATE.serial),
        )
        _STATE.capturing, _STATE.external, _STATE.steps, _STATE.scratch = None, {}, [], []
        return graph

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


ROUND = 512  # CuPy rounds every allocation up to a multiple of this


@dataclass(slots=True)
class Block:
    address: int
    size: int
    chunk: np.ndarray  # the host memory standing in for one cudaMalloc
    offset: int  # of the block in the chunk


class MemoryPool:
    """CuPy's memory pool as far as the backend can tell: a request takes the smallest free block that holds
    it (best fit; the rest of the block stays free), else a new chunk; a freed block is merged with free
    neighbours of its chunk and handed out again. Chunks live as long as the pool."""

    def __init__(self) -> None:
        self._free: list[tuple[int, int]] = []  # sorted (size, address) of the free blocks
        self._blocks: dict[int, Block] = {}  # address -> block, free or not
        self._ends: dict[int, int] = {}  # end address -> address of the block that ends there
        self._used: dict[int, tuple[int, str]] = {}  # address of each block in use -> (its allocation serial, what)

    def malloc(self, nbytes: int) -> Block:
        size = max(1, -(-nbytes // ROUND)) * ROUND
        i = bisect.bisect_left(self._free, (size, 0))
        if i < len(self._free):
            _, address = self._free.pop(i)
            block = self._blocks[address]
            if block.size > size:  # split: the rest stays free
                rest = Block(address + size, block.size - size, block.chunk, block.offset + size)
                block.size = size
                self._ends[address + size] = address
                self._add(rest)
                bisect.insort(self._free, (rest.size, rest.address))
        else:
            chunk = np.empty(size + ROUND, np.uint8)
            offset = -chunk.ctypes.data % ROUND
            block = Block(chunk.ctypes.data + offset, size, chunk, offset)
            self._add(block)
        self._used[block.address] = (0, "")
        return block

    def note(self, address: int, serial: int, what: str) -> None:
        self._used[address] = (serial, what)

    def free(self, address: int) -> None:
        del self._used[address]
        block = self._blocks[address]
        after = self._blocks.get(address + block.size)
        if after is not None and after.chunk is block.chunk and after.address not in self._used:
            self._free.remove((after.size, after.address))
            self._drop(after)
            del self._ends[block.address + block.size]
            block.size += after.size
            self._ends[block.address + block.size] = block.address
        before = self._blocks.get(self._ends.get(address, -1))
        if before is not None and before.chunk is block.chunk and before.address not in self._used:
            self._free.remove((before.size, before.address))
            self._drop(block)
            del self._ends[before.address + before.size]
            before.size += block.size
            self._ends[before.address + before.size] = before.address
            block = before
        bisect.insort(self._free, (block.size, block.address))

    def taken(self, address: int, size: int, serials: tuple[int, int]) -> str:
        """The live allocation, if any, that overlaps [address, address + size) and has a serial outside
        `serials` (first, last): what a write there would clobber."""
        for start, (serial, what) in self._used.items():
            overlaps = start < address + size and address < start + self._blocks[start].size
            if overlaps and not serials[0] <= serial <= serials[1]:
                return what
        return ""

    def _add(self, block: Block) -> None:
        self._blocks[block.address] = block
        self._ends[block.address + block.size] = block.address

    def _drop(self, block: Block) -> None:
        del self._blocks[block.address]
        del self._ends[block.address + block.size]


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
    if _STATE.capturing is not None:  # captured work runs when its graph is replayed
        args = (handle, transa, transb, m, n, k, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc)
        _STATE.steps.append(lambda: gemm_ex(*args, compute, algo))
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
        return _device(np.ascontiguousarray(a, dtype=dtype))
    _STATE.use(a)
    fn = lambda x: np.ascontiguousarray(x, dtype=dtype)
    return _result(fn, (a,), fn(a.view(np.ndarray)), a)


def asnumpy(a: Any, stream: Any = None) -> np.ndarray:
    _STATE.forbid_transfer("asnumpy")
    return np.array(a)


def _op(fn: Callable[..., Any]) -> Callable[..., StandInArray]:
    """cupy.<fn>: its result in device memory, computed again by a replay when captured."""

    def call(*a: Any, **k: Any) -> StandInArray:
        _STATE.use(a, tuple(k.values()))
        out = _place(np.asarray(fn(*_plain(a), **_plain(k))))
        _STATE.record(lambda args, kw: fn(*args, **kw), (a, k), out)
        return out

    return call


def module(execute: bool = False) -> types.ModuleType:
    """A fresh `cupy` stand-in (launch records cleared, a new default pool); `execute`: run the kernels on the CPU."""
    _STATE.launches.clear()
    _STATE.capturing, _STATE.allocator, _STATE.execute = None, None, execute
    _STATE.pool = MemoryPool()
    cp = types.ModuleType("cupy")
    cp.RawModule, cp.asarray, cp.ascontiguousarray, cp.asnumpy = RawModule, asarray, ascontiguousarray, asnumpy
    cp.empty = _fresh(lambda shape, dtype=np.float64: (shape, dtype))
    cp.empty_like = _fresh(lambda a, dtype=None: (a.shape, a.dtype if dtype is None else dtype))
    for name, fn in (
        ("zeros", np.zeros),
        ("full", np.full),
        ("take", np.take),
        ("matmul", np.matmul),
        ("argmax", np.argmax),
    ):
        setattr(cp, name, _op(fn))
    cp.get_default_memory_pool = lambda: _STATE.pool
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

"""Weights and KV caches in memory backed by 2 MiB pages where the OS gives them (Linux transparent huge pages).

A CPU decode step streams every weight byte once. Over 4 KiB pages that stream takes a TLB miss and a page
walk every 4 KiB, and the hardware prefetchers stop at each page's end; over 2 MiB pages both go away
(a 1B model's down projection, 2048 x 8192 q4, read 8-10% faster from DRAM: docs/performance.md).

NumPy asks for huge pages itself (madvise) for a new allocation of 4 MiB or more, but only memory that is
not yet touched becomes huge: the allocator hands a model load's later arrays the heap pages that the loader's
freed arrays had already faulted in as 4 KiB pages, and a small weight never qualifies. So the blocked weights
are copied into an arena of fresh anonymous mappings, each 2 MiB-aligned and marked MADV_HUGEPAGE before its
first touch. The CPU backends' KV caches take such mappings too (`zeroed_huge`). Where the OS has no such advice
(not Linux, or THP set to `never`) the memory is plain and nothing else changes.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20
ARENA_CHUNK = 32 << 20  # bytes a mapping holds; larger arrays get one of their own
ALIGN = 64  # every array starts on a cache line


def huge_mapping(nbytes: int) -> np.ndarray:
    """A fresh private anonymous mapping of at least `nbytes`, zero, as uint8, starting on a 2 MiB boundary and
    advised to take huge pages. Memory is taken as it is first written, a huge page at a time. (Private: a shared
    anonymous mapping is shared memory, which the kernel leaves in 4 KiB pages whatever the advice.)"""
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    m = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:  # the kernel knows no transparent huge pages: plain pages
            pass
    whole = np.frombuffer(m, dtype=np.uint8)  # keeps the mapping alive as long as any view of it
    start = (-whole.ctypes.data) % HUGE_PAGE
    return whole[start : start + size]


class HugePageArena:
    """Copies arrays into huge-page memory, packed one after another in ARENA_CHUNK mappings (a chunk is
    unmapped once every array in it is gone)."""

    __slots__ = ("_chunk", "_used")

    def __init__(self) -> None:
        self._chunk: np.ndarray | None = None
        self._used = 0

    def copy(self, a: np.ndarray) -> np.ndarray:
        """A C-contiguous copy of `a` in the arena (an empty array stays as it is)."""
        if a.size == 0:
            return a
        n = a.nbytes
        if n >= ARENA_CHUNK:
            raw = huge_mapping(n)[:n]
        else:
            at = -(-self._used // ALIGN) * ALIGN
            if self._chunk is None or at + n > self._chunk.size:
                self._chunk, at = huge_mapping(ARENA_CHUNK), 0
            raw = self._chunk[at : at + n]
            self._used = at + n
        out = raw.view(a.dtype).reshape(a.shape)
        out[...] = a
        return out


def zeroed_huge(shape: tuple[int, ...]) -> np.ndarray:
    """A zero float32 array (the CPU backends' KV caches), in `huge_mapping` memory from one huge page up. A KV cache
    grows into fresh memory a few slots at a time: in 4 KiB pages every few tokens of every sequence took a page
    fault. A smaller array stays in plain pages, where a huge one would take more memory than the array holds."""
    n = int(np.prod(shape))
    if n * 4 < HUGE_PAGE:
        return np.zeros(shape, dtype=np.float32)
    return huge_mapping(n * 4)[: n * 4].view(np.float32).reshape(shape)

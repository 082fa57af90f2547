"""The arena that holds the numba backend's blocked weights (kernels/huge_pages.py): exact copies, aligned and apart,
in mappings the kernel may back with huge pages."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels.huge_pages import ALIGN, ARENA_CHUNK, HUGE_PAGE, HugePageArena, zeroed_huge

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _vma_fields(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds `address`."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if m := re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line):
            inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
        elif inside and ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def test_copies_are_exact_aligned_and_do_not_overlap() -> None:
    arena = HugePageArena()
    rng = np.random.default_rng(0)
    sources = [
        rng.integers(0, 255, 1000, dtype=np.uint8),
        rng.standard_normal(333).astype(np.float32),
        rng.integers(0, 1 << 16, (7, 5), dtype=np.uint16),
        rng.integers(0, 255, ARENA_CHUNK + 10, dtype=np.uint8),  # larger than a chunk: a mapping of its own
        np.empty(0, np.uint16),
    ]
    copies = [arena.copy(a) for a in sources]
    spans = []
    for a, c in zip(sources, copies):
        assert c.dtype == a.dtype and c.shape == a.shape and c.flags.c_contiguous
        assert np.array_equal(c, a)
        if a.size:
            assert c.ctypes.data % ALIGN == 0
            spans.append((c.ctypes.data, c.ctypes.data + c.nbytes))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    copies[0][:] = 0  # each copy is its own memory: writing one leaves the others and the sources alone
    assert np.array_equal(copies[1], sources[1]) and sources[0].any()


def test_a_new_chunk_starts_when_the_current_one_is_full() -> None:
    arena = HugePageArena()
    first = arena.copy(np.ones(ARENA_CHUNK - 100, np.uint8))
    second = arena.copy(np.ones(1000, np.uint8))
    assert second.ctypes.data % HUGE_PAGE == 0  # the start of a fresh mapping
    assert not (first.ctypes.data <= second.ctypes.data < first.ctypes.data + first.nbytes)


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="this kernel has transparent huge pages off or none"
)
def test_the_arena_and_a_kv_cache_are_private_memory_eligible_for_huge_pages() -> None:
    """The mappings are private (a shared anonymous mapping is shared memory, which stays in 4 KiB pages) and marked
    for huge pages (THPeligible); whether the kernel finds free 2 MiB pages at that moment is the machine's state."""
    copy = HugePageArena().copy(np.ones(3 * HUGE_PAGE, np.uint8))
    cache = zeroed_huge((256, 16, 8, 64))  # 8 MiB
    assert cache.dtype == np.float32 and cache.shape == (256, 16, 8, 64) and not cache.any()
    cache[::2] = 1.0
    for a in (copy, cache):
        fields = _vma_fields(a.ctypes.data)
        assert fields.get("THPeligible") == "1", fields


@pytest.mark.skipif(
    not THP.exists() or "[madvise]" not in THP.read_text(),
    reason="only where huge pages come on advice (THP `madvise`) does Forge choose them; `always` gives them to all",
)
def test_a_kv_cache_under_one_huge_page_is_not_advised_to_take_them() -> None:
    """A 1.5 MiB cache (a small KV budget's layer) would take a whole 2 MiB page once touched."""
    cache = zeroed_huge((48, 16, 8, 64))
    assert cache.nbytes < HUGE_PAGE and not cache.any()
    cache[0] = 1.0
    assert _vma_fields(cache.ctypes.data).get("THPeligible") == "0"

"""The process heap (glibc malloc): what the engine asks of it to keep its resident memory low.

Elsewhere (another libc) both calls do nothing.
"""

from __future__ import annotations

import ctypes
import functools

_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018  (glibc has both)
    except (OSError, AttributeError):
        return None
    return libc


def share_one_arena() -> None:
    """Make threads created from now on allocate from the arena that exists, not one of their own.

    glibc gives each thread that allocates an arena of its own, and memory freed in one arena is
    only reused by the threads of that arena: the step thread, the GEMM workers and the threads
    that compile structured-output grammars would each grow a heap beside the main thread's, which
    holds what loading freed (the effect on peak RSS: docs/performance.md). NumPy allocates under
    the GIL anyway; the only allocations from parallel threads, the attention kernels' scratch per
    work item, share the arena's lock.
    """
    if (libc := _libc()) is not None:
        libc.mallopt(_M_ARENA_MAX, 1)


def return_freed_memory() -> None:
    """Give the heap's free pages back to the OS (those inside the heap too, not only its top).

    Called after each layer the model prepares, and by the step loop each time it goes idle: a
    prefill's large temporaries otherwise stay resident as free heap beside the K/V pages that
    later steps touch. A call costs far less than a step and runs only while the loop is idle
    (figures: docs/performance.md)."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)

"""Per-step attention metadata: built once per model step, shared by every layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class _Device(Protocol):
    """What the metadata needs of a backend (kernels.Backend has it; the package imports this module)."""

    def asarray(self, a: Any, dtype: Any = None) -> Any: ...


@dataclass(slots=True)
class AttentionMetadata:
    """How the flattened varlen batch maps onto the paged KV cache.

    query_start:  [B+1] int32, cumulative new-token counts; seq b owns rows query_start[b]:query_start[b+1]
    context_lens: [B] int32, tokens of seq b after this step's K/V are written (cached + new)
    block_tables: [B, max_blocks] int32, padded with 0 (never read past context_lens)
    slot_mapping: [T] int64, flat cache slot (block * block_size + offset) of each new token
    max_context:  max(context_lens)
    is_decode_only: every sequence has exactly one new token

    Arrays live on the backend (numpy or cupy). `query_lens_host` / `context_lens_host` keep host
    copies so host-side loops never have to read device memory.
    """

    query_start: Any
    context_lens: Any
    block_tables: Any
    slot_mapping: Any
    max_context: int
    is_decode_only: bool
    query_start_host: np.ndarray | None = None
    context_lens_host: np.ndarray | None = None
    plan: Any = None  # a backend's per-step work plan, computed by the first layer, reused by the rest

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    def host_query_start(self) -> np.ndarray:
        """query_start as a host numpy array (cached)."""
        if self.query_start_host is None:
            self.query_start_host = _to_host(self.query_start).astype(np.int64)
        return self.query_start_host

    def host_context_lens(self) -> np.ndarray:
        """context_lens as a host numpy array (cached)."""
        if self.context_lens_host is None:
            self.context_lens_host = _to_host(self.context_lens).astype(np.int64)
        return self.context_lens_host


def _to_host(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # cupy
        return a.get()
    return np.asarray(a)


def build_attention_metadata(
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    backend: _Device | None = None,
) -> AttentionMetadata:
    """Build metadata from plain host lists.

    query_lens[b] new tokens of seq b sit at positions context_lens[b]-query_lens[b] .. context_lens[b]-1;
    their slots come from block_tables[b]. With `backend`, arrays are moved onto it (host copies kept).
    """
    q_lens = np.asarray(query_lens, dtype=np.int64)
    c_lens = np.asarray(context_lens, dtype=np.int64)
    if q_lens.ndim != 1 or c_lens.shape != q_lens.shape:
        raise ValueError(f"query_lens {q_lens.shape} and context_lens {c_lens.shape} must be 1-D of equal length")
    if len(block_tables) != len(q_lens):
        raise ValueError(f"block_tables has {len(block_tables)} rows for {len(q_lens)} sequences")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if np.any(q_lens < 1):
        raise ValueError(f"every sequence needs at least one new token, query_lens={q_lens.tolist()}")
    if np.any(c_lens < q_lens):
        raise ValueError(f"context_lens {c_lens.tolist()} must be >= query_lens {q_lens.tolist()}")
    B = len(q_lens)
    max_blocks = max([len(t) for t in block_tables] + [1])
    table = np.zeros((B, max_blocks), dtype=np.int32)
    slots = []
    for b, blocks in enumerate(block_tables):
        need = -(-int(c_lens[b]) // block_size)
        if len(blocks) < need:
            raise ValueError(f"seq {b}: block table has {len(blocks)} blocks, context {int(c_lens[b])} needs {need}")
        table[b, : len(blocks)] = blocks
        pos = np.arange(c_lens[b] - q_lens[b], c_lens[b], dtype=np.int64)
        slots.append(table[b, pos // block_size].astype(np.int64) * block_size + pos % block_size)
    query_start = np.zeros(B + 1, dtype=np.int32)
    np.cumsum(q_lens, out=query_start[1:])
    host_qs, host_cl = query_start.astype(np.int64), c_lens
    c32 = c_lens.astype(np.int32)
    slot_mapping = np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64)
    if backend is not None:
        query_start, c32 = backend.asarray(query_start), backend.asarray(c32)
        table, slot_mapping = backend.asarray(table), backend.asarray(slot_mapping)
    return AttentionMetadata(
        query_start=query_start,
        context_lens=c32,
        block_tables=table,
        slot_mapping=slot_mapping,
        max_context=int(c_lens.max()) if B else 0,
        is_decode_only=bool(B) and bool(np.all(q_lens == 1)),
        query_start_host=host_qs,
        context_lens_host=host_cl,
    )

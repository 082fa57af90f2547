"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket (backends with `capture_graph`).

A decode-only step of B sequences runs as the graph of the smallest bucket >= B. The graph reads its
inputs from one device buffer, filled by a single host-to-device copy a step, and leaves logits
[bucket, vocab] in a device array of its own. Rows past B are padding: one-token sequences at position
0 whose K/V go to the pad block, a block of the cache that the block manager never hands out, so every
op sees an ordinary batch. Every bucket is captured at load (`capture_all`, from the model runner), so no
step waits on a capture and no timed window holds one; each capture has a memory pool of its own (the
backend's `capture_graph`), kept by its `_Graph`. If CUDA refuses a capture, that bucket and the larger ones
run eagerly from then on.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from engine.model.llama import LlamaModel
from kernels import Backend, GraphBackend
from kernels.attention_meta import AttentionMetadata

log = logging.getLogger("forge.engine")

# (name, dtype, per-row shape) of the packed step inputs; block_tables rows are `width` wide.
_FIELDS = (
    ("token_ids", np.int64),
    ("positions", np.int64),
    ("slot_mapping", np.int64),
    ("context_lens", np.int32),
    ("block_tables", np.int32),
)


def graph_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, then multiples of 8, up to the first one >= max_batch."""
    sizes = [1, 2, 4, *range(8, max_batch + 8, 8)]
    return sizes[: bisect.bisect_left(sizes, max_batch) + 1]


def bucket_for(batch: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds `batch` rows, or None when none does."""
    i = bisect.bisect_left(buckets, batch)
    return buckets[i] if i < len(buckets) else None


class PackedInputs:
    """A decode step's inputs for `rows` rows in one host buffer and its device twin: views of each by name."""

    def __init__(self, rows: int, width: int, backend: Backend) -> None:
        self.rows, self.width = rows, width
        offsets, at = {}, 0
        for name, dtype in _FIELDS:
            shape = (rows, width) if name == "block_tables" else (rows,)
            offsets[name] = (at, dtype, shape)
            at += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 8) * 8  # keep every field 8-byte aligned
        self.host = np.zeros(at, dtype=np.uint8)
        self.device = backend.asarray(self.host)
        self.backend = backend

        def views(buf: Any) -> dict[str, Any]:
            return {
                name: buf[o : o + int(np.prod(s)) * np.dtype(d).itemsize].view(d).reshape(s)
                for name, (o, d, s) in offsets.items()
            }

        self.h, self.d = views(self.host), views(self.device)

    def fill(
        self, token_ids: list[int], positions: list[int], block_tables: list[list[int]], block_size: int, pad_block: int
    ) -> None:
        """Write one step's rows (decode: context = position + 1) and pad the rest; then copy to the device."""
        h, B = self.h, len(token_ids)
        assert self.rows >= B and len(positions) == B == len(block_tables)
        pos = np.asarray(positions, dtype=np.int64)
        h["token_ids"][:B] = token_ids
        h["positions"][:B] = pos
        h["context_lens"][:B] = pos + 1
        for i, table in enumerate(block_tables):
            h["block_tables"][i, : len(table)] = table[: self.width]  # blocks past the context are never read
        tables = h["block_tables"][:B]
        h["slot_mapping"][:B] = tables[np.arange(B), pos // block_size].astype(np.int64) * block_size + pos % block_size
        # Padding rows: token 0 at position 0 of the pad block.
        h["token_ids"][B:] = 0
        h["positions"][B:] = 0
        h["context_lens"][B:] = 1
        h["block_tables"][B:, 0] = pad_block
        h["slot_mapping"][B:] = pad_block * block_size
        self.backend.upload(self.device, self.host)

    def metadata(self, block_size: int) -> AttentionMetadata:
        """Attention metadata over the device views (every row one decode token)."""
        qs = np.arange(self.rows + 1, dtype=np.int32)
        return AttentionMetadata(
            query_start=self.backend.asarray(qs),
            context_lens=self.d["context_lens"],
            block_tables=self.d["block_tables"],
            slot_mapping=self.d["slot_mapping"],
            max_context=self.width * block_size,
            is_decode_only=True,
            query_start_host=qs.astype(np.int64),
        )


@dataclass(slots=True)
class _Graph:
    """A captured decode step and every device buffer it reads or writes that it did not allocate while capturing.

    A CUDA graph holds raw addresses, not arrays: a buffer it uses that is freed goes back to CuPy's pool and the
    next allocation gets it, so replays would read (or write) someone else's memory. Whatever the graph touches
    therefore lives here, as long as the graph does (the model's weights and the KV caches outlive DecodeGraphs)."""

    inputs: PackedInputs  # the packed step inputs (host and device)
    meta: AttentionMetadata  # query_start and the attention plan the graph's kernels read
    rows: Any  # the logits rows (0 .. bucket - 1) the final gather reads
    graph: Any  # what capture_graph returned: on CuPy the graph with the memory pool its scratch and plan are in
    logits: Any  # [bucket, vocab] on the device, rewritten by every replay


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[Any, Any]],
        block_size: int,
        pad_block: int,
        width: int,
        max_batch: int,
    ) -> None:
        """`pad_block`: a cache block no sequence uses; `width`: the most blocks a sequence can hold."""
        # engine/model_runner.py builds these only over a backend with capture_graph.
        self.model, self.backend, self.kv_caches = model, cast(GraphBackend, model.backend), kv_caches
        self.block_size, self.pad_block, self.width = block_size, pad_block, width
        # Buckets up to the backend's graph_max_rows: larger steps would call what a capture cannot hold.
        limit = getattr(self.backend, "graph_max_rows", max_batch)
        self.buckets = [b for b in graph_buckets(max_batch) if b <= limit] or [1]
        self.eager_from = self.buckets[-1] + 1  # buckets this large run eagerly (a capture failed)
        self._graphs: dict[int, _Graph] = {}

    def run(self, token_ids: list[int], positions: list[int], block_tables: list[list[int]]) -> Any | None:
        """Device logits [B, vocab] of a decode step of B sequences, or None when no graph can run it."""
        rows = bucket_for(len(token_ids), self.buckets)
        g = None if rows is None else self._graph(rows)
        if g is None:
            return None
        g.inputs.fill(token_ids, positions, block_tables, self.block_size, self.pad_block)
        self.backend.replay(g.graph)
        return g.logits[: len(token_ids)]

    def capture_all(self) -> None:
        """Capture every bucket now, smallest first (at load: a capture runs the model twice, which a step must
        not wait for); the first one CUDA refuses and every larger one stay eager."""
        start = time.perf_counter()
        for rows in self.buckets:
            if self._graph(rows) is None:
                break
        log.info(
            "captured decode steps of %s rows as CUDA graphs in %.2fs",
            ", ".join(map(str, sorted(self._graphs))) or "no",
            time.perf_counter() - start,
        )

    def _graph(self, rows: int) -> _Graph | None:
        """The graph of bucket `rows`, captured now if it was not yet; None where that bucket runs eagerly."""
        if rows >= self.eager_from:
            return None
        g = self._graphs.get(rows)
        if g is None:
            try:
                g = self._graphs[rows] = self._capture(rows)
            except Exception:
                log.warning(
                    "CUDA graph capture failed for %d rows: decode steps of that many run eagerly", rows, exc_info=True
                )
                self.eager_from = rows
                return None
        return g

    def _capture(self, rows: int) -> _Graph:
        inputs = PackedInputs(rows, self.width, self.backend)
        inputs.fill([], [], [], self.block_size, self.pad_block)  # all padding: capturing writes only the pad block
        meta = inputs.metadata(self.block_size)
        logits_rows = self.backend.asarray(np.arange(rows, dtype=np.int64))
        d = inputs.d
        graph, logits = self.backend.capture_graph(
            lambda: self.model.forward_device(d["token_ids"], d["positions"], meta, self.kv_caches, logits_rows)
        )
        return _Graph(inputs, meta, logits_rows, graph, logits)

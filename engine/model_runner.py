"""The model runner: owns the KV tensors, turns one scheduled batch into model inputs, runs the
forward and returns the logits rows that were asked for, left on the backend (the device on CuPy).
Plain decode steps (one new token and one logits row a sequence) replay a CUDA graph where the
backend can capture one (engine/decode_graphs.py; every bucket captured here, at load); prefill chunks and
speculative verification run eagerly."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.decode_graphs import DecodeGraphs
from engine.loader import LoadedModel
from engine.model.llama import LlamaModel
from engine.op_profile import OpProfile
from kernels.attention_meta import build_attention_metadata


@dataclass(slots=True)
class SeqInput:
    """One sequence's part of a step: `tokens` sit at positions start .. start + len(tokens) - 1
    and go into the blocks of `block_table`; logits are wanted for the last `num_logits` of them, the final
    norm's output (embeddings) at `hidden` (indices into `tokens`)."""

    tokens: list[int]
    start: int
    block_table: list[int]
    num_logits: int
    hidden: range = range(0)


def kv_bytes_per_block(model: LoadedModel, block_size: int, itemsize: int = 4) -> int:
    c = model.config
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        cuda_graphs: bool = True,
    ) -> None:
        """`num_blocks` for the block manager; `cuda_graphs`: replay decode steps where the backend can."""
        self.model, self.backend, self.block_size = model, model.backend, block_size
        self.profile: OpProfile | None = None  # eager forwards timed op by op (Engine.profile_ops)
        c, be = loaded.config, self.backend
        graphs = cuda_graphs and hasattr(be, "capture_graph")
        cache_blocks = num_blocks + graphs  # + the graphs' pad block, which the block manager never hands out
        self.kv_caches = [
            (
                be.empty_kv_cache(cache_blocks, block_size, c.num_kv_heads, c.head_dim, be.kv_dtype),
                be.empty_kv_cache(cache_blocks, block_size, c.num_kv_heads, c.head_dim, be.kv_dtype),
            )
            for _ in range(c.num_layers)
        ]
        self.max_context = min(c.max_position, num_blocks * block_size)  # the most tokens a sequence holds
        width = -(-self.max_context // block_size)
        self.graphs = (
            DecodeGraphs(model, self.kv_caches, block_size, num_blocks, width, max_num_seqs) if graphs else None
        )
        if self.graphs is not None:
            self.graphs.capture_all()  # now, at load: never inside a step (or a benchmark's timed window)

    def read_block(self, block_id: int) -> np.ndarray:
        """A host copy of one block's K and V in every layer: [2 * layers, block_size, kv_heads, head_dim]."""
        be = self.backend
        return np.stack([be.to_numpy(cache[block_id]) for kv in self.kv_caches for cache in kv])

    def write_block(self, block_id: int, data: np.ndarray) -> None:
        """Put a `read_block` copy back into block `block_id`."""
        caches = [cache for kv in self.kv_caches for cache in kv]
        assert data.shape[0] == len(caches)
        for cache, part in zip(caches, data):
            self.backend.upload(cache[block_id], part)

    def run(self, inputs: list[SeqInput]) -> Any:
        """Write every input's K/V and return float32 logits [sum(num_logits), vocab] on the backend, in
        input order. On CuPy a graph's logits are its own buffer: valid until the next step.

        The step's wall time goes back to the backend (`end_step`): the CPU backend picks its thread
        count from such timings (kernels/thread_tuner.py)."""
        self.backend.begin_step(sum(len(x.tokens) for x in inputs))
        start = time.perf_counter()
        logits = self._forward(inputs)
        self.backend.end_step(time.perf_counter() - start)
        return logits

    def run_hidden(self, inputs: list[SeqInput]) -> tuple[Any, np.ndarray]:
        """`run` for a step with embeddings: (the logits asked for, None when none are; the final norm's
        output at every input's `hidden` rows, float32 on the host, in input order)."""
        self.backend.begin_step(sum(len(x.tokens) for x in inputs))
        start = time.perf_counter()
        token_ids, positions, meta, logits_rows = self._batch(inputs)
        row, hidden_rows = 0, []
        for x in inputs:
            hidden_rows += [row + i for i in x.hidden]
            row += len(x.tokens)
        out = self.model.forward_hidden(
            token_ids, positions, meta, self.kv_caches, logits_rows, np.asarray(hidden_rows, dtype=np.int64)
        )
        self.backend.end_step(time.perf_counter() - start)
        return out

    def _forward(self, inputs: list[SeqInput]) -> Any:
        if self.graphs is not None and all(len(x.tokens) == 1 and x.num_logits == 1 for x in inputs):
            logits = self.graphs.run(
                [x.tokens[0] for x in inputs], [x.start for x in inputs], [x.block_table for x in inputs]
            )
            if logits is not None:
                return logits
        token_ids, positions, meta, logits_rows = self._batch(inputs)
        if self.profile is not None:
            return self.profile.forward(self.model, token_ids, positions, meta, self.kv_caches, logits_rows)
        return self.model.forward_device(token_ids, positions, meta, self.kv_caches, logits_rows)

    def _batch(self, inputs: list[SeqInput]) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray]:
        """The model's inputs for a step: token ids, positions, attention metadata and the logits rows."""
        token_ids: list[int] = []
        positions, logits_rows = [], []
        query_lens, context_lens = [], []
        row = 0
        for x in inputs:
            n = len(x.tokens)
            token_ids += x.tokens
            positions.append(np.arange(x.start, x.start + n))
            query_lens.append(n)
            context_lens.append(x.start + n)
            row += n
            logits_rows.append(np.arange(row - x.num_logits, row))
        meta = build_attention_metadata(
            query_lens, context_lens, [x.block_table for x in inputs], self.block_size, self.backend
        )
        return (
            np.asarray(token_ids, dtype=np.int64),
            np.concatenate(positions),
            meta,
            np.concatenate(logits_rows).astype(np.int64),
        )

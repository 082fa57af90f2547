"""The model runner: owns the KV tensors, turns one scheduled batch into model inputs, runs the
forward and returns the logits rows that were asked for."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.loader import LoadedModel
from engine.model.llama import LlamaModel
from kernels.attention_meta import build_attention_metadata


@dataclass(slots=True)
class SeqInput:
    """One sequence's part of a step: `tokens` sit at positions start .. start + len(tokens) - 1
    and go into the blocks of `block_table`; logits are wanted for the last `num_logits` of them."""

    tokens: list[int]
    start: int
    block_table: list[int]
    num_logits: int


def kv_bytes_per_block(model: LoadedModel, block_size: int, itemsize: int = 4) -> int:
    c = model.config
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize


class ModelRunner:
    def __init__(self, loaded: LoadedModel, model: LlamaModel, num_blocks: int, block_size: int) -> None:
        self.model, self.backend, self.block_size = model, model.backend, block_size
        c = loaded.config
        self.kv_caches = [
            (
                self.backend.empty_kv_cache(num_blocks, block_size, c.num_kv_heads, c.head_dim, np.float32),
                self.backend.empty_kv_cache(num_blocks, block_size, c.num_kv_heads, c.head_dim, np.float32),
            )
            for _ in range(c.num_layers)
        ]

    def run(self, inputs: list[SeqInput]) -> np.ndarray:
        """Write every input's K/V and return float32 host logits [sum(num_logits), vocab], in input order."""
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
        meta = build_attention_metadata(query_lens, context_lens, [x.block_table for x in inputs], self.block_size, self.backend)
        return self.model.forward(
            np.asarray(token_ids, dtype=np.int64),
            np.concatenate(positions),
            meta,
            self.kv_caches,
            np.concatenate(logits_rows).astype(np.int64),
        )

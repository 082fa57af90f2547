"""Embeddings: pooling a sequence's final-norm output (the model's last hidden state) over its tokens.

`mean` averages every token's row, `last` takes the last token's, `cls` the first's; the vector is L2-normalised.
Rows arrive chunk by chunk as the prefill computes them; a sequence computed again from its start (preempted)
starts over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POOLINGS = ("mean", "last", "cls")
# GGUF `{arch}.pooling_type` (llama.cpp's enum llama_pooling_type) -> ours; NONE (0) and RANK (4) have no vector
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}


@dataclass(slots=True)
class Pooled:
    """One input's pooling state: `rows(start, n, length)` says which of a chunk's rows it needs."""

    kind: str
    total: np.ndarray | None = None  # float64: the rows' sum (mean) or the row (last, cls)

    def rows(self, start: int, n: int, length: int) -> range:
        """Indices into a chunk of `n` tokens at `start` (of `length`) whose final-norm output is needed."""
        if self.kind == "mean":
            return range(n)
        if self.kind == "cls":
            return range(0, 1) if start == 0 else range(0)
        return range(n - 1, n) if start + n == length else range(0)

    def add(self, hidden: np.ndarray, start: int) -> None:
        """Take the needed rows of a chunk at `start` (as `rows` named them)."""
        if start == 0:
            self.total = None  # a first chunk: whatever came before (a preempted run) is void
        if not len(hidden):
            return
        part = hidden.astype(np.float64).sum(axis=0) if self.kind == "mean" else hidden[-1].astype(np.float64)
        self.total = part if self.total is None else self.total + part

    def vector(self, length: int) -> np.ndarray:
        """The L2-normalised float32 embedding of a `length`-token input, all of whose rows were added."""
        assert self.total is not None, "no rows pooled"
        v = self.total / length if self.kind == "mean" else self.total
        norm = float(np.linalg.norm(v))
        return (v / norm if norm > 0 else v).astype(np.float32)

"""A scheduled batch as the model runner's inputs: which tokens each sequence runs, and which sample after."""

from __future__ import annotations

import time

from engine.metrics import EngineMetrics
from engine.model_runner import SeqInput
from engine.sequence import Sequence


def step_inputs(
    seqs: list[Sequence], num_new: list[int], metrics: EngineMetrics
) -> tuple[list[SeqInput], list[Sequence]]:
    """The model runner's inputs for a scheduled batch, and the sequences that sample after it. A sequence's first
    scheduling is stamped here (and its prompt counted in `metrics`)."""
    now = time.monotonic()
    inputs, sampling = [], []
    for seq, n in zip(seqs, num_new):
        if seq.first_scheduled is None:
            seq.first_scheduled = now
            if seq.index == 0 or seq.pooled is not None:
                metrics.prompt_tokens += seq.prompt_len
                metrics.cached_tokens += seq.num_cached
        start = seq.num_computed
        if seq.pooled is not None:
            rows = seq.pooled.rows(start, n, seq.num_tokens)
            inputs.append(SeqInput(seq.token_ids[start : start + n], start, seq.block_table, 0, rows))
        elif start + n - len(seq.draft) == seq.num_tokens:  # reaches the end: sample after it
            inputs.append(SeqInput(seq.token_ids[start:] + seq.draft, start, seq.block_table, 1 + len(seq.draft)))
            sampling.append(seq)
        else:
            inputs.append(SeqInput(seq.token_ids[start : start + n], start, seq.block_table, 0))
    return inputs, sampling

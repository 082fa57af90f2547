"""`Sampler`: one step's logits -> each sampling sequence's emitted tokens (accepted drafts + one).

It masks constrained rows on the backend (structured output), then picks the cheapest of three paths:
every row plain greedy -> the backend's argmax (ids and their logits leave it); every row one draw without
penalties, bias or draft -> the backend samples (ids and the logprobs asked for leave it); otherwise the
logits come to the host and engine/sampling.py samples and verifies there. A failing host batch is retried
sequence by sequence, so one bad request fails alone.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import numpy as np

from engine.sampling import (
    SampleOutput,
    SamplerRow,
    is_plain_greedy,
    is_single_draw,
    sample,
    sample_greedy,
    sample_on_backend,
)
from engine.sequence import Sequence
from engine.structured import Grammars
from engine.types import TokenLogprob
from kernels import Backend

log = logging.getLogger("forge.engine")

Emitted = tuple[list[int], list[TokenLogprob] | None]  # a sequence's tokens this step and their logprobs


class Sampler:
    """Samples and verifies on the backend where it can; never raises: a failure is that row's Exception."""

    def __init__(self, backend: Backend, grammars: Grammars) -> None:
        self.backend, self.grammars = backend, grammars

    def __call__(self, seqs: list[Sequence], logits: Any) -> list[Emitted | Exception]:
        """Per sequence: its emitted tokens and their logprobs, or the error. `logits` are the runner's rows
        (1 + len(draft) a sequence, in order), on the backend."""
        if not seqs:
            return []
        try:
            self._mask(seqs, logits)
        except Exception as exc:
            log.exception("structured output mask failed")
            return [RuntimeError(f"structured output failed: {exc}")] * len(seqs)
        rows = [SamplerRow(s.request.params, s.rng, s.token_ids, s.prompt_len, s.draft) for s in seqs]
        if all(is_plain_greedy(r.params) for r in rows):
            try:
                top, best = self.backend.argmax_rows(logits)
                return _split(sample_greedy(top, best, rows))
            except ValueError:
                pass  # a row with no usable token: the host path below singles its sequence out
        elif all(is_single_draw(r) for r in rows):  # sampled on the backend: ids and asked-for logprobs leave it
            try:
                return [*sample_on_backend(self.backend, logits, rows)]
            except Exception as exc:  # the rows' draws are spent: they fail rather than draw again
                log.exception("sampling failed")
                return [RuntimeError(f"sampling failed: {exc}")] * len(seqs)
        host = self.backend.to_numpy(logits)
        try:
            return _split(sample(host, rows))
        except Exception:
            pass
        # Find the culprit: sample sequence by sequence so that one bad request fails alone.
        results: list[Emitted | Exception] = []
        start = 0
        for seq, row in zip(seqs, rows):
            end = start + 1 + len(row.draft)
            try:
                results += _split(sample(host[start:end], [row]))
            except Exception as exc:
                log.exception("sampling failed for request %s", seq.request_id)
                results.append(ValueError(f"sampling failed: {exc}"))
            start = end
        return results

    def _mask(self, seqs: list[Sequence], logits: Any) -> None:
        """Structured output: disallowed tokens of every constrained row get -inf (one batched fill)."""
        rows: list[int] = []
        work, row = [], 0
        for seq in seqs:
            n = 1 + len(seq.draft)
            if seq.matcher is not None:
                work.append((seq.matcher, len(rows), seq.draft))
                rows += range(row, row + n)
            row += n
        if not work:
            return
        bitmask = self.grammars.fill(work, len(rows))
        if len(rows) == logits.shape[0]:
            self.backend.apply_token_bitmask(logits, bitmask)
        else:
            index = self.backend.asarray(np.asarray(rows, dtype=np.int64))
            part = logits[index]
            self.backend.apply_token_bitmask(part, bitmask)
            logits[index] = part


def _split(out: SampleOutput) -> list[Emitted | Exception]:
    """Per sequence: (its emitted tokens, their logprobs or None)."""
    results: list[Emitted | Exception] = []
    start = 0
    tokens = out.token_ids.tolist()
    for n in out.num_tokens:
        lps = out.logprobs[start : start + n]
        results.append((tokens[start : start + n], None if lps[0] is None else cast(list[TokenLogprob], lps)))
        start += n
    return results

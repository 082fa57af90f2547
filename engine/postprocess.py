"""`Postprocessor`: what a step's results do to its sequences: prefill chunks committed, embeddings pooled, sampled
tokens accepted up to the first finish (EOS, stop, length), and ended sequences' final events.

The last part of `LLMEngine.step()` (schedule -> run -> postprocess); it owns no state of its own.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from engine.metrics import EngineMetrics
from engine.model_runner import SeqInput
from engine.request_groups import RequestGroups, pooled_inputs
from engine.sampler import Emitted
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import Sequence
from engine.types import GenerationEvent, Timings, TokenLogprob, Usage

log = logging.getLogger("forge.engine")


class Postprocessor:
    """Applies a step's results; `eos_ids` end a sample (unless it ignores EOS), `max_context` caps its length."""

    __slots__ = ("eos_ids", "max_context", "blocks", "scheduler", "groups", "metrics")

    def __init__(
        self,
        eos_ids: frozenset[int],
        max_context: int,
        scheduler: Scheduler,
        groups: RequestGroups,
        metrics: EngineMetrics,
    ) -> None:
        self.eos_ids, self.max_context = eos_ids, max_context
        self.scheduler, self.blocks, self.groups, self.metrics = scheduler, scheduler.blocks, groups, metrics

    def computed(
        self, batch: ScheduledBatch, inputs: list[SeqInput], hidden: np.ndarray | None
    ) -> list[GenerationEvent]:
        """Prefill chunks short of the end move on (the others move on in `accept`); embeddings are pooled, an
        input computed to its end is done."""
        for seq, n, x in zip(batch.seqs, batch.num_new, inputs):
            if not x.num_logits:
                seq.num_computed += n
                if seq.pooled is None:
                    self.blocks.commit(seq)  # an embedding's blocks are never offered to the prefix cache
        if hidden is None:
            return []
        return [self.finish(seq, "stop", embedding=vector) for seq, vector in pooled_inputs(batch.seqs, inputs, hidden)]

    def sampled(self, sampling: list[Sequence], results: list[Emitted | Exception]) -> list[GenerationEvent]:
        """Each sampling sequence's tokens accepted (or its failure ended it)."""
        events: list[GenerationEvent] = []
        generated = 0
        now = time.monotonic()  # the tokens exist from here (TTFT)
        for seq, result in zip(sampling, results):
            if isinstance(result, Exception):
                events.append(self.finish(seq, "error", str(result)))
                continue
            tokens, logprobs = result
            generated += len(tokens)
            try:
                events += self.accept(seq, tokens, logprobs, now)
            except Exception as exc:
                log.exception("post-processing failed for request %s", seq.request_id)
                events.append(self.finish(seq, "error", f"token post-processing failed: {exc}"))
        self.metrics.step_done(generated)
        return events

    def accept(
        self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None, now: float
    ) -> list[GenerationEvent]:
        """Take the step's emitted tokens up to the first finish (EOS, stop, length): KV is kept for all
        but the last, the blocks past it (rejected draft slots) are given back, full ones are cached."""
        drafted = len(seq.draft)
        if drafted:
            self.metrics.verified(drafted, len(tokens) - 1)
        seq.draft = []
        if seq.first_token is None:
            seq.first_token = now
        params = seq.request.params
        reason = None
        parts = []
        before = seq.num_tokens
        if logprobs is not None:
            for lp in logprobs:  # a token the constraint or the sampler rules out (-inf) is no alternative
                if lp.top and not math.isfinite(lp.top[-1][1]):
                    lp.top = [t for t in lp.top if math.isfinite(t[1])]
        sent: list[tuple[int, TokenLogprob | None]] = []  # with `seq.calls`: the tokens whose text went out
        for i, token in enumerate(tokens, 1):
            eos = (not params.ignore_eos and token in self.eos_ids) or token in params.stop_token_ids
            text = "" if eos else seq.detok.push(token)
            if seq.calls is not None:
                text, items = seq.calls.push(text, (token, logprobs[i - 1] if logprobs is not None else None))
                sent += items
            parts.append(text)
            if eos or seq.detok.stopped or (seq.calls is not None and seq.calls.stopped):
                reason = "stop"
            if reason is None and (before + i - seq.prompt_len >= params.max_tokens or before + i >= self.max_context):
                reason = "length"
            if reason is not None:
                tokens = tokens[:i]  # accepted drafts past the end are not output
                break
        seq.token_ids += tokens
        if seq.drafter is not None:
            seq.drafter.observe(seq.token_ids)
        seq.num_computed = seq.num_tokens - 1  # the last token's KV comes with the next step
        self.blocks.trim(seq)
        self.blocks.commit(seq)
        if seq.matcher is not None and reason is None and not seq.matcher.consume_tokens(tokens):
            return [self.finish(seq, "error", f"grammar refused a sampled token: {seq.matcher.get_error()}")]
        if seq.calls is not None:  # a repeated call's tokens (held, then dropped) are counted in usage only
            tokens, logprobs = _unzip(sent, logprobs is not None)
        elif logprobs is not None:
            logprobs = logprobs[: len(tokens)]
        delta = GenerationEvent(seq.request_id, seq.index, "".join(parts), tokens, logprobs)
        if reason is None:
            return [delta]
        return [delta, self.finish(seq, reason)]

    def finish(
        self, seq: Sequence, reason: str, error: str | None = None, embedding: np.ndarray | None = None
    ) -> GenerationEvent:
        """End `seq`, free its blocks and build its final event."""
        tail = seq.detok.finish() if reason != "error" else ""  # held-back text is part of the reply
        tokens: list[int] = []
        logprobs: list[TokenLogprob] | None = None
        if seq.calls is not None and reason != "error":
            tail, items = seq.calls.finish(tail)
            tokens, logprobs = _unzip(items, seq.request.params.logprobs is not None)
        self.scheduler.finish(seq)
        seq.finish_reason, seq.error = reason, error
        self.metrics.finished[reason] += 1
        for sib in self.groups.remove(seq):  # sample 0 ended before releasing its siblings: they go on without it
            self.scheduler.add(sib, front=True)
        now = time.monotonic()
        start = seq.first_scheduled or now
        timings = Timings(
            queued=start - seq.arrival,
            ttft=(seq.first_token - seq.arrival) if seq.first_token else 0.0,
            total=now - seq.arrival,
        )
        usage = Usage(seq.prompt_len, seq.num_cached, seq.num_output)
        return GenerationEvent(
            seq.request_id, seq.index, tail, tokens, logprobs, reason, usage, timings, error, embedding
        )

    def end_group(self, request_id: str, reason: str, error: str | None = None) -> list[GenerationEvent]:
        """End every sample of a request (those still waiting for the prompt's blocks too)."""
        return [self.finish(s, reason, error) for s in self.groups.end(request_id)]


def _unzip(
    items: list[tuple[int, TokenLogprob | None]], with_logprobs: bool
) -> tuple[list[int], list[TokenLogprob] | None]:
    """(token, logprob) pairs as an event's token ids and logprobs (None when the request asked for none)."""
    return [t for t, _ in items], [lp for _, lp in items if lp is not None] if with_logprobs else None

"""The synchronous engine core: `step()` = draft -> schedule -> run the model -> mask, sample and
verify -> accept and emit.

Single-threaded by design: the async façade (engine/engine.py) drives it from one
long-lived thread. Tests and the benchmark may drive it directly.
"""
from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.kv_cache import BlockManager
from engine.loader import LoadedModel
from engine.metrics import EngineMetrics
from engine.model.llama import LlamaModel
from engine.model_runner import ModelRunner, SeqInput, kv_bytes_per_block
from engine.sampling import (
    SampleOutput, SamplerRow, is_plain_greedy, is_single_draw, make_rng, sample, sample_greedy, sample_on_backend,
)
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.spec_policy import SpecPolicy
from engine.speculative import Drafter, SpecConfig
from engine.structured import Grammars
from engine.tokenizer import IncrementalDetokenizer
from engine.types import (
    EngineOverloaded,
    GenerationEvent,
    GenerationRequest,
    InvalidRequest,
    Timings,
    TokenLogprob,
    Usage,
)

log = logging.getLogger("forge.engine")


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    kv_memory: int = 1 << 30  # bytes for K and V of all layers
    max_num_seqs: int = 64
    max_batched_tokens: int = 512
    max_waiting: int = 256
    speculative: SpecConfig = field(default_factory=SpecConfig)
    cuda_graphs: bool = True  # replay plain decode steps from CUDA graphs where the backend can (engine/decode_graphs.py)


class LLMEngine:
    def __init__(self, loaded: LoadedModel, model: LlamaModel, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.config.speculative.check()
        self.loaded, self.model = loaded, model
        self.backend = model.backend
        self.tokenizer = loaded.tokenizer
        mc = loaded.config
        bs = self.config.block_size
        num_blocks = self.config.kv_memory // kv_bytes_per_block(loaded, bs, np.dtype(self.backend.kv_dtype).itemsize)
        if num_blocks < 2:
            raise ValueError(f"kv_memory {self.config.kv_memory} bytes holds fewer than 2 blocks of {bs} tokens")
        self.runner = ModelRunner(loaded, model, num_blocks, bs, self.config.max_num_seqs, self.config.cuda_graphs)
        self.blocks = BlockManager(num_blocks, bs)
        self.scheduler = Scheduler(
            SchedulerConfig(self.config.max_num_seqs, self.config.max_batched_tokens, self.config.max_waiting),
            self.blocks,
        )
        self.max_context = self.runner.max_context
        self.eos_ids = frozenset(mc.eos_token_ids)
        self.grammars = Grammars(self.tokenizer, mc.vocab_size, sorted(self.eos_ids))
        self.metrics = EngineMetrics()
        self.spec_policy = SpecPolicy(self.config.speculative.row_cost)
        self._seq_ids = itertools.count()
        self._groups: dict[str, list[Sequence]] = {}  # request id -> its live sequences
        self._pending_siblings: dict[str, list[Sequence]] = {}  # n > 1: wait for the prompt's blocks
        self._num_deadlines = 0  # live requests with a timeout: _expire has nothing to scan without one

    # ---- requests ------------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        """Raise InvalidRequest for anything that can never run (compiling its constraint, if any)."""
        ids = req.prompt_token_ids
        vocab = self.loaded.config.vocab_size
        if not ids:
            raise InvalidRequest("prompt is empty", param="prompt")
        if min(ids) < 0 or max(ids) >= vocab:
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if len(ids) >= self.max_context:
            raise InvalidRequest(
                f"prompt has {len(ids)} tokens; this engine's context is {self.max_context}", param="messages"
            )
        req.params.validate(vocab)
        if req.timeout_s is not None and not req.timeout_s > 0:
            raise InvalidRequest("timeout must be > 0 seconds", param="timeout")
        self._check_fits(len(ids), req.params.n, req.params.max_tokens)
        if req.params.response_format is not None:
            self.grammars.compile(req.params.response_format)

    def _check_fits(self, prompt_len: int, n: int, max_tokens: int) -> None:
        """Refuse n samples that could never hold their KV at once: each holds a block for every
        `block_size` of its tokens but the last (one that reaches the context's end stops there), and
        the prompt's full blocks are computed once and shared (the prefix cache always leaves the
        prompt's last token to compute, so its block is each sample's own)."""
        bs, total = self.blocks.block_size, self.blocks.num_blocks

        def blocks(length: int) -> int:
            shared = (prompt_len - 1) // bs
            return shared + n * (-(-(min(length, self.max_context) - 1) // bs) - shared)

        need = blocks(prompt_len + max_tokens)
        if need > total:
            param = "max_tokens" if blocks(prompt_len + 1) <= total else "n"
            raise InvalidRequest(
                f"{n} samples of a {prompt_len}-token prompt plus up to {max_tokens} tokens need {need} KV blocks of "
                f"{bs} tokens; this engine holds {total}: ask for fewer samples (n) or a shorter reply (max_tokens)",
                param=param)

    def add_request(self, req: GenerationRequest, arrival: float | None = None) -> None:
        self.validate(req)
        if req.request_id in self._groups:
            raise InvalidRequest(f"request id {req.request_id!r} is already running", param="request_id")
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"server overloaded: {len(self.scheduler.waiting)} requests already waiting")
        arrival = time.monotonic() if arrival is None else arrival
        deadline = arrival + req.timeout_s if req.timeout_s else None
        params = req.params
        spec = self.config.speculative
        drafting = (params.speculative or spec.mode) == "ngram"
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request=req,
                index=i,
                token_ids=list(req.prompt_token_ids),
                prompt_len=len(req.prompt_token_ids),
                rng=make_rng(params.seed, i) if params.temperature > 0 else None,
                detok=IncrementalDetokenizer(self.tokenizer, stop=params.stop),
                matcher=self.grammars.matcher(params.response_format) if params.response_format else None,
                drafter=Drafter(len(req.prompt_token_ids), self.spec_policy.acceptance,
                                params.temperature == 0.0) if drafting else None,
                arrival=arrival,
                deadline=deadline,
            )
            for i in range(params.n)
        ]
        self._groups[req.request_id] = seqs
        self._num_deadlines += deadline is not None
        self.scheduler.add(seqs[0])
        if len(seqs) > 1:
            self._pending_siblings[req.request_id] = seqs[1:]

    def abort(self, request_id: str) -> list[GenerationEvent]:
        return self._end_group(request_id, "abort")

    def is_running(self, request_id: str) -> bool:
        return request_id in self._groups

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending_siblings)

    # ---- the step ------------------------------------------------------------------
    def step(self) -> list[GenerationEvent]:
        started = time.perf_counter()
        events = self._expire(time.monotonic())
        self._propose_drafts()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return events
        now = time.monotonic()
        inputs, sampling = [], []
        for seq, n in zip(batch.seqs, batch.num_new):
            if seq.first_scheduled is None:
                seq.first_scheduled = now
                if seq.index == 0:
                    self.metrics.prompt_tokens += seq.prompt_len
                    self.metrics.cached_tokens += seq.num_cached
            start = seq.num_computed
            if start + n - len(seq.draft) == seq.num_tokens:  # reaches the end: sample after it
                inputs.append(SeqInput(seq.token_ids[start:] + seq.draft, start, seq.block_table, 1 + len(seq.draft)))
                sampling.append(seq)
            else:
                inputs.append(SeqInput(seq.token_ids[start : start + n], start, seq.block_table, 0))
        decode_rows = sum(x.num_logits for x in inputs) if all(x.num_logits == len(x.tokens) for x in inputs) else 0
        try:
            logits = self.runner.run(inputs)
        except Exception as exc:  # the model itself failed: these sequences cannot go on
            log.exception("model step failed")
            return events + [self._finish(s, "error", f"model step failed: {exc}") for s in batch.seqs]

        for seq, n, x in zip(batch.seqs, batch.num_new, inputs):
            if not x.num_logits:  # a prefill chunk short of the end; the others move on in _accept
                seq.num_computed += n
                self.blocks.commit(seq)
        generated = 0
        results = self._sample(sampling, logits)
        now = time.monotonic()  # the tokens exist from here (TTFT)
        for seq, result in zip(sampling, results):
            if isinstance(result, Exception):
                events.append(self._finish(seq, "error", str(result)))
                continue
            tokens, logprobs = result
            generated += len(tokens)
            try:
                events += self._accept(seq, tokens, logprobs, now)
            except Exception as exc:
                log.exception("post-processing failed for request %s", seq.request_id)
                events.append(self._finish(seq, "error", f"token post-processing failed: {exc}"))
        self.metrics.step_done(generated)
        if decode_rows:  # what a decode step of this many rows (sequences + drafts) costs, drafting included
            self.spec_policy.cost.observe(decode_rows, time.perf_counter() - started)
        self._release_siblings()
        return events

    def _propose_drafts(self) -> None:
        """Drafts for decoding sequences, each as long as it pays for the whole step (engine/spec_policy.py)."""
        spec = self.config.speculative
        decoding = [s for s in self.scheduler.running if s.remaining == 1]
        rows, tokens = len(decoding), float(len(decoding))  # the step's rows and expected tokens so far
        for seq in decoding:
            seq.draft = []
            if seq.drafter is None:
                continue
            params = seq.request.params
            limit = min(spec.max_k, spec.max_rows - rows, params.max_tokens - seq.num_output - 1,
                        self.max_context - seq.num_tokens - 1)
            k, gain = self.spec_policy.length(seq.drafter, rows, tokens, limit)
            draft = seq.drafter.draft(seq.token_ids, k)
            if draft and seq.matcher is not None:  # only grammar-valid drafts are scored
                draft = draft[: seq.matcher.validate_tokens(draft)]
            seq.draft = draft
            rows += len(draft)
            tokens += gain

    def _sample(self, seqs: list[Sequence], logits: Any) -> list[tuple[list[int], list[TokenLogprob] | None] | Exception]:
        """Per sequence: its emitted tokens (accepted drafts + one) and their logprobs, or the error.

        `logits` are the runner's, on the backend: masked there; when every sequence is plain greedy only
        each row's argmax and its logit come back to the host; when every sequence takes one token without
        penalties or bias the backend samples (one uniform a row drawn here) and returns token ids and the
        logprobs asked for; otherwise the logits come back and are sampled on the host."""
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
                return _split(sample_greedy(*self.backend.argmax_rows(logits), rows))
            except ValueError:
                pass  # a row with no usable token: the host path below singles its sequence out
        elif all(is_single_draw(r) for r in rows):  # sampled on the backend: ids and asked-for logprobs leave it
            try:
                return sample_on_backend(self.backend, logits, rows)
            except Exception as exc:  # the rows' draws are spent: they fail rather than draw again
                log.exception("sampling failed")
                return [RuntimeError(f"sampling failed: {exc}")] * len(seqs)
        logits = self.backend.to_numpy(logits)
        try:
            return _split(sample(logits, rows))
        except Exception:
            pass
        # Find the culprit: sample sequence by sequence so that one bad request fails alone.
        results: list = []
        start = 0
        for seq, row in zip(seqs, rows):
            end = start + 1 + len(row.draft)
            try:
                results += _split(sample(logits[start:end], [row]))
            except Exception as exc:
                log.exception("sampling failed for request %s", seq.request_id)
                results.append(ValueError(f"sampling failed: {exc}"))
            start = end
        return results

    def _mask(self, seqs: list[Sequence], logits: Any) -> None:
        """Structured output: disallowed tokens of every constrained row get -inf (one batched fill)."""
        rows, work, row = [], [], 0
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

    def _accept(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None, now: float) -> list[GenerationEvent]:
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
        for i, token in enumerate(tokens, 1):
            if (not params.ignore_eos and token in self.eos_ids) or token in params.stop_token_ids:
                reason = "stop"
            else:
                parts.append(seq.detok.push(token))
                if seq.detok.stopped:
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
            return [self._finish(seq, "error", f"grammar refused a sampled token: {seq.matcher.get_error()}")]
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
            for lp in logprobs:  # a token the constraint or the sampler rules out (-inf) is no alternative
                if lp.top and not math.isfinite(lp.top[-1][1]):
                    lp.top = [t for t in lp.top if math.isfinite(t[1])]
        delta = GenerationEvent(seq.request_id, seq.index, "".join(parts), tokens, logprobs)
        if reason is None:
            return [delta]
        return [delta, self._finish(seq, reason)]

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> GenerationEvent:
        """End `seq`, free its blocks and build its final event."""
        tail = seq.detok.finish() if reason != "error" else ""  # held-back text is part of the reply
        self.scheduler.finish(seq)
        seq.finish_reason, seq.error = reason, error
        self.metrics.finished[reason] += 1
        group = self._groups.get(seq.request_id, [])
        if seq in group:
            group.remove(seq)
        siblings = self._pending_siblings.get(seq.request_id)
        if not group and self._groups.pop(seq.request_id, None) is not None:
            self._pending_siblings.pop(seq.request_id, None)
            self._num_deadlines -= seq.deadline is not None
        elif siblings and seq.index == 0:
            # Sample 0 ended before releasing its siblings (it failed alone, or stopped at its
            # first token): they go on without it.
            for sib in self._pending_siblings.pop(seq.request_id):
                self.scheduler.add(sib, front=True)
        now = time.monotonic()
        start = seq.first_scheduled or now
        timings = Timings(
            queued=start - seq.arrival,
            ttft=(seq.first_token - seq.arrival) if seq.first_token else 0.0,
            total=now - seq.arrival,
        )
        usage = Usage(seq.prompt_len, seq.num_cached, seq.num_output)
        return GenerationEvent(seq.request_id, seq.index, tail, [], None, reason, usage, timings, error)

    def _release_siblings(self) -> None:
        for rid, siblings in list(self._pending_siblings.items()):
            leader = self._groups[rid][0] if self._groups.get(rid) else None
            if leader is None or leader.index != 0 or leader.num_computed >= leader.prompt_len:
                # To the front: they should find the prompt's blocks still cached.
                for sib in reversed(self._pending_siblings.pop(rid)):
                    self.scheduler.add(sib, front=True)

    def _expire(self, now: float) -> list[GenerationEvent]:
        if not self._num_deadlines:
            return []
        expired = [rid for rid, group in self._groups.items() if group[0].deadline is not None and now >= group[0].deadline]
        return [ev for rid in expired for ev in self._end_group(rid, "timeout")]

    def _end_group(self, request_id: str, reason: str, error: str | None = None) -> list[GenerationEvent]:
        """End every sample of a request (those still waiting for the prompt's blocks too)."""
        self._pending_siblings.pop(request_id, None)
        return [self._finish(s, reason, error) for s in list(self._groups.get(request_id, []))]

    def fail_all(self, message: str) -> list[GenerationEvent]:
        return [ev for rid in list(self._groups) for ev in self._end_group(rid, "error", message)]

    def abort_all(self) -> list[GenerationEvent]:
        return [ev for rid in list(self._groups) for ev in self._end_group(rid, "abort")]

    # ---- numbers for /metrics and the admin page ------------------------------------
    def stats(self) -> dict:
        """A snapshot; safe to call from any thread (it copies what the step thread mutates)."""
        ps = self.blocks.stats
        return {
            "waiting": len(self.scheduler.waiting) + sum(map(len, list(self._pending_siblings.values()))),
            "running": len(self.scheduler.running),
            "kv_blocks_used": self.blocks.num_used,
            "kv_blocks_total": self.blocks.num_blocks,
            "kv_usage": self.blocks.num_used / self.blocks.num_blocks,
            "prefix_queried_tokens": ps.queried_tokens,
            "prefix_hit_tokens": ps.hit_tokens,
            "prefix_hit_rate": ps.hit_tokens / ps.queried_tokens if ps.queried_tokens else 0.0,
            "prefix_evictions": ps.evictions,
            "preemptions": self.scheduler.num_preemptions,
            "speculative": self.config.speculative.mode,
            **self.metrics.snapshot(),
        }


def _split(out: SampleOutput) -> list[tuple[list[int], list[TokenLogprob] | None]]:
    """Per sequence: (its emitted tokens, their logprobs or None)."""
    results, start = [], 0
    tokens = out.token_ids.tolist()
    for n in out.num_tokens:
        lps = out.logprobs[start : start + n]
        results.append((tokens[start : start + n], None if lps[0] is None else lps))
        start += n
    return results

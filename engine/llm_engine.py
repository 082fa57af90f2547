"""The synchronous engine core: `step()` = schedule -> run the model -> sample -> accept -> emit.

Single-threaded by design: the async façade (engine/engine.py) drives it from one long-lived thread. Tests
and the benchmark may drive it directly. Its parts: drafts (engine/spec_policy.py), the batch
(engine/scheduler.py), the forward (engine/model_runner.py), masking and sampling (engine/sampler.py), a
request's samples and deadline (engine/request_groups.py), checks before queueing (engine/validate.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.kv_cache import BlockManager
from engine.kv_spill import KVSpill
from engine.kv_spill_file import file_size
from engine.loader import LoadedModel
from engine.metrics import EngineMetrics
from engine.model.llama import LlamaModel
from engine.model_runner import ModelRunner, SeqInput, kv_bytes_per_block
from engine.pooling import Pooled
from engine.request_groups import RequestGroups
from engine.sampler import Sampler
from engine.sampling import make_rng
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.spec_policy import SpecPolicy
from engine.speculative import Drafter, SpecConfig
from engine.stats import engine_stats
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
from engine.validate import RequestValidator

log = logging.getLogger("forge.engine")


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    kv_memory: int = 1 << 30  # bytes for K and V of all layers
    max_num_seqs: int = 64
    max_batched_tokens: int = 512
    max_waiting: int = 256
    speculative: SpecConfig = field(default_factory=SpecConfig)
    cuda_graphs: bool = (
        True  # replay plain decode steps from CUDA graphs where the backend can (engine/decode_graphs.py)
    )
    kv_spill_dir: str | None = None  # evicted prefix blocks go to files here (engine/kv_spill.py) ...
    kv_spill_size: int = 0  # ... within this many bytes; 0: no spill tier


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
        if self.config.kv_spill_size:
            if not self.config.kv_spill_dir:
                raise ValueError("kv_spill_size is set but kv_spill_dir is not")
            self.blocks.spill = self.spill_tier(self.config.kv_spill_dir, self.config.kv_spill_size)
        self.scheduler = Scheduler(
            SchedulerConfig(self.config.max_num_seqs, self.config.max_batched_tokens, self.config.max_waiting),
            self.blocks,
        )
        self.max_context = self.runner.max_context
        self.eos_ids = frozenset(mc.eos_token_ids)
        self.grammars = Grammars(self.tokenizer, mc.vocab_size, sorted(self.eos_ids))
        self.validate = RequestValidator(mc.vocab_size, self.max_context, self.blocks, self.grammars)
        self.sampler = Sampler(self.backend, self.grammars)
        self.metrics = EngineMetrics()
        self.spec_policy = SpecPolicy(self.config.speculative.row_cost)
        self._groups = RequestGroups()
        self._seq_ids = itertools.count()

    def spill_tier(self, directory: str, capacity: int) -> KVSpill:
        """A spill tier for this engine's blocks in `directory` (files named for this model, backend and KV
        layout), at most `capacity` bytes. ValueError when no block file fits or the folder is unusable."""
        c, be, m = self.loaded.config, self.backend, self.loaded
        kv_dtype = np.dtype(be.kv_dtype)
        shape = (2 * c.num_layers, self.config.block_size, c.num_kv_heads, c.head_dim)
        size = file_size(self.config.block_size, int(np.prod(shape)) * kv_dtype.itemsize)
        if capacity < size:
            raise ValueError(
                f"kv_spill_size {capacity} bytes holds no block file ({size} bytes each for this "
                f"model); 0 turns the spill tier off"
            )
        try:
            file_bytes = os.path.getsize(m.path) if os.path.isfile(m.path) else 0
        except OSError:
            file_bytes = 0
        layout = "|".join(
            str(x)
            for x in (
                m.name,
                os.path.basename(m.path),
                file_bytes,
                c.arch,
                m.quant,
                self.model.weight_bytes,
                be.name,
                getattr(be, "activations", "f32"),
                kv_dtype.str,
                shape,
            )
        )
        try:
            return KVSpill(
                directory, capacity, layout, shape, kv_dtype, self.runner.read_block, self.runner.write_block
            )
        except OSError as exc:
            raise ValueError(f"kv_spill_dir {directory!r} is not a usable folder: {exc}") from None

    def close(self, timeout: float | None = None) -> None:
        """The step loop has stopped: the cached blocks go to the spill tier (a restart warms from them), its writes
        finish (within `timeout` seconds)."""
        if self.blocks.spill is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            self.blocks.spill_cached(deadline)
            self.blocks.spill.close(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # ---- requests ------------------------------------------------------------------
    def add_request(self, req: GenerationRequest, arrival: float | None = None) -> None:
        self.validate(req)
        if req.request_id in self._groups:
            raise InvalidRequest(f"request id {req.request_id!r} is already running", param="request_id")
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"server overloaded: {len(self.scheduler.waiting)} requests already waiting")
        arrival = time.monotonic() if arrival is None else arrival
        deadline = arrival + req.timeout_s if req.timeout_s else None
        params = req.params
        drafting = (params.speculative or self.config.speculative.mode) == "ngram"
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
                drafter=Drafter(len(req.prompt_token_ids), self.spec_policy.acceptance, params.temperature == 0.0)
                if drafting
                else None,
                arrival=arrival,
                deadline=deadline,
            )
            for i in range(params.n)
        ]
        for seq in self._groups.add(seqs):
            self.scheduler.add(seq)

    def add_embedding(
        self,
        request_id: str,
        inputs: list[list[int]],
        pooling: str,
        truncate: bool = False,
        arrival: float | None = None,
    ) -> None:
        """Queue an embedding request: each input a sequence whose prompt is computed (chunked, batched with
        everything else) and pooled, its KV dropped after; one final event per input carries its vector.
        `pooling` yields to the model's own (its GGUF `pooling_type`)."""
        inputs = self.validate.embedding(inputs, pooling, truncate)
        if request_id in self._groups:
            raise InvalidRequest(f"request id {request_id!r} is already running", param="request_id")
        arrival = time.monotonic() if arrival is None else arrival
        kind = self.loaded.pooling or pooling
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request=GenerationRequest(ids, request_id=request_id),
                index=i,
                token_ids=list(ids),
                prompt_len=len(ids),
                rng=None,
                detok=IncrementalDetokenizer(self.tokenizer),
                arrival=arrival,
                pooled=Pooled(kind),
            )
            for i, ids in enumerate(inputs)
        ]
        for seq in self._groups.add(seqs, share_prompt=False):
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> list[GenerationEvent]:
        return self._end_group(request_id, "abort")

    def is_running(self, request_id: str) -> bool:
        return request_id in self._groups

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._groups.has_pending

    # ---- the step ------------------------------------------------------------------
    def step(self) -> list[GenerationEvent]:
        started = time.perf_counter()
        events = [ev for rid in self._groups.expired(time.monotonic()) for ev in self._end_group(rid, "timeout")]
        for seq in self._groups.refill():  # embedding inputs, a window at a time
            self.scheduler.add(seq)
        self.spec_policy.propose(
            [s for s in self.scheduler.running if s.remaining == 1], self.config.speculative, self.max_context
        )
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return events
        inputs, sampling = self._inputs(batch.seqs, batch.num_new)
        decode_rows = sum(x.num_logits for x in inputs) if all(x.num_logits == len(x.tokens) for x in inputs) else 0
        hidden = None
        try:
            if any(s.pooled is not None for s in batch.seqs):
                logits, hidden = self.runner.run_hidden(inputs)
            else:
                logits = self.runner.run(inputs)
        except Exception as exc:  # the model itself failed: these sequences cannot go on
            log.exception("model step failed")
            return events + [self._finish(s, "error", f"model step failed: {exc}") for s in batch.seqs]

        for seq, n, x in zip(batch.seqs, batch.num_new, inputs):
            if not x.num_logits:  # a prefill chunk short of the end; the others move on in _accept
                seq.num_computed += n
                if seq.pooled is None:
                    self.blocks.commit(seq)  # an embedding's blocks are never offered to the prefix cache
        if hidden is not None:
            events += self._pool(batch.seqs, inputs, hidden)
        generated = 0
        results = self.sampler(sampling, logits)
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
        for siblings in self._groups.ready_siblings():  # to the front: they should find the prompt's blocks cached
            for sib in reversed(siblings):
                self.scheduler.add(sib, front=True)
        return events

    def _inputs(self, seqs: list[Sequence], num_new: list[int]) -> tuple[list[SeqInput], list[Sequence]]:
        """The model runner's inputs for a scheduled batch, and the sequences that sample after it."""
        now = time.monotonic()
        inputs, sampling = [], []
        for seq, n in zip(seqs, num_new):
            if seq.first_scheduled is None:
                seq.first_scheduled = now
                if seq.index == 0 or seq.pooled is not None:
                    self.metrics.prompt_tokens += seq.prompt_len
                    self.metrics.cached_tokens += seq.num_cached
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

    def _pool(self, seqs: list[Sequence], inputs: list[SeqInput], hidden: np.ndarray) -> list[GenerationEvent]:
        """Pool the step's hidden rows into their embeddings; an input computed to its end is done."""
        events, row = [], 0
        for seq, x in zip(seqs, inputs):
            if seq.pooled is None:
                continue
            seq.pooled.add(hidden[row : row + len(x.hidden)], x.start)
            row += len(x.hidden)
            if seq.num_computed == seq.num_tokens:
                events.append(self._finish(seq, "stop", embedding=seq.pooled.vector(seq.num_tokens)))
        return events

    def _accept(
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

    def _finish(
        self, seq: Sequence, reason: str, error: str | None = None, embedding: np.ndarray | None = None
    ) -> GenerationEvent:
        """End `seq`, free its blocks and build its final event."""
        tail = seq.detok.finish() if reason != "error" else ""  # held-back text is part of the reply
        self.scheduler.finish(seq)
        seq.finish_reason, seq.error = reason, error
        self.metrics.finished[reason] += 1
        for sib in self._groups.remove(seq):  # sample 0 ended before releasing its siblings: they go on without it
            self.scheduler.add(sib, front=True)
        now = time.monotonic()
        start = seq.first_scheduled or now
        timings = Timings(
            queued=start - seq.arrival,
            ttft=(seq.first_token - seq.arrival) if seq.first_token else 0.0,
            total=now - seq.arrival,
        )
        usage = Usage(seq.prompt_len, seq.num_cached, seq.num_output)
        return GenerationEvent(seq.request_id, seq.index, tail, [], None, reason, usage, timings, error, embedding)

    def _end_group(self, request_id: str, reason: str, error: str | None = None) -> list[GenerationEvent]:
        """End every sample of a request (those still waiting for the prompt's blocks too)."""
        return [self._finish(s, reason, error) for s in self._groups.end(request_id)]

    def fail_all(self, message: str) -> list[GenerationEvent]:
        return [ev for rid in self._groups.ids() for ev in self._end_group(rid, "error", message)]

    def abort_all(self) -> list[GenerationEvent]:
        return [ev for rid in self._groups.ids() for ev in self._end_group(rid, "abort")]

    def stats(self) -> dict[str, Any]:
        """A snapshot for /metrics and the admin page; safe to call from any thread."""
        return engine_stats(self.scheduler, self.blocks, self._groups, self.metrics, self.config.speculative.mode)

"""The synchronous engine core: `step()` = schedule -> run the model -> postprocess.

Single-threaded by design: the step thread (engine/step_thread.py) drives it. Tests and the benchmark may drive
it directly. Its parts: drafts (engine/spec_policy.py), the batch (engine/scheduler.py), the batch's inputs
(engine/step_inputs.py), the forward (engine/model_runner.py), masking and sampling (engine/sampler.py), what the
results do to the sequences (engine/postprocess.py), a request's samples, embedding inputs and deadline
(engine/request_groups.py), checks before queueing (engine/validate.py).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.kv_cache import BlockManager
from engine.kv_spill import spill_tier
from engine.loader import LoadedModel
from engine.metrics import EngineMetrics
from engine.model.llama import LlamaModel
from engine.model_runner import ModelRunner, SeqInput, kv_bytes_per_block
from engine.postprocess import Postprocessor
from engine.request_groups import RequestGroups, embedding_sequences, sample_sequences
from engine.sampler import Sampler
from engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.spec_policy import SpecPolicy
from engine.speculative import SpecConfig
from engine.stats import engine_stats
from engine.step_inputs import step_inputs
from engine.structured import Grammars
from engine.types import EngineOverloaded, GenerationEvent, GenerationRequest, InvalidRequest
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
        self.config = config = config or EngineConfig()
        config.speculative.check()
        self.loaded, self.model, self.backend, self.tokenizer = loaded, model, model.backend, loaded.tokenizer
        bs = config.block_size
        num_blocks = config.kv_memory // kv_bytes_per_block(loaded, bs, np.dtype(self.backend.kv_dtype).itemsize)
        if num_blocks < 2:
            raise ValueError(f"kv_memory {config.kv_memory} bytes holds fewer than 2 blocks of {bs} tokens")
        self.runner = ModelRunner(loaded, model, num_blocks, bs, config.max_num_seqs, config.cuda_graphs)
        self.blocks = BlockManager(num_blocks, bs)
        if config.kv_spill_size:
            if not config.kv_spill_dir:
                raise ValueError("kv_spill_size is set but kv_spill_dir is not")
            self.blocks.spill = spill_tier(loaded, self.runner, config.kv_spill_dir, config.kv_spill_size)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_batched_tokens, config.max_waiting), self.blocks
        )
        self.max_context = self.runner.max_context
        self.eos_ids = frozenset(loaded.config.eos_token_ids)
        self.grammars = Grammars(self.tokenizer, loaded.config.vocab_size, sorted(self.eos_ids))
        self.validate = RequestValidator(loaded.config.vocab_size, self.max_context, self.blocks, self.grammars)
        self.sampler = Sampler(self.backend, self.grammars)
        self.metrics = EngineMetrics()
        self.spec_policy = SpecPolicy(config.speculative.row_cost)
        self._groups = RequestGroups()
        self.post = Postprocessor(self.eos_ids, self.max_context, self.scheduler, self._groups, self.metrics)
        self._seq_ids = itertools.count()

    def close(self, timeout: float | None = None) -> None:
        """The step loop has stopped: the cached blocks go to the spill tier (a restart warms from them), its writes
        finish (within `timeout` seconds)."""
        if self.blocks.spill is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            self.blocks.spill_cached(deadline)
            self.blocks.spill.close(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def use_model(self, model: LlamaModel) -> None:
        """Run the next steps on `model` (the same weights on another backend, engine/backend_swap.py). Between
        steps only: its backend must keep the KV cache in the same dtype and layout, which then carries over."""
        assert np.dtype(model.backend.kv_dtype) == np.dtype(self.backend.kv_dtype)
        assert self.runner.graphs is None, "decode graphs are captured for the old model"
        self.model = self.runner.model = model
        self.backend = self.runner.backend = self.sampler.backend = model.backend

    # ---- requests ------------------------------------------------------------------
    def add_request(self, req: GenerationRequest, arrival: float | None = None) -> None:
        self.validate(req)
        self._check_new(req.request_id)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"server overloaded: {len(self.scheduler.waiting)} requests already waiting")
        arrival = time.monotonic() if arrival is None else arrival
        mode = self.config.speculative.mode
        self._add(sample_sequences(req, arrival, self._seq_ids, self.tokenizer, self.grammars, self.spec_policy, mode))

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
        self._check_new(request_id)
        arrival = time.monotonic() if arrival is None else arrival
        kind = self.loaded.pooling or pooling
        self._add(embedding_sequences(request_id, inputs, kind, arrival, self._seq_ids, self.tokenizer), False)

    def _check_new(self, request_id: str) -> None:
        if request_id in self._groups:
            raise InvalidRequest(f"request id {request_id!r} is already running", param="request_id")

    def _add(self, seqs: list[Sequence], share_prompt: bool = True) -> None:
        for seq in self._groups.add(seqs, share_prompt):
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> list[GenerationEvent]:
        return self.post.end_group(request_id, "abort")

    def is_running(self, request_id: str) -> bool:
        return request_id in self._groups

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._groups.has_pending

    # ---- the step ------------------------------------------------------------------
    def step(self) -> list[GenerationEvent]:
        started = time.perf_counter()
        events = self._prepare()
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return events
        inputs, sampling = step_inputs(batch.seqs, batch.num_new, self.metrics)
        try:
            logits, hidden = self._run(batch, inputs)
        except Exception as exc:  # the model itself failed: these sequences cannot go on
            log.exception("model step failed")
            return events + [self.post.finish(s, "error", f"model step failed: {exc}") for s in batch.seqs]
        events += self.post.computed(batch, inputs, hidden)
        events += self.post.sampled(sampling, self.sampler(sampling, logits))
        self._done(inputs, started)
        return events

    def _prepare(self) -> list[GenerationEvent]:
        """Before scheduling: requests past their deadline end, embedding inputs come in, decodes get drafts."""
        events = [ev for rid in self._groups.expired(time.monotonic()) for ev in self.post.end_group(rid, "timeout")]
        for seq in self._groups.refill():  # embedding inputs, a window at a time
            self.scheduler.add(seq)
        self.spec_policy.propose(
            [s for s in self.scheduler.running if s.remaining == 1], self.config.speculative, self.max_context
        )
        return events

    def _run(self, batch: ScheduledBatch, inputs: list[SeqInput]) -> tuple[Any, np.ndarray | None]:
        """The forward: logits rows, and the final norm's rows when the batch holds embedding inputs."""
        if any(s.pooled is not None for s in batch.seqs):
            return self.runner.run_hidden(inputs)
        return self.runner.run(inputs), None

    def _done(self, inputs: list[SeqInput], started: float) -> None:
        """After the step: its cost is observed (decode steps: what drafting weighs), released siblings queue."""
        if all(x.num_logits == len(x.tokens) for x in inputs) and (rows := sum(x.num_logits for x in inputs)):
            self.spec_policy.cost.observe(rows, time.perf_counter() - started)
        for siblings in self._groups.ready_siblings():  # to the front: they should find the prompt's blocks cached
            for sib in reversed(siblings):
                self.scheduler.add(sib, front=True)

    def fail_all(self, message: str) -> list[GenerationEvent]:
        return [ev for rid in self._groups.ids() for ev in self.post.end_group(rid, "error", message)]

    def abort_all(self) -> list[GenerationEvent]:
        return [ev for rid in self._groups.ids() for ev in self.post.end_group(rid, "abort")]

    def stats(self) -> dict[str, Any]:
        """A snapshot for /metrics and the admin page; safe to call from any thread."""
        return engine_stats(self.scheduler, self.blocks, self._groups, self.metrics, self.config.speculative.mode)

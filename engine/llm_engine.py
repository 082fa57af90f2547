"""The synchronous engine core: `step()` = schedule -> run the model -> sample -> emit.

Single-threaded by design: the async façade (engine/engine.py) drives it from one
long-lived thread. Tests and the benchmark may drive it directly.
"""
from __future__ import annotations

import collections
import itertools
import logging
import time
from dataclasses import dataclass
import numpy as np

from engine.decode_graphs import DecodeGraphs
from engine.kv_cache import BlockManager
from engine.loader import LoadedModel
from engine.model.llama import LlamaModel
from engine.sampling import SamplerRow, make_rng, sample
from engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from engine.sequence import Sequence
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
from kernels.attention_meta import build_attention_metadata

log = logging.getLogger("forge.engine")


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    kv_memory: int = 1 << 30  # bytes for K and V of all layers
    max_num_seqs: int = 64
    max_batched_tokens: int = 512
    max_waiting: int = 256
    cuda_graphs: bool = True  # replay decode steps from CUDA graphs where the backend can (engine/decode_graphs.py)


def kv_bytes_per_block(model: LoadedModel, block_size: int, itemsize: int = 4) -> int:
    c = model.config
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize


class LLMEngine:
    def __init__(self, loaded: LoadedModel, model: LlamaModel, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.loaded, self.model = loaded, model
        self.backend = backend = model.backend
        self.tokenizer = loaded.tokenizer
        mc = loaded.config
        bs = self.config.block_size
        num_blocks = self.config.kv_memory // kv_bytes_per_block(loaded, bs, np.dtype(backend.kv_dtype).itemsize)
        if num_blocks < 2:
            raise ValueError(f"kv_memory {self.config.kv_memory} bytes holds fewer than 2 blocks of {bs} tokens")
        graphs = self.config.cuda_graphs and hasattr(backend, "capture_graph")
        cache_blocks = num_blocks + graphs  # + the graphs' pad block, which the block manager never hands out
        self.kv_caches = [
            (
                backend.empty_kv_cache(cache_blocks, bs, mc.num_kv_heads, mc.head_dim, backend.kv_dtype),
                backend.empty_kv_cache(cache_blocks, bs, mc.num_kv_heads, mc.head_dim, backend.kv_dtype),
            )
            for _ in range(mc.num_layers)
        ]
        self.blocks = BlockManager(num_blocks, bs)
        self.scheduler = Scheduler(
            SchedulerConfig(self.config.max_num_seqs, self.config.max_batched_tokens, self.config.max_waiting),
            self.blocks,
        )
        self.max_context = min(mc.max_position, num_blocks * bs)
        self.graphs = DecodeGraphs(
            model, self.kv_caches, bs, pad_block=num_blocks, width=-(-self.max_context // bs), max_batch=self.config.max_num_seqs
        ) if graphs else None
        self.eos_ids = frozenset(mc.eos_token_ids)
        self._seq_ids = itertools.count()
        self._groups: dict[str, list[Sequence]] = {}  # request id -> its live sequences
        self._pending_siblings: dict[str, list[Sequence]] = {}  # n > 1: wait for the prompt's blocks
        self._num_deadlines = 0  # live requests with a timeout: _expire has nothing to scan without one
        self.counters = collections.Counter()
        self.finished_by_reason: collections.Counter[str] = collections.Counter()
        self._decode_window: collections.deque[tuple[float, int]] = collections.deque()

    # ---- requests ------------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        """Raise InvalidRequest for anything that can never run."""
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

    def add_request(self, req: GenerationRequest, arrival: float | None = None) -> None:
        self.validate(req)
        if req.request_id in self._groups:
            raise InvalidRequest(f"request id {req.request_id!r} is already running", param="request_id")
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"server overloaded: {len(self.scheduler.waiting)} requests already waiting")
        arrival = time.monotonic() if arrival is None else arrival
        deadline = arrival + req.timeout_s if req.timeout_s else None
        params = req.params
        seqs = [
            Sequence(
                seq_id=next(self._seq_ids),
                request=req,
                index=i,
                token_ids=list(req.prompt_token_ids),
                prompt_len=len(req.prompt_token_ids),
                sampler=SamplerRow(params, make_rng(params.seed, i), np.asarray(req.prompt_token_ids), []),
                detok=IncrementalDetokenizer(self.tokenizer, stop=params.stop),
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
        events = self._expire(time.monotonic())
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return events
        now = time.monotonic()
        for seq in batch.seqs:
            if seq.first_scheduled is None:
                seq.first_scheduled = now
                if seq.index == 0:
                    self.counters["prompt_tokens"] += seq.prompt_len
                    self.counters["cached_tokens"] += seq.num_cached
        try:
            logits, sampling = self._run_model(batch)
        except Exception as exc:  # the model itself failed: these sequences cannot go on
            log.exception("model step failed")
            return events + [self._finish(s, "error", f"model step failed: {exc}") for s in batch.seqs]

        for seq, n in zip(batch.seqs, batch.num_new):
            seq.num_computed += n
            self.blocks.commit(seq)
        self.counters["steps"] += 1
        events += self._sample_and_emit(sampling, logits)
        self._release_siblings()
        window = self._decode_window
        window.append((time.monotonic(), len(sampling)))
        while window[0][0] < window[-1][0] - 10.0:
            window.popleft()
        return events

    def _run_model(self, batch: ScheduledBatch) -> tuple[np.ndarray, list[Sequence]]:
        token_ids, positions, context_lens, logits_rows, sampling = [], [], [], [], []
        row = 0
        for seq, n in zip(batch.seqs, batch.num_new):
            start = seq.num_computed
            token_ids.extend(seq.token_ids[start : start + n])
            positions.append(np.arange(start, start + n))
            context_lens.append(start + n)
            row += n
            if start + n == seq.num_tokens:  # the chunk reaches the end: sample after it
                logits_rows.append(row - 1)
                sampling.append(seq)
        tables = [s.block_table for s in batch.seqs]
        if self.graphs is not None and len(sampling) == row:  # decode only: one new token a sequence, each sampled
            logits = self.graphs.run(token_ids, [int(p[0]) for p in positions], tables)
            if logits is not None:
                return self.backend.to_numpy(logits), sampling
        meta = build_attention_metadata(batch.num_new, context_lens, tables, self.blocks.block_size, self.backend)
        logits = self.model.forward(
            np.asarray(token_ids, dtype=np.int64),
            np.concatenate(positions),
            meta,
            self.kv_caches,
            np.asarray(logits_rows, dtype=np.int64),
        )
        return logits, sampling

    def _sample_and_emit(self, seqs: list[Sequence], logits: np.ndarray) -> list[GenerationEvent]:
        if not seqs:
            return []
        try:
            out = sample(logits, [s.sampler for s in seqs])
            results = list(zip(out.token_ids.tolist(), out.logprobs))
        except Exception:
            # Find the culprit: sample row by row so that one bad request fails alone.
            results = []
            for i, seq in enumerate(seqs):
                try:
                    one = sample(logits[i : i + 1], [seq.sampler])
                    results.append((int(one.token_ids[0]), one.logprobs[0]))
                except Exception as exc:
                    log.exception("sampling failed for request %s", seq.request_id)
                    results.append(exc)
        events = []
        now = time.monotonic()
        for seq, result in zip(seqs, results):
            if isinstance(result, Exception):
                events.append(self._finish(seq, "error", f"sampling failed: {result}"))
                continue
            try:
                events.extend(self._append_token(seq, *result, now))
            except Exception as exc:
                log.exception("post-processing failed for request %s", seq.request_id)
                events.append(self._finish(seq, "error", f"token post-processing failed: {exc}"))
        return events

    def _append_token(self, seq: Sequence, token: int, lp: TokenLogprob | None, now: float) -> list[GenerationEvent]:
        if seq.first_token is None:
            seq.first_token = now
        seq.token_ids.append(token)
        seq.sampler.output_ids.append(token)
        self.counters["generated_tokens"] += 1
        params = seq.request.params
        is_eos = not params.ignore_eos and token in self.eos_ids
        reason = None
        if is_eos or token in params.stop_token_ids:
            text, reason = "", "stop"
        else:
            text = seq.detok.push(token)
            if seq.detok.stopped:
                reason = "stop"
        if reason is None and (seq.num_output >= params.max_tokens or seq.num_tokens >= self.max_context):
            reason = "length"
        delta = GenerationEvent(seq.request_id, seq.index, text, [token], [lp] if lp is not None else None)
        if reason is None:
            return [delta]
        return [delta, self._finish(seq, reason)]

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> GenerationEvent:
        """End `seq`, free its blocks and build its final event."""
        tail = seq.detok.finish() if reason != "error" else ""  # held-back text is part of the reply
        self.scheduler.finish(seq)
        seq.finish_reason, seq.error = reason, error
        self.finished_by_reason[reason] += 1
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
        now = time.monotonic()
        window = [(t, n) for t, n in list(self._decode_window) if now - t <= 10.0]
        span = (now - window[0][0]) if window else 0.0
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
            "prompt_tokens_total": self.counters["prompt_tokens"],
            "cached_tokens_total": self.counters["cached_tokens"],
            "generated_tokens_total": self.counters["generated_tokens"],
            "requests_finished": dict(self.finished_by_reason.copy()),
            "preemptions": self.scheduler.num_preemptions,
            "decode_tok_s": sum(n for _, n in window) / span if span > 0.5 else 0.0,
            "steps": self.counters["steps"],
        }

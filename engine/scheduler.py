"""Continuous batching: which sequences run in the next step, and with how many tokens.

Each step fills a token budget: running decodes first (one token each, plus the tokens of
its draft when speculative decoding proposed one: a decode is never chunked, its draft is
cut to the budget or dropped when its blocks do not fit), then chunks of prompts being
prefilled, then newly admitted requests (FCFS). A long prompt therefore
never holds back other users' decoding by more than one chunk. When blocks run out, the
most recently admitted sequence is preempted by recompute: its blocks are released (and
stay in the prefix cache), and it re-enters the front of the waiting queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.kv_cache import BlockManager
from engine.sequence import SeqStatus, Sequence


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences per step
    max_batched_tokens: int = 512  # token budget per step = the prefill chunk size
    max_waiting: int = 256  # beyond this, new requests are refused


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


@dataclass(slots=True)
class Scheduler:
    config: SchedulerConfig
    blocks: BlockManager
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0

    def add(self, seq: Sequence, front: bool = False) -> None:
        seq.status = SeqStatus.WAITING
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_batched_tokens

        # 1. Decodes, oldest first; make room by preempting the newest when blocks run out.
        for seq in [s for s in self.running if s.remaining == 1]:
            if seq.status is not SeqStatus.RUNNING or budget == 0:
                continue  # preempted above as a victim, or budget spent
            del seq.draft[budget - 1 :]
            if seq.draft and not self.blocks.reserve(seq, 1 + len(seq.draft)):
                seq.draft.clear()  # no room to verify it: a plain decode
            while not self.blocks.reserve(seq, 1):
                victim = next((s for s in reversed(self.running) if s not in batch.seqs), None)
                assert victim is not None  # seq itself is running and not yet in the batch
                self._preempt(victim, batch)
                if victim is seq:
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new.append(1 + len(seq.draft))
                budget -= 1 + len(seq.draft)

        # 2. Prompts part-way through chunked prefill.
        for seq in [s for s in self.running if s.remaining > 1]:
            if budget == 0:
                break
            chunk = min(seq.remaining, budget)
            if self.blocks.reserve(seq, chunk):
                batch.seqs.append(seq)
                batch.num_new.append(chunk)
                budget -= chunk

        # 3. Admit waiting sequences while budget, slots and blocks last (not in a step that
        #    had to preempt: the victim would come straight back and thrash).
        while not batch.preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = self.blocks.admit(seq)
            chunk = min(seq.remaining, budget)
            if not self.blocks.reserve(seq, chunk):
                self.blocks.release(seq)
                break
            self.waiting.popleft()
            stats = self.blocks.stats
            stats.queried_tokens += seq.num_tokens
            stats.hit_tokens += cached
            if not seq.admitted:
                seq.admitted, seq.num_cached = True, min(cached, seq.prompt_len)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new.append(chunk)
            budget -= chunk
        return batch

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence wherever it is and release its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        if seq.block_table:
            self.blocks.release(seq)
        seq.status = SeqStatus.FINISHED

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        assert seq is not None and seq not in batch.seqs
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.draft.clear()
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)
        self.num_preemptions += 1

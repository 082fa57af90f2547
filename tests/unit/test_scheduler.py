"""Scheduler policy on fake sequences (no model): decodes first, chunked prefill within the
token budget, FCFS admission, preemption of the newest without same-step re-admission."""

from __future__ import annotations

from engine.kv_cache import BlockManager
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import SeqStatus, Sequence
from engine.types import GenerationRequest


def seq(n_tokens: int, seq_id: int) -> Sequence:
    tokens = [1000 * seq_id + i for i in range(n_tokens)]  # distinct: no prefix sharing
    return Sequence(seq_id, GenerationRequest(tokens), 0, list(tokens), n_tokens, rng=None, detok=None)


def run(sched: Scheduler) -> list[tuple[int, int]]:
    """One step as the engine does it: schedule, 'compute', and append a token to finished prefills."""
    batch = sched.schedule()
    for s, n in zip(batch.seqs, batch.num_new):
        s.num_computed += n
        sched.blocks.commit(s)
        if s.num_computed == s.num_tokens:
            s.token_ids.append(7)
    return [(s.seq_id, n) for s, n in zip(batch.seqs, batch.num_new)]


def test_long_prompt_is_chunked_and_decodes_go_first():
    sched = Scheduler(SchedulerConfig(max_batched_tokens=32), BlockManager(64, 16))
    a = seq(10, 1)
    sched.add(a)
    assert run(sched) == [(1, 10)]
    sched.add(seq(100, 2))
    assert run(sched) == [(1, 1), (2, 31)]  # a's decode first, then a chunk of the long prompt
    assert run(sched) == [(1, 1), (2, 31)]
    assert run(sched) == [(1, 1), (2, 31)]
    assert run(sched) == [(1, 1), (2, 7)]  # the rest of the prompt
    assert run(sched) == [(1, 1), (2, 1)]  # both decoding


def test_admission_is_first_come_first_served_within_the_budget():
    sched = Scheduler(SchedulerConfig(max_batched_tokens=20), BlockManager(64, 16))
    for i in range(3):
        sched.add(seq(8, i))
    assert run(sched) == [(0, 8), (1, 8), (2, 4)]
    assert run(sched) == [(0, 1), (1, 1), (2, 4)]


def test_out_of_blocks_preempts_the_newest_and_does_not_readmit_it_in_the_same_step():
    sched = Scheduler(SchedulerConfig(max_batched_tokens=64), BlockManager(4, 16))
    old, new = seq(31, 1), seq(32, 2)  # 2 blocks each: the cache is full
    sched.add(old)
    sched.add(new)
    assert run(sched) == [(1, 31), (2, 32)]
    # old's next token still fits its 2 blocks; new's 33rd token needs a third: there is none,
    # so the newest sequence (new itself) is preempted and only old runs.
    assert run(sched) == [(1, 1)]
    assert sched.num_preemptions == 1 and new.status is SeqStatus.WAITING
    assert new.num_computed == 0 and new.block_table == [] and sched.waiting[0] is new
    # Next step: old takes a third block; new (33 tokens, 3 blocks) cannot come back yet.
    assert run(sched) == [(1, 1)]
    assert sched.blocks.num_free == 1


def test_max_num_seqs_limits_the_running_set():
    sched = Scheduler(SchedulerConfig(max_num_seqs=2, max_batched_tokens=100), BlockManager(64, 16))
    for i in range(3):
        sched.add(seq(5, i))
    assert [sid for sid, _ in run(sched)] == [0, 1]
    assert len(sched.waiting) == 1


def test_a_decode_brings_its_draft_whole_or_cut_to_the_budget():
    sched = Scheduler(SchedulerConfig(max_batched_tokens=6), BlockManager(64, 16))
    a = seq(4, 1)
    sched.add(a)
    assert run(sched) == [(1, 4)]
    a.draft = [9, 9, 9]
    batch = sched.schedule()
    assert batch.num_new == [4]  # the last token + 3 drafted, never chunked
    a.token_ids.append(8)  # nothing accepted: the step's own token
    a.num_computed = a.num_tokens - 1
    sched.blocks.trim(a)
    a.draft = [9] * 10
    assert sched.schedule().num_new == [6] and a.draft == [9] * 5  # cut to the budget


def test_a_draft_that_does_not_fit_the_blocks_is_dropped_not_preempting():
    sched = Scheduler(SchedulerConfig(max_batched_tokens=64), BlockManager(2, 16))
    a = seq(10, 1)
    sched.add(a)
    run(sched)  # 11 tokens, 10 computed: one block
    other = seq(15, 2)
    sched.add(other)
    run(sched)  # a decodes (12 tokens, 11 computed); other takes the second block
    a.draft = [5, 6, 7, 8, 9]  # positions 11..16 would need a second block
    batch = sched.schedule()
    assert a in batch.seqs and a.draft == [] and sched.num_preemptions == 0

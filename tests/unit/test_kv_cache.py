"""BlockManager invariants: allocation, sharing, eviction, the hash chain and LRU order."""

from __future__ import annotations

import pytest

from engine import kv_cache
from engine.kv_cache import BlockManager
from engine.sequence import Sequence
from engine.types import GenerationRequest

BS = 4


def make_seq(tokens: list[int], seq_id: int = 0) -> Sequence:
    req = GenerationRequest(list(tokens))
    return Sequence(seq_id, req, 0, list(tokens), len(tokens), rng=None, detok=None)


def run_prompt(bm: BlockManager, seq: Sequence) -> int:
    """Admit, reserve and 'compute' the whole sequence, as the scheduler + engine would."""
    cached = bm.admit(seq)
    assert bm.reserve(seq, seq.remaining)
    seq.num_computed = seq.num_tokens
    bm.commit(seq)
    return cached


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    refs = [0] * bm.num_blocks
    for seq in live:
        for bid in seq.block_table:
            refs[bid] += 1
    for block in bm.blocks:
        assert block.ref_count == refs[block.block_id]
        assert (block.ref_count == 0) == (block.block_id in bm.free)
    for key, bid in bm.cached.items():
        assert bm.blocks[bid].key == key


def test_allocate_and_free_return_every_block():
    bm = BlockManager(8, BS)
    seq = make_seq(list(range(10)))
    assert run_prompt(bm, seq) == 0
    assert len(seq.block_table) == 3 and bm.num_free == 5
    check_invariants(bm, [seq])
    bm.release(seq)
    assert bm.num_free == 8 and seq.block_table == []
    check_invariants(bm, [])


def test_second_request_shares_full_prefix_blocks_without_copy():
    bm = BlockManager(16, BS)
    a = make_seq(list(range(10)))
    run_prompt(bm, a)
    b = make_seq(list(range(8)) + [99, 98, 97], seq_id=1)
    assert run_prompt(bm, b) == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    check_invariants(bm, [a, b])


def test_hit_mid_block_is_not_reused():
    bm = BlockManager(16, BS)
    run_prompt(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert run_prompt(bm, make_seq([1, 2, 3, 4, 5, 6, 0, 0, 0], seq_id=1)) == 4


def test_fully_cached_prompt_still_leaves_one_token_to_compute():
    bm = BlockManager(16, BS)
    a = make_seq(list(range(8)))
    run_prompt(bm, a)
    bm.release(a)
    b = make_seq(list(range(8)), seq_id=1)
    assert bm.admit(b) == 4  # the last block is recomputed so the model sees its last token


def test_freed_blocks_stay_cached_until_space_is_needed():
    bm = BlockManager(4, BS)
    a = make_seq(list(range(8)))
    run_prompt(bm, a)
    bm.release(a)
    assert bm.num_free == 4 and len(bm.cached) == 2
    b = make_seq(list(range(8)) + [50], seq_id=1)
    assert run_prompt(bm, b) == 8  # still there after release
    bm.release(b)
    c = make_seq(list(range(100, 116)), seq_id=2)  # needs all four blocks: evicts everything
    assert run_prompt(bm, c) == 0
    assert bm.stats.evictions == 2
    assert bm.match_prefix(list(range(8)) + [50]) == []
    check_invariants(bm, [c])


def test_a_reset_cache_reuses_its_blocks_before_untouched_ones():
    bm = BlockManager(6, BS)
    a = make_seq(list(range(8)))
    run_prompt(bm, a)
    used = set(a.block_table)
    bm.release(a)
    bm.reset_prefix_cache()
    assert not bm.cached
    b = make_seq(list(range(100, 108)), seq_id=1)
    run_prompt(bm, b)
    assert set(b.block_table) == used  # written before, not the four never touched
    check_invariants(bm, [b])


def test_lru_evicts_least_recently_freed_and_tail_before_head():
    bm = BlockManager(6, BS)
    a = make_seq(list(range(0, 8)))  # blocks a0 a1
    b = make_seq(list(range(100, 108)), seq_id=1)  # blocks b0 b1
    run_prompt(bm, a)
    run_prompt(bm, b)
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.release(a)
    bm.release(b)
    # Two never-used blocks are handed out first, then a's tail, then a's head.
    order = [bm._fresh() for _ in range(6)]
    assert order[2:] == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]


def test_reserve_fails_without_side_effects_when_full():
    bm = BlockManager(2, BS)
    seq = make_seq(list(range(12)))
    bm.admit(seq)
    assert not bm.reserve(seq, 12)
    assert seq.block_table == [] and bm.num_free == 2


def test_hash_collision_is_detected(monkeypatch):
    monkeypatch.setattr(kv_cache, "block_key", lambda parent, tokens: 42)  # every block collides
    bm = BlockManager(8, BS)
    run_prompt(bm, make_seq([1, 2, 3, 4, 5]))
    other = make_seq([9, 9, 9, 9, 5], seq_id=1)
    assert bm.admit(other) == 0  # same key, different tokens: not shared


def test_chain_key_depends_on_parent():
    bm = BlockManager(8, BS)
    run_prompt(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0]))
    # Same second block, different first block: the second must not match on its own.
    assert bm.match_prefix([0, 0, 0, 0, 5, 6, 7, 8, 0]) == []


def test_double_free_is_caught():
    bm = BlockManager(4, BS)
    seq = make_seq([1, 2, 3])
    run_prompt(bm, seq)
    table = list(seq.block_table)
    bm.release(seq)
    seq.block_table = table
    with pytest.raises(AssertionError):
        bm.release(seq)


def test_trim_returns_rejected_draft_blocks_and_commit_keys_only_accepted_ones():
    bm = BlockManager(8, BS)
    seq = make_seq(list(range(6)))
    run_prompt(bm, seq)  # 6 computed tokens: one full block, one partial
    seq.token_ids.append(6)  # sampled, no KV yet
    assert bm.reserve(seq, 1 + 5)  # verify it and a 5-token draft: positions 6..11, three blocks
    assert len(seq.block_table) == 3
    seq.token_ids += [7]  # one draft token accepted (+ the bonus token 8 below)
    seq.token_ids.append(8)
    seq.num_computed = len(seq.token_ids) - 1  # KV kept for 0..7
    bm.trim(seq)
    bm.commit(seq)
    assert len(seq.block_table) == 2 and bm.num_free == 6
    assert bm.match_prefix(list(range(8)) + [99]) == seq.block_table  # both full blocks, accepted tokens only
    assert bm.free and next(iter(bm.free)) not in seq.block_table  # the trimmed block is reused first
    check_invariants(bm, [seq])


def test_a_finished_sequences_partial_block_is_taken_over_by_a_prompt_that_goes_on_from_it():
    bm = BlockManager(8, BS)
    a = make_seq(list(range(10)))  # two full blocks + a partial one holding 8, 9
    run_prompt(bm, a)
    tail = a.block_table[2]
    bm.release(a)
    check_invariants(bm, [])
    b = make_seq(list(range(10)) + [50, 51], seq_id=1)  # the next turn of the same chat
    assert bm.admit(b) == 10
    assert b.block_table[2] == tail and bm.blocks[tail].ref_count == 1
    assert bm.reserve(b, b.remaining) and len(b.block_table) == 3  # writes on in the same block
    check_invariants(bm, [b])
    c = make_seq(list(range(10)) + [60], seq_id=2)  # b owns the tail now: c recomputes it
    assert bm.admit(c) == 8
    assert bm.reserve(c, c.remaining)
    check_invariants(bm, [b, c])


def test_a_tail_is_taken_only_whole_and_never_for_a_prompts_last_token():
    for prompt in (list(range(10)) + [77, 78], list(range(11))):
        bm = BlockManager(8, BS)
        a = make_seq(list(range(11)))  # tail 8, 9, 10
        run_prompt(bm, a)
        bm.release(a)
        # diverges inside the tail; or the tail would leave nothing to compute
        assert bm.admit(make_seq(prompt, seq_id=1)) == 8


def test_the_longest_matching_tail_wins_and_eviction_or_reset_forgets_tails():
    bm = BlockManager(8, BS)
    for i, extra in enumerate(([8, 9, 10], [8, 9], [8])):
        s = make_seq(list(range(8)) + extra, seq_id=i)
        run_prompt(bm, s)
        bm.release(s)
    assert sorted(map(len, bm.tails[bm.blocks[bm.match_prefix(list(range(9)))[1]].key])) == [1, 2, 3]
    b = make_seq(list(range(11)) + [5], seq_id=9)
    assert bm.admit(b) == 11
    bm.release(b)
    while bm.tails:  # fresh blocks evict the tails (after the blocks never cached)
        bm._fresh()
    assert bm.admit(make_seq(list(range(11)) + [5], seq_id=10)) == 8
    bm2 = BlockManager(8, BS)
    a = make_seq(list(range(10)))
    run_prompt(bm2, a)
    bm2.release(a)
    bm2.reset_prefix_cache()
    assert not bm2.tails and not bm2.cached
    check_invariants(bm2, [])

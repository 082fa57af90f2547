"""The n-gram drafter's track: which earlier occurrence it follows, how it keeps and loses it, and what
it scores (engine/speculative.py)."""

from __future__ import annotations

from engine.spec_policy import PRIOR, Acceptance
from engine.speculative import MAX_MATCH, Drafter


def test_the_track_is_the_longest_match_not_the_most_recent():
    # "2 3" occurs twice before the tail "1 2 3": after "1 2 3" (then 4 5) and after "9 2 3" (then 7 8).
    prompt = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    d = Drafter(prompt_len=len(prompt))
    d.observe(prompt)
    assert (d.src, d.match) == (3, 3) and d.draft(prompt, 4) == [4, 5, 9, 2]
    assert d.draft(prompt, 0) == []


def test_a_single_token_match_when_no_pair_matches():
    tokens = [5, 6, 7, 8, 6]
    d = Drafter(prompt_len=len(tokens))
    d.observe(tokens)
    assert (d.src, d.match) == (2, 1) and d.draft(tokens, 10) == [7, 8, 6]  # cut where the tokens end
    tokens.append(42)  # never seen before: no track
    d.observe(tokens)
    assert d.src is None and d.match == 0 and d.draft(tokens, 4) == []


def test_the_track_is_kept_while_tokens_follow_it_then_found_again():
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4, 5, 8, 1, 2, 3]
    d = Drafter(prompt_len=len(prompt))
    d.observe(prompt)
    assert (d.src, d.match) == (3, 3)  # behind "1 2 3"
    tokens = prompt + [4, 5]
    d.observe(tokens)
    # Still the first occurrence: "9 2 3 4 5" now matches "2 3 4 5" as well, but the track does not jump.
    assert (d.src, d.match) == (5, 5) and d.draft(tokens, 2) == [6, 7]
    tokens.append(8)  # the track said 6: lost, and "5 8" is found after "4 5" in the second occurrence
    d.observe(tokens)
    assert (d.src, d.match) == (13, 5) and d.draft(tokens, 2) == [1, 2]


def test_match_length_is_counted_up_to_max_match():
    block = list(range(100, 100 + MAX_MATCH + 10))
    tokens = block + [1] + block[:-1]
    d = Drafter(prompt_len=len(tokens))
    d.observe(tokens)
    assert d.match == MAX_MATCH and d.draft(tokens, 1) == [block[-1]]


def test_generated_tokens_are_scored_by_match_length_prompt_tokens_are_not():
    acceptance = Acceptance()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    d = Drafter(prompt_len=len(prompt), acceptance=acceptance, greedy=True)
    d.observe(prompt)
    assert (d.match, acceptance.p(True, 3)) == (3, PRIOR[1])  # the prompt is taken in, not scored
    d.observe(prompt + [4, 5, 6])  # three hits, at match lengths 3 (class 2-3), 4 and 5 (class 4-7)
    assert acceptance.p(True, 3) > PRIOR[1] and acceptance.p(True, 4) > PRIOR[2]
    high = acceptance.p(True, 4)
    d.observe(prompt + [4, 5, 6, 9])  # a miss at match length 6
    assert acceptance.p(True, 4) < high
    assert acceptance.p(False, 4) == PRIOR[2]  # sampled requests are scored apart

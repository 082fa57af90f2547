"""N-gram speculative decoding on the real default model: greedy output identical to decoding
without it, counters that move, sampled distributions kept, and the features it must live with."""

from __future__ import annotations

import collections
import json
import re

import pytest
from engine_helpers import chat_prompt, collect, greedy, make_core, run_all
from scipy.stats import chi2_contingency

from engine.speculative import SpecConfig
from engine.types import GenerationRequest, ResponseFormat, SamplingParams

CODE = '''def area(width, height):
    result = width * height
    return result


def perimeter(width, height):
    result = 2 * (width + height)
    return result
'''


def spec_core(default_model, mode: str, max_rows: int = 32):
    """Rows priced as free (`row_cost=0`): every sequence with a track drafts, whatever this machine's timing."""
    return make_core(
        default_model, kv_memory=64 << 20, speculative=SpecConfig(mode=mode, max_rows=max_rows, row_cost=0.0)
    )


def rewrite_prompt(core) -> list[int]:
    return chat_prompt(core, [{"role": "user", "content": "Repeat this code exactly:\n```python\n" + CODE + "```"}])


def test_greedy_identical_to_plain_decoding_on_the_fixture_prompts(default_model, reference):
    # The reference ids are plain greedy decoding (transformers, float32): no second run needed.
    core = spec_core(default_model, "ngram")
    reqs = [greedy(case["prompt_ids"], 32, ignore_eos=True) for case in reference["prompts"]]
    for i, r in enumerate(reqs):
        r.request_id = str(i)
    results = run_all(core, reqs)
    assert core.stats()["spec_accepted_tokens"] > 0
    for i, case in enumerate(reference["prompts"]):
        assert results[str(i)].token_ids == case["greedy32_no_eos_stop_ids"]


def test_rewrite_task_identical_counters_move_and_the_prefix_cache_stays_clean(default_model):
    core = spec_core(default_model, "ngram")
    prompt = rewrite_prompt(core)
    runs = {}
    for mode in ("off", "ngram"):  # the per-request override first, then the engine's default
        req = greedy(prompt, 48, logprobs=2, stop=["perimeter(width"])
        req.params.speculative = None if mode == "ngram" else "off"
        before = core.stats()
        runs[mode] = (next(iter(run_all(core, [req]).values())), before, core.stats())
    off, off_before, off_after = runs["off"]
    on, on_before, stats = runs["ngram"]
    assert off_after["spec_drafted_tokens"] == off_before["spec_drafted_tokens"]  # "off" drafted nothing
    assert on.token_ids == off.token_ids and on.text == off.text
    assert on.final.finish_reason == off.final.finish_reason
    assert [lp.token_id for lp in on.logprobs] == on.token_ids
    for a, b in zip(on.logprobs, off.logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3) and [t for t, _ in a.top] == [t for t, _ in b.top]
    assert "def area(width, height):" in on.text  # the model did copy: drafts had something to match
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_drafted_tokens"]  # accepted and rejected drafts
    assert stats["steps"] - on_before["steps"] < off_after["steps"] - off_before["steps"]
    assert stats["spec_mean_accepted_length"] > 1.0 and 0 < stats["spec_acceptance_rate"] < 1
    assert core.blocks.num_free == core.blocks.num_blocks  # rejected slots and finished blocks all came back
    # Every cached block holds a block of what the sequence really became: no rejected draft token.
    seen, bs = prompt + on.token_ids, core.blocks.block_size
    expected = {tuple(seen[i : i + bs]) for i in range(0, len(seen) - bs + 1, bs)}
    cached = {core.blocks.blocks[bid].tokens for bid in core.blocks.cached.values()}
    assert cached and cached <= expected


def test_a_request_can_ask_for_speculation_the_engine_does_not_default_to(default_model):
    core = spec_core(default_model, "off")
    req = greedy(rewrite_prompt(core), 16)
    req.params.speculative = "ngram"
    run_all(core, [req])
    assert core.stats()["spec_drafted_tokens"] > 0


def test_structured_and_speculative_together_stay_identical(default_model):
    payload = '{"name": "Ada", "langs": ["python", "c"], "year": 1843}'
    core = spec_core(default_model, "ngram")
    prompt = chat_prompt(core, [{"role": "user", "content": f"Return this JSON unchanged: {payload}"}])
    outputs = {}
    for mode in ("off", "ngram"):
        params = SamplingParams(
            max_tokens=40, temperature=0.0, response_format=ResponseFormat("json_object"), speculative=mode
        )
        outputs[mode] = next(iter(run_all(core, [GenerationRequest(prompt, params)]).values()))
    off, on = outputs["off"], outputs["ngram"]
    assert on.token_ids == off.token_ids and on.final.finish_reason == "stop"
    assert isinstance(json.loads(on.text), dict)
    assert core.stats()["spec_accepted_tokens"] > 0


def test_sampling_keeps_the_distribution_and_seeds_reproduce(default_model):
    """A regex leaves a few tokens per position ("a"/"b" runs). Seeded samples are token-for-token
    those of plain decoding; samples from disjoint seeds have the same distribution of replies
    (chi-square homogeneity test, false failure < 1e-6)."""
    fmt = ResponseFormat("regex", "[ab]{6}")
    n = 16
    texts: dict[tuple[str, int], list[str]] = {}
    # 128 samples with drafts (every step has room for them here), 128 without from other seeds,
    # and 16 without from the first seeds again.
    for mode, seed0, n_req in (("ngram", 0, 8), ("off", 10_000, 8), ("off", 0, 1)):
        core = spec_core(default_model, mode, max_rows=256)
        prompt = chat_prompt(
            core,
            [
                {
                    "role": "user",
                    "content": (
                        "Flip a coin six times; write a for heads and b for tails, e.g. abbaba or aababb or babbab."
                    ),
                }
            ],
        )
        results: dict = {}
        for i in range(n_req):
            core.add_request(
                GenerationRequest(
                    prompt,
                    SamplingParams(max_tokens=8, temperature=1.0, seed=seed0 + i, n=n, response_format=fmt),
                    request_id=str(i),
                )
            )
        while core.has_work():
            collect(core.step(), results)
        out = [results[(str(i), j)].text for i in range(n_req) for j in range(n)]
        assert all(re.fullmatch("[ab]{6}", t) for t in out)
        texts[(mode, seed0)] = out
        if mode == "ngram":
            stats = core.stats()
            assert 0 < stats["spec_accepted_tokens"] < stats["spec_drafted_tokens"]  # accepts and rejects
    assert texts[("ngram", 0)][:n] == texts[("off", 0)]  # same seeds: the same samples, drafts or not

    # Homogeneity of the replies between speculation on (seeds 0..) and off (other seeds): one bin
    # per reply seen >= 20 times on both sides together, the rest pooled (>= 20 too, or merged into
    # the smallest bin), so that the chi-square approximation holds.
    on, off = texts[("ngram", 0)], texts[("off", 10_000)]
    both = collections.Counter(on + off)
    bins = [[t] for t, c in both.most_common() if c >= 20]
    rest = [t for t, c in both.items() if c < 20]
    if sum(both[t] for t in rest) >= 20 or not bins:
        bins.append(rest)
    else:
        bins[-1] += rest
    assert len(bins) >= 3, f"the replies barely vary ({both.most_common(5)}): the test would show nothing"
    table = [[sum(side.count(t) for t in b) for b in bins] for side in (on, off)]
    test = chi2_contingency(table, correction=False)
    assert test.pvalue > 1e-6, f"chi-square {test.statistic:.1f} with {test.dof} df: {table}"


def test_preemption_with_drafts_matches_the_solo_run(default_model):
    probe = spec_core(default_model, "ngram")
    prompt = rewrite_prompt(probe)
    solo = next(iter(run_all(probe, [greedy(prompt, 24, ignore_eos=True)]).values())).token_ids
    per_block = probe.runner.kv_caches[0][0][0].nbytes * 2 * len(probe.runner.kv_caches)
    core = make_core(
        default_model,
        kv_memory=per_block * (2 * -(-(len(prompt) + 24) // 16) - 1),
        speculative=SpecConfig(row_cost=0.0),
    )
    reqs = [greedy(prompt, 24, ignore_eos=True) for _ in range(2)]
    reqs[1].prompt_token_ids = prompt[:-1] + [prompt[-1]]  # same tokens, its own request
    results = run_all(core, reqs)
    assert core.scheduler.num_preemptions > 0 and core.stats()["spec_accepted_tokens"] > 0
    assert all(r.token_ids == solo for r in results.values())
    assert core.blocks.num_free == core.blocks.num_blocks

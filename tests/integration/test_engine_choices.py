"""Every one of a request's n samples ends with exactly one final event, through the asyncio façade on the
default model and the default (numba) backend: n = 1..16 with stop strings and logprobs, structured output,
speculation, preemption under a small KV budget, many concurrent requests sharing prompt prefixes, and
timeouts and aborts that reach samples still waiting for the prompt's blocks. What could never fit the KV
budget is refused before it is queued."""

from __future__ import annotations

import asyncio
import math
import re

import numpy as np
import pytest
from engine_helpers import make_core

from engine import Engine, GenerationRequest, InvalidRequest, SamplingParams
from engine.engine import RequestStream
from engine.model_runner import kv_bytes_per_block
from engine.speculative import SpecConfig
from engine.types import GenerationEvent, ResponseFormat

HANG_S = 120  # a hang detector only: every request here ends in a few steps


@pytest.fixture(scope="module")
async def engine(default_model):
    """Speculation off unless a request asks for it; rows priced as free (`row_cost=0`), so a request that
    asks drafts wherever it has a track, whatever this machine's load."""
    eng = Engine(
        make_core(default_model, kv_memory=64 << 20, speculative=SpecConfig(mode="off", row_cost=0.0)), threads=2
    )
    yield eng
    await eng.shutdown()


def small_kv(default_model, blocks: int) -> int:
    loaded, model = default_model
    return blocks * kv_bytes_per_block(loaded, 16, np.dtype(model.backend.kv_dtype).itemsize)


async def finals_of(
    engine: Engine, req: GenerationRequest, stream: RequestStream | None = None
) -> dict[int, tuple[str, GenerationEvent]]:
    """Sample index -> (its whole text, its final event); asserts exactly one final event per sample.
    `stream`: the request's, when it was already submitted."""
    texts: dict[int, str] = {}
    finals: dict[int, tuple[str, GenerationEvent]] = {}

    async def consume() -> None:
        async for ev in stream or engine.generate(req):
            assert ev.index not in finals, f"sample {ev.index} sent an event after its final one"
            texts[ev.index] = texts.get(ev.index, "") + ev.text
            if ev.final:
                finals[ev.index] = (texts[ev.index], ev)

    await asyncio.wait_for(consume(), HANG_S)
    assert sorted(finals) == list(range(req.params.n)), f"finished samples {sorted(finals)} of n={req.params.n}"
    return finals


def assert_logprobs(ev: GenerationEvent, k: int) -> None:
    assert ev.logprobs is not None
    for lp in ev.logprobs:
        assert math.isfinite(lp.logprob) and lp.logprob <= 0.0 and len(lp.top) == k


async def test_n_1_to_16_every_sample_finishes(engine):
    # The report: 4 sampled tokens of "Once upon a time" finished samples 0 and 1 only, whatever n.
    prompt = engine.tokenizer.encode("Once upon a time")
    reqs = [
        GenerationRequest(
            prompt,
            SamplingParams(
                max_tokens=3,
                temperature=0.7,
                n=n,
                seed=n,
                stop=["."] if n % 2 else [],
                logprobs=2 if n % 3 == 0 else None,
            ),
        )
        for n in range(1, 17)
    ]
    results = await asyncio.gather(*(finals_of(engine, r) for r in reqs))
    for req, finals in zip(reqs, results):
        for text, ev in finals.values():
            assert ev.finish_reason in ("stop", "length") and ev.error is None
            assert 1 <= ev.usage.completion_tokens <= 3
            assert not (req.params.stop and "." in text)
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_used"] == 0


async def test_identical_greedy_samples_finish_in_the_same_step(engine):
    # Samples 1..7 start together (once sample 0 has computed the prompt) and, greedy, give one reply: they end
    # in the same step. That lost all but the first of them.
    prompt = engine.render_chat([{"role": "user", "content": "Say hi."}])
    params = SamplingParams(max_tokens=6, temperature=0.0, n=8, stop=["!", "."], logprobs=3)
    finals = await finals_of(engine, GenerationRequest(prompt, params))
    assert len({text for text, _ in finals.values()}) == 1
    assert len({ev.finish_reason for _, ev in finals.values()} - {"stop", "length"}) == 0


async def test_logprobs_reach_every_sample(engine):
    prompt = engine.tokenizer.encode("The capital of France is")
    req = GenerationRequest(prompt, SamplingParams(max_tokens=3, temperature=1.0, n=6, seed=5, logprobs=4))
    seen: dict[int, int] = {}

    async def consume() -> None:
        async for ev in engine.generate(req):
            if ev.token_ids:
                assert_logprobs(ev, 4)
                assert len(ev.logprobs) == len(ev.token_ids)
                seen[ev.index] = seen.get(ev.index, 0) + len(ev.token_ids)

    await asyncio.wait_for(consume(), HANG_S)
    assert sorted(seen) == list(range(6)) and all(1 <= v <= 3 for v in seen.values())


async def test_structured_output_every_sample_finishes_and_matches(engine):
    prompt = engine.render_chat([{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
    regex = ResponseFormat("regex", r"(yes|no)")
    finals = await finals_of(
        engine,
        GenerationRequest(prompt, SamplingParams(max_tokens=4, temperature=1.0, n=8, seed=2, response_format=regex)),
    )
    for text, ev in finals.values():
        assert ev.finish_reason == "stop" and re.fullmatch(r"yes|no", text), (text, ev.finish_reason)
    json_req = GenerationRequest(
        prompt,
        SamplingParams(max_tokens=6, temperature=1.0, n=5, seed=3, response_format=ResponseFormat("json_object")),
    )
    finals = await finals_of(engine, json_req)
    for text, ev in finals.values():
        assert ev.finish_reason in ("stop", "length") and text.lstrip().startswith("{")


async def test_speculation_every_sample_finishes(engine):
    code = "def f(x):\n    y = x + 1\n    return y\n"
    prompt = engine.render_chat([{"role": "user", "content": f"Repeat exactly:\n{code}{code}"}])
    before = engine.stats()["spec_drafted_tokens"]
    for temperature in (0.0, 0.8):  # greedy siblings are identical: they finish together
        params = SamplingParams(
            max_tokens=12, temperature=temperature, n=4, seed=7, stop=["return"], speculative="ngram", logprobs=1
        )
        finals = await finals_of(engine, GenerationRequest(prompt, params))
        assert all(ev.finish_reason in ("stop", "length") for _, ev in finals.values())
    assert engine.stats()["spec_drafted_tokens"] > before


async def test_concurrent_requests_sharing_prefixes_all_finish(engine):
    # The report's mixed traffic: n 2-4, prompts that share prefixes with each other, a stop string.
    unit = "Once upon a time "
    reqs = [
        GenerationRequest(
            engine.tokenizer.encode(unit * (27 + (i * 5) % 18)),
            SamplingParams(
                max_tokens=4, temperature=0.9, n=2 + i % 3, seed=i, stop=["."], logprobs=1 if i % 4 == 0 else None
            ),
        )
        for i in range(8)
    ]
    results = await asyncio.gather(*(finals_of(engine, r) for r in reqs))
    for finals in results:
        assert all(ev.finish_reason in ("stop", "length") for _, ev in finals.values())
        assert all("." not in text for text, _ in finals.values())
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] > 0
    assert stats["running"] == 0 and stats["kv_blocks_used"] == 0


async def test_a_timeout_or_abort_ends_every_sample_with_one_reason(engine):
    prompt = engine.tokenizer.encode("Once upon a time " * 20)
    # The deadline passes before the first step: samples still waiting for the prompt's blocks end too.
    finals = await finals_of(engine, GenerationRequest(prompt, SamplingParams(max_tokens=8, n=6), timeout_s=1e-9))
    assert {ev.finish_reason for _, ev in finals.values()} == {"timeout"}
    # Aborted before its first step (the commands reach the step thread in order): every sample, pending or not.
    req = GenerationRequest(prompt, SamplingParams(max_tokens=8, n=5))
    stream = engine.generate(req)
    engine.abort(req.request_id)

    async def ends_of() -> list[str]:
        return [ev.finish_reason async for ev in stream if ev.final]

    assert await asyncio.wait_for(ends_of(), HANG_S) == ["abort"] * 5
    # Aborted mid-reply: every sample ends once, those not already at max_tokens with "abort".
    req = GenerationRequest(prompt, SamplingParams(max_tokens=250, n=5, ignore_eos=True))
    ends: dict[int, str] = {}

    async def consume() -> None:
        async for ev in engine.generate(req):
            if ev.token_ids and not ends:
                engine.abort(req.request_id)
                ends[-1] = "asked"
            if ev.final:
                assert ev.index not in ends
                ends[ev.index] = ev.finish_reason

    await asyncio.wait_for(consume(), HANG_S)
    assert sorted(ends) == [-1, 0, 1, 2, 3, 4] and "abort" in ends.values()
    assert set(ends.values()) <= {"asked", "abort", "length"}


async def test_preemption_under_a_small_kv_budget_loses_no_sample(default_model):
    # 20 blocks of 16 tokens: one request fits, three at once do not, so siblings are preempted and recomputed.
    eng = Engine(
        make_core(default_model, kv_memory=small_kv(default_model, 20), speculative=SpecConfig(row_cost=0.0)), threads=2
    )
    try:
        unit = "Once upon a time "
        reqs = [
            GenerationRequest(
                eng.tokenizer.encode(unit * (6 + i)),
                SamplingParams(
                    max_tokens=16, temperature=0.8, n=4, seed=i, ignore_eos=True, stop=["." * 40], logprobs=1
                ),
            )
            for i in range(3)
        ]
        streams = [eng.generate(r) for r in reqs]  # all queued at once: they overlap whatever the machine's speed
        results = await asyncio.gather(*(finals_of(eng, r, st) for r, st in zip(reqs, streams)))
        for finals in results:
            assert {ev.finish_reason for _, ev in finals.values()} == {"length"}
            assert all(ev.usage.completion_tokens == 16 for _, ev in finals.values())
        stats = eng.stats()
        assert stats["preemptions"] > 0
        assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_used"] == 0
    finally:
        await eng.shutdown()


async def test_what_could_never_fit_the_kv_budget_is_refused_naming_the_parameter(default_model):
    eng = Engine(make_core(default_model, kv_memory=small_kv(default_model, 16)), threads=2)  # 256 tokens
    try:
        prompt = eng.tokenizer.encode("Once upon a time " * 8)  # 33 tokens: 2 full blocks the samples share
        assert len(prompt) == 33

        def refused(**kw) -> str:
            with pytest.raises(InvalidRequest) as info:
                eng.generate(GenerationRequest(prompt, SamplingParams(**kw)))
            return info.value.param

        assert refused(n=16, max_tokens=8) == "n"  # 2 + 16 x 1 blocks > 16 however short the reply
        assert refused(n=4, max_tokens=200) == "max_tokens"  # 2 + 4 x 13 blocks; a shorter reply would fit
        assert eng.stats()["waiting"] == 0
        assert refused(n=7, max_tokens=33) == "max_tokens"
        # The largest that fits: 2 shared blocks + 7 x 2 blocks (a sample's last token needs no KV) = 16.
        finals = await finals_of(eng, GenerationRequest(prompt, SamplingParams(n=7, max_tokens=32, ignore_eos=True)))
        assert {ev.finish_reason for _, ev in finals.values()} == {"length"}
        assert all(ev.usage.completion_tokens == 32 for _, ev in finals.values())
        assert eng.stats()["preemptions"] == 0  # the count is exact: all seven held their KV at once
        # One sample always fits: a reply longer than the KV budget ends at the context's end instead.
        eng.core.validate(GenerationRequest(prompt, SamplingParams(n=1, max_tokens=10**9)))
    finally:
        await eng.shutdown()


async def test_a_sample_whose_end_went_missing_still_ends_its_consumer(engine, monkeypatch):
    # A backstop for bugs: were a final event ever lost inside the core, the consumer gets an error end, not a hang.
    step = engine.core.step

    def lossy() -> list[GenerationEvent]:
        return [ev for ev in step() if not (ev.final and ev.index == 1)]

    monkeypatch.setattr(engine.core, "step", lossy)
    prompt = engine.tokenizer.encode("Once upon a time")
    finals = await finals_of(engine, GenerationRequest(prompt, SamplingParams(max_tokens=2, n=3, ignore_eos=True)))
    assert finals[1][1].finish_reason == "error" and finals[1][1].error
    assert {finals[i][1].finish_reason for i in (0, 2)} == {"length"}

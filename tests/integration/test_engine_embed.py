"""`Engine.embed` on the default model and the default (numba) backend: the final norm's output pooled and
L2-normalised, computed by the step loop's chunked prefill beside generation, the same alone or in a batch,
over-context inputs refused or cut only when asked, and no KV left behind."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_helpers import make_core

from engine import Engine, GenerationRequest, InvalidRequest, SamplingParams
from kernels.attention_meta import build_attention_metadata

TEXTS = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today.", "hello"]


@pytest.fixture
async def engine(default_model):
    # max_batched_tokens 64: a 150-token input takes three steps, in chunks that other inputs share
    eng = Engine(make_core(default_model, kv_memory=16 << 20, max_batched_tokens=64), threads=2)
    yield eng
    await eng.shutdown()


def ids_of(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text)


def whole_forward(default_model, ids: list[int]) -> np.ndarray:
    """The final norm's output at every position of `ids`, from one forward over the whole input."""
    loaded, model = default_model
    c, bs = loaded.config, 16
    blocks = -(-len(ids) // bs)
    be = model.backend
    caches = [
        (
            be.empty_kv_cache(blocks, bs, c.num_kv_heads, c.head_dim, be.kv_dtype),
            be.empty_kv_cache(blocks, bs, c.num_kv_heads, c.head_dim, be.kv_dtype),
        )
        for _ in range(c.num_layers)
    ]
    meta = build_attention_metadata([len(ids)], [len(ids)], [list(range(blocks))], bs, be)
    be.begin_step()
    _, hidden = model.forward_hidden(
        np.asarray(ids), np.arange(len(ids)), meta, caches, np.zeros(0, dtype=np.int64), np.arange(len(ids))
    )
    return hidden.astype(np.float64)


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


async def test_vectors_are_the_pooled_final_norm_output_and_unit_length(engine, default_model):
    long = ids_of(engine, "Paris is the capital of France. " * 20)[:150]  # several prefill chunks
    inputs = [ids_of(engine, t) for t in TEXTS] + [long]
    for pooling in ("mean", "last"):
        vectors = await engine.embed(inputs, pooling)
        assert len(vectors) == len(inputs)
        for ids, v in zip(inputs, vectors):
            assert v.dtype == np.float32 and v.shape == (default_model[0].config.hidden_size,)
            assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
            hidden = whole_forward(default_model, ids)
            want = unit(hidden.mean(axis=0) if pooling == "mean" else hidden[-1])
            assert np.abs(v - want).max() < 1e-4, pooling
    mean, last = await engine.embed([long], "mean"), await engine.embed([long], "last")
    assert np.abs(mean[0] - last[0]).max() > 0.01  # the pooling is really chosen


async def test_an_input_gets_the_same_vector_alone_in_a_batch_and_among_concurrent_requests(engine):
    inputs = [ids_of(engine, t) for t in TEXTS] + [ids_of(engine, "Numbers: " + " ".join(map(str, range(60))))]
    alone = [(await engine.embed([ids]))[0] for ids in inputs]
    batch = await engine.embed(inputs)
    assert max(float(np.abs(a - b).max()) for a, b in zip(alone, batch)) < 1e-5
    # many requests at once, beside a generation: they share steps, nobody's result moves
    prompt = engine.render_chat([{"role": "user", "content": "Name three colours."}])
    params = SamplingParams(max_tokens=12, temperature=0.0, speculative="off")

    async def generate() -> list[int]:
        out: list[int] = []
        async for ev in engine.generate(GenerationRequest(prompt, params)):
            out += ev.token_ids
        return out

    solo_reply = await generate()
    steps = engine.stats()["steps"]
    results = await asyncio.gather(
        generate(), *(engine.embed([inputs[i % len(inputs)], inputs[(i + 1) % len(inputs)]]) for i in range(12))
    )
    assert results[0] == solo_reply
    for i, pair in enumerate(results[1:]):
        assert float(np.abs(pair[0] - alone[i % len(inputs)]).max()) < 1e-5
        assert float(np.abs(pair[1] - alone[(i + 1) % len(inputs)]).max()) < 1e-5
    total_tokens = sum(len(inputs[i % len(inputs)]) + len(inputs[(i + 1) % len(inputs)]) for i in range(12))
    assert engine.stats()["steps"] - steps < total_tokens // 8  # shared steps, not one per input or token


async def test_a_request_of_many_inputs_is_fed_a_window_at_a_time_and_leaves_no_kv_behind(engine):
    core = engine.core
    inputs = [ids_of(engine, t) for t in TEXTS]
    alone = [(await engine.embed([ids]))[0] for ids in inputs]
    many = await engine.embed(inputs * 10)  # more inputs than the window (32): fed as earlier ones finish
    assert len(many) == 40 and max(float(np.abs(v - alone[i % 4]).max()) for i, v in enumerate(many)) < 1e-5
    assert not core.has_work() and engine.stats()["waiting"] == 0
    assert core.blocks.num_free == core.blocks.num_blocks and not core.blocks.cached
    first = await engine.embed([ids_of(engine, TEXTS[0] * 5)])  # the same input again: computed again, same vector
    assert core.blocks.stats.hit_tokens == 0 and not core.blocks.cached
    assert float(np.abs(first[0] - (await engine.embed([ids_of(engine, TEXTS[0] * 5)]))[0]).max()) == 0.0


async def test_over_context_is_refused_unless_truncation_is_asked(default_model):
    eng = Engine(make_core(default_model, kv_memory=12 << 20), threads=2)  # a context of a few hundred tokens
    try:
        ctx = eng.max_context
        too_long = (ids_of(eng, "one two three four five six seven eight nine ten ") * 100)[: ctx + 5]
        with pytest.raises(InvalidRequest, match=f"input\\[1\\] has {ctx + 5} tokens") as err:
            await eng.embed([[1, 2, 3], too_long])
        assert err.value.param == "input"
        cut, exact = await eng.embed([too_long], truncate=True), await eng.embed([too_long[:ctx]])
        assert float(np.abs(cut[0] - exact[0]).max()) == 0.0
    finally:
        await eng.shutdown()


@pytest.mark.parametrize(
    "inputs,pooling,match",
    [
        ([], "mean", "1 to"),
        ([[]], "mean", r"input\[0\] is empty"),
        ([[1, -1]], "mean", "token ids"),
        ([[1, 10**9]], "mean", "token ids"),
        ([[1, 2]], "max", "pooling"),
        ([[1, True]], "mean", "token ids"),
    ],
)
async def test_bad_inputs_are_refused_before_anything_is_queued(engine, inputs, pooling, match):
    with pytest.raises(InvalidRequest, match=match):
        await engine.embed(inputs, pooling)
    assert not engine.core.has_work()


async def test_the_models_own_pooling_wins(engine, monkeypatch):
    ids = ids_of(engine, "Paris is the capital of France.")
    last = (await engine.embed([ids], "last"))[0]
    monkeypatch.setattr(engine.core.loaded, "pooling", "last")  # as a GGUF with pooling_type 3 says
    assert engine.pooling == "last"
    assert float(np.abs((await engine.embed([ids], "mean"))[0] - last).max()) == 0.0


async def test_the_bench_reports_embedding_rates(engine):
    from engine.bench import _embeddings

    out = await _embeddings(engine, 4, 1)
    assert out["input_tokens"] == 64 and out["inputs_per_s_batch1"] > 0 and out["inputs_per_s_batch4"] > 0


def test_a_large_request_waits_in_the_core_a_window_at_a_time_and_aborts_whole(default_model):
    core = make_core(default_model, kv_memory=16 << 20)
    core.add_embedding("r", [[1, 2, 3]] * 40, "mean")
    assert len(core.scheduler.waiting) == 32 and core.stats()["waiting"] == 40
    events = core.abort("r")
    assert sorted(ev.index for ev in events if ev.final) == list(range(40))  # the backlog ends too, once
    assert not core.has_work() and core.stats()["waiting"] == 0

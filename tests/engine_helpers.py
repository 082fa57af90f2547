"""Drive the synchronous engine core to completion (tests only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.llm_engine import EngineConfig, LLMEngine
from engine.types import GenerationEvent, GenerationRequest, SamplingParams, TokenLogprob
from kernels.attention_meta import build_attention_metadata


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: GenerationEvent | None = None


def make_core(default_model, **config) -> LLMEngine:
    loaded, model = default_model
    return LLMEngine(loaded, model, EngineConfig(**config))


def chat_prompt(core: LLMEngine, messages: list[dict[str, str]]) -> list[int]:
    """The messages in the model's chat template, as token ids."""
    from engine.chat_template import render_chat

    tok = core.tokenizer
    return tok.encode(
        render_chat(
            core.loaded.chat_template,
            messages,
            add_generation_prompt=True,
            bos_token=tok.bos_token,
            eos_token=tok.eos_token,
        )
    )


def greedy(prompt: list[int], max_tokens: int = 16, **kw) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw))


def collect(events: list[GenerationEvent], results: dict[tuple[str, int], Result]) -> None:
    for ev in events:
        r = results.setdefault((ev.request_id, ev.index), Result())
        r.token_ids += ev.token_ids
        r.text += ev.text
        r.logprobs += ev.logprobs or []
        if ev.final:
            r.final = ev


def run_all(core: LLMEngine, requests: list[GenerationRequest], max_steps: int = 10_000) -> dict[str, Result]:
    """Submit everything, step until idle; results by request id (sample 0)."""
    results: dict[tuple[str, int], Result] = {}
    for req in requests:
        core.add_request(req)
    for _ in range(max_steps):
        if not core.has_work():
            break
        collect(core.step(), results)
    assert not core.has_work(), "engine did not finish"
    return {rid: r for (rid, idx), r in results.items() if idx == 0}


def greedy_divergence(reference, prompt: list[int], got: list[int], want: list[int]) -> tuple[int, float] | None:
    """None when greedy ids `got` equal the reference's `want`; else (the first generated position where they
    differ, the reference's top-1 minus top-2 logit there). `reference`: (LoadedModel, LlamaModel)."""
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if at is None:
        assert len(got) == len(want)
        return None
    ids = prompt + want[:at]
    core = make_core(reference, kv_memory=1 << 24, block_size=16)
    meta = build_attention_metadata([len(ids)], [len(ids)], [list(range(-(-len(ids) // 16)))], 16, core.backend)
    logits = core.model.forward(
        np.asarray(ids), np.arange(len(ids)), meta, core.runner.kv_caches, np.array([len(ids) - 1])
    )[0]
    top = np.sort(logits)[-2:]
    return at, float(top[1] - top[0])

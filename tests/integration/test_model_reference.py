"""The engine against Hugging Face transformers' float32 reference for the default model, on the
numba backend (quantized weights, compiled kernels) and on the float32 NumPy reference backend."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import greedy, make_core, run_all

from kernels.attention_meta import build_attention_metadata


def first_logits(core, prompt: list[int]) -> np.ndarray:
    """Logits after the whole prompt, computed in one prefill through the paged cache."""
    bs = core.blocks.block_size
    n_blocks = -(-len(prompt) // bs)
    table = list(range(n_blocks))
    meta = build_attention_metadata([len(prompt)], [len(prompt)], [table], bs, core.backend)
    return core.model.forward(
        np.asarray(prompt), np.arange(len(prompt)), meta, core.runner.kv_caches, np.asarray([len(prompt) - 1])
    )[0]


@pytest.fixture(scope="module", params=["numba", "numpy"])
def core(request, default_model, reference_model):
    return make_core(default_model if request.param == "numba" else reference_model, kv_memory=64 << 20)


def test_prompt_tokens_match_reference(core, reference):
    for case in reference["prompts"]:
        assert core.tokenizer.encode(case["prompt_text"]) == case["prompt_ids"]


def test_first_position_logits_within_1e4(core, reference):
    for case in reference["prompts"]:
        logits = first_logits(core, case["prompt_ids"])
        top = case["first_position_top5"]
        assert np.argsort(-logits)[:5].tolist() == top["ids"]
        np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=1e-4, rtol=0)
        stats = case["first_position_logits_stats"]
        np.testing.assert_allclose(logits[:8], stats["first8"], atol=1e-4, rtol=0)
        assert abs(float(logits.mean()) - stats["mean"]) < 1e-4


def test_greedy_ids_equal_reference(core, reference):
    reqs = {}
    for i, case in enumerate(reference["prompts"]):
        reqs[f"eos{i}"] = greedy(case["prompt_ids"], max_tokens=32)
        reqs[f"all{i}"] = greedy(case["prompt_ids"], max_tokens=32, ignore_eos=True)
    for rid, req in reqs.items():
        req.request_id = rid
    results = run_all(core, list(reqs.values()))
    for i, case in enumerate(reference["prompts"]):
        assert results[f"eos{i}"].token_ids == case["generated_ids"]
        assert results[f"eos{i}"].final.finish_reason == ("stop" if case["stopped_at_eos"] else "length")
        assert results[f"all{i}"].token_ids == case["greedy32_no_eos_stop_ids"]
        assert results[f"eos{i}"].text == case["generated_text_skip_special"]


def test_top1_logit_at_every_greedy_step_matches_reference(core, reference):
    """Teacher-forced over the 32 reference steps: every step's top-1 logit agrees."""
    bs = core.blocks.block_size
    worst = 0.0
    for case in reference["prompts"]:
        ids = case["prompt_ids"] + case["greedy32_no_eos_stop_ids"]
        n_prompt, steps = len(case["prompt_ids"]), len(case["greedy32_no_eos_stop_ids"])
        meta = build_attention_metadata([len(ids)], [len(ids)], [list(range(-(-len(ids) // bs)))], bs, core.backend)
        rows = np.arange(n_prompt - 1, n_prompt - 1 + steps)
        logits = core.model.forward(np.asarray(ids), np.arange(len(ids)), meta, core.runner.kv_caches, rows)
        assert logits.argmax(axis=1).tolist() == case["greedy32_no_eos_stop_ids"]
        diff = np.abs(logits.max(axis=1) - case["greedy32_no_eos_stop_top1_logit"]).max()
        worst = max(worst, float(diff))
    assert worst < 1e-4, f"worst top-1 logit difference {worst:.2e}"

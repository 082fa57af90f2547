"""The whole engine on the CuPy backend (quantized weights on the GPU, float16 KV cache) against the
NumPy float32 reference backend on the default model's fixture prompts. Needs a CUDA GPU; skipped
otherwise, with the reason.

Greedy ids must agree. float16 K/V and float16 prefill products move logits by ~1e-3, so a step may
only flip where the reference's two best logits are closer than NEAR_TIE; the first divergence of
each reply and that margin are printed (pytest -s) whatever happens.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine_helpers import greedy, greedy_divergence, make_core, run_all
from kernels import cupy_unavailable_reason, get_backend
from kernels.attention_meta import build_attention_metadata

_REASON = cupy_unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"no CUDA GPU on this machine ({_REASON})")

TOKENS = 32
NEAR_TIE = 0.05


@pytest.fixture(scope="module")
def gpu_model(loaded_default):
    from engine.model.llama import LlamaModel

    return loaded_default, LlamaModel(loaded_default.config, loaded_default.weights, get_backend("cupy"))


@pytest.mark.parametrize("graphs", [True, False], ids=["cuda_graphs", "eager"])
def test_greedy_ids_equal_the_numpy_backend(gpu_model, reference_model, reference, graphs):
    prompts = [case["prompt_ids"] for case in reference["prompts"]]
    prompts += [prompts[0][:7], prompts[1] + prompts[2][5:40]]

    def reqs():
        out = [greedy(p, TOKENS, ignore_eos=True) for p in prompts]
        for i, r in enumerate(out):
            r.request_id = f"r{i}"
        return out

    core = make_core(gpu_model, kv_memory=256 << 20, cuda_graphs=graphs)
    got = run_all(core, reqs())
    want = run_all(make_core(reference_model, kv_memory=64 << 20), reqs())
    assert (core.runner.graphs is not None) == graphs and (not graphs or core.runner.graphs._graphs)
    for i, prompt in enumerate(prompts):
        a, b = got[f"r{i}"].token_ids, want[f"r{i}"].token_ids
        diverged = greedy_divergence(reference_model, prompt, a, b)
        if diverged is None:
            print(f"r{i}: {TOKENS} greedy ids equal")
            continue
        at, margin = diverged
        print(f"r{i}: first divergence at generated token {at} ({a[at]} vs {b[at]}), reference margin {margin:.4f}")
        assert margin < NEAR_TIE, f"r{i} diverges at token {at} where the reference margin is {margin:.4f}"


def test_first_position_logits_close_to_transformers(gpu_model, reference):
    core = make_core(gpu_model, kv_memory=64 << 20)
    for case in reference["prompts"]:
        ids = case["prompt_ids"]
        meta = build_attention_metadata([len(ids)], [len(ids)], [list(range(-(-len(ids) // 16)))], 16, core.backend)
        logits = core.model.forward(np.asarray(ids), np.arange(len(ids)), meta, core.runner.kv_caches, np.array([len(ids) - 1]))[0]
        top = case["first_position_top5"]
        assert int(np.argmax(logits)) == top["ids"][0]
        np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=5e-2, rtol=0)  # float16 paths: ~1e-3 relative

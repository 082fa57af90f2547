"""The whole engine on the CuPy backend (quantized weights on the GPU, float16 KV cache) against the
NumPy float32 reference backend on the same weights. Needs a CUDA GPU; skipped otherwise, with the reason.

The model is the default one, or the GGUF that FORGE_GPU_TEST_MODEL names (a machine without the default
model makes one with `forge synth --shape smollm2-135m`: scripts/gpu_check.py does). The prompts are the
fixture's token ids, valid in either (a synthetic model carries the default tokenizer).

The GPU rounds where it says it does: K/V to float16, and activations to float16 in products of more than
GEMV_MAX_ROWS rows (prefill). How far those roundings alone move a model's logits depends on the model: about
2e-3 (norm-wise) on the default model, 2e-2 on a synthetic one with random weights, where 1e-6 of noise in
every product already moves them 1e-2. So the bounds are the larger of a fixed floor and three times what the
same roundings do on the NumPy reference (`GpuRoundings`): a wrong kernel is off by far more than either.
Greedy ids may differ only where the reference's two best logits are closer than that bound's absolute twin.
The first divergence of each reply, its margin and the bounds are printed (pytest -s) whatever happens.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from engine_helpers import greedy, greedy_divergence, make_core, run_all

from kernels import cupy_unavailable_reason, get_backend
from kernels.attention_meta import build_attention_metadata
from kernels.cuda_launch import GEMV_MAX_ROWS
from kernels.numpy_backend import NumpyBackend

_REASON = cupy_unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"no CUDA GPU on this machine ({_REASON})")

MODEL = os.environ.get("FORGE_GPU_TEST_MODEL")  # a GGUF instead of the default model
TOKENS = 32
NEAR_TIE = 0.05  # floors of the bounds (see the module docstring)
LOGITS_REL = 1e-2
SENSITIVITY = 3.0


class GpuRoundings(NumpyBackend):
    """The NumPy reference rounded where the CuPy backend rounds: K/V to float16, and x to float16 in products of
    more than GEMV_MAX_ROWS rows (its cuBLAS panels also round the weights, which this leaves out)."""

    def linear(self, x, weight, bias=None):
        if x.shape[0] > GEMV_MAX_ROWS:
            x = x.astype(np.float16).astype(np.float32)
        return super().linear(x, weight, bias)

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping):
        half = lambda a: np.asarray(a, np.float16).astype(np.float32)
        super().write_kv(k_cache, v_cache, half(k), half(v), slot_mapping)


@pytest.fixture(scope="module")
def loaded(request):
    if not MODEL:
        return request.getfixturevalue("loaded_default")
    from engine.loader import load_model

    return load_model(MODEL)


@pytest.fixture(scope="module")
def gpu_model(loaded):
    from engine.model.llama import LlamaModel

    return loaded, LlamaModel(loaded.config, loaded.weights, get_backend("cupy"))


@pytest.fixture(scope="module")
def numpy_model(loaded):
    """The same weights dequantized to float32 on the NumPy reference backend."""
    from engine.model.llama import LlamaModel

    return loaded, LlamaModel(loaded.config, loaded.weights, get_backend("numpy"))


@pytest.fixture(scope="module")
def bounds(loaded, numpy_model, reference) -> list[tuple[float, float]]:
    """Per prompt: (norm-wise, absolute) bounds on the GPU's first-position logits error, from what the GPU's
    roundings do to the reference (GpuRoundings) on this model."""
    from engine.model.llama import LlamaModel

    rounded = loaded, LlamaModel(loaded.config, loaded.weights, GpuRoundings())
    out = []
    for i, ids in enumerate(_prompts(reference)):
        want, moved = _first_logits(numpy_model, ids), _first_logits(rounded, ids)
        rel = float(np.linalg.norm(moved - want) / np.linalg.norm(want))
        absolute = float(np.abs(moved - want).max())
        out.append((max(LOGITS_REL, SENSITIVITY * rel), max(NEAR_TIE, SENSITIVITY * absolute)))
        print(f"prompt {i}: the GPU's roundings alone move the logits {rel:.2e} (max abs {absolute:.2e})")
    return out


def _prompts(reference) -> list[list[int]]:
    prompts = [case["prompt_ids"] for case in reference["prompts"]]
    return prompts + [prompts[0][:7], prompts[1] + prompts[2][5:40]]


def _first_logits(model_pair, ids: list[int]) -> np.ndarray:
    core = make_core(model_pair, kv_memory=64 << 20)
    meta = build_attention_metadata([len(ids)], [len(ids)], [list(range(-(-len(ids) // 16)))], 16, core.backend)
    return core.model.forward(
        np.asarray(ids), np.arange(len(ids)), meta, core.runner.kv_caches, np.array([len(ids) - 1])
    )[0]


@pytest.mark.parametrize("graphs", [True, False], ids=["cuda_graphs", "eager"])
def test_greedy_ids_equal_the_numpy_backend(gpu_model, numpy_model, reference, bounds, graphs):
    prompts = _prompts(reference)

    def reqs():
        out = [greedy(p, TOKENS, ignore_eos=True) for p in prompts]
        for i, r in enumerate(out):
            r.request_id = f"r{i}"
        return out

    core = make_core(gpu_model, kv_memory=256 << 20, cuda_graphs=graphs)
    got = run_all(core, reqs())
    want = run_all(make_core(numpy_model, kv_memory=64 << 20), reqs())
    assert (core.runner.graphs is not None) == graphs and (not graphs or core.runner.graphs._graphs)
    for i, prompt in enumerate(prompts):
        a, b = got[f"r{i}"].token_ids, want[f"r{i}"].token_ids
        diverged = greedy_divergence(numpy_model, prompt, a, b)
        if diverged is None:
            print(f"r{i}: {TOKENS} greedy ids equal")
            continue
        at, margin = diverged
        tie = bounds[i][1]
        print(f"r{i}: first divergence at generated token {at} ({a[at]} vs {b[at]}), reference margin {margin:.4f}")
        assert margin < tie, f"r{i} diverges at token {at} where the reference margin is {margin:.4f} (bound {tie:.3f})"


def test_first_position_logits_close_to_the_numpy_backend(gpu_model, numpy_model, reference, bounds):
    for i, ids in enumerate(_prompts(reference)):
        got, want = _first_logits(gpu_model, ids), _first_logits(numpy_model, ids)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        top = np.sort(want)[-2:]
        rel, tie = bounds[i]
        print(
            f"prompt {i}: first-position logits relative error {err:.2e}, max abs {np.abs(got - want).max():.2e}"
            f" (bounds {rel:.2e}, {tie:.3f})"
        )
        assert err < rel, f"prompt {i}: relative error {err:.2e} (bound {rel:.2e})"
        assert int(np.argmax(got)) == int(np.argmax(want)) or top[1] - top[0] < tie


@pytest.mark.skipif(MODEL is not None, reason="the transformers reference is the default model's")
def test_first_position_logits_close_to_transformers(gpu_model, reference):
    for case in reference["prompts"]:
        logits = _first_logits(gpu_model, case["prompt_ids"])
        top = case["first_position_top5"]
        assert int(np.argmax(logits)) == top["ids"][0]
        np.testing.assert_allclose(
            logits[top["ids"]], top["values"], atol=5e-2, rtol=0
        )  # float16 paths: ~1e-3 relative

"""The CUDA kernels themselves, run on the CPU (no GPU here): kernels/cuda/*.cu built with g++ over a
fiber-based CUDA shim (_cuda_on_cpu.py), driven by the CuPy backend on the NumPy stand-in for CuPy,
through the parity tests a GPU runs (test_kernels_cupy_parity.py). This checks the kernels' indexing,
arithmetic and synchronisation, and CUDA graphs as the stand-in models them (a replay redoes the captured
work at the captured addresses, in memory from a pool that reuses freed blocks); it is not a GPU: no memory
model, timing or FMA contraction."""

from __future__ import annotations

import _cuda_on_cpu
import _cupy_stand_in
import numpy as np
import pytest
from _attention_cases import make_case
from test_kernels_cupy_parity import (  # noqa: F401  (collected here, on the CPU build of the kernels)
    RTOL_SUM,
    _attention_pair,
    _close,
    test_a_replayed_decode_graph_equals_the_eager_step,
    test_add_rms_norm_updates_the_residual_in_place,
    test_apply_token_bitmask,
    test_argmax_takes_the_first_maximum,
    test_each_gemv_route_over_several_rounds_of_k,
    test_embedding_of_float_tables,
    test_embedding_rows_are_bit_equal_to_gguf_py,
    test_linear_over_every_block_type,
    test_linear_over_float_weights,
    test_logprob_rows_match_the_host,
    test_paged_attention,
    test_panels_cover_a_weight_larger_than_one,
    test_replays_of_two_buckets_in_turn_equal_the_eager_steps,
    test_rms_norm,
    test_rope_contiguous_and_strided_view,
    test_rope_cos_sin_with_llama3_scaling,
    test_rope_write_kv_rotates_q_and_writes_float16_k_v,
    test_sample_rows_over_a_full_vocabulary_of_strided_rows,
    test_sample_rows_picks_what_the_host_sampler_picks,
    test_silu_mul,
    test_tiny_model_logits_match_numpy,
    test_write_kv_float16,
)

from kernels.numpy_backend import NumpyBackend

_REASON = _cuda_on_cpu.unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.fixture(scope="module", autouse=True)
def stand_in():
    mp = pytest.MonkeyPatch()
    yield _cupy_stand_in.install(mp, execute=True)
    mp.undo()


@pytest.fixture(scope="module")
def gpu(stand_in):
    from kernels.cupy_backend import CupyBackend

    return CupyBackend()


@pytest.fixture(scope="module")
def cpu() -> NumpyBackend:
    return NumpyBackend()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(4321)


@pytest.mark.parametrize("head_dim", [80, 256])
def test_paged_attention_many_tiles_and_odd_shapes(gpu, cpu, rng, head_dim):
    """test_paged_attention_long_context_and_odd_shapes at a size the CPU build runs in about a second: several
    key tiles per warp, a ragged last row tile and warps without rows, block size 32, strided q."""
    case = make_case(
        rng, [(1, 300), (40, 130), (1, 3), (17, 17)], heads=4, kv_heads=2, head_dim=head_dim, block_size=32
    )
    got, want = _attention_pair(gpu, cpu, case, head_dim**-0.5, q_view=True)
    _close(gpu, got, want, RTOL_SUM, RTOL_SUM)


@pytest.mark.parametrize("arch,dtype,quantize", [("llama", "F16", None), ("qwen2", "BF16", "q8_0")])
def test_the_engine_over_the_cpu_build_gives_the_numpy_backends_greedy_ids(
    gpu, tmp_path, monkeypatch, arch, dtype, quantize
):
    """Tiny GGUF models (float16 weights; q/k/v biases and Q8_0 at load) through the engine: chunked prefills
    beside decodes, float16 KV, plain decode steps replayed from the CUDA graphs captured at load. Float16
    products move logits by ~1e-3, so ids may differ only where the reference's two best logits are closer
    than 0.01."""
    from _gguf_helpers import write_tiny_pair
    from engine_helpers import greedy, greedy_divergence, run_all

    from engine.llm_engine import EngineConfig, LLMEngine
    from engine.loader import load_model
    from engine.model.llama import LlamaModel

    replays = []
    real_replay = gpu.replay
    monkeypatch.setattr(gpu, "replay", lambda graph: replays.append(graph) or real_replay(graph))
    loaded = load_model(write_tiny_pair(tmp_path, arch, dtype=dtype)[1], quantize=quantize)
    prompts = [[5, 17, 42, 8, 99, 23, 61, 7, 150, 3, 77], [9, 8, 7], list(range(30, 54))]
    ids, models = [], [(loaded, LlamaModel(loaded.config, loaded.weights, be)) for be in (gpu, NumpyBackend())]
    for model in models:
        reqs = [greedy(p, 6, ignore_eos=True) for p in prompts]
        for i, r in enumerate(reqs):
            r.request_id = f"r{i}"
        core = LLMEngine(*model, EngineConfig(kv_memory=1 << 20, max_num_seqs=8, max_batched_tokens=16))
        ids.append([run_all(core, reqs)[f"r{i}"].token_ids for i in range(len(prompts))])
        if model[1].backend is gpu:
            assert sorted(core.runner.graphs._graphs) == [1, 2, 4, 8]
    for prompt, got, want in zip(prompts, *ids):
        diverged = greedy_divergence(models[1], prompt, got, want)
        assert diverged is None or diverged[1] < 0.01, diverged
    assert replays


def test_the_engine_samples_on_the_device_what_the_host_path_samples(gpu, tmp_path, monkeypatch):
    """Seeded sampled requests (temperature, top-k, top-p, min-p, logprobs; one greedy beside them; no drafts) on a
    tiny model: through the backend's sample_rows and logprob_rows only token ids and logprobs leave the device,
    and they equal what the same engine samples on the host from copied logits (is_single_draw forced off), so
    each sequence's rng is used the same way."""
    from _gguf_helpers import write_tiny_pair
    from engine_helpers import run_all

    from engine import sampler as llm_engine
    from engine.llm_engine import EngineConfig, LLMEngine
    from engine.loader import load_model
    from engine.model.llama import LlamaModel
    from engine.types import GenerationRequest, SamplingParams

    loaded = load_model(write_tiny_pair(tmp_path, "llama", dtype="F16")[1])
    model = LlamaModel(loaded.config, loaded.weights, gpu)
    settings = [
        dict(temperature=1.3),
        dict(temperature=0.8, top_k=20, logprobs=3),
        dict(temperature=1.0, top_p=0.9),
        dict(temperature=1.7, top_k=40, top_p=0.8, min_p=0.05),
        dict(temperature=0.0, logprobs=0),
    ]
    copied = []

    def run() -> list:
        reqs = [
            GenerationRequest(
                [5, 17, 42 + i, 8],
                SamplingParams(max_tokens=6, seed=100 + i, ignore_eos=True, speculative="off", **s),
                request_id=f"r{i}",
            )
            for i, s in enumerate(settings)
        ]
        core = LLMEngine(loaded, model, EngineConfig(kv_memory=1 << 20, cuda_graphs=False))
        out = run_all(core, reqs)
        return [
            (
                out[f"r{i}"].token_ids,
                [(lp.token_id, lp.logprob, [t for t, _ in lp.top]) for lp in out[f"r{i}"].logprobs],
            )
            for i in range(len(settings))
        ]

    real_to_numpy = gpu.to_numpy
    monkeypatch.setattr(gpu, "to_numpy", lambda a: copied.append(a.shape) or real_to_numpy(a))
    before = len(gpu.xp.launches)
    on_device = run()
    assert "sample_rows_f32" in [launch.kernel for launch in gpu.xp.launches[before:]]
    assert copied and all(shape[-1:] != (loaded.config.vocab_size,) for shape in copied)  # ids, never logits
    monkeypatch.setattr(llm_engine, "is_single_draw", lambda row: False)
    on_host = run()
    assert [ids for ids, _ in on_host] == [ids for ids, _ in on_device]
    assert [len(lps) for _, lps in on_device] == [0, 6, 0, 0, 6]
    for (_, host_lps), (_, device_lps) in zip(on_host, on_device):
        for (token, lp, top), (d_token, d_lp, d_top) in zip(host_lps, device_lps):
            assert (token, top) == (d_token, d_top) and lp == pytest.approx(d_lp, abs=1e-5)
    assert any(shape[-1:] == (loaded.config.vocab_size,) for shape in copied)


def test_a_wrong_tiled_gemv_is_retired_for_the_plain_one_at_start_up(gpu, monkeypatch):
    """The start-up gate on the GPU's routes: a planted tiled GEMV that writes one output wrong fails its check, the
    plain kernels replace it (the failed checks say so), and the checks that follow all pass on the plain route."""
    real = gpu._kernel

    def planted(name):
        fn = real(name)
        if not name.startswith("gemv_tiled"):
            return fn

        def wrong(grid, block, args):
            fn(grid, block, args)
            args[0][0, 0] += 1.0  # one value of `out` off

        return wrong

    monkeypatch.setattr(gpu, "_kernel", planted)
    monkeypatch.setattr(gpu, "gemv", "gemv_tiled")
    checks = gpu.check_routes()
    assert gpu.gemv == "gemv"
    retired = [c for c in checks if c.replaced_by == "gemv"]
    assert retired and all(not c.ok and c.rows <= 32 for c in retired)
    assert all(c.ok for c in checks if c.replaced_by is None)

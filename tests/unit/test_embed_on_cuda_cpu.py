"""Embeddings through the CuPy backend's path (the CUDA kernels built for the CPU, on the NumPy stand-in for
CuPy; see test_cuda_kernels_on_cpu.py): the engine core's pooled vectors equal the NumPy reference backend's
up to float16 KV's rounding, with chunked prefills beside a generation."""

from __future__ import annotations

import _cuda_on_cpu
import _cupy_stand_in
import numpy as np
import pytest

_REASON = _cuda_on_cpu.unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.fixture(scope="module", autouse=True)
def stand_in():
    mp = pytest.MonkeyPatch()
    yield _cupy_stand_in.install(mp, execute=True)
    mp.undo()


def embed_all(core, inputs: list[list[int]], pooling: str) -> list[np.ndarray]:
    from engine.types import GenerationRequest, SamplingParams

    core.add_request(
        GenerationRequest(
            [9, 8, 7], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), request_id="beside"
        )
    )
    core.add_embedding("e", inputs, pooling)
    out: dict[int, np.ndarray] = {}
    for _ in range(200):
        if not core.has_work():
            break
        for ev in core.step():
            if ev.request_id == "e" and ev.final:
                assert ev.error is None, ev.error
                out[ev.index] = ev.embedding
    assert not core.has_work() and core.blocks.num_free == core.blocks.num_blocks
    return [out[i] for i in range(len(inputs))]


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_pooled_vectors_on_the_cuda_path_match_numpy(tmp_path, pooling):
    from _gguf_helpers import write_tiny_pair

    from engine.llm_engine import EngineConfig, LLMEngine
    from engine.loader import load_model
    from engine.model.llama import LlamaModel
    from kernels.cupy_backend import CupyBackend
    from kernels.numpy_backend import NumpyBackend

    loaded = load_model(write_tiny_pair(tmp_path, "llama", dtype="F16")[1])
    inputs = [[5, 17, 42, 8, 99, 23, 61, 7, 150, 3, 77] * 3, [9, 8, 7], list(range(30, 54))]
    got = []
    for be in (CupyBackend(), NumpyBackend()):
        core = LLMEngine(
            loaded,
            LlamaModel(loaded.config, loaded.weights, be),
            EngineConfig(kv_memory=1 << 20, max_batched_tokens=16, cuda_graphs=False),
        )
        got.append(embed_all(core, inputs, pooling))
    for gpu_v, cpu_v in zip(*got):
        assert gpu_v.dtype == np.float32 and abs(float(np.linalg.norm(gpu_v)) - 1) < 1e-5
        assert np.abs(gpu_v - cpu_v).max() < 2e-3

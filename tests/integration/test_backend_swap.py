"""The parts of the quick start (engine/backend_swap.py) in one process: the compile stamp, when a swap is planned,
and a switch from the float32 reference to the numba model between two steps, with sequences running."""

from __future__ import annotations

import numba
import pytest
from engine_helpers import collect, greedy, make_core

from engine import backend_swap
from engine.backend_swap import BackendSwap
from kernels import (
    compile_stamp,
    get_backend,
    numba_backend,  # noqa: F401  (kernels bind numba's cache folder on import: before a test moves it)
)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_stamp_marks_one_model_compiled_in_numbas_cache_folder(empty_cache) -> None:
    assert compile_stamp.cache_dir() == str(empty_cache)
    assert not compile_stamp.is_compiled("model-a")
    compile_stamp.mark_compiled("model-a")
    assert compile_stamp.is_compiled("model-a") and not compile_stamp.is_compiled("model-b")
    assert [p.parent for p in empty_cache.iterdir()] == [empty_cache]


def test_a_swap_is_planned_only_for_uncompiled_numba_kernels_that_fit_in_memory(
    empty_cache, loaded_default, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    numba_be = get_backend("numba")
    key = backend_swap.model_key(loaded_default, None, "f32")
    assert BackendSwap.plan(loaded_default, get_backend("numpy"), key, said.append) is None
    assert BackendSwap.plan(loaded_default, get_backend("numba", activations="q8"), key, said.append) is None
    monkeypatch.setattr(backend_swap, "MEMORY_SHARE", 1e-6)
    assert BackendSwap.plan(loaded_default, numba_be, key, said.append) is None
    assert said and "before serving" in said[-1] and "available memory" in said[-1]
    monkeypatch.setattr(backend_swap, "MEMORY_SHARE", 0.25)
    assert isinstance(BackendSwap.plan(loaded_default, numba_be, key, said.append), BackendSwap)
    compile_stamp.mark_compiled(key)  # compiled here: load as before
    assert BackendSwap.plan(loaded_default, numba_be, key, said.append) is None


def test_running_sequences_continue_on_the_numba_model_with_the_reference_greedy_tokens(
    default_model, reference_model, reference
) -> None:
    """Both fixture prompts that run 32 tokens without an end of turn, switched mid-reply: the KV cache the
    reference wrote carries over."""
    cases = [reference["prompts"][i] for i in (1, 2)]
    core = make_core(reference_model, kv_memory=64 << 20)
    for i, case in enumerate(cases):
        req = greedy(case["prompt_ids"], 32)
        req.request_id = f"r{i}"
        core.add_request(req)
    results: dict = {}
    while core.has_work() and min((len(r.token_ids) for r in results.values()), default=0) < 10:
        collect(core.step(), results)
    assert core.backend.name == "numpy" and len(results) == 2
    core.use_model(default_model[1])
    assert core.backend.name == "numba" and core.runner.backend is core.sampler.backend is core.backend
    while core.has_work():
        collect(core.step(), results)
    for i, case in enumerate(cases):
        assert results[(f"r{i}", 0)].token_ids == case["greedy32_no_eos_stop_ids"], i

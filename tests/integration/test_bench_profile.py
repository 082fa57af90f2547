"""`forge bench --profile`'s decode profile on the default model and backend: the steps it times are decode steps
(one row each; the prompt's prefill is left out), with every layer's ops counted in each."""

from __future__ import annotations

import pytest
from engine_helpers import make_core

from engine import Engine
from engine.bench import _profile_decode


@pytest.fixture
async def engine(default_model):
    eng = Engine(make_core(default_model, kv_memory=16 << 20), threads=2)
    yield eng
    await eng.shutdown()


async def test_the_decode_profile_times_the_decode_steps_only(engine):
    tokens = 8
    out = await _profile_decode(engine, tokens)
    layers = engine.core.model.config.num_layers
    # The first token comes from the prompt's forward (32 rows), which is not timed; each later token is a step.
    assert out["steps"] == tokens - 1 and out["rows_per_step"] == 1.0, out
    calls = out["calls_per_step"]
    assert calls["linear"] == 4 * layers + 1 and calls["paged_attention"] == layers, calls
    assert 0 < sum(out["ops_ms"].values()) < out["step_ms"] and 0 < out["outside_kernels_share"] < 1, out

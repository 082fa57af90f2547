"""Sampling on a backend (engine/sampling.py `sample_on_backend`: the backend's sample_rows and logprob_rows) equals
the host sampler (`sample`) on the same rows: the same token and logprobs from the same logits, params and seeded
generator, with one draw a sampled row.
The CuPy kernel is held to the NumPy op in test_kernels_cupy_parity.py (on the CPU: test_cuda_kernels_on_cpu.py)."""

from __future__ import annotations

import numpy as np

from engine.sampling import SamplerRow, draw_table, is_single_draw, make_rng, sample, sample_on_backend
from engine.types import SamplingParams
from kernels.numpy_backend import NumpyBackend

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.3, top_k=1),
    dict(temperature=1.7, top_k=40),
    dict(temperature=1.0, top_p=0.1),
    dict(temperature=0.7, top_p=0.9, min_p=0.05),
    dict(temperature=1.2, top_k=50, top_p=0.95, logprobs=4),
    dict(temperature=0.0, logprobs=0),
]


def rows(seed: int) -> list[SamplerRow]:
    out = []
    for i, s in enumerate(SETTINGS):
        p = SamplingParams(seed=seed + i, **s)
        out.append(SamplerRow(p, make_rng(p.seed) if p.temperature > 0 else None, [1, 2, 3], 3))
    return out


def test_the_backend_op_samples_what_the_host_sampler_samples():
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal((len(SETTINGS), 5000)) * 3).astype(np.float32)
    logits[:, ::7] = -np.inf  # masked tokens, as a grammar leaves them
    backend = NumpyBackend()
    seen = set()
    for seed in range(20):
        host, dev = rows(seed), rows(seed)
        assert all(is_single_draw(r) for r in dev)
        want = sample(logits, host)
        got = sample_on_backend(backend, logits, dev)
        assert got == [([t], None if lp is None else [lp]) for t, lp in zip(want.token_ids.tolist(), want.logprobs)]
        assert [r.rng.random() for r in host if r.rng] == [r.rng.random() for r in dev if r.rng]  # the same draws spent
        seen.add(tuple(want.token_ids.tolist()))
    assert len(seen) > 10  # the seeds do change the picks


def test_rows_with_penalties_bias_or_a_draft_are_not_single_draws():
    base = rows(0)[1]
    for p in (
        SamplingParams(presence_penalty=0.5),
        SamplingParams(repetition_penalty=1.2),
        SamplingParams(logit_bias={3: 1.0}),
    ):
        assert not is_single_draw(SamplerRow(p, base.rng, [1], 1))
    assert not is_single_draw(SamplerRow(base.params, base.rng, [1], 1, draft=[4]))


def test_a_row_without_a_usable_token_fails_alone():
    logits = np.zeros((3, 8), np.float32)
    logits[0, 2], logits[1] = np.nan, -np.inf
    table = draw_table([SamplerRow(SamplingParams(seed=1), make_rng(1), [1], 1)] * 3)
    assert NumpyBackend().sample_rows(logits, table).tolist()[:2] == [-1, -1]
    out = sample_on_backend(
        NumpyBackend(), logits, [SamplerRow(SamplingParams(seed=1, logprobs=2), make_rng(1), [1], 1)] * 3
    )
    assert [type(r) for r in out[:2]] == [ValueError] * 2 and "row 1 has no usable token" in str(out[1])
    assert len(out[2][0]) == 1 and len(out[2][1][0].top) == 2

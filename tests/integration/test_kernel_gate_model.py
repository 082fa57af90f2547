"""The start-up parity gate on the default model: a planted wrong kernel on this CPU's decode route is caught at
load, and greedy output still equals the transformers reference exactly (its products took the next route)."""

from __future__ import annotations

import logging

from engine_helpers import greedy, make_core, run_all

from kernels import get_backend, routes


def test_a_planted_wrong_decode_kernel_is_retired_and_greedy_ids_stay_the_reference(
    loaded_default, reference, monkeypatch, caplog
):
    from engine.model.llama import LlamaModel

    be = get_backend("numba", threads=2)
    model = LlamaModel(loaded_default.config, loaded_default.weights, be)
    qkv = model.layers[0].qkv
    decode = be.route(1, qkv)  # what this CPU runs for a decode step's Q4_1 products
    real = be.kernels[decode.kernel]

    def wrong(b, x, out, threads):  # right but for one value
        real(b, x, out, threads)
        out[:, 7] *= 1.001

    monkeypatch.setitem(be.kernels, decode.kernel, wrong)
    be.warm_up()
    with caplog.at_level(logging.WARNING, logger="forge.kernels"):
        checks = be.check_routes()
    assert [c.route for c in checks if not c.ok] and all(c.route == str(decode) for c in checks if not c.ok)
    assert any(f"kernel route {decode}" in r.message for r in caplog.records)
    assert be.route(1, qkv) == routes.fallback(decode)
    core = make_core((loaded_default, model), kv_memory=32 << 20)
    reqs = []
    for i, case in enumerate(reference["prompts"]):
        reqs.append(greedy(case["prompt_ids"], max_tokens=32, ignore_eos=True))
        reqs[-1].request_id = f"p{i}"
    results = run_all(core, reqs)
    for i, case in enumerate(reference["prompts"]):
        assert results[f"p{i}"].token_ids == case["greedy32_no_eos_stop_ids"], i

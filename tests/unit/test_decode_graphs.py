"""Decode graphs' host side on real parts: batch buckets, the packed step inputs, and the padded decode
step a graph captures, run eagerly on the NumPy backend against the ordinary forward; which steps the
model runner offers to its graphs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from _tiny_model import tiny_config, tiny_weights

from engine.decode_graphs import PackedInputs, bucket_for, graph_buckets
from engine.model.llama import LlamaModel
from engine.model_runner import ModelRunner, SeqInput
from kernels.attention_meta import build_attention_metadata
from kernels.numpy_backend import NumpyBackend


@pytest.mark.parametrize(
    "max_batch,want",
    [
        (1, [1]),
        (3, [1, 2, 4]),
        (8, [1, 2, 4, 8]),
        (20, [1, 2, 4, 8, 16, 24]),
        (64, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
    ],
)
def test_buckets(max_batch, want):
    assert graph_buckets(max_batch) == want


def test_bucket_for_is_the_smallest_that_fits():
    buckets = graph_buckets(24)
    assert [bucket_for(b, buckets) for b in (1, 3, 4, 5, 9, 24, 25)] == [1, 4, 4, 8, 16, 24, None]


def test_packed_fields_are_aligned_disjoint_views_of_one_buffer():
    p = PackedInputs(5, 7, NumpyBackend())
    spans = []
    for name, a in p.h.items():
        assert np.shares_memory(a, p.host) and a.ctypes.data % 8 == 0, name
        spans.append((a.ctypes.data, a.ctypes.data + a.nbytes))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert p.h["block_tables"].shape == (5, 7) and p.h["context_lens"].dtype == np.int32
    assert p.h["slot_mapping"].dtype == np.int64


def test_a_padded_decode_step_gives_the_ordinary_logits_and_writes_only_the_pad_block():
    rng = np.random.default_rng(3)
    be = NumpyBackend()
    config = tiny_config()
    model = LlamaModel(config, tiny_weights(config, ["q4", "q8", "f16"], rng), be)
    bs, pad = 4, 9
    caches = [
        (be.empty_kv_cache(pad + 1, bs, 2, 16), be.empty_kv_cache(pad + 1, bs, 2, 16)) for _ in range(config.num_layers)
    ]
    prompts, tables = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]], [[3, 0], [5], [1]]
    meta = build_attention_metadata([6, 1, 3], [6, 1, 3], tables, bs, be)
    model.forward(
        np.concatenate(prompts), np.concatenate([np.arange(len(p)) for p in prompts]), meta, caches, np.array([5])
    )

    tokens, positions = [20, 21, 22], [6, 1, 3]
    meta = build_attention_metadata([1, 1, 1], [7, 2, 4], tables, bs, be)
    want = model.forward(np.array(tokens), np.array(positions), meta, caches, np.arange(3))
    before = [(k.copy(), v.copy()) for k, v in caches]

    packed = PackedInputs(8, 3, be)
    packed.fill(tokens, positions, tables, bs, pad)
    d = packed.d
    got = model.forward_device(d["token_ids"], d["positions"], packed.metadata(bs), caches, np.arange(8))
    np.testing.assert_allclose(got[:3], want, rtol=1e-5, atol=1e-5)
    for (k0, v0), (k1, v1) in zip(
        before, caches
    ):  # the real rows rewrote their own K/V; padding wrote only block `pad`
        np.testing.assert_allclose(k1[:pad], k0[:pad], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v1[:pad], v0[:pad], rtol=1e-5, atol=1e-5)
        assert np.abs(k1[pad, 0]).max() > 0


class _GraphsStandIn:
    """Stands in for DecodeGraphs (capturing needs a GPU): records the steps offered to it and runs none,
    as DecodeGraphs does for a batch no bucket holds."""

    def __init__(self) -> None:
        self.offered: list[tuple[list[int], list[int], list[list[int]]]] = []

    def run(self, token_ids: list[int], positions: list[int], block_tables: list[list[int]]) -> None:
        self.offered.append((token_ids, positions, block_tables))


def test_the_runner_offers_only_plain_decode_steps_to_the_graphs_stand_in():
    config = tiny_config()
    model = LlamaModel(config, tiny_weights(config, ["q8"], np.random.default_rng(5)), NumpyBackend())
    runner = ModelRunner(SimpleNamespace(config=config), model, num_blocks=8, block_size=4, max_num_seqs=4)
    assert runner.graphs is None  # NumPy cannot capture
    runner.graphs = graphs = _GraphsStandIn()
    runner.run([SeqInput([5, 6, 7], 0, [0], 1), SeqInput([8, 9], 0, [1], 1)])  # prefill
    decode = runner.run([SeqInput([4], 3, [0], 1), SeqInput([3], 2, [1], 1)])
    verify = runner.run([SeqInput([4, 2, 2], 4, [0, 2], 3), SeqInput([1], 3, [1], 1)])  # a draft of two
    runner.run([SeqInput([2], 7, [0, 2], 1), SeqInput([6, 6, 6], 4, [1, 3], 0)])  # a decode beside a prefill chunk
    assert graphs.offered == [([4, 3], [3, 2], [[0], [1]])]
    assert decode.shape == (2, config.vocab_size) and verify.shape == (4, config.vocab_size)

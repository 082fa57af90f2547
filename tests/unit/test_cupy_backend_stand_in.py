"""The CuPy backend's host code on a NumPy stand-in for CuPy (no GPU on this machine): every kernel
launch matches its C signature and the launch limits, every op launches the kernels it should with a
grid that covers its work, and CUDA-graph capture makes no host <-> device copy. The kernels themselves
do not run here (see test_kernels_cupy_parity.py on a GPU)."""

from __future__ import annotations

import gc
import types

import _cupy_stand_in
import numpy as np
import pytest
from _attention_cases import make_case
from _tiny_model import random_weight, tiny_config, tiny_weights
from test_dequant import random_blocks
from test_kernels_cupy_parity import _assert_same_samples

from engine.decode_graphs import DecodeGraphs
from engine.loader.quant import GGML_TYPES, gguf_weight
from engine.model.llama import LlamaModel
from engine.model_runner import ModelRunner, SeqInput
from kernels import cuda_launch, cupy_backend
from kernels.cupy_backend import KERNELS, CupyBackend
from kernels.numpy_backend import NumpyBackend
from kernels.weight import Weight


@pytest.fixture
def cp(monkeypatch):
    return _cupy_stand_in.install(monkeypatch)


@pytest.fixture
def gpu(cp) -> CupyBackend:
    return CupyBackend()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def launched(cp, since: int = 0) -> list[str]:
    return [launch.kernel for launch in cp.launches[since:]]


def half_scaled(type_id: int, rows: int, cols: int, rng) -> Weight:
    """A weight as the loader takes it from a GGUF Q4_0, Q4_1 or Q8_0 file: the file's float16 scales (and mins)."""
    t = GGML_TYPES[type_id]
    raw = random_blocks(type_id, rows, cols // t.block_size, rng)
    raw[-1] = raw[0]  # random_blocks leaves the last block's scales random (maybe NaN)
    return gguf_weight(raw, type_id, (rows, cols))


def test_every_op_on_the_stand_in_launches_matching_kernels(cp, gpu, rng):
    T, H, Hkv, Dh = 5, 4, 2, 16
    f32 = lambda *shape: gpu.asarray(rng.standard_normal(shape).astype(np.float32))
    weights = [random_weight(kind, 70, 64, rng) for kind in ("q4", "q8", "f16", "bf16", "f32")]
    for host in weights + [half_scaled(t, 70, 64, rng) for t in (2, 3, 8)]:  # Q4_0, Q4_1, Q8_0
        w = gpu.prepare_linear(host)
        assert w.kind == ("f16" if host.kind == "bf16" else host.kind)
        for route in ("gemv_tiled", "gemv"):
            gpu.gemv = route
            for rows in (1, 9, 33):
                assert gpu.linear(f32(rows, 64), w, f32(70)).shape == (rows, 70)
        assert gpu.embedding(w, gpu.asarray(np.array([3, 0, 69]))).shape == (3, 64)
    x, res, g = f32(T, 64), f32(T, 64), f32(64)
    assert gpu.rms_norm(x, g, 1e-5).shape == (T, 64)
    out, new_res = gpu.add_rms_norm(x, res, g, 1e-5)
    assert new_res is res and out.shape == (T, 64)
    cos, sin = gpu.rope_cos_sin(f32(Dh // 2), gpu.asarray(np.arange(T)))
    assert cos.shape == sin.shape == (T, Dh // 2)
    qkv = f32(T, (H + 2 * Hkv) * Dh)
    assert gpu.rope(qkv[:, : H * Dh].reshape(T, H, Dh), cos, sin).shape == (T, H, Dh)
    kc, vc = (gpu.empty_kv_cache(4, 16, Hkv, Dh) for _ in range(2))
    slots = gpu.asarray(np.arange(T))
    q = gpu.rope_write_kv(qkv, cos, sin, H, Hkv, kc, vc, slots)
    assert q.shape == (T, H, Dh)
    gpu.write_kv(kc, vc, f32(T, Hkv, Dh), f32(T, Hkv, Dh), slots)
    assert gpu.silu_mul(f32(T, 2 * 96)).shape == (T, 96)
    case = make_case(rng, [(1, 20), (3, 3), (1, 7)], heads=H, kv_heads=Hkv, head_dim=Dh)
    meta = case.meta(gpu)
    kc, vc = (gpu.asarray(c.astype(np.float16)) for c in (case.k_cache, case.v_cache))
    assert gpu.paged_attention(gpu.asarray(case.q), kc, vc, meta, Dh**-0.5).shape == case.q.shape
    ids, values = gpu.argmax_rows(f32(3, 10))
    assert ids.shape == values.shape == (3,) and isinstance(ids, np.ndarray)
    gpu.apply_token_bitmask(f32(3, 10), np.zeros((3, 1), np.int32))
    ids = gpu.sample_rows(f32(3, 10), np.array([[1.0, 0, 1.0, 0.0, 0.5]] * 3))
    assert ids.shape == (3,) and isinstance(ids, np.ndarray) and ids.dtype == np.int64
    chosen, top_ids, top = gpu.logprob_rows(f32(3, 10), np.array([0, 2]), np.array([4, 9]), 20)
    assert chosen.shape == (2,) and top_ids.shape == top.shape == (2, 10) and isinstance(top, np.ndarray)
    assert set(launched(cp)) == set(KERNELS)


@pytest.mark.parametrize("kind", ["q4", "q8"])
@pytest.mark.parametrize("rows", [1, 8, 9, cuda_launch.GEMV_MAX_ROWS])
def test_few_rows_read_the_quantized_weight_in_one_gemv_launch(cp, gpu, rng, kind, rows):
    w = gpu.prepare_linear(random_weight(kind, 70, 64, rng))
    gpu.linear(gpu.asarray(np.ones((rows, 64), np.float32)), w)
    (launch,) = cp.launches
    assert launch.kernel == f"gemv_tiled_{kind}"
    assert (launch.grid, launch.block) == cuda_launch.gemv_tiled_geometry(70, rows)
    gpu.gemv = "gemv"  # the route the start-up gate falls back to
    gpu.linear(gpu.asarray(np.ones((rows, 64), np.float32)), w)
    assert cp.launches[1].kernel == f"gemv_{kind}"
    assert (cp.launches[1].grid, cp.launches[1].block) == cuda_launch.gemv_geometry(70, rows)


def test_many_rows_dequantize_panels_that_cover_the_weight(cp, monkeypatch, rng):
    monkeypatch.setattr(cupy_backend, "PANEL_VALUES", 64 * 200)  # 200 rows of 64 a panel: 3 panels for 470 rows
    gpu = CupyBackend()
    w = gpu.prepare_linear(random_weight("q8", 470, 64, rng))
    out = gpu.linear(gpu.asarray(np.ones((40, 64), np.float32)), w)
    assert out.shape == (40, 470) and out.dtype == np.float32
    panels = [(int(launch.args[5]), int(launch.args[7])) for launch in cp.launches]  # (row0, rows)
    assert launched(cp) == ["q8_rows_f16"] * 3
    assert panels == [(0, 192), (192, 192), (384, 86)]


@pytest.mark.parametrize("type_id", [2, 3, 8], ids=["Q4_0", "Q4_1", "Q8_0"])
def test_q4_0_q4_1_and_q8_0_weights_hold_the_files_bytes_on_the_device(gpu, rng, type_id):
    """Their scales (and Q4_1's mins) stay float16 and Q4_0 keeps no mins: a decode step reads the file's bytes, which
    is what `weight_bytes` and the bound it gives count."""
    t = GGML_TYPES[type_id]
    raw = random_blocks(type_id, 70, 64 // t.block_size, rng)
    w = gpu.prepare_linear(gguf_weight(raw, type_id, (70, 64)))
    assert w.nbytes == raw.nbytes
    assert w.scale.dtype == np.float16 and (w.min is None) == (type_id != 3) and w.zero == (8 if type_id == 2 else 0)


def test_a_q4_0_models_matrices_take_the_files_bytes_on_the_device(gpu, tmp_path):
    """Through the loader and the model's fusions (QKV, gate/up), a synthetic Q4_0 file's matrices."""
    from engine.loader import load_model
    from engine.loader.synth import Q, plan_tensors, shape_from_hf, write_synthetic

    config = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    shape = shape_from_hf(config, "tiny")
    write_synthetic(shape, "q4_0", tmp_path / "tiny.gguf")
    loaded = load_model(str(tmp_path / "tiny.gguf"))
    model = LlamaModel(loaded.config, loaded.weights, gpu)
    matrices = [model.embed, model.lm_head] + [
        m for layer in model.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    assert {m.kind for m in matrices} == {"q4"}
    assert sum(m.nbytes for m in matrices) == sum(t.nbytes for t in plan_tensors(shape, "q4_0") if t.qtype != Q.F32)


def test_tied_embeddings_share_one_device_copy(gpu, rng):
    w = random_weight("q4", 100, 64, rng)
    embed = gpu.prepare_embedding(w)
    assert gpu.prepare_linear(w) is embed
    assert gpu.prepare_linear(w) is not embed  # only right after prepare_embedding


def test_attention_launches_one_decode_block_per_sequence_and_head_and_tiles_the_prefills(cp, gpu, rng):
    case = make_case(rng, [(1, 40), (37, 50), (1, 3)], heads=4, kv_heads=2, head_dim=16)
    kc, vc = (gpu.asarray(c.astype(np.float16)) for c in (case.k_cache, case.v_cache))
    meta = case.meta(gpu)
    for _ in range(2):  # the second layer reuses the plan
        gpu.paged_attention(gpu.asarray(case.q), kc, vc, meta, 0.25)
    decode, prefill = cp.launches[:2]
    assert decode.kernel == "paged_attention_decode_f16" and decode.grid == (2, 4)
    assert decode.args[4].tolist() == [0, 2]
    assert prefill.kernel == "paged_attention_prefill_f16" and prefill.grid == (3, 4)
    assert prefill.args[4].tolist() == [[1, 0], [1, 16], [1, 32]]
    assert cp.launches[2].args[4] is decode.args[4]


def test_attention_rejects_what_the_kernels_cannot_do(gpu, rng):
    case = make_case(rng, [(1, 5)], heads=2, kv_heads=1, head_dim=12)
    kc, vc = (gpu.asarray(c.astype(np.float16)) for c in (case.k_cache, case.v_cache))
    with pytest.raises(ValueError, match="multiple of 8"):
        gpu.paged_attention(gpu.asarray(case.q), kc, vc, case.meta(gpu), 1.0)
    case = make_case(rng, [(1, 5)], heads=2, kv_heads=1, head_dim=16)
    with pytest.raises(ValueError, match="float16"):
        gpu.paged_attention(
            gpu.asarray(case.q), gpu.asarray(case.k_cache), gpu.asarray(case.v_cache), case.meta(gpu), 1.0
        )


def tiny_model(gpu, rng, kinds=("q4", "q8", "f16")) -> tuple[LlamaModel, list]:
    config = tiny_config()
    model = LlamaModel(config, tiny_weights(config, list(kinds), rng), gpu)
    caches = [(gpu.empty_kv_cache(9, 16, 2, 16), gpu.empty_kv_cache(9, 16, 2, 16)) for _ in range(config.num_layers)]
    return model, caches


def test_a_forward_of_the_tiny_model_runs_on_the_stand_in(gpu, rng):
    from kernels.attention_meta import build_attention_metadata

    model, caches = tiny_model(gpu, rng)
    assert model.lm_head is model.embed
    meta = build_attention_metadata([37, 1], [37, 5], [[0, 1, 2], [3]], 16, gpu)
    logits = model.forward(np.arange(38), np.concatenate([np.arange(37), [4]]), meta, caches, np.array([36, 37]))
    assert isinstance(logits, np.ndarray) and logits.shape == (2, 100)


def test_decode_graphs_capture_once_per_bucket_without_host_copies_and_replay(cp, gpu, rng):
    model, caches = tiny_model(gpu, rng)
    graphs = DecodeGraphs(model, caches, 16, pad_block=8, width=8, max_batch=8)
    tables = [[0, 1], [2], [3]]
    logits = graphs.run([5, 6, 7], [20, 3, 0], tables)  # bucket 4: warm-up, capture, replay
    assert logits.shape == (3, 100)
    g = graphs._graphs[4]
    assert g.logits.shape == (4, 100) and g.graph.graph.launches
    d = g.inputs.d
    assert d["token_ids"].tolist() == [5, 6, 7, 0]
    assert d["slot_mapping"].tolist() == [1 * 16 + 4, 2 * 16 + 3, 3 * 16, 8 * 16]
    assert d["context_lens"].tolist() == [21, 4, 1, 1]
    assert d["block_tables"][:, 0].tolist() == [0, 2, 3, 8]
    before = len(cp.launches)
    graphs.run([9, 9, 9], [21, 4, 1], tables)  # the same bucket: replayed, not captured again
    assert graphs._graphs.keys() == {4}
    assert launched(cp, before) == [launch.kernel for launch in g.graph.graph.launches]
    assert d["token_ids"].tolist() == [9, 9, 9, 0] and d["positions"].tolist() == [21, 4, 1, 0]


def test_every_decode_graph_keeps_alive_what_it_reads(cp, gpu, rng):
    """A graph holds raw addresses: the logits rows its final gather reads (and every other buffer it did not
    allocate while capturing) must live as long as the graph, or a replay reads memory handed out again since."""
    model, caches = tiny_model(gpu, rng)
    graphs = DecodeGraphs(model, caches, 16, pad_block=8, width=8, max_batch=8)
    for batch in (1, 2, 3, 8):
        graphs.run([5] * batch, [0] * batch, [[0]] * batch)
    assert sorted(graphs._graphs) == [1, 2, 4, 8]
    gc.collect()
    for rows, g in graphs._graphs.items():
        assert g.rows.tolist() == list(range(rows)) and g.graph.graph.uses
        assert graphs.run([6] * rows, [1] * rows, [[0]] * rows).shape == (rows, 100)  # the stand-in checks every use


def _graph_of_rms_norm(gpu, x, weight, rows=None):
    """A graph of rms_norm(x[rows], weight) that holds none of its inputs (as a CUDA graph does not)."""
    return gpu.capture_graph(lambda: gpu.rms_norm(x if rows is None else x[rows], weight, 1e-5))[0]


def test_the_stand_in_refuses_to_replay_a_graph_whose_buffers_were_freed(cp, gpu, rng):
    x = gpu.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    weight, rows = gpu.asarray(np.ones(64, np.float32)), gpu.asarray(np.array([2, 0]))
    graph = _graph_of_rms_norm(gpu, x, weight, rows)  # CuPy's own gather reads rows
    gpu.replay(graph)
    del rows
    gc.collect()
    with pytest.raises(RuntimeError, match=r"freed after capture: int64 \[2\]"):
        gpu.replay(graph)
    graph = _graph_of_rms_norm(gpu, x, weight)  # a kernel argument
    gpu.replay(graph)
    del weight
    gc.collect()
    with pytest.raises(RuntimeError, match=r"freed after capture: float32 \[64\]"):
        gpu.replay(graph)


def test_the_stand_in_pool_hands_freed_blocks_out_again_best_fit(cp):
    """As CuPy's pool does: a freed block goes to the next request it holds, the smallest such block first."""
    big, small, keep = cp.empty(4096, np.uint8), cp.empty(1000, np.uint8), cp.empty(10, np.uint8)
    at = {"big": big.data.ptr, "small": small.data.ptr}
    del big, small
    gc.collect()
    medium = cp.empty(600, np.float32)  # 2400 bytes: only the big block holds it
    assert medium.data.ptr == at["big"]
    assert cp.empty(300, np.uint8).data.ptr == at["small"]  # best fit: the 1024-byte block, not the big one's rest
    assert keep.data.ptr not in at.values()


def test_the_stand_in_refuses_to_replay_a_graph_over_scratch_handed_out_again(cp, gpu, rng):
    """A graph's replays write the memory its capture allocated, freed or not: a pool that gives it to anything
    else afterwards (another capture's plan, say) makes the replay clobber it, which the stand-in refuses."""
    x = gpu.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    weight, pool, stream = gpu.asarray(np.ones(64, np.float32)), cp.cuda.MemoryPool(), cp.cuda.Stream()
    with cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        gpu.rms_norm(x, weight, 1e-5)  # its output is freed at once: the graph's scratch
        graph = stream.end_capture()
        graph.launch()
        taken = cp.empty((2, 64), np.float32)
    with pytest.raises(RuntimeError, match=r"writes its scratch, which is now float32 \[2, 64\]"):
        graph.launch()
    del taken
    gc.collect()
    graph.launch()


def test_every_capture_allocates_from_a_pool_of_its_own(cp, gpu, rng):
    x = gpu.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    weight = gpu.asarray(np.ones(64, np.float32))
    first, out = gpu.capture_graph(lambda: gpu.rms_norm(x, weight, 1e-5))
    second, _ = gpu.capture_graph(lambda: gpu.rms_norm(x, weight, 1e-5))
    assert first.pool is not second.pool
    for graph in (first, second, first):
        gpu.replay(graph)  # the stand-in checks that neither's scratch went to the other


def test_the_model_runner_captures_every_bucket_at_load_and_steps_capture_none(cp, gpu, rng, monkeypatch):
    """All decode graphs exist once the runner does: no step (and no timed window of `forge bench`) waits on a
    capture."""
    model, _ = tiny_model(gpu, rng)
    runner = ModelRunner(types.SimpleNamespace(config=model.config), model, 8, 16, max_num_seqs=20)
    assert sorted(runner.graphs._graphs) == [1, 2, 4, 8, 16, 24]
    captured = []
    monkeypatch.setattr(gpu, "capture_graph", lambda fn: captured.append(fn))
    for batch in (1, 3, 8, 17, 2, 24):
        logits = runner.run([SeqInput([5], 0, [i % 8], 1) for i in range(batch)])
        assert logits.shape == (batch, 100)
    assert captured == []


def test_gemv_reads_x_from_an_aligned_copy_of_a_misaligned_contiguous_view(cp, gpu, rng):
    w = gpu.prepare_linear(random_weight("q4", 70, 64, rng))
    flat = gpu.asarray(rng.standard_normal(1 + 2 * 64).astype(np.float32))
    x = flat[1:].reshape(2, 64)  # contiguous, 4 bytes past an aligned start: gemv.cu's float4 loads would fault
    assert x.flags.c_contiguous and x.data.ptr % 16
    assert gpu.linear(x, w).shape == (2, 70)  # the stand-in checks the alignment of every launch
    grid, block = cuda_launch.gemv_geometry(70, 2)
    with pytest.raises(AssertionError, match="16-byte alignment"):
        gpu._kernel("gemv_q4")(
            grid,
            block,
            (
                gpu.xp.empty((2, 70), np.float32),
                x,
                w.data,
                w.scale,
                w.min,
                np.int32(2),
                np.int32(70),
                np.int32(64),
                np.int32(0),
            ),
        )


def test_a_failed_capture_leaves_that_bucket_eager(cp, gpu, rng):
    model, caches = tiny_model(gpu, rng)
    graphs = DecodeGraphs(model, caches, 16, pad_block=8, width=8, max_batch=8)
    real = model.forward_device
    model.forward_device = lambda *a: gpu.to_numpy(real(*a))  # a copy to the host: refused while capturing
    assert graphs.run([5] * 5, [0] * 5, [[0]] * 5) is None
    assert graphs.eager_from == 8
    model.forward_device = real
    assert graphs.run([5], [0], [[0]]).shape == (1, 100)  # smaller buckets still capture
    assert graphs.run([5] * 6, [0] * 6, [[0]] * 6) is None


def test_warm_up_compiles_every_source_up_front(gpu):
    seen = []
    gpu.warm_up(lambda i, n, file: seen.append((i, n, file)))
    files = sorted(set(KERNELS.values()))
    assert seen == [(i, len(files), f) for i, f in enumerate(files, 1)]
    assert set(gpu._functions) == set(KERNELS)


def test_the_parity_files_sampling_rule_is_exact_away_from_the_margins():
    """The parity file's sampling rule (_assert_same_samples) accepts a neighbour only at a boundary: one token off
    anywhere else still fails."""
    cpu, rng, V = NumpyBackend(), np.random.default_rng(2), 1000
    logits = (rng.standard_normal((1, V)) * 3).astype(np.float32)
    table = np.array([[1.0, 0, 1.0, 0.0, 0.5]])
    want = cpu.sample_rows(logits, table)
    _assert_same_samples(cpu, logits, table, want)
    with pytest.raises(AssertionError, match="device"):
        _assert_same_samples(cpu, logits, table, (want + 1) % V)
    w = np.exp(logits[0].astype(np.float64) - logits.max())  # u on a CDF step: the next token is as right
    u = float(np.cumsum(w)[want[0]] / w.sum())
    table[0, 4] = u
    at = cpu.sample_rows(logits, table)
    _assert_same_samples(cpu, logits, table, np.array([at[0] + 1 if at[0] == want[0] else want[0]]))

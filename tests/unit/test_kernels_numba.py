"""The numba backend's compiled kernels against the NumPy reference and gguf-py.

Shapes include row counts that are not multiples of the 4-row blocks or the 32-row work chunks,
and every GGML type the loader keeps: block types as q4/q8 weights, F16/BF16/F32 as they are.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import gguf
import numba
import numpy as np
import pytest
from _kernel_cases import NAMES, QUANTIZED, float_weight, quantized
from test_dequant import random_blocks
from test_kernels_numpy import (  # the same op semantics, run here against the numba backend
    test_add_rms_norm_returns_sum_and_its_norm,
    test_paged_attention_decode_flag_and_mixed_agree,
    test_paged_attention_matches_dense_causal,
    test_paged_attention_rejects_mismatched_metadata,
    test_paged_attention_tiled_long_prefill,
    test_rms_norm_matches_formula,
    test_silu_mul_matches_formula,
)

from engine.loader.quant import GGML_TYPES, gguf_weight
from kernels import numba_activations, numba_attention, numba_backend, numba_layout, numba_linear, numba_linear16, simd
from kernels.cpu import SIMULATED, CpuCaps
from kernels.numba_backend import TRANSPOSED_PANEL_MAX_ROWS, Linear, NumbaBackend
from kernels.numba_ops import PARALLEL_ROWS
from kernels.numpy_backend import NumpyBackend
from kernels.reference import int8_product, quantize_activations
from kernels.routes import AMX_MIN_ROWS, MATVEC_MAX_ROWS, Route
from kernels.simd import target_has
from kernels.weight import Weight, concat_rows, pack_q4, quantize_q8_0

HERE = CpuCaps.detect()

__all__ = [  # re-exported tests (keeps linters from calling the imports unused)
    "test_add_rms_norm_returns_sum_and_its_norm",
    "test_paged_attention_decode_flag_and_mixed_agree",
    "test_paged_attention_matches_dense_causal",
    "test_paged_attention_rejects_mismatched_metadata",
    "test_paged_attention_tiled_long_prefill",
    "test_rms_norm_matches_formula",
    "test_silu_mul_matches_formula",
]


@pytest.fixture(scope="module")
def be() -> NumbaBackend:
    return NumbaBackend(threads=2)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.mark.parametrize("type_id", QUANTIZED, ids=NAMES.get)
def test_in_kernel_dequantization_is_bit_equal_to_gguf_py(be, rng, type_id):
    rows, cols = 37, 2 * GGML_TYPES[type_id].block_size
    w, want = quantized(type_id, rows, cols, rng)
    assert w.kind == ("q4" if NAMES[type_id] in ("Q4_0", "Q4_1", "Q4_K") else "q8")
    assert np.isfinite(want).all()
    lin = be.prepare_linear(w)
    picked = np.array([36, 0, 5, 5, 17])
    got = be.dequantize_rows(lin, picked, np.empty((len(picked), cols), np.float32))
    np.testing.assert_array_equal(got, want[picked])
    np.testing.assert_array_equal(w.dequantize(), want)
    np.testing.assert_array_equal(be.embedding(be.prepare_embedding(w), picked), want[picked])


@pytest.mark.parametrize("rows", [1, MATVEC_MAX_ROWS, MATVEC_MAX_ROWS + 3], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("type_id", QUANTIZED, ids=NAMES.get)
def test_linear_over_every_block_type(be, rng, type_id, rows):
    n, k = 70, 2 * GGML_TYPES[type_id].block_size  # 70 rows: two 32-row chunks and a ragged 6
    w, dense = quantized(type_id, n, k, rng)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    got = be.linear(x, be.prepare_linear(w), bias)
    want = x.astype(np.float64) @ dense.T.astype(np.float64) + bias
    assert got.shape == (rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(
    "type_id", [t for t in QUANTIZED if NAMES[t] in ("Q4_1", "Q8_0", "Q4_K", "Q6_K")], ids=NAMES.get
)
def test_wide_tiles_over_long_rows_match_a_float64_product(be, rng, type_id):
    # 1536 columns: a tile of 8 rows takes its activations in two L1-sized spans of groups
    # (numba_linear.L1_TILE_BYTES), whose partial sums add up in `out`; up to MATVEC_MAX_ROWS rows.
    n, k = 70, 1536
    w, dense = quantized(type_id, n, k, rng)
    lin = be.prepare_linear(w)
    x = rng.standard_normal((MATVEC_MAX_ROWS, k)).astype(np.float32)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    for rows in (7, 8, 13, MATVEC_MAX_ROWS):
        np.testing.assert_allclose(
            be.linear(x[:rows], lin), want[:rows], rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"{rows} rows"
        )


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("rows", [1, MATVEC_MAX_ROWS + 1], ids=lambda t: f"T{t}")
def test_linear_over_float_weights(be, rng, kind, rows):
    w, dense = float_weight(kind, 45, 40, rng)
    assert w.kind == kind
    x = rng.standard_normal((rows, 40)).astype(np.float32)
    got = be.linear(x, be.prepare_linear(w))
    np.testing.assert_allclose(got, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-4)


def test_linear_matches_the_numpy_backend_on_model_shapes(be, rng):
    w, _ = quantized(3, 96, 576, rng)  # Q4_1, the default model's matrices
    x = rng.standard_normal((3, 576)).astype(np.float32)
    ref = NumpyBackend()
    np.testing.assert_allclose(
        be.linear(x, be.prepare_linear(w)), ref.linear(x, ref.prepare_linear(w)), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(
    "rows", [MATVEC_MAX_ROWS + 2, TRANSPOSED_PANEL_MAX_ROWS + 1], ids=["W@xT", "x@WT"]
)  # both forms of a panel's product
def test_panels_cover_a_weight_larger_than_one(be, rng, monkeypatch, rows):
    monkeypatch.setattr("kernels.numba_backend.PANEL_VALUES", 16 * 64)  # 16-row panels over 150 rows
    w, dense = quantized(8, 150, 64, rng)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    lin = be.prepare_linear(w)
    panels = Route("panels", "f32", lin.blocked.stripe)  # forced: an AMX CPU would take its tiles here
    np.testing.assert_allclose(be.linear(x, lin, route=panels), x @ dense.T, rtol=1e-4, atol=1e-3)


def test_fused_parts_of_mixed_types_match_their_parts(rng):
    # Q4_K_M files put Q6_K (groups of 16, no min) beside Q4_K (packed, groups of 32, mins).
    parts = [quantized(12, 8, 256, rng), quantized(14, 4, 256, rng), quantized(2, 4, 256, rng)]
    fused = concat_rows([w for w, _ in parts])
    assert (fused.kind, fused.group) == ("q8", 16)
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([d for _, d in parts]))
    q4 = concat_rows([parts[0][0], parts[2][0]])
    assert q4.kind == "q4"
    np.testing.assert_array_equal(q4.dequantize(), np.concatenate([parts[0][1], parts[2][1]]))
    mixed = concat_rows([parts[0][0], float_weight("f16", 3, 256, rng)[0]])
    assert mixed.kind == "f32" and mixed.shape == (11, 256)


def test_q8_0_quantization_at_load_is_close_and_byte_sized(rng):
    x = rng.standard_normal((6, 64)).astype(np.float32)
    w = quantize_q8_0(x)
    assert (w.kind, w.data.dtype, w.group) == ("q8", np.int8, 32)
    step = np.abs(x).reshape(6, 2, 32).max(axis=2, keepdims=True) / 127
    assert (np.abs(w.dequantize().reshape(6, 2, 32) - x.reshape(6, 2, 32)) <= step * 0.5 + 1e-3 * step).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.ones((2, 40), np.float32))


def test_embedding_rejects_bad_ids(be, rng):
    lin = be.prepare_embedding(quantized(8, 10, 32, rng)[0])
    with pytest.raises(ValueError, match="out of range"):
        be.embedding(lin, np.array([10]))
    with pytest.raises(ValueError, match="1-D integer"):
        be.embedding(lin, np.array([0.5]))


@pytest.mark.parametrize("rows", [3, PARALLEL_ROWS + 5], ids=["serial", "parallel"])
def test_rope_write_kv_and_row_ops_match_numpy(be, rng, rows):
    ref = NumpyBackend()
    H, Hkv, Dh, nb, bs = 4, 2, 8, 40, 4
    qkv = rng.standard_normal((rows, (H + 2 * Hkv) * Dh)).astype(np.float32)
    ang = rng.uniform(-4, 4, (rows, Dh // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    slots = rng.permutation(nb * bs)[:rows]
    caches = [[np.zeros((nb, bs, Hkv, Dh), np.float32) for _ in range(2)] for _ in range(2)]
    q_got = be.rope_write_kv(qkv.copy(), cos, sin, H, Hkv, *caches[0], slots)
    q_want = ref.rope_write_kv(qkv.copy(), cos, sin, H, Hkv, *caches[1], slots)
    np.testing.assert_allclose(q_got, q_want, rtol=1e-5, atol=1e-5)
    for got, want in zip(caches[0], caches[1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    x, res, w = (rng.standard_normal((rows, 48)).astype(np.float32) for _ in range(3))
    got, got_res = be.add_rms_norm(x, res.copy(), w[0], 1e-5)
    want, want_res = ref.add_rms_norm(x, res.copy(), w[0], 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_res, want_res, rtol=1e-6)
    np.testing.assert_allclose(be.silu_mul(x), ref.silu_mul(x), rtol=1e-5, atol=1e-6)


def test_exp32_is_within_a_few_ulps_and_clamps():
    from numba import njit

    from kernels.numba_jit import JIT
    from kernels.numba_math import exp32

    @njit(**{**JIT, "cache": False})  # the shared fast-math flags, as in the kernels that inline it
    def exp_all(x, out):
        for i in range(x.shape[0]):
            out[i] = exp32(x[i])

    x = np.linspace(-87, 88, 100_003, dtype=np.float32)
    got = np.empty_like(x)
    exp_all(x, got)
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)), rtol=4e-7, atol=0)
    edges = np.array([-np.inf, -1e4, 1e4, np.inf], np.float32)
    out = np.empty_like(edges)
    exp_all(edges, out)
    assert np.all(np.isfinite(out)) and out[0] == out[1] < 1e-37 and out[2] == out[3] > 1e38


def test_silu_mul_saturates_like_numpy(be, rng):
    gate = np.concatenate([rng.uniform(-200, 200, 37), [-1e30, -90.0, 0.0, 90.0, 1e30]]).astype(np.float32)
    x = np.concatenate([gate, rng.standard_normal(gate.size).astype(np.float32)])[None]
    np.testing.assert_allclose(be.silu_mul(x), NumpyBackend().silu_mul(x), rtol=1e-5, atol=1e-30)


def test_attention_spreads_a_long_prefill_over_row_tiles(be, rng, monkeypatch):
    from _attention_cases import make_case
    from test_kernels_numpy import naive_attention

    monkeypatch.setattr(numba_attention, "ROW_TILE", 16)
    case = make_case(rng, [(50, 83), (1, 9)], heads=6, kv_heads=2, head_dim=16, block_size=8)
    meta = case.meta()
    be.write_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, meta.slot_mapping)
    got = be.paged_attention(case.q, case.k_cache, case.v_cache, meta, 0.25)
    np.testing.assert_allclose(got, naive_attention(case, 0.25), rtol=1e-5, atol=1e-5)


def test_long_prefills_take_blas_tiles_beside_the_kernel(be, rng):
    # Two prompt chunks of at least BLAS_ATTENTION_ROWS new rows (one over a cached prefix, one
    # ragged against the tile) go to the BLAS tiles, a short chunk and a decode to the kernel, in one step.
    from _attention_cases import make_case
    from test_kernels_numpy import naive_attention

    long = numba_backend.BLAS_ATTENTION_ROWS
    case = make_case(
        rng,
        [(1, 40), (long + 5, long + 30), (7, 7), (2 * long + 3, 2 * long + 3)],
        heads=6,
        kv_heads=2,
        head_dim=16,
        block_size=8,
    )
    meta = case.meta()
    be.write_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, meta.slot_mapping)
    got = be.paged_attention(case.q, case.k_cache, case.v_cache, meta, 0.25)
    assert [int(b) for b in meta.plan[4]] == [1, 3]
    np.testing.assert_allclose(got, naive_attention(case, 0.25), rtol=1e-5, atol=1e-5)
    only_long = make_case(rng, [(long, long)], heads=6, kv_heads=2, head_dim=16, block_size=8)  # nothing for the kernel
    meta = only_long.meta()
    be.write_kv(only_long.k_cache, only_long.v_cache, only_long.k_new, only_long.v_new, meta.slot_mapping)
    np.testing.assert_allclose(
        be.paged_attention(only_long.q, only_long.k_cache, only_long.v_cache, meta, 0.25),
        naive_attention(only_long, 0.25),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("serial_below", [0, 1 << 30], ids=["parallel", "serial"])
def test_decode_attention_reads_the_cache_in_place_on_model_shapes(be, rng, monkeypatch, serial_below):
    # One-row items read K/V rows through the block table (no gather): contexts on and off block edges.
    from _attention_cases import make_case
    from test_kernels_numpy import naive_attention

    monkeypatch.setattr("kernels.numba_backend.SERIAL_ATTENTION_DOTS", serial_below)
    case = make_case(rng, [(1, 1), (1, 16), (1, 33), (1, 100), (1, 257)], heads=9, kv_heads=3, head_dim=64)
    meta = case.meta()
    be.write_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, meta.slot_mapping)
    got = be.paged_attention(case.q, case.k_cache, case.v_cache, meta, 0.125)
    np.testing.assert_allclose(got, naive_attention(case, 0.125), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", [8, 16])
def test_a_few_decode_rows_split_their_keys_and_combine_to_the_softmax_over_all(be, rng, monkeypatch, block_size):
    # Fewer than TILES_TOGETHER decode rows take the parallel kernel's spans of keys (every head an item, the spans'
    # outputs weighed by their log-sum-exp): one span, spans on and off the block and span edges, SPLITS of them.
    from _attention_cases import make_case
    from test_kernels_numpy import naive_attention

    monkeypatch.setattr("kernels.numba_backend.SERIAL_ATTENTION_DOTS", 0)
    contexts = [1, 31, 32, 33, 170, 1000, 1025]
    case = make_case(rng, [(1, c) for c in contexts], heads=32, kv_heads=8, head_dim=64, block_size=block_size)
    meta = case.meta()
    be.write_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, meta.slot_mapping)
    got = be.paged_attention(case.q, case.k_cache, case.v_cache, meta, 0.125)
    assert meta.plan[3] is numba_attention.paged_attention and len(contexts) < numba_attention.TILES_TOGETHER
    np.testing.assert_allclose(got, naive_attention(case, 0.125), rtol=1e-5, atol=1e-5)
    span, first = numba_attention._spans(np.array(contexts, np.int32), block_size)
    items = np.diff(first)
    assert (span % block_size == 0).all() and (span >= numba_attention.SPLIT_KEYS).all()
    assert (items <= numba_attention.SPLITS).all() and items[-1] == numba_attention.SPLITS
    assert (span * items >= contexts).all() and (span * (items - 1) < contexts).all()


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(4, 4, 24), (8, 2, 80), (6, 3, 40), (32, 8, 64), (4, 1, 128)],
    ids=["mha-24", "gqa4-80", "gqa2-40", "llama-1b", "mqa-128"],
)
def test_attention_register_tiles_on_every_head_shape(be, rng, heads, kv_heads, head_dim):
    # Decode rows (keys LANES at a time, a transposing reduction) and prompt chunks (query register
    # tiles) on head dims on and off the vector width, groups of 1-4 query heads per kv head, contexts
    # just short of, on and past power-of-two strides, chunks short of and past a register tile.
    from _attention_cases import make_case
    from test_kernels_numpy import naive_attention

    seqs = [(1, 1), (1, 17), (1, 511), (3, 3), (17, 512), (40, 1024), (1, 1025), (15, 100)]
    case = make_case(rng, seqs, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=16)
    meta = case.meta()
    be.write_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, meta.slot_mapping)
    got = be.paged_attention(case.q, case.k_cache, case.v_cache, meta, 0.125)
    np.testing.assert_allclose(got, naive_attention(case, 0.125), rtol=1e-5, atol=1e-5)


def test_kernels_are_cached_on_disk():
    # cache=True everywhere: a fresh process loads machine code instead of compiling.
    for fn in (numba_linear.matvec_q4, numba_layout.dequant_rows, numba_attention.paged_attention):
        assert fn._cache.__class__.__name__ == "FunctionCache", fn


# ---- the blocked matrix-vector kernels, both activation modes ---------------------------------
def blocked_case(case: str, n: int, k: int, rng: np.random.Generator, scales: str = "f32") -> Weight:
    """A random q4/q8 weight of one layout the kernels take (values over the kind's full range);
    `scales="f16"`: scales and mins that are float16 values (as in GGUF Q4_0/Q4_1/Q8_0), which the
    backend stores as float16."""
    g = 16 if "g16" in case else 32

    def as_scales(a: np.ndarray) -> np.ndarray:
        return (a.astype(np.float16) if scales == "f16" else a).astype(np.float32)

    scale = as_scales(rng.uniform(0.01, 0.1, (n, k // g)))
    mins = as_scales(rng.uniform(-0.5, 0.5, (n, k // g))) if "min" in case else None
    if case == "q4 min":  # Q4_1, Q4_K: values 0..15 and a min
        return Weight("q4", pack_q4(rng.integers(0, 16, (n, k), dtype=np.uint8)), scale, mins, 32)
    if case == "q4":  # Q4_0: -8..7 and no min, stored as 0..15 with min -8 * scale
        return Weight("q8", rng.integers(-8, 8, (n, k), dtype=np.int8), scale, None, 32).to_q4()
    return Weight("q8", rng.integers(-128, 128, (n, k), dtype=np.int8), scale, mins, g)


BLOCKED_CASES = ["q4", "q4 min", "q8 g32", "q8 g32 min", "q8 g16", "q8 g16 min"]
# The blocked layout's two scale dtypes; float16 needs the CPU's F16C conversion.
SCALES = [
    "f32",
    pytest.param(
        "f16", marks=pytest.mark.skipif(not target_has("f16c"), reason="the CPU lacks F16C: scales stay float32")
    ),
]
SCALE_DTYPES = {"f32": np.float32, "f16": np.uint16}


int8_model = int8_product  # the int8 kernels' arithmetic (kernels/reference.py)


def random_activations(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    x[0, :32] = 0  # a block of zeros (scale 0)
    return x


def test_activation_quantization_matches_its_numpy_model(rng):
    x = random_activations(rng, 3, 160)
    xq, xd, xsum = np.empty(x.shape, np.int8), np.empty((3, 5), np.float32), np.empty((3, 5), np.float32)
    numba_activations.quantize_rows(x, xq, xd, xsum)
    want_q, want_d = quantize_activations(x)
    np.testing.assert_array_equal(xq, want_q)
    np.testing.assert_array_equal(xd, want_d)
    assert np.abs(xq).max() == 127
    np.testing.assert_array_equal(xsum, want_d * xq.reshape(3, 5, 32).sum(axis=2, dtype=np.int32).astype(np.float32))


def test_a_prompt_quantized_on_all_threads_matches_its_numpy_model(rng):
    # The int8 products quantize PARALLEL_QUANTIZE_ROWS rows or more a row a thread; a row is a row wherever it runs.
    rows = numba_activations.PARALLEL_QUANTIZE_ROWS + 3
    x = random_activations(rng, rows, 96)
    xq, xd, xsum = np.empty(x.shape, np.int8), np.empty((rows, 3), np.float32), np.empty((rows, 3), np.float32)
    numba_activations.quantize_rows_parallel(x, xq, xd, xsum)
    want_q, want_d = quantize_activations(x)
    np.testing.assert_array_equal(xq, want_q)
    np.testing.assert_array_equal(xd, want_d)
    np.testing.assert_array_equal(xsum, want_d * xq.reshape(rows, 3, 32).sum(axis=2, dtype=np.int32).astype(np.float32))


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("activations", ["f32", "q8"])
@pytest.mark.parametrize("case", BLOCKED_CASES)
def test_blocked_matvec_matches_numpy_on_random_shapes(rng, case, activations, scales):
    be = NumbaBackend(threads=2, activations=activations)
    ref = NumpyBackend()
    for n, k, rows in (
        (1, 32, 1),
        (6, 64, 2),
        (70, 96, MATVEC_MAX_ROWS + 6),
        (133, 160, 3),
    ):  # N % 4 in 1, 2, 2, 1; a prompt's rows
        w = blocked_case(case, n, k, rng, scales)
        x = random_activations(rng, rows, k)
        lin = be.prepare_linear(w)
        assert lin.blocked.scale.dtype == lin.blocked.min.dtype == SCALE_DTYPES[scales]
        route = be.route(rows, lin)  # what this CPU runs: the expected numbers follow from it
        got = be.linear(x, lin)
        dense = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
        scale = np.abs(dense).max()
        np.testing.assert_allclose(ref.linear(x, ref.prepare_linear(w)), dense, rtol=0, atol=1e-5 * scale)
        assert got.shape == (rows, n) and got.dtype == np.float32
        if route.int8:
            np.testing.assert_allclose(got, int8_model(x, w), rtol=0, atol=2e-6 * scale, err_msg=f"{n}x{k} {route}")
            np.testing.assert_allclose(got, dense, rtol=0, atol=2e-2 * scale, err_msg=f"{n}x{k} {route} vs float")
        else:
            np.testing.assert_allclose(got, dense, rtol=0, atol=2e-6 * scale, err_msg=f"{n}x{k} {route}")


# Every blocked route, forced, over the weight cases its kernel reads (kernels/routes.py names them).
FORCED_ROUTES = [
    Route("matvec_q4", "f32", 4),
    Route("matvec_q4_split", "pieces", 4),
    Route("matvec_q8", "f32", 4),
    Route("matvec_i8", "int8", 4),
    Route("x16_split", "pieces", 16),
    Route("x16_i8", "int8", 16),
    Route("amx_tiles", "f32", 4),
    Route("amx_i8", "int8", 4),
    Route("panels", "f32", 4),
    Route("panels", "f32", 16),
]


def _reads(route: Route, case: str, scales: str) -> bool:
    q4, g32 = case.startswith("q4"), "g16" not in case
    return {
        "matvec_q4": q4,
        "matvec_q4_split": q4,
        "matvec_q8": not q4,
        "matvec_i8": g32,
        "x16_split": q4,
        "x16_i8": q4,
        "amx_tiles": g32 and scales == "f16",  # the tiles read float16 scales only
        "amx_i8": g32 and scales == "f16",
        "panels": route.stripe == 4 or q4,
    }[route.kernel]


def _route_id(r: Route) -> str:
    emulated = r.needs.amx and not HERE.amx  # AMX routes run on emulated tiles where the CPU has none
    return f"{r.kernel}-{r.stripe}" + ("-emulated-tiles" if emulated else "")


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("case", BLOCKED_CASES)
@pytest.mark.parametrize("route", FORCED_ROUTES, ids=_route_id)
def test_every_route_matches_its_model_where_this_cpu_runs_it(rng, route, case, scales):
    # Whichever route this CPU would pick, each one it can run is checked here: int8 routes against the int8
    # model, the others against the float64 product, from one row to a prompt's, on ragged weight blocks.
    # The AMX routes run everywhere: on emulated tiles where the CPU has none (the test id says so).
    emulate = route.needs.amx and not HERE.amx
    if not route.needs.within(replace(HERE, amx=HERE.amx or emulate)):
        pytest.skip(f"this CPU lacks {route.needs.missing(HERE)}: {route.kernel} cannot run here")
    if not _reads(route, case, scales):
        pytest.skip(f"{route.kernel} takes no {case} weight with {scales} scales")
    be = NumbaBackend(threads=2, emulate_amx=emulate)
    for n, k in ((38, 96), (133, 160)):
        w = blocked_case(case, n, k, rng, scales)
        b = (numba_layout.block_rows16 if route.stripe == 16 else numba_layout.block_rows)(w, half=scales == "f16")
        lin = Linear(w.shape, b)
        for rows in (1, 5, AMX_MIN_ROWS + 1, MATVEC_MAX_ROWS + 1):
            x = random_activations(rng, rows, k)
            dense = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
            want = int8_model(x, w) if route.int8 else dense
            got = be.linear(x, lin, route=route)
            scale = np.abs(dense).max()
            bound = 1e-5 if route.kernel in ("panels", "amx_tiles", "amx_i8") else 2e-6  # float32 sums, another order
            np.testing.assert_allclose(got, want, rtol=0, atol=bound * scale, err_msg=f"{n}x{k} T{rows}")


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("activations", ["f32", "q8"])
@pytest.mark.parametrize("case", BLOCKED_CASES)
def test_blocked_matvec_over_row_tiles_and_their_remainders(rng, case, activations, scales):
    # float32 rows go through a block in tiles of 8, the rest in one tile (3, 5-7 rows dequantize first,
    # 2 and 4 scale afterwards) or alone: every remainder, and each row's result equal to the same row
    # computed alone.
    be = NumbaBackend(threads=2, activations=activations)
    w = blocked_case(case, 38, 64, rng, scales)  # 38 rows: a ragged last block of 2
    lin = be.prepare_linear(w)
    assert lin.blocked.scale.dtype == SCALE_DTYPES[scales]
    x = random_activations(rng, 32, 64)
    dense = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
    int8 = int8_model(x, w) if w.group == 32 else None
    one = be.route(1, lin)
    alone = np.concatenate([be.linear(x[t : t + 1], lin) for t in range(32)])
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 31, 32):
        route = be.route(rows, lin)
        got = be.linear(x[:rows], lin)
        want = int8 if route.int8 else dense
        scale = np.abs(dense[:rows]).max()
        np.testing.assert_allclose(got, want[:rows], rtol=0, atol=2e-6 * scale, err_msg=f"T{rows} {route}")
        if route == one:  # the row tiles of one kernel: each row as it comes alone
            np.testing.assert_allclose(got, alone[:rows], rtol=0, atol=1e-6 * scale, err_msg=f"T{rows} vs alone")


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("case", ["q4", "q4 min"])
def test_int8_q4_products_over_group_counts_around_four_group_rounds(rng, case, scales):
    # The q4 int8 kernel takes a block's groups four at a time (their scales in one vector) and the
    # groups left over one at a time: every group count from one round minus one to two rounds plus
    # one, and row tiles with and without a remainder, each scale in its own group's lanes.
    be = NumbaBackend(threads=2, activations="q8")
    for ng in (3, 4, 5, 7, 8, 9, 18):
        k = 32 * ng
        w = blocked_case(case, 13, k, rng, scales)
        lin = be.prepare_linear(w)
        x = random_activations(rng, 6, k)
        want = int8_model(x, w)
        for rows in (1, 4, 5, 6):
            assert be.route(rows, lin).int8  # int8 on every CPU
            got = be.linear(x[:rows], lin)
            scale = np.abs(want[:rows]).max()
            np.testing.assert_allclose(got, want[:rows], rtol=0, atol=2e-6 * scale, err_msg=f"groups {ng} T{rows}")


@pytest.mark.parametrize("scales", SCALES)
def test_blocked_layout_round_trips_and_pads_to_four_rows(be, rng, scales):
    for case in BLOCKED_CASES:
        w = blocked_case(case, 7, 64, rng, scales)
        b = numba_layout.block_rows(w, half=scales == "f16")
        assert b.scale.dtype == SCALE_DTYPES[scales]
        assert (b.rows, b.cols, b.group) == (7, 64, w.group) and b.data.size == 8 * w.data.shape[1]
        rows = np.arange(7)
        out = np.empty((7, 64), np.float32)
        numba_layout.dequant_rows(b.data, b.scale, b.min, b.kind == "q4", b.group, b.zero, rows, out)
        np.testing.assert_array_equal(out, w.dequantize())


@pytest.mark.parametrize("scales", SCALES)
def test_sixteen_row_layout_round_trips_and_holds_the_same_bytes(rng, scales):
    for case in ("q4", "q4 min"):
        for n in (7, 16, 38):
            w = blocked_case(case, n, 96, rng, scales)
            b = numba_layout.block_rows16(w, half=scales == "f16")
            n16 = -(-n // 16) * 16
            assert (b.stripe, b.rows, b.cols, b.zero) == (16, n, 96, w.zero)
            assert b.data.size == n16 * 48 and b.scale.size == n16 * 3 and b.scale.dtype == SCALE_DTYPES[scales]
            if n % 16 == 0:  # a model's matrices: the four-row order's bytes, reordered
                assert b.nbytes == numba_layout.block_rows(w, half=scales == "f16").nbytes
            out = np.empty((n, 96), np.float32)
            rows = np.arange(n)[::-1].copy()
            numba_layout.dequant_rows16(b.data, b.scale, b.min, b.zero, rows, out)
            np.testing.assert_array_equal(out, w.dequantize(rows))


def _x16_product(b: numba_layout.Blocked, x: np.ndarray, activations: str) -> np.ndarray:
    """x times a 16-row blocked q4 weight, called directly: int8 activations ("q8"), or float32 as four int8
    pieces ("f32")."""
    out = np.full((len(x), b.rows), np.nan, np.float32)
    kernel = numba_linear16.matvec_i8_x16 if activations == "q8" else numba_linear16.matvec_q4_split_x16
    kernel(b.data, b.scale, b.min, np.float32(-b.zero if b.zero else 1), x, out, 2)
    return out


@pytest.mark.skipif(not simd.VNNI512, reason="the 16-row kernels are AVX-512 VNNI code, chosen nowhere else")
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("activations", ["f32", "q8"])
@pytest.mark.parametrize("case", ["q4", "q4 min"])
def test_sixteen_row_products_over_every_tile_remainder(rng, case, activations, scales):
    # Called directly (an AMX Xeon runs them too, though its backend keeps four rows): ragged last blocks,
    # tiles of X16_TILE rows and every remainder, each row equal to the same row computed alone; the float32
    # mode to float32 rounding of the exact product, int8 to its NumPy model.
    tile = numba_linear16.X16_TILE
    for n, k in ((1, 32), (38, 96), (133, 320)):
        w = blocked_case(case, n, k, rng, scales)
        b = numba_layout.block_rows16(w, half=scales == "f16")
        x = random_activations(rng, 2 * tile + 3, k)
        dense = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
        want = int8_model(x, w) if activations == "q8" else dense
        alone = np.concatenate([_x16_product(b, x[t : t + 1], activations) for t in range(len(x))])
        for rows in (1, 2, tile - 1, tile, tile + 1, 2 * tile + 3):
            got = _x16_product(b, x[:rows], activations)
            scale = max(np.abs(dense[:rows]).max(), 1e-30)
            np.testing.assert_allclose(got, want[:rows], rtol=0, atol=2e-6 * scale, err_msg=f"{n}x{k} T{rows}")
            np.testing.assert_allclose(got, alone[:rows], rtol=0, atol=1e-6 * scale, err_msg=f"{n}x{k} T{rows} alone")


@pytest.mark.parametrize("cpu", sorted(SIMULATED))
def test_q4_weights_take_the_sixteen_row_layout_where_vnni_runs_it(rng, cpu):
    # On AVX-512 VNNI (no AMX) q4 weights are blocked sixteen rows at a time in both activation modes; q8
    # weights and AMX CPUs keep four. The backend's embedding rows read either.
    caps = SIMULATED[cpu]
    if not caps.within(HERE):
        pytest.skip(f"this CPU lacks {caps.missing(HERE)}: a backend for {cpu} cannot run here")
    for activations in ("f32", "q8"):
        be = NumbaBackend(threads=2, activations=activations, caps=caps)
        q4, q8 = blocked_case("q4", 40, 64, rng, "f16"), blocked_case("q8 g32", 40, 64, rng, "f16")
        assert be.prepare_linear(q4).blocked.stripe == (16 if cpu == "avx512-vnni" else 4)
        assert be.prepare_linear(q8).blocked.stripe == 4
        ids = np.array([39, 0, 17, 17])
        np.testing.assert_array_equal(be.embedding(be.prepare_embedding(q4), ids), q4.dequantize(ids))


def test_a_tied_embedding_and_lm_head_share_one_repacked_copy(be, rng):
    w = blocked_case("q4 min", 9, 64, rng)
    emb = be.prepare_embedding(w)
    assert be.prepare_linear(w) is emb
    assert be.prepare_linear(blocked_case("q4 min", 9, 64, rng)) is not emb


@pytest.mark.skipif(not target_has("f16c"), reason="the CPU lacks F16C: every weight keeps float32 scales")
def test_scales_are_float16_only_where_every_one_round_trips(be, rng):
    # GGUF Q4_0, Q4_1 and Q8_0 store d (and m) as float16: always exact. Q6_K's d * sc products are not.
    for type_id, half in ((2, True), (3, True), (8, True), (14, False)):
        w, want = quantized(type_id, 9, 256, rng)
        lin = be.prepare_linear(w)
        assert lin.blocked.scale.dtype == (np.uint16 if half else np.float32), NAMES[type_id]
        np.testing.assert_array_equal(be.embedding(lin, np.arange(9)), want)
    w = blocked_case("q4 min", 9, 64, rng, "f16")
    w.min[4, 1] = np.float32(0.1)  # one min that float16 would round
    lin = be.prepare_linear(w)
    assert lin.blocked.scale.dtype == lin.blocked.min.dtype == np.float32
    np.testing.assert_array_equal(be.embedding(lin, np.arange(9)), w.dequantize())


def test_only_the_stepping_thread_leads_a_team_of_kernel_threads():
    """The thread that builds the backend (and warms it up) launches its kernels on one thread until it
    calls begin_step: a second libgomp team, idle, made every launch of the stepping thread's team wait
    for a wake-up."""
    seen = {}

    def build_then_step():
        be = NumbaBackend(threads=2)
        seen["built"] = numba.get_num_threads()
        be.begin_step()
        seen["stepping"] = numba.get_num_threads()

    t = threading.Thread(target=build_then_step)
    t.start()
    t.join()
    assert seen == {"built": 1, "stepping": 2}


# ---- weights as the file stores them; the activation pieces; each instruction set's path ---------------
@pytest.mark.parametrize("type_id", [2, 3, 8], ids=["Q4_0", "Q4_1", "Q8_0"])
def test_q4_0_q4_1_q8_0_weights_hold_exactly_the_files_bytes(be, rng, type_id):
    t = GGML_TYPES[type_id]
    raw = random_blocks(type_id, 16, 4, rng)  # 16 rows: whole blocks of either order
    raw[-1] = raw[0]
    w = gguf_weight(raw, type_id, (16, 4 * t.block_size))
    assert w.nbytes == raw.size and w.scales.dtype == np.float16
    assert (w.mins is None) == (type_id != 3) and w.zero == (8 if type_id == 2 else 0)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(type_id)).reshape(16, -1)
    np.testing.assert_array_equal(w.dequantize(), want)
    if type_id == 2:  # d * (q - 8): the mins read as -8 d, none stored
        np.testing.assert_array_equal(w.min, -8 * w.scale)
    lin = be.prepare_linear(w)
    if target_has("f16c"):
        assert lin.blocked.nbytes == raw.size
    np.testing.assert_array_equal(be.embedding(lin, np.arange(16)), want)
    fused = concat_rows([w, w.take_rows(np.arange(16)[::-1])])
    assert fused.nbytes == 2 * raw.size and fused.zero == w.zero


def test_activation_pieces_rebuild_every_value_to_float32_precision(rng):
    x = random_activations(rng, 3, 160)
    x[1, 32:64] *= np.float32(1e-30)  # a block of tiny values (still above the cut-off)
    x[2, 64:96] = np.float32(2.0**-120)  # a block below it: zeros
    xp, xs, xsum = np.empty(3 * 4 * 160, np.int8), np.empty((3, 5), np.float32), np.empty((3, 5), np.float32)
    numba_activations.split_rows(x, xp, xs, xsum)
    p = xp.reshape(3, 5, 4, 32).astype(np.float64)
    rebuilt = ((p[:, :, 0] * 2**7 + p[:, :, 1] + p[:, :, 2] / 2**7 + p[:, :, 3] / 2**14) * xs[:, :, None]).reshape(
        3, 160
    )
    np.testing.assert_array_equal(rebuilt[2, 64:96], 0)
    rebuilt[2, 64:96] = x[2, 64:96]
    blocks_max = np.abs(x).reshape(3, 5, 32).max(axis=2).repeat(32, axis=1)
    assert (np.abs(rebuilt - x) <= blocks_max * 2.0**-26).all()
    near_max = np.abs(x) >= blocks_max / 8
    np.testing.assert_array_equal(rebuilt[near_max], x[near_max])  # exact within 2^3 of the block's max
    np.testing.assert_allclose(xsum, x.reshape(3, 5, 32).sum(axis=2), rtol=1e-5, atol=1e-30)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


_AVX2 = (
    "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+lzcnt,+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,"
    "+sse4.2,+ssse3,+xsave"
)
# path -> (cpu name, features, float lanes, whether vpdpbusd on ymm, the CPU flags it needs to run here)
NARROWER_CPUS = {
    "avx2": ("haswell", _AVX2, 8, False, {"avx2"}),
    "vnni-ymm": (
        "skylake-avx512",
        _AVX2 + ",+avx512f,+avx512vl,+avx512vnni,+avx512cd,+avx512dq",
        16,
        True,
        {"avx512_vnni", "avx512vl"},
    ),  # AVX-512 VNNI without BW: vpdpbusd on ymm, q4 two rows a vector
    "avx-vnni": ("alderlake", _AVX2 + ",+avxvnni", 8, True, {"avx_vnni"}),  # the VEX encoding
}
_NARROW_CHECK = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_kernels_numba import blocked_case, random_activations
from kernels import simd
from kernels.numba_backend import NumbaBackend
from kernels.reference import int8_product
assert not simd.VNNI512 and simd.VNNI256 == (sys.argv[3] == "True") and simd.LANES == int(sys.argv[2])
rng = np.random.default_rng(0)
for activations in ("f32", "q8"):
    be = NumbaBackend(threads=2, activations=activations)
    for case in ("q4", "q4 min", "q8 g32"):
        for rows in (1, 4):  # a lone row, and a tile
            w = blocked_case(case, 38, 96, rng, "f16")
            x = random_activations(rng, rows, 96)
            got = be.linear(x, be.prepare_linear(w))
            dense = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
            want = int8_product(x, w) if activations == "q8" else dense
            assert be.route(rows, be.prepare_linear(w)).int8 == (activations == "q8")
            assert np.abs(got - want).max() <= 2e-6 * np.abs(dense).max(), (activations, case, rows)
print("ok")
"""


@pytest.mark.parametrize("isa", sorted(NARROWER_CPUS))
def test_each_narrower_instruction_set_path_matches_the_reference(isa):
    # The SIMD blocks pick vpdpbusd on zmm (AVX-512 VNNI), on ymm (AVX-VNNI, or AVX-512 VNNI without BW) or
    # AVX2's vpmaddubsw by the CPU numba compiles for: pinning a narrower one runs the code that a machine
    # without the wider instructions gets (its own entries in the kernel cache).
    import os
    import subprocess
    import sys

    from kernels import simd

    name, features, lanes, vnni256, needs = NARROWER_CPUS[isa]
    if not needs <= _cpu_flags():
        pytest.skip(f"this CPU lacks {sorted(needs - _cpu_flags())}: the {isa} path's instructions would fault here")
    if not simd.VNNI512 and vnni256 == simd.VNNI256 and lanes == simd.LANES:
        pytest.skip(f"this CPU's own kernels take the {isa} path: every kernel test here checks it natively")
    env = dict(os.environ, NUMBA_CPU_NAME=name, NUMBA_CPU_FEATURES=features)
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-c", _NARROW_CHECK, here, str(lanes), str(vnni256)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (done.returncode, done.stderr[-3000:])

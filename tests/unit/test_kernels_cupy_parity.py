"""Every CuPy op against its NumPy twin on fresh random inputs. Needs CuPy and a CUDA GPU; skipped
otherwise, with the reason. Imports no numba (a GPU machine's may not match the pins): shared weight
cases come from _kernel_cases.py.

Before every test the free memory of CuPy's pool is filled with 0xFF bytes (NaN as float32 and
float16, -1 as integers), so an output element that a kernel forgets to write shows up. Shapes
include sizes that are not multiples of the kernels' tiles (32-lane warps, 4 weight rows and 8
activation rows per GEMV block, 16-row prefill tiles, 32-key attention tiles). Tolerances: float32
paths to float32 rounding; float16 paths (KV cache, prefill products) a relative error below 1e-3;
quantized rows bit-equal to gguf-py; sampled ids exact except within a margin of a boundary
(_assert_same_samples).

Run on a GPU box in a pytest process of its own (`pip install -e '.[gpu-cuda13,dev]'`, or `.[gpu,dev]`
for CUDA 12), or through scripts/gpu_check.sh (docs/gpu.md).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _attention_cases import ATTENTION_CASES, AttnCase, make_case
from _kernel_cases import NAMES, QUANTIZED, float_weight, quantized
from _tiny_model import tiny_config, tiny_weights

import kernels
from engine.decode_graphs import DecodeGraphs
from engine.loader.quant import GGML_TYPES
from engine.model.llama import LlamaModel
from engine.model.rope import rope_inv_freq
from kernels import cupy_backend
from kernels.attention_meta import build_attention_metadata
from kernels.cuda_launch import GEMV_MAX_ROWS
from kernels.numpy_backend import NumpyBackend

_REASON = kernels.cupy_unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"no CUDA GPU on this machine ({_REASON})")

RTOL, ATOL = 1e-5, 1e-5
# Reductions run in a different order on the GPU (warp trees, online softmax, cuBLAS).
RTOL_SUM, ATOL_SUM = 1e-4, 1e-4
F16_REL = 1e-3


@pytest.fixture(scope="module")
def gpu():
    assert os.environ.get("CUPY_TF32", "0") == "0", "CUPY_TF32 would make cuBLAS matmuls TF32, not float32"
    backend = cupy_backend.CupyBackend()
    backend.begin_step()
    return backend


@pytest.fixture(scope="module")
def cpu() -> NumpyBackend:
    return NumpyBackend()


@pytest.fixture(autouse=True)
def poison(gpu):
    # Every test starts on the backend's own stream: a test that makes another backend's stream current
    # (its begin_step) would otherwise leave later launches unordered with this backend's copies. The pool
    # keeps freed memory per stream, so the poisoned block is freed on the stream the test then allocates on.
    gpu.begin_step()
    cp = gpu.xp
    pool = cp.get_default_memory_pool()
    gpu.synchronize()
    pool.free_all_blocks()
    junk = cp.full(64 << 20, 0xFF, dtype=np.uint8)  # freed below: later allocations are carved from it
    del junk


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(4321)


def _close(gpu, got, want, rtol=RTOL, atol=ATOL):
    got = gpu.to_numpy(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _rel(gpu, got, want, tol):
    """Norm-wise relative error below tol (elementwise tolerances mean nothing for near-zero outputs)."""
    got = gpu.to_numpy(got).astype(np.float64)
    assert got.shape == want.shape and np.isfinite(got).all()
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < tol, f"relative error {err:.2e}"


def test_auto_picks_cupy_here():
    assert kernels.get_backend("auto").name == "cupy"
    assert kernels.get_backend("cupy").name == "cupy"


# ---- row ops ------------------------------------------------------------------------


@pytest.mark.parametrize("D", [64, 100, 576, 2048])
def test_rms_norm(gpu, cpu, rng, D):
    x = rng.standard_normal((9, D)).astype(np.float32) * 2
    w = rng.standard_normal(D).astype(np.float32)
    _close(gpu, gpu.rms_norm(gpu.asarray(x), gpu.asarray(w), 1e-5), cpu.rms_norm(x, w, 1e-5))


def test_add_rms_norm_updates_the_residual_in_place(gpu, cpu, rng):
    x, res = (rng.standard_normal((7, 576)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(576).astype(np.float32)
    res_gpu = gpu.asarray(res)
    n_gpu, r_gpu = gpu.add_rms_norm(gpu.asarray(x), res_gpu, gpu.asarray(w), 1e-6)
    n_cpu, r_cpu = cpu.add_rms_norm(x, res, w, 1e-6)
    assert r_gpu is res_gpu
    _close(gpu, r_gpu, r_cpu, 0, 0)
    _close(gpu, n_gpu, n_cpu)


def test_rope_cos_sin_with_llama3_scaling(gpu, cpu, rng):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    inv_freq = rope_inv_freq(128, 500000.0, scaling)
    positions = np.concatenate([rng.integers(0, 130000, 37), [0, 1, 8191]])
    got = gpu.rope_cos_sin(gpu.asarray(inv_freq), gpu.asarray(positions))
    for g, w in zip(got, cpu.rope_cos_sin(inv_freq, positions)):
        _close(gpu, g, w, 0, 2e-6)


def test_rope_contiguous_and_strided_view(gpu, cpu, rng):
    T, H, Dh = 6, 9, 64
    ang = rng.uniform(-10, 10, (T, Dh // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x = rng.standard_normal((T, H, Dh)).astype(np.float32)
    want = cpu.rope(x.copy(), cos, sin)
    xg = gpu.asarray(x)
    _close(gpu, gpu.rope(xg, gpu.asarray(cos), gpu.asarray(sin)), want)
    _close(gpu, xg, want)  # in place
    qkv = rng.standard_normal((T, (H + 6) * Dh)).astype(np.float32)
    qkv_g = gpu.asarray(qkv)
    gpu.rope(qkv_g[:, : H * Dh].reshape(T, H, Dh), gpu.asarray(cos), gpu.asarray(sin))
    _close(gpu, qkv_g[:, : H * Dh].reshape(T, H, Dh), cpu.rope(qkv[:, : H * Dh].reshape(T, H, Dh).copy(), cos, sin))
    _close(gpu, qkv_g[:, H * Dh :], qkv[:, H * Dh :], 0, 0)


@pytest.mark.parametrize("T", [1, 13])
def test_rope_write_kv_rotates_q_and_writes_float16_k_v(gpu, cpu, rng, T):
    H, Hkv, Dh, nb, bs = 9, 3, 64, 6, 16
    qkv = rng.standard_normal((T, (H + 2 * Hkv) * Dh)).astype(np.float32)
    ang = rng.uniform(-10, 10, (T, Dh // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    slots = rng.choice(nb * bs, size=T, replace=False).astype(np.int64)
    kc, vc = cpu.empty_kv_cache(nb, bs, Hkv, Dh), cpu.empty_kv_cache(nb, bs, Hkv, Dh)
    q_want = cpu.rope_write_kv(qkv.copy(), cos, sin, H, Hkv, kc, vc, slots)
    kg, vg = gpu.empty_kv_cache(nb, bs, Hkv, Dh), gpu.empty_kv_cache(nb, bs, Hkv, Dh)
    q_got = gpu.rope_write_kv(gpu.asarray(qkv), gpu.asarray(cos), gpu.asarray(sin), H, Hkv, kg, vg, gpu.asarray(slots))
    _close(gpu, q_got, q_want)
    for got, want in ((kg, kc), (vg, vc)):
        _close(gpu, got.astype(np.float32), want.astype(np.float16).astype(np.float32), 1e-3, 1e-3)
        untouched = np.setdiff1d(np.arange(nb * bs), slots)
        assert not gpu.to_numpy(got.reshape(nb * bs, -1)[gpu.asarray(untouched)]).any()


def test_silu_mul(gpu, cpu, rng):
    gu = (rng.standard_normal((11, 2 * 1536)) * 5).astype(np.float32)
    gu[0, :2] = [-200.0, 200.0]
    _close(gpu, gpu.silu_mul(gpu.asarray(gu)), cpu.silu_mul(gu))


@pytest.mark.parametrize("words", [31, 32, 40])  # 992 ids (the last 8 are out), exactly the vocabulary, more
def test_apply_token_bitmask(gpu, cpu, rng, words):
    logits = rng.standard_normal((5, 1024)).astype(np.float32)
    mask = rng.integers(-(2**31), 2**31, (5, words), dtype=np.int64).astype(np.int32)
    want = logits[:, :1000].copy()
    cpu.apply_token_bitmask(want, mask)
    got = gpu.asarray(logits)
    gpu.apply_token_bitmask(got[:, :1000], mask)  # rows of a wider matrix; the mask from the host
    np.testing.assert_array_equal(gpu.to_numpy(got)[:, :1000], want)
    np.testing.assert_array_equal(gpu.to_numpy(got)[:, 1000:], logits[:, 1000:])


def test_argmax_takes_the_first_maximum(gpu, cpu, rng):
    logits = rng.standard_normal((4, 1000)).astype(np.float32)
    logits[1, [7, 300, 999]] = 50.0
    logits[3] = -np.inf
    got, want = gpu.argmax_rows(gpu.asarray(logits)), cpu.argmax_rows(logits)
    assert got[0].tolist() == want[0].tolist()
    np.testing.assert_array_equal(got[1], want[1])


def _sampling_rows(rng: np.random.Generator, V: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits [R, V] and their sampling table: every top_k (1, 40, V) x top_p (0.1, 0.9, 1.0) x temperature
    (0.3, 1, 1.7) on fresh random logits, min-p on some, then rows the selects find hard: ties at the k-th
    value and at the nucleus cut, a vocabulary masked to a few tokens, all mass in one token, a tiny
    temperature, greedy with a tied maximum, u at the ends of [0, 1), and rows with no usable token."""
    rows, table = [], []

    def add(x, temperature, top_k, top_p, min_p=0.0, u=None):
        rows.append(np.asarray(x, dtype=np.float32))
        table.append((temperature, top_k, top_p, min_p, rng.random() if u is None else u))

    for k in (1, 40, V):
        for p in (0.1, 0.9, 1.0):
            for t in (0.3, 1.0, 1.7):
                add(rng.standard_normal(V) * 3, t, k, p, min_p=float(rng.choice([0.0, 0.05])))
    ties = rng.integers(-4, 2, V).astype(np.float32)  # thousands of equal values at every level
    for k, p in ((40, 1.0), (0, 0.9), (0, 0.5), (40, 0.3), (V // 2, 0.95)):
        add(ties, 1.0, k, p)
    masked = rng.standard_normal(V) * 2
    masked[rng.random(V) < 0.98] = -np.inf  # as apply_token_bitmask leaves a constrained row
    add(masked, 1.0, 40, 0.9)
    add(masked, 0.7, 0, 1.0, min_p=0.1)
    add(masked, 1.0, V - 1, 0.99)
    one = np.full(V, -1e4)
    one[V // 3] = 5.0  # exp underflows to 0 for every other token
    add(one, 1.0, 0, 0.5)
    add(one, 1.0, 40, 1.0)
    add(rng.standard_normal(V), 1e-6, 0, 1.0)  # a tiny temperature: z is -inf but at the maximum
    add(rng.standard_normal(V), 1.3, 0, 0.8, u=0.0)
    add(rng.standard_normal(V), 1.3, 7, 1.0, u=float(np.nextafter(1.0, 0.0)))
    greedy = rng.standard_normal(V)
    greedy[[5, V - 2]] = 9.0
    add(greedy, 0.0, 0, 1.0)
    greedy = greedy.copy()
    greedy[[7, 9]] = np.inf  # greedy takes the first +inf, as the host's argmax does; sampling cannot
    add(greedy, 0.0, 0, 1.0)
    for bad in (np.nan, np.inf):
        x = rng.standard_normal(V)
        x[V // 2] = bad
        add(x, 1.0, 0, 1.0)
    add(np.full(V, -np.inf), 1.0, 0, 1.0)
    return np.stack(rows), np.asarray(table, dtype=np.float64)


# The device's expf differs from NumPy's by an ulp or two, flushes denormals to zero (CuPy compiles with -ftz=true)
# and sums in another order: a probability, and so a running mass, may differ by this much relative.
SAMPLE_MARGIN = 1e-5


def _assert_same_samples(cpu, logits: np.ndarray, table: np.ndarray, got: np.ndarray) -> None:
    """Token ids equal to the host's, except on a row whose pick sits within SAMPLE_MARGIN of a boundary (u at a
    CDF step, top-p at the nucleus's edge, min-p at a token's probability): there the device's id must be one the
    host picks itself once u, top_p or min_p move by that margin. Elsewhere the rule is exact."""
    want = cpu.sample_rows(logits, table)
    for r in np.flatnonzero(got != want):
        t, k, p, m, u = table[r]
        d = SAMPLE_MARGIN
        near = {
            int(cpu.sample_rows(logits[r : r + 1], np.array([[t, k, p2, m2, u2]]))[0])
            for u2 in (u, max(u - d, 0.0), min(u + d, float(np.nextafter(1.0, 0.0))))
            for p2 in ((p, p - d, min(p + d, 1.0)) if p < 1.0 else (p,))
            for m2 in ((m, m * (1 - d), m * (1 + d)) if m > 0.0 else (m,))
        }
        assert got[r] in near, (
            f"row {r} {table[r].tolist()}: device {got[r]}, host {want[r]}, host near the margins {sorted(near)}"
        )


@pytest.mark.parametrize("V", [1000, 4099])  # 2 and 9 values a thread, the last chunk ragged
def test_sample_rows_picks_what_the_host_sampler_picks(gpu, cpu, rng, V):
    """Same logits, params and uniforms: the same token ids as the host (kernels/row_sampling.py, which
    engine/sampling.py draws with; exact but at a margin, _assert_same_samples), -1 where a row has no usable token."""
    for _ in range(3):
        logits, table = _sampling_rows(rng, V)
        want = cpu.sample_rows(logits, table)
        assert want[-3:].tolist() == [-1, -1, -1] and (want[:-3] >= 0).all()
        got = gpu.sample_rows(gpu.asarray(logits), table)
        assert got[-3:].tolist() == [-1, -1, -1]
        _assert_same_samples(cpu, logits, table, got)


def test_sample_rows_over_a_full_vocabulary_of_strided_rows(gpu, cpu, rng):
    V = 49152
    logits = (rng.standard_normal((3, V + 16)) * 4).astype(np.float32)
    table = np.array([(0.8, 0, 0.9, 0.0, 0.3), (1.0, 50, 0.95, 0.05, 0.7), (1.5, 0, 1.0, 0.0, 0.99)])
    got = gpu.sample_rows(gpu.asarray(logits)[:, :V], table)  # rows of a wider matrix
    _assert_same_samples(cpu, logits[:, :V], table, got)


@pytest.mark.parametrize("n", [0, 5, 20])
def test_logprob_rows_match_the_host(gpu, cpu, rng, n):
    """Chosen and top-n logprobs of some rows of a wider matrix: ids equal (ties to the lower id, -inf entries
    ranked last), values to float64 rounding of float32 sums."""
    V = 3001
    logits = (rng.standard_normal((6, V + 7)) * 3).astype(np.float32)
    logits[1, [10, 400, 2000]] = 9.0  # a tie at the top
    logits[3] = np.round(logits[3])  # ties everywhere
    logits[4, 5:] = -np.inf  # fewer usable tokens than n
    rows, tokens = np.array([5, 1, 3, 4, 0]), np.array([0, 400, 17, 2, V - 1])
    got = gpu.logprob_rows(gpu.asarray(logits)[:, :V], rows, tokens, n)
    want = cpu.logprob_rows(logits[:, :V], rows, tokens, n)
    np.testing.assert_array_equal(got[1], want[1])
    for g, w in ((got[0], want[0]), (got[2], want[2])):
        np.testing.assert_allclose(g, w, rtol=RTOL_SUM, atol=ATOL_SUM)


# ---- weights: embedding and linear -----------------------------------------------------


@pytest.mark.parametrize("type_id", QUANTIZED, ids=NAMES.get)
def test_embedding_rows_are_bit_equal_to_gguf_py(gpu, rng, type_id):
    w, want = quantized(type_id, 37, 2 * GGML_TYPES[type_id].block_size, rng)
    ids = np.array([36, 0, 5, 5, 17])
    got = gpu.embedding(gpu.prepare_embedding(w), gpu.asarray(ids))
    _close(gpu, got, want[ids], 0, 0)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_embedding_of_float_tables(gpu, rng, kind):
    w, dense = float_weight(kind, 45, 40, rng)
    ids = np.array([44, 0, 3])
    _close(gpu, gpu.embedding(gpu.prepare_embedding(w), gpu.asarray(ids)), dense[ids], 0, 0)


@pytest.mark.parametrize("rows", [1, 5, 8, 9, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 100], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("type_id", QUANTIZED, ids=NAMES.get)
def test_linear_over_every_block_type(gpu, rng, type_id, rows):
    w, dense = quantized(type_id, 70, 256, rng)  # 70 outputs: not a multiple of the 4 rows of a GEMV block
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    got = gpu.linear(gpu.asarray(x), gpu.prepare_linear(w), gpu.asarray(bias))
    want = x.astype(np.float64) @ dense.T.astype(np.float64) + bias
    _rel(gpu, got, want, 1e-5 if rows <= GEMV_MAX_ROWS else F16_REL)  # GEMV: float32; more rows: float16 panels


@pytest.mark.parametrize("route", ["gemv_tiled", "gemv"])
@pytest.mark.parametrize("rows", [1, 9, GEMV_MAX_ROWS], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("type_id", QUANTIZED, ids=NAMES.get)
def test_each_gemv_route_over_several_rounds_of_k(gpu, rng, type_id, rows, route, monkeypatch):
    """Both GEMV routes, named: K of 1280 (five K-quant blocks) takes the tiled form several rounds of staged x
    (1024 q4 values, 512 q8 values a round), the last one ragged; 70 outputs leave a block's last warps without
    weight rows."""
    monkeypatch.setattr(gpu, "gemv", route)
    w, dense = quantized(type_id, 70, 1280, rng)
    x = rng.standard_normal((rows, 1280)).astype(np.float32)
    got = gpu.linear(gpu.asarray(x), gpu.prepare_linear(w))
    _rel(gpu, got, x.astype(np.float64) @ dense.T.astype(np.float64), 1e-5)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("rows", [1, 40], ids=lambda t: f"T{t}")
def test_linear_over_float_weights(gpu, rng, kind, rows):
    w, dense = float_weight(kind, 45, 40, rng)
    x = rng.standard_normal((rows, 40)).astype(np.float32)
    _rel(
        gpu,
        gpu.linear(gpu.asarray(x), gpu.prepare_linear(w)),
        x.astype(np.float64) @ dense.T,
        1e-5 if kind == "f32" else F16_REL,
    )


def test_panels_cover_a_weight_larger_than_one(rng, monkeypatch):
    monkeypatch.setattr(cupy_backend, "PANEL_VALUES", 200 * 64)  # 192-row panels over 470 rows
    gpu = cupy_backend.CupyBackend()
    gpu.begin_step()
    w, dense = quantized(8, 470, 64, rng)
    x = rng.standard_normal((GEMV_MAX_ROWS + 7, 64)).astype(np.float32)
    _rel(gpu, gpu.linear(gpu.asarray(x), gpu.prepare_linear(w)), x.astype(np.float64) @ dense.T, F16_REL)


# ---- KV cache and attention ----------------------------------------------------------


def test_write_kv_float16(gpu, cpu, rng):
    kc, vc = cpu.empty_kv_cache(8, 16, 3, 64), cpu.empty_kv_cache(8, 16, 3, 64)
    kg, vg = gpu.empty_kv_cache(8, 16, 3, 64), gpu.empty_kv_cache(8, 16, 3, 64)
    kv = rng.standard_normal((10, 2, 3, 64)).astype(np.float32)  # k/v as views into a fused projection
    slots = rng.choice(8 * 16, size=10, replace=False).astype(np.int64)
    cpu.write_kv(kc, vc, kv[:, 0], kv[:, 1], slots)
    kv_g = gpu.asarray(kv)
    gpu.write_kv(kg, vg, kv_g[:, 0], kv_g[:, 1], gpu.asarray(slots))
    _close(gpu, kg, kc.astype(np.float16), 0, 0)
    _close(gpu, vg, vc.astype(np.float16), 0, 0)


def _attention_pair(gpu, cpu, case: AttnCase, scale: float, q_view: bool = False):
    """(GPU result, NumPy result) with the cache values rounded to float16 for both."""
    for name in ("k_cache", "v_cache", "k_new", "v_new"):
        setattr(case, name, getattr(case, name).astype(np.float16).astype(np.float32))
    meta_c = case.meta()
    kc, vc = case.k_cache.copy(), case.v_cache.copy()
    cpu.write_kv(kc, vc, case.k_new, case.v_new, meta_c.slot_mapping)
    want = cpu.paged_attention(case.q, kc, vc, meta_c, scale)
    meta_g = case.meta(gpu)
    kg, vg = gpu.asarray(case.k_cache.astype(np.float16)), gpu.asarray(case.v_cache.astype(np.float16))
    gpu.write_kv(kg, vg, gpu.asarray(case.k_new), gpu.asarray(case.v_new), meta_g.slot_mapping)
    if q_view:  # q as a strided view of a wider array
        T, H, Dh = case.q.shape
        wide = gpu.xp.zeros((T, H, 2 * Dh), dtype=np.float32)
        wide[:, :, :Dh] = gpu.asarray(case.q)
        q = wide[:, :, :Dh]
    else:
        q = gpu.asarray(case.q)
    return gpu.paged_attention(q, kg, vg, meta_g, scale), want


@pytest.mark.parametrize("name,seqs,heads,kv_heads", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_paged_attention(gpu, cpu, rng, name, seqs, heads, kv_heads, head_dim):
    case = make_case(rng, seqs, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    got, want = _attention_pair(gpu, cpu, case, head_dim**-0.5)
    _close(gpu, got, want, RTOL_SUM, ATOL_SUM)


@pytest.mark.parametrize("head_dim", [80, 256])
def test_paged_attention_long_context_and_odd_shapes(gpu, cpu, rng, head_dim):
    # Many tiles per warp, a 100-row prefill over a prefix (tiles of 16 rows, the last one ragged),
    # block size 32, head_dim not a multiple of 64, strided q.
    case = make_case(
        rng, [(1, 1500), (100, 900), (1, 3), (17, 17)], heads=6, kv_heads=2, head_dim=head_dim, block_size=32
    )
    got, want = _attention_pair(gpu, cpu, case, head_dim**-0.5, q_view=True)
    _close(gpu, got, want, RTOL_SUM, ATOL_SUM)


# ---- the model and its decode graphs ------------------------------------------------------


def _tiny(backend, kinds):
    config = tiny_config()
    return LlamaModel(config, tiny_weights(config, kinds, np.random.default_rng(11)), backend)


@pytest.mark.parametrize("kinds", [["q4"], ["q8"], ["f16", "bf16", "f32"]], ids=["q4", "q8", "float"])
def test_tiny_model_logits_match_numpy(gpu, cpu, kinds):
    prompt, bs = list(range(3, 40)), 16
    out = []
    for be in (gpu, cpu):
        model = _tiny(be, kinds)
        caches = [(be.empty_kv_cache(4, bs, 2, 16), be.empty_kv_cache(4, bs, 2, 16)) for _ in range(2)]
        meta = build_attention_metadata([36], [36], [[2, 0, 3]], bs, be)  # prefill, then one decode token
        first = model.forward(np.array(prompt[:36]), np.arange(36), meta, caches, np.arange(36))
        meta = build_attention_metadata([1], [37], [[2, 0, 3]], bs, be)
        out.append(
            np.concatenate([first, model.forward(np.array(prompt[36:]), np.array([36]), meta, caches, np.array([0]))])
        )
    err = np.linalg.norm(out[0] - out[1]) / np.linalg.norm(out[1])
    assert err < F16_REL, f"relative error {err:.2e}"


def test_a_replayed_decode_graph_equals_the_eager_step(gpu):
    model, bs = _tiny(gpu, ["q4", "q8"]), 16
    caches = [(gpu.empty_kv_cache(9, bs, 2, 16), gpu.empty_kv_cache(9, bs, 2, 16)) for _ in range(2)]
    tables = [[0, 1], [2], [3]]
    meta = build_attention_metadata([20, 3, 1], [20, 3, 1], tables, bs, gpu)
    model.forward(np.arange(24) % 90, np.concatenate([np.arange(20), np.arange(3), [0]]), meta, caches, np.array([19]))
    graphs = DecodeGraphs(model, caches, bs, pad_block=8, width=4, max_batch=8)
    for step in range(3):  # capture at the first step, replays after
        tokens, positions = [5 + step, 6, 7], [20 + step, 3 + step, 1 + step]
        meta = build_attention_metadata([1, 1, 1], [p + 1 for p in positions], tables, bs, gpu)
        eager = model.forward(np.array(tokens), np.array(positions), meta, caches, np.arange(3))
        replayed = gpu.to_numpy(graphs.run(tokens, positions, tables))
        np.testing.assert_array_equal(replayed, eager)
    assert list(graphs._graphs) == [4]


def test_replays_of_two_buckets_in_turn_equal_the_eager_steps(gpu):
    """Buckets 1 and 4 captured one after the other, then replayed 1 -> 4 -> 1: each replay bit-equal to the eager
    step. Every capture has memory of its own: were one capture's plan or scratch carved from another's, replaying
    one bucket would overwrite what the other reads (its attention plan: an illegal address or garbage logits)."""
    model, bs = _tiny(gpu, ["q4", "q8"]), 16
    caches = [(gpu.empty_kv_cache(9, bs, 2, 16), gpu.empty_kv_cache(9, bs, 2, 16)) for _ in range(2)]
    tables = [[0, 1], [2], [3], [4]]
    prompt = [20, 3, 5, 9]
    meta = build_attention_metadata(prompt, prompt, tables, bs, gpu)
    positions = np.concatenate([np.arange(n) for n in prompt])
    model.forward(np.arange(sum(prompt)) % 90, positions, meta, caches, np.array([sum(prompt) - 1]))
    graphs = DecodeGraphs(model, caches, bs, pad_block=8, width=4, max_batch=4)
    for step, batch in enumerate([1, 4, 1, 4, 1]):  # captures at the first two steps, replays after
        tokens = [5 + step + i for i in range(batch)]
        positions = [p + step for p in prompt[:batch]]
        meta = build_attention_metadata([1] * batch, [p + 1 for p in positions], tables[:batch], bs, gpu)
        eager = model.forward(np.array(tokens), np.array(positions), meta, caches, np.arange(batch))
        replayed = gpu.to_numpy(graphs.run(tokens, positions, tables[:batch]))
        np.testing.assert_array_equal(replayed, eager, err_msg=f"step {step}, {batch} rows")
    assert sorted(graphs._graphs) == [1, 4]

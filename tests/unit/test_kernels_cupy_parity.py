"""Every CuPy op against its NumPy twin on random inputs. Needs cupy-cuda12x and a CUDA GPU.

Run on a GPU box: `pip install -e '.[gpu,dev]' && pytest tests/unit/test_kernels_cupy_parity.py`.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import kernels
from kernels.numpy_backend import NumpyBackend
from _attention_cases import ATTENTION_CASES, AttnCase, make_case

_REASON = kernels.cupy_unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"no CUDA GPU on this machine ({_REASON})")

RTOL, ATOL = 1e-5, 1e-5
# Reductions run in a different order on the GPU (cuBLAS, warp trees, online softmax).
RTOL_SUM, ATOL_SUM = 1e-4, 1e-4


@pytest.fixture(scope="module")
def gpu():
    assert os.environ.get("CUPY_TF32", "0") == "0", "CUPY_TF32 would make cuBLAS matmuls TF32, not float32"
    from kernels.cupy_backend import CupyBackend

    return CupyBackend()


@pytest.fixture(scope="module")
def cpu() -> NumpyBackend:
    return NumpyBackend()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(4321)


def _close(gpu, got, want, rtol=RTOL, atol=ATOL):
    got = gpu.to_numpy(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_auto_picks_cupy_here():
    assert kernels.get_backend("auto").name == "cupy"
    assert kernels.get_backend("cupy").name == "cupy"


@pytest.mark.parametrize("D", [64, 576, 2048])
def test_rms_norm(gpu, cpu, rng, D):
    x = rng.standard_normal((9, D)).astype(np.float32) * 2
    w = rng.standard_normal(D).astype(np.float32)
    _close(gpu, gpu.rms_norm(gpu.asarray(x), gpu.asarray(w), 1e-5), cpu.rms_norm(x, w, 1e-5))


def test_add_rms_norm(gpu, cpu, rng):
    x, res = (rng.standard_normal((7, 576)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(576).astype(np.float32)
    n_gpu, r_gpu = gpu.add_rms_norm(gpu.asarray(x), gpu.asarray(res), gpu.asarray(w), 1e-6)
    n_cpu, r_cpu = cpu.add_rms_norm(x, res, w, 1e-6)
    _close(gpu, r_gpu, r_cpu)
    _close(gpu, n_gpu, n_cpu)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_linear(gpu, cpu, rng, with_bias):
    x = rng.standard_normal((13, 576)).astype(np.float32)
    w = rng.standard_normal((576, 192)).astype(np.float32)  # [K, N]
    b = rng.standard_normal(192).astype(np.float32) if with_bias else None
    got = gpu.linear(gpu.asarray(x), gpu.asarray(w), None if b is None else gpu.asarray(b))
    _close(gpu, got, cpu.linear(x, w, b), RTOL_SUM, ATOL_SUM)


def test_rope_contiguous_and_strided_view(gpu, cpu, rng):
    T, H, Dh = 6, 9, 64
    ang = rng.uniform(-10, 10, (T, Dh // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x = rng.standard_normal((T, H, Dh)).astype(np.float32)
    want = cpu.rope(x.copy(), cos, sin)
    xg = gpu.asarray(x)
    _close(gpu, gpu.rope(xg, gpu.asarray(cos), gpu.asarray(sin)), want)
    _close(gpu, xg, want)  # in place
    # q as a view into a fused [T, (H + 2*Hkv) * Dh] projection output
    qkv = rng.standard_normal((T, (H + 6) * Dh)).astype(np.float32)
    qkv_g = gpu.asarray(qkv)
    gpu.rope(qkv_g[:, : H * Dh].reshape(T, H, Dh), gpu.asarray(cos), gpu.asarray(sin))
    want_q = cpu.rope(qkv[:, : H * Dh].reshape(T, H, Dh).copy(), cos, sin)
    _close(gpu, qkv_g[:, : H * Dh].reshape(T, H, Dh), want_q)
    _close(gpu, qkv_g[:, H * Dh :], qkv[:, H * Dh :])


def test_silu_mul(gpu, cpu, rng):
    gu = (rng.standard_normal((11, 2 * 1536)) * 5).astype(np.float32)
    gu[0, :2] = [-200.0, 200.0]
    _close(gpu, gpu.silu_mul(gpu.asarray(gu)), cpu.silu_mul(gu))


def test_apply_token_bitmask(gpu, cpu, rng):
    logits = rng.standard_normal((5, 1000)).astype(np.float32)
    mask = rng.integers(-(2**31), 2**31, (5, 31), dtype=np.int64).astype(np.int32)  # 992 ids: the last 8 are out
    want = logits.copy()
    cpu.apply_token_bitmask(want, mask)
    got = gpu.asarray(logits)
    gpu.apply_token_bitmask(got, gpu.asarray(mask))
    np.testing.assert_array_equal(gpu.to_numpy(got), want)


def test_embedding_and_argmax(gpu, cpu, rng):
    table = rng.standard_normal((100, 32)).astype(np.float32)
    ids = np.array([5, 0, 99, 5, 42])
    _close(gpu, gpu.embedding(gpu.asarray(table), gpu.asarray(ids)), cpu.embedding(table, ids), 0, 0)
    logits = rng.standard_normal((4, 1000)).astype(np.float32)
    assert gpu.argmax_rows(gpu.asarray(logits)).tolist() == cpu.argmax_rows(logits).tolist()


def test_write_kv(gpu, cpu, rng):
    kc, vc = cpu.empty_kv_cache(8, 16, 3, 64, np.float32), cpu.empty_kv_cache(8, 16, 3, 64, np.float32)
    kg, vg = gpu.empty_kv_cache(8, 16, 3, 64, np.float32), gpu.empty_kv_cache(8, 16, 3, 64, np.float32)
    # k/v as views into a fused projection, as the model produces them
    kv = rng.standard_normal((10, 2, 3, 64)).astype(np.float32)
    slots = rng.choice(8 * 16, size=10, replace=False).astype(np.int64)
    cpu.write_kv(kc, vc, kv[:, 0], kv[:, 1], slots)
    kv_g = gpu.asarray(kv)
    gpu.write_kv(kg, vg, kv_g[:, 0], kv_g[:, 1], gpu.asarray(slots))
    _close(gpu, kg, kc, 0, 0)
    _close(gpu, vg, vc, 0, 0)


def _attention_pair(gpu, cpu, case: AttnCase, scale: float, q_view: bool = False):
    meta_c = case.meta()
    kc, vc = case.k_cache.copy(), case.v_cache.copy()
    cpu.write_kv(kc, vc, case.k_new, case.v_new, meta_c.slot_mapping)
    want = cpu.paged_attention(case.q, kc, vc, meta_c, scale)
    meta_g = case.meta(gpu)
    kg, vg = gpu.asarray(case.k_cache), gpu.asarray(case.v_cache)
    gpu.write_kv(kg, vg, gpu.asarray(case.k_new), gpu.asarray(case.v_new), meta_g.slot_mapping)
    if q_view:  # q as a strided view of a wider array
        T, H, Dh = case.q.shape
        wide = gpu.xp.zeros((T, H, 2 * Dh), dtype=np.float32)
        wide[:, :, :Dh] = gpu.asarray(case.q)
        q = wide[:, :, :Dh]
    else:
        q = gpu.asarray(case.q)
    got = gpu.paged_attention(q, kg, vg, meta_g, scale)
    _close(gpu, kg, kc, 0, 0)
    return got, want


@pytest.mark.parametrize("name,seqs,heads,kv_heads", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_paged_attention(gpu, cpu, rng, name, seqs, heads, kv_heads, head_dim):
    case = make_case(rng, seqs, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    got, want = _attention_pair(gpu, cpu, case, head_dim**-0.5)
    _close(gpu, got, want, RTOL_SUM, ATOL_SUM)


def test_paged_attention_long_context_and_odd_shapes(gpu, cpu, rng):
    # Many keys per warp (online softmax), block size 32, head_dim not a multiple of 32, strided q.
    case = make_case(rng, [(1, 1500), (100, 900), (1, 3)], heads=6, kv_heads=2, head_dim=80, block_size=32)
    got, want = _attention_pair(gpu, cpu, case, 80**-0.5, q_view=True)
    _close(gpu, got, want, RTOL_SUM, ATOL_SUM)

"""NumPy backend ops against naive references (loops and explicit formulas, float64)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from _attention_cases import ATTENTION_CASES, AttnCase, make_case

import kernels
from kernels import numpy_backend
from kernels.attention_meta import build_attention_metadata
from kernels.numpy_backend import NumpyBackend

RTOL = ATOL = 1e-5


@pytest.fixture(scope="module")
def be() -> NumpyBackend:
    return NumpyBackend()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def naive_attention(case: AttnCase, scale: float) -> np.ndarray:
    """Dense causal attention per sequence, per query, per head, in float64 with explicit loops."""
    H, Hkv = case.q.shape[1], case.k_dense[0].shape[1]
    out = np.zeros(case.q.shape, dtype=np.float64)
    row = 0
    for n, c, kd, vd in zip(case.query_lens, case.context_lens, case.k_dense, case.v_dense):
        for j in range(n):
            pos = c - n + j
            for h in range(H):
                kvh = h // (H // Hkv)
                scores = np.array(
                    [scale * np.dot(case.q[row + j, h].astype(np.float64), kd[t, kvh]) for t in range(pos + 1)]
                )
                w = np.exp(scores - scores.max())
                w /= w.sum()
                out[row + j, h] = (w[:, None] * vd[: pos + 1, kvh].astype(np.float64)).sum(axis=0)
        row += n
    return out


# ---- elementwise ops ------------------------------------------------------


def test_rms_norm_matches_formula(be, rng):
    x = rng.standard_normal((7, 576)).astype(np.float32) * 3
    w = rng.standard_normal(576).astype(np.float32)
    got = be.rms_norm(x, w, 1e-5)
    ref = np.empty((7, 576))
    for t in range(7):
        xt = x[t].astype(np.float64)
        ref[t] = xt / np.sqrt(np.mean(xt * xt) + 1e-5) * w
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def test_add_rms_norm_returns_sum_and_its_norm(be, rng):
    x = rng.standard_normal((5, 64)).astype(np.float32)
    res = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    x0, res0 = x.copy(), res.copy()
    normed, new_res = be.add_rms_norm(x, res, w, 1e-6)
    s = x0.astype(np.float64) + res0
    np.testing.assert_allclose(new_res, s, rtol=RTOL, atol=ATOL)
    ref = s / np.sqrt((s * s).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(normed, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_linear_matches_loops(be, rng, with_bias):
    x = rng.standard_normal((6, 40)).astype(np.float32)
    w = rng.standard_normal((40, 24)).astype(np.float32)  # [K, N]
    b = rng.standard_normal(24).astype(np.float32) if with_bias else None
    got = be.linear(x, w, b)
    ref = np.zeros((6, 24))
    for t in range(6):
        for n in range(24):
            ref[t, n] = sum(float(x[t, k]) * float(w[k, n]) for k in range(40)) + (float(b[n]) if with_bias else 0.0)
    assert got.shape == (6, 24)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def test_rope_rotate_half_formula_in_place(be, rng):
    T, H, Dh = 5, 3, 8
    x = rng.standard_normal((T, H, Dh)).astype(np.float32)
    ang = rng.uniform(-4, 4, (T, Dh // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    ref = np.zeros((T, H, Dh))
    for t in range(T):
        for h in range(H):
            for i in range(Dh // 2):
                a, b = float(x[t, h, i]), float(x[t, h, i + Dh // 2])
                ref[t, h, i] = a * cos[t, i] - b * sin[t, i]
                ref[t, h, i + Dh // 2] = b * cos[t, i] + a * sin[t, i]
    got = be.rope(x, cos, sin)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(x, ref, rtol=RTOL, atol=ATOL)  # documented: may work in place


def test_rope_on_a_strided_view_leaves_the_rest_alone(be, rng):
    qkv = rng.standard_normal((4, 3 * 2 * 8)).astype(np.float32)
    orig = qkv.copy()
    q = qkv[:, :16].reshape(4, 2, 8)  # a view into a fused projection output
    ang = rng.uniform(-4, 4, (4, 4))
    be.rope(q, np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
    np.testing.assert_array_equal(qkv[:, 16:], orig[:, 16:])
    assert not np.allclose(qkv[:, :16], orig[:, :16])


def test_silu_mul_matches_formula(be, rng):
    gate_up = (rng.standard_normal((4, 2 * 30)) * 6).astype(np.float32)
    gate_up[0, 0], gate_up[0, 1] = -200.0, 200.0  # extremes: no overflow, exact limits
    got = be.silu_mul(gate_up)
    g, u = gate_up[:, :30].astype(np.float64), gate_up[:, 30:].astype(np.float64)
    ref = g / (1.0 + np.exp(-g)) * u
    assert got.shape == (4, 30)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def test_embedding_rows_and_bad_ids(be, rng):
    table = rng.standard_normal((50, 12)).astype(np.float32)
    ids = np.array([3, 0, 49, 3])
    got = be.embedding(table, ids)
    for i, t in enumerate(ids):
        np.testing.assert_array_equal(got[i], table[t])
    with pytest.raises(ValueError, match="out of range"):
        be.embedding(table, np.array([50]))


def test_argmax_rows_gives_each_row_s_first_maximum_and_its_logit(be, rng):
    logits = rng.standard_normal((3, 100)).astype(np.float32)
    logits[1, [9, 50]] = 7.0
    logits[2, 4] = np.nan
    ids, values = be.argmax_rows(logits)
    assert ids.tolist() == [int(np.argmax(logits[0])), 9, 4]
    assert values[0] == logits[0].max() and values[1] == 7.0 and np.isnan(values[2])


# ---- KV cache ---------------------------------------------------------------


def test_write_kv_puts_each_token_in_its_slot(be, rng):
    k_cache = be.empty_kv_cache(6, 4, 2, 8, np.float32)
    v_cache = be.empty_kv_cache(6, 4, 2, 8, np.float32)
    assert k_cache.shape == (6, 4, 2, 8) and not k_cache.any()
    k = rng.standard_normal((5, 2, 8)).astype(np.float32)
    v = rng.standard_normal((5, 2, 8)).astype(np.float32)
    slots = np.array([13, 2, 23, 0, 9], dtype=np.int64)
    be.write_kv(k_cache, v_cache, k, v, slots)
    for t, s in enumerate(slots):
        np.testing.assert_array_equal(k_cache[s // 4, s % 4], k[t])
        np.testing.assert_array_equal(v_cache[s // 4, s % 4], v[t])
    untouched = np.ones(24, bool)
    untouched[slots] = False
    assert not k_cache.reshape(24, -1)[untouched].any() and not v_cache.reshape(24, -1)[untouched].any()


def test_write_kv_rejects_out_of_range_slot(be):
    cache = be.empty_kv_cache(2, 4, 1, 8, np.float32)
    k = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="slot_mapping out of range"):
        be.write_kv(cache, cache.copy(), k, k, np.array([8]))


def test_metadata_slots_follow_block_tables():
    meta = build_attention_metadata([2, 1], [5, 9], [[7, 3], [4, 0, 6]], 4)
    # seq 0: positions 3, 4 -> block 7 offset 3, block 3 offset 0; seq 1: position 8 -> block 6 offset 0
    assert meta.slot_mapping.tolist() == [7 * 4 + 3, 3 * 4 + 0, 6 * 4 + 0]
    assert meta.query_start.tolist() == [0, 2, 3] and meta.max_context == 9 and not meta.is_decode_only
    with pytest.raises(ValueError, match="needs 3"):
        build_attention_metadata([1], [9], [[1, 2]], 4)


# ---- paged attention --------------------------------------------------------


def _run_case(be, case: AttnCase, scale: float) -> np.ndarray:
    meta = case.meta()
    be.write_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, meta.slot_mapping)
    return be.paged_attention(case.q, case.k_cache, case.v_cache, meta, scale)


@pytest.mark.parametrize("name,seqs,heads,kv_heads", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_paged_attention_matches_dense_causal(be, rng, name, seqs, heads, kv_heads):
    case = make_case(rng, seqs, heads=heads, kv_heads=kv_heads, head_dim=32)
    scale = 32**-0.5
    got = _run_case(be, case, scale)
    assert got.shape == case.q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, naive_attention(case, scale), rtol=RTOL, atol=ATOL)


def test_paged_attention_tiled_long_prefill(be, rng, monkeypatch):
    # A tiny tile budget forces many query tiles, each with its own causal key range.
    monkeypatch.setattr(numpy_backend, "_TILE_SCORES", 4000)
    case = make_case(rng, [(45, 80), (1, 20), (30, 30)], heads=4, kv_heads=2, head_dim=16, block_size=8)
    got = _run_case(be, case, 0.25)
    np.testing.assert_allclose(got, naive_attention(case, 0.25), rtol=RTOL, atol=ATOL)


def test_paged_attention_decode_flag_and_mixed_agree(be, rng):
    # The same decode rows must come out the same whether or not prefill rows share the batch.
    case = make_case(rng, [(1, 40), (10, 25), (1, 7)], head_dim=16)
    mixed = _run_case(be, case, 0.25)
    decode_only = make_case(np.random.default_rng(0), [(1, 40), (1, 7)], head_dim=16)
    decode_only.q = case.q[[0, 11]]
    decode_only.k_dense, decode_only.v_dense = [case.k_dense[0], case.k_dense[2]], [case.v_dense[0], case.v_dense[2]]
    decode_only.k_cache, decode_only.v_cache = case.k_cache, case.v_cache
    decode_only.block_tables = [case.block_tables[0], case.block_tables[2]]
    meta = decode_only.meta()
    assert meta.is_decode_only
    got = be.paged_attention(decode_only.q, case.k_cache, case.v_cache, meta, 0.25)
    np.testing.assert_allclose(got, mixed[[0, 11]], rtol=RTOL, atol=ATOL)


def test_paged_attention_rejects_mismatched_metadata(be, rng):
    case = make_case(rng, [(3, 10)], head_dim=16)
    meta = case.meta()
    with pytest.raises(ValueError, match="does not cover"):
        be.paged_attention(case.q[:2], case.k_cache, case.v_cache, meta, 1.0)
    with pytest.raises(ValueError, match="does not fit cache"):
        be.paged_attention(case.q[..., :8], case.k_cache, case.v_cache, meta, 1.0)


# ---- backend choice ---------------------------------------------------------


def test_get_backend_numpy_and_unknown():
    assert kernels.get_backend("numpy").name == "numpy"
    with pytest.raises(ValueError, match="unknown kernel backend 'tpu'"):
        kernels.get_backend("tpu")


def test_get_backend_auto_logs_its_choice(caplog):
    reason = kernels.cupy_unavailable_reason()
    with caplog.at_level(logging.INFO, logger="forge.kernels"):
        be = kernels.get_backend("auto")
    assert be.name == ("numba" if reason else "cupy")
    assert any(be.name in r.getMessage() for r in caplog.records)
    if reason:
        assert any(reason in r.getMessage() for r in caplog.records)
        with pytest.raises(RuntimeError, match="'cupy' is not usable"):
            kernels.get_backend("cupy")


def test_apply_token_bitmask_keeps_exactly_the_allowed_tokens(be, rng):
    R, V = 3, 100  # 4 words of 32 bits: the last one covers 96..127, ids past V are ignored
    allowed = rng.random((R, V)) < 0.3
    words = np.zeros((R, 4), dtype=np.uint32)
    for r, v in zip(*np.nonzero(allowed)):
        words[r, v // 32] |= np.uint32(1) << np.uint32(v % 32)
    words[:, 3] |= np.uint32(0xFFFFFFF0)  # bits past the vocabulary set: must not matter
    logits = rng.standard_normal((R, V)).astype(np.float32)
    out = logits.copy()
    be.apply_token_bitmask(out, words.view(np.int32))
    np.testing.assert_array_equal(np.isfinite(out), allowed)
    np.testing.assert_array_equal(out[allowed], logits[allowed])
    assert (out[~allowed] == -np.inf).all()
    short = logits.copy()  # a mask narrower than the vocabulary disallows the rest
    be.apply_token_bitmask(short, words[:, :2].view(np.int32).copy())
    assert (short[:, 64:] == -np.inf).all()
    with pytest.raises(ValueError, match="int32"):
        be.apply_token_bitmask(logits, words.astype(np.int64))

"""The Llama forward on tiny random models: HF safetensors and GGUF copies of the same weights
give the same logits, and both equal an independent dense NumPy transformer."""

from __future__ import annotations

import numpy as np
import pytest
from _gguf_helpers import hf_weights, spec_for, tiny_vocab, write_tiny_pair

from engine.loader import ModelLoadError, load_model
from engine.model.llama import LlamaModel
from kernels import get_backend
from kernels.attention_meta import build_attention_metadata


def paged_logits(
    path, prompt: list[int], chunks: list[int], backend: str = "numpy", quantize: str | None = None
) -> np.ndarray:
    """Logits at every position, feeding the prompt in `chunks` through a paged cache whose
    blocks are deliberately out of order."""
    loaded = load_model(path, quantize=quantize)
    be = get_backend(backend)
    model = LlamaModel(loaded.config, loaded.weights, be)
    c, bs = loaded.config, 4
    n_blocks = -(-len(prompt) // bs)
    table = list(reversed(range(n_blocks)))
    caches = [
        (
            be.empty_kv_cache(n_blocks, bs, c.num_kv_heads, c.head_dim),
            be.empty_kv_cache(n_blocks, bs, c.num_kv_heads, c.head_dim),
        )
        for _ in range(c.num_layers)
    ]
    out, done = [], 0
    for n in chunks:
        meta = build_attention_metadata([n], [done + n], [table], bs, be)
        out.append(
            model.forward(np.asarray(prompt[done : done + n]), np.arange(done, done + n), meta, caches, np.arange(n))
        )
        done += n
    return np.concatenate(out)


def dense_reference(arch: str, prompt: list[int]) -> np.ndarray:
    """Straight from HF-named weights, float64, rotate-half RoPE: no engine code involved."""
    spec = spec_for(arch)
    w = {k: v.astype(np.float64) for k, v in hf_weights(spec, len(tiny_vocab()[0])).items()}
    H, Hkv, Dh, T = spec.heads, spec.kv_heads, spec.head_dim, len(prompt)

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + spec.rms_eps) * g

    inv = 1.0 / spec.rope_theta ** (np.arange(0, Dh, 2) / Dh)
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [T, heads, Dh]
        rot = np.concatenate([-x[..., Dh // 2 :], x[..., : Dh // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    h = w["model.embed_tokens.weight"][prompt]
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        proj = lambda n, x=x, p=p: x @ w[p + f"self_attn.{n}_proj.weight"].T + w.get(p + f"self_attn.{n}_proj.bias", 0)
        q, k, v = rope(proj("q").reshape(T, H, Dh)), rope(proj("k").reshape(T, Hkv, Dh)), proj("v").reshape(T, Hkv, Dh)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(Dh) + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        h = h + np.einsum("hts,shd->thd", a, v).reshape(T, H * Dh) @ w[p + "self_attn.o_proj.weight"].T
        x = norm(h, w[p + "post_attention_layernorm.weight"])
        g = x @ w[p + "mlp.gate_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if spec.tied else w["lm_head.weight"]
    return norm(h, w["model.norm.weight"]) @ head.T


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_safetensors_and_gguf_give_the_same_logits_as_a_dense_reference(tmp_path, arch):
    hf_dir, gguf_path = write_tiny_pair(tmp_path, arch)
    prompt = [5, 17, 42, 8, 99, 23, 61, 7, 150, 3, 77]
    from_hf = paged_logits(hf_dir, prompt, [len(prompt)])
    from_gguf = paged_logits(gguf_path, prompt, [4, 1, 6])  # chunked prefill + a decode step
    np.testing.assert_allclose(from_hf, from_gguf, atol=1e-5, rtol=0)
    np.testing.assert_allclose(from_hf, dense_reference(arch, prompt), atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_numba_backend_on_float_weights_matches_numpy(tmp_path, arch, dtype):
    """F32/F16/BF16 matrices stay as they are on the numba backend; chunked prefill + decode."""
    hf_dir, gguf_path = write_tiny_pair(tmp_path, arch, dtype=dtype)
    prompt = [5, 17, 42, 8, 99, 23, 61, 7, 150, 3, 77]
    want = paged_logits(hf_dir, prompt, [len(prompt)])
    np.testing.assert_allclose(paged_logits(gguf_path, prompt, [4, 1, 6], "numba"), want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(paged_logits(hf_dir, prompt, [9, 1, 1], "numba"), want, atol=1e-4, rtol=0)


def test_q8_0_at_load_is_close_and_backends_agree(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path, "llama", dtype="BF16")
    prompt = [5, 17, 42, 8, 99, 23, 61, 7]
    exact = paged_logits(hf_dir, prompt, [len(prompt)])
    q8 = paged_logits(hf_dir, prompt, [len(prompt)], "numba", quantize="q8_0")
    np.testing.assert_allclose(
        q8, paged_logits(hf_dir, prompt, [len(prompt)], "numpy", quantize="q8_0"), atol=1e-4, rtol=0
    )
    assert 0 < np.abs(q8 - exact).max() < 0.02 * np.abs(exact).max()
    with pytest.raises(ModelLoadError, match="q4_2"):
        load_model(hf_dir, quantize="q4_2")

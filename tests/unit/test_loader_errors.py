"""Every bad input to load_model raises ModelLoadError with a message naming the problem."""

from __future__ import annotations

import json
import os
import struct

import gguf
import numpy as np
import pytest
from _gguf_helpers import (
    hf_weights,
    patch_tensor_type,
    spec_for,
    tiny_vocab,
    write_gguf,
    write_safetensors,
    write_tiny_pair,
)

from engine.loader import ModelLoadError, load_model


@pytest.fixture
def tiny_gguf(tmp_path):
    spec = spec_for("llama")
    return write_gguf(tmp_path / "tiny.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])))


def _fails(model, *patterns: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(model)
    msg = str(info.value)
    for p in patterns:
        assert p in msg, msg
    return msg


def test_missing_path(tmp_path):
    _fails(tmp_path / "nope.gguf", "does not exist", "nope.gguf")
    _fails("", "no model given")


def test_random_bytes_file(tmp_path):
    p = tmp_path / "random.gguf"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _fails(p, "is not a GGUF file", "random.gguf")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    _fails(empty, "is not a GGUF file")


def test_lone_safetensors_file(tmp_path):
    p = tmp_path / "model.safetensors"
    write_safetensors(p, {"x": np.zeros(2, np.float32)}, "F32")
    _fails(p, "pass its directory")


@pytest.mark.parametrize("keep", [0.9, 0.5, 0.02, 12])
def test_truncated_gguf(tiny_gguf, keep):
    data = tiny_gguf.read_bytes()
    cut = tiny_gguf.with_name("cut.gguf")
    cut.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    msg = _fails(cut, "truncated", "cut.gguf")
    assert ("tensor '" in msg) or ("header" in msg)


def test_bad_gguf_version(tiny_gguf):
    data = bytearray(tiny_gguf.read_bytes())
    struct.pack_into("<I", data, 4, 1)
    tiny_gguf.write_bytes(bytes(data))
    _fails(tiny_gguf, "unsupported GGUF version 1")
    struct.pack_into("<I", data, 4, 0x03000000)
    tiny_gguf.write_bytes(bytes(data))
    _fails(tiny_gguf, "big-endian")


def test_unsupported_architecture(tmp_path):
    spec = spec_for("llama")
    p = write_gguf(tmp_path / "falcon.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])), arch_name="falcon")
    _fails(p, "unsupported architecture 'falcon'")
    hf_dir, _ = write_tiny_pair(tmp_path, "llama")
    cfg = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps(cfg | {"model_type": "gpt_neox"}))
    _fails(hf_dir, "unsupported architecture 'gpt_neox'")


def test_unsupported_tensor_type_named(tmp_path):
    spec = spec_for("llama")
    w = hf_weights(spec, len(tiny_vocab()[0]))
    iq = np.zeros((96, 66), dtype=np.uint8)  # one IQ2_XXS block per row
    p = write_gguf(tmp_path / "iq.gguf", spec, w, raw={"blk.0.ffn_up.weight": (iq, gguf.GGMLQuantizationType.IQ2_XXS)})
    _fails(p, "'blk.0.ffn_up.weight'", "unsupported type IQ2_XXS", "Q4_K")


def test_made_up_tensor_type_id(tiny_gguf):
    patch_tensor_type(tiny_gguf, "blk.1.attn_v.weight", 99)
    _fails(tiny_gguf, "'blk.1.attn_v.weight'", "unknown type id 99")


def test_missing_tensor_named(tmp_path):
    spec = spec_for("llama")
    p = write_gguf(tmp_path / "m.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])), skip=("blk.1.ffn_up.weight",))
    _fails(p, "missing tensor 'blk.1.ffn_up.weight'")
    hf_dir, _ = write_tiny_pair(tmp_path, "qwen2")
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.0.self_attn.k_proj.bias"]
    shard = hf_dir / "model-00001-of-00002.safetensors"
    w = hf_weights(spec_for("qwen2"), len(tiny_vocab()[0]))
    keep = {k: w[k] for k, f in index["weight_map"].items() if f == shard.name}
    write_safetensors(shard, keep, "F32")
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    _fails(hf_dir, "missing tensor 'model.layers.0.self_attn.k_proj.bias'")


def test_wrong_tensor_shape(tmp_path):
    spec = spec_for("llama")
    w = hf_weights(spec, len(tiny_vocab()[0]))
    w["model.layers.0.mlp.up_proj.weight"] = w["model.layers.0.mlp.up_proj.weight"][:, :32].copy()
    _fails(write_gguf(tmp_path / "s.gguf", spec, w), "'blk.0.ffn_up.weight' has shape (96, 32), expected (96, 64)")


def test_gguf_without_tokenizer(tmp_path):
    spec = spec_for("llama")

    def drop(writer):
        for k in [k for k in writer.kv_data[0] if k.startswith("tokenizer.ggml")]:
            writer.kv_data[0].pop(k)

    _fails(write_gguf(tmp_path / "t.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])), hook=drop), "no tokenizer")


def test_gguf_missing_hparam(tmp_path):
    spec = spec_for("llama")

    def drop(writer):
        writer.kv_data[0].pop("llama.block_count")

    _fails(
        write_gguf(tmp_path / "h.gguf", spec, hf_weights(spec, len(tiny_vocab()[0])), hook=drop), "'llama.block_count'"
    )


def test_directory_problems(tmp_path):
    _fails(tmp_path, "neither config.json", "nor a .gguf")
    spec = spec_for("llama")
    w = hf_weights(spec, len(tiny_vocab()[0]))
    write_gguf(tmp_path / "a.gguf", spec, w)
    write_gguf(tmp_path / "b.gguf", spec, w)
    _fails(tmp_path, "several .gguf files", "a.gguf, b.gguf")


def test_hf_dir_problems(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path, "llama")
    shard = hf_dir / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    _fails(hf_dir, "truncated", shard.name)
    shard.write_bytes(b"\x00" * 7)
    _fails(hf_dir, "is not a safetensors file", shard.name)
    os.remove(shard)
    _fails(hf_dir, "missing shard model-00002-of-00002.safetensors")


def test_hf_unsupported_dtype_and_bin_only(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path, "llama")
    shard = hf_dir / "model-00001-of-00002.safetensors"
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    info = header[name]
    header[name] = info | {"dtype": "I32"}  # same byte count, integer dtype
    head = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n :])
    _fails(hf_dir, f"'{name}' has unsupported dtype I32")
    for f in hf_dir.glob("*.safetensors*"):
        f.unlink()
    (hf_dir / "pytorch_model.bin").write_bytes(b"x")
    _fails(hf_dir, "no *.safetensors", ".bin checkpoints are not supported")


def test_hf_bad_config(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path, "llama")
    (hf_dir / "config.json").write_text("{not json")
    _fails(hf_dir, "config.json", "cannot parse JSON")
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    _fails(hf_dir, "config.json has no 'num_attention_heads'")
    (hf_dir / "tokenizer.json").unlink()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _fails(hf_dir, "no tokenizer.json")


def test_tensor_not_a_whole_number_of_blocks(tiny_gguf):
    patch_tensor_type(tiny_gguf, "blk.0.attn_norm.weight", 12)  # 64 values can't be Q4_K (256 per block)
    _fails(tiny_gguf, "'blk.0.attn_norm.weight'", "not a whole number of Q4_K blocks")

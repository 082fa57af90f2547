"""`forge synth`: random-weight GGUF files that gguf-py, Forge's loader and the engine all accept,
with the block statistics intended, the same bytes for the same seed, and clear CLI errors."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.cli import main as cli_main
from engine.loader import load_model
from engine.loader.gguf_file import read_gguf
from engine.loader.synth import (
    QUANTS,
    SYNTH_VOCAB,
    SynthError,
    block_scale,
    plan_tensors,
    preset,
    random_blocks,
    shape_from_config_file,
    shape_from_hf,
    write_synthetic,
)

Q = gguf.GGMLQuantizationType
# hidden 256 and FFN 512: whole K-quant super-blocks; untied so output.weight is written too
TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def _tiny_config(tmp_path: Path, **over) -> Path:
    p = tmp_path / "tiny" / "config.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps(TINY | over))
    return p


@pytest.mark.parametrize("quant", list(QUANTS))
def test_every_quant_loads_with_forge_and_dequantizes_like_gguf_py(tmp_path, quant):
    shape = shape_from_config_file(_tiny_config(tmp_path))
    out = tmp_path / f"tiny-{quant}.gguf"
    result = write_synthetic(shape, quant, out, seed=1)
    assert result.path == out and result.file_bytes == out.stat().st_size
    assert not out.with_name(out.name + ".part").exists()

    g = read_gguf(out)
    assert len(g.tensors) == 1 + 2 * 9 + 2  # embed, 9 per layer, final norm, untied head
    for name in ("token_embd.weight", "blk.0.ffn_down.weight", "output.weight"):
        assert g.tensors[name].type_id == QUANTS[quant]
    assert g.tensors["blk.1.attn_norm.weight"].type_id == Q.F32
    assert g.tensors["token_embd.weight"].shape == (SYNTH_VOCAB, 256)
    assert g.metadata["general.file_type"] > 0 and g.metadata["tokenizer.ggml.pre"] == "smollm"

    loaded = load_model(out)
    c = loaded.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.intermediate_size, c.vocab_size) == (
        2,
        256,
        4,
        2,
        512,
        SYNTH_VOCAB,
    )
    assert not c.tie_word_embeddings and c.rope_theta == 10000.0
    assert loaded.chat_template and "<|im_start|>" in loaded.chat_template
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("Hello world")) == "Hello world"
    # what Forge loaded is what gguf-py's dequantizer reads from the same bytes
    want = gguf.quants.dequantize(g.raw("blk.0.ffn_up.weight"), QUANTS[quant]).reshape(512, 256)
    assert np.array_equal(loaded.weights["layers.0.up"].dequantize(), want)
    assert want.std() == pytest.approx(1 / 16, rel=0.05)  # 1 / sqrt(fan_in)
    norm = loaded.weights["layers.0.attn_norm"]
    assert abs(norm.mean() - 1) < 0.02 and 0 < norm.std() < 0.1


def test_gguf_py_reader_parses_the_file(tmp_path):
    out = tmp_path / "tiny-q4_k.gguf"
    write_synthetic(shape_from_config_file(_tiny_config(tmp_path)), "q4_k", out, seed=1)
    reader = gguf.GGUFReader(out)  # seconds: it builds an array per vocabulary string
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors["token_embd.weight"].shape) == [256, SYNTH_VOCAB]  # GGUF order: ne0 = columns
    assert tensors["blk.0.attn_k.weight"].tensor_type == Q.Q4_K
    assert reader.fields["llama.block_count"].contents() == 2
    assert reader.fields["general.architecture"].contents() == "llama"
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == SYNTH_VOCAB
    w = gguf.quants.dequantize(tensors["blk.0.attn_k.weight"].data, Q.Q4_K)
    assert w.shape == (128, 256) and np.isfinite(w).all()


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_random_blocks_have_the_intended_statistics(qtype):
    std = 0.02
    bs, _ = gguf.GGML_QUANT_SIZES[qtype]
    blocks = random_blocks(qtype, (1 << 17) // bs, std, np.random.default_rng(0))
    w = gguf.quants.dequantize(blocks, qtype).reshape(-1)
    assert w.size == 1 << 17 and np.isfinite(w).all()
    assert abs(w.mean()) < 0.02 * std  # zero mean: ~7 standard errors
    assert w.std() == pytest.approx(std, rel=0.03)
    d = block_scale(qtype, std)
    if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):  # d (q - offset): values are whole multiples of d, d of either sign
        levels = w / d
        assert np.allclose(levels, np.round(levels), atol=1e-3)
        offset = {Q.Q4_0: 8, Q.Q5_0: 16, Q.Q8_0: 128}[qtype]
        assert np.abs(levels).max() <= offset  # q - offset in [-offset, offset - 1], times a signed d
        scales = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
        assert set(np.abs(scales)) == {d} and 0.45 < (scales > 0).mean() < 0.55


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        {"type": "linear", "factor": 2.0},
    ],
)
def test_rope_scaling_reaches_forge_as_written(tmp_path, rope_scaling):
    cfg = _tiny_config(tmp_path, rope_scaling=rope_scaling, head_dim=64, rope_theta=500000.0)
    out = tmp_path / "rope.gguf"
    write_synthetic(shape_from_config_file(cfg), "q4_0", out)
    got = load_model(out).config.rope_scaling
    assert got["rope_type"] == rope_scaling.get("rope_type", rope_scaling.get("type"))
    assert got["factor"] == pytest.approx(rope_scaling["factor"])
    if got["rope_type"] == "llama3":
        assert (got["low_freq_factor"], got["high_freq_factor"]) == pytest.approx((1.0, 4.0))


def test_k_quants_fall_back_like_llama_quantize_where_rows_are_not_whole_super_blocks():
    plan = {t.name: t.qtype for t in plan_tensors(preset("smollm2-135m"), "q4_k")}
    assert plan["blk.0.attn_q.weight"] == Q.Q5_0  # 576 columns
    assert plan["blk.0.ffn_down.weight"] == Q.Q4_K  # 1536 columns
    plan = {t.name: t.qtype for t in plan_tensors(preset("smollm2-135m"), "q6_k")}
    assert plan["token_embd.weight"] == Q.Q8_0 and plan["blk.3.ffn_down.weight"] == Q.Q6_K


def test_presets_have_the_published_shapes():
    p = preset("llama-3.1-8b")
    assert (p.layers, p.hidden, p.heads, p.kv_heads, p.ffn, p.head_dim, p.tied) == (32, 4096, 32, 8, 14336, 128, False)
    p = preset("llama-3.2-1b")
    assert (p.layers, p.hidden, p.heads, p.kv_heads, p.ffn, p.head_dim, p.tied) == (16, 2048, 32, 8, 8192, 64, True)
    assert p.rope_theta == 500000.0 and p.rope_scaling["rope_type"] == "llama3"
    names = [t.name for t in plan_tensors(p, "q4_0")]
    assert "rope_freqs.weight" in names and "output.weight" not in names
    n_bytes = sum(t.nbytes for t in plan_tensors(p, "q4_0"))
    assert 570 * 2**20 < n_bytes < 580 * 2**20  # ~1.07 B parameters at 4.5 bits
    p = preset("smollm2-135m")
    assert (p.layers, p.hidden, p.heads, p.kv_heads, p.ffn, p.tied, p.context) == (30, 576, 9, 3, 1536, True, 8192)


def test_the_same_seed_writes_the_same_bytes(tmp_path):
    shape = shape_from_config_file(_tiny_config(tmp_path))

    def digest(name: str, seed: int) -> str:
        out = tmp_path / name
        write_synthetic(shape, "q4_k", out, seed=seed)
        return hashlib.sha256(out.read_bytes()).hexdigest()

    assert digest("a.gguf", 7) == digest("b.gguf", 7)
    assert digest("c.gguf", 8) != digest("a.gguf", 7)


async def test_smollm2_shaped_q4_0_gives_finite_logits_and_varied_greedy_tokens(tmp_path):
    from engine import Engine, GenerationRequest, SamplingParams

    out = tmp_path / "smollm2-135m-q4_0.gguf"
    write_synthetic(preset("smollm2-135m"), "q4_0", out, seed=0)
    engine = Engine.load(model=str(out), backend="numba", kv_memory="64MiB", speculative="off", threads=1)
    try:
        for prompt in ("The quick brown fox", "def main():"):
            ids = engine.tokenizer.encode(prompt, add_special=False)
            params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, logprobs=5, speculative="off")
            tokens, logprobs = [], []
            async for ev in engine.generate(GenerationRequest(ids, params)):
                tokens += ev.token_ids
                logprobs += ev.logprobs or []
            assert len(tokens) == 32 and len(logprobs) == 32
            values = [lp.logprob for lp in logprobs] + [v for lp in logprobs for _, v in lp.top]
            assert all(math.isfinite(v) for v in values)
            assert len(set(tokens)) >= 8  # not one token forever
            assert max(len(list(run)) for _, run in itertools.groupby(tokens)) <= 8
            chosen = sorted(lp.logprob for lp in logprobs)
            assert -5 < chosen[16] < -0.1  # the median greedy token: likely, as in a trained model, yet not certain
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"hidden_size": 256, "num_attention_heads": 4}, "missing 'num_hidden_layers'"),
        (
            TINY | {"hidden_size": 240, "num_attention_heads": 5, "num_key_value_heads": 5},
            "hidden_size = 240 is not a multiple of 32",
        ),
        (TINY | {"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        (TINY | {"num_hidden_layers": "two"}, "'num_hidden_layers' must be a number"),
        (TINY | {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "unsupported rope_scaling type 'dynamic'"),
    ],
)
def test_bad_configs_name_the_problem(cfg, message):
    with pytest.raises(SynthError, match=message):
        shape_from_hf(cfg, "x")


def _cli(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        cli_main(["synth", *args])
    return exc.value.code, capsys.readouterr().err


def test_cli_writes_a_file_and_rejects_bad_input_with_exit_2(tmp_path, capsys):
    cfg = _tiny_config(tmp_path)
    out = tmp_path / "ok.gguf"
    cli_main(["synth", "--config", str(cfg), "--quant", "q8_0", "--out", str(out), "--seed", "3"])
    assert "wrote" in capsys.readouterr().out and out.stat().st_size > 0

    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{nope")
    cases = [
        (["--shape", "llama-9b", "--out", str(out)], "unknown shape 'llama-9b'"),
        (["--config", str(tmp_path / "missing.json"), "--out", str(out)], "cannot read config"),
        (["--config", str(bad_json), "--out", str(out)], "not valid JSON"),
        (["--config", str(cfg), "--quant", "q3_x", "--out", str(out)], "unknown quant 'q3_x'"),
        (["--config", str(cfg), "--out", str(tmp_path / "no" / "dir" / "x.gguf")], "does not exist"),
        (["--config", str(cfg), "--out", str(tmp_path)], "is a directory"),
        (["--config", str(cfg), "--out", str(out), "--seed", "-1"], "--seed must be a non-negative integer"),
    ]
    for args, message in cases:
        code, err = _cli(capsys, *args)
        assert code == 2, args
        assert message in err and "Traceback" not in err, err


def test_vocab_size_pads_the_tokenizer_with_unused_tokens_forge_loads(tmp_path, capsys):
    """Llama 3's vocabulary on the default tokenizer: the matrices get 128256 rows, the padding ids are ordinary
    tokens no text encodes to, and text still encodes as before."""
    cfg = _tiny_config(tmp_path, hidden_size=64, intermediate_size=128)
    out = tmp_path / "padded.gguf"
    cli_main(["synth", "--config", str(cfg), "--quant", "q4_0", "--out", str(out), "--vocab-size", "128256"])
    assert "wrote" in capsys.readouterr().out
    loaded = load_model(str(out))
    assert loaded.config.vocab_size == 128256 and loaded.tokenizer.vocab_size == 128256
    assert loaded.weights["embed"].shape == loaded.weights["lm_head"].shape == (128256, 64)
    text = "Padding never changes how text encodes."
    ids = loaded.tokenizer.encode(text)
    assert max(ids) < SYNTH_VOCAB and loaded.tokenizer.decode(ids) == text
    assert loaded.tokenizer.decode([128255]) == "[PAD128255]"
    code, err = _cli(capsys, "--config", str(cfg), "--out", str(out), "--vocab-size", "1000")
    assert code == 2 and "smaller than the tokenizer's 49152 tokens" in err

"""Builders for tiny test models: the same random Llama/Qwen2 weights and tokenizer written
both as a HF safetensors directory and as a GGUF file (the way llama.cpp's converter writes it).

Independent of engine/loader on purpose: the Q/K permutation, the BF16 rounding and the
safetensors writer are re-implemented here so that loader bugs cannot cancel out.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"  # noqa: E501
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello, world! How are you today? I'm fine, thanks.",
    "def main():\n    return 42  # the answer\n",
    "naïve café, 日本語, emoji 😀 and numbers 12345 67890.",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\nhello!<|im_end|>",
]


@dataclass(frozen=True)
class TinySpec:
    arch: str  # "llama" | "qwen2"
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 96
    layers: int = 2
    tied: bool = False
    bias: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = float(np.float32(1e-5))  # GGUF stores float32
    max_pos: int = 256

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def spec_for(arch: str) -> TinySpec:
    """llama: untied lm_head, no bias; qwen2: tied embeddings and q/k/v bias (like Qwen2-0.5B)."""
    return TinySpec(arch=arch, tied=arch == "qwen2", bias=arch == "qwen2")


@lru_cache(maxsize=1)
def tiny_tokenizer_json() -> str:
    """A byte-level BPE (GPT-2 style, ~300 tokens) trained on a small corpus; specials are ids 0-2."""
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(_CORPUS, trainer=trainer)
    return tk.to_str()


def tiny_vocab() -> tuple[list[str], list[str]]:
    """(tokens by id, merges as "a b") of the tiny tokenizer, as GGUF stores them."""
    spec = json.loads(tiny_tokenizer_json())
    vocab = spec["model"]["vocab"]
    tokens = [""] * len(vocab)
    for tok, i in vocab.items():
        tokens[i] = tok
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, merges


def round_to(w: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values to what `dtype` can hold (BF16 by truncation-with-rounding, as torch)."""
    if dtype == "F32":
        return w.astype(np.float32)
    if dtype == "F16":
        return w.astype(np.float16).astype(np.float32)
    bits = w.astype(np.float32).view(np.uint32)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return bits.view(np.float32)


def hf_weights(spec: TinySpec, vocab: int, seed: int = 0, dtype: str = "F32") -> dict[str, np.ndarray]:
    """Random weights under HF names (already rounded to `dtype`)."""
    rng = np.random.default_rng(seed)
    d, q, kv, f = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.ffn

    def r(*shape: int) -> np.ndarray:
        return round_to(rng.standard_normal(shape).astype(np.float32) * 0.1, dtype)

    w = {"model.embed_tokens.weight": r(vocab, d), "model.norm.weight": round_to(1 + r(d), dtype)}
    if not spec.tied:
        w["lm_head.weight"] = r(vocab, d)
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": round_to(1 + r(d), dtype),
            p + "post_attention_layernorm.weight": round_to(1 + r(d), dtype),
            p + "self_attn.q_proj.weight": r(q, d),
            p + "self_attn.k_proj.weight": r(kv, d),
            p + "self_attn.v_proj.weight": r(kv, d),
            p + "self_attn.o_proj.weight": r(d, q),
            p + "mlp.gate_proj.weight": r(f, d),
            p + "mlp.up_proj.weight": r(f, d),
            p + "mlp.down_proj.weight": r(d, f),
        }
        if spec.bias:
            w |= {
                p + "self_attn.q_proj.bias": r(q),
                p + "self_attn.k_proj.bias": r(kv),
                p + "self_attn.v_proj.bias": r(kv),
            }
    return w


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """Minimal safetensors writer (F32 / F16 / BF16)."""
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        if dtype == "F32":
            raw = arr.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = arr.astype("<f2").tobytes()
        else:
            raw = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(chunks))


def write_hf_dir(
    out: Path, spec: TinySpec, weights: dict[str, np.ndarray], dtype: str = "F32", shards: int = 2
) -> Path:
    """config.json, generation_config.json, tokenizer files and `shards` safetensors files (+ index)."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = weights["model.embed_tokens.weight"].shape[0]
    config = {
        "architectures": ["LlamaForCausalLM" if spec.arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": spec.arch,
        "vocab_size": vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "max_position_embeddings": spec.max_pos,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tied,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
    }
    if spec.arch == "llama":
        config["attention_bias"] = spec.bias
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    (out / "tokenizer.json").write_text(tiny_tokenizer_json())
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML, "add_bos_token": False}
        )
    )
    names = list(weights)
    parts = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for k, part in enumerate(parts):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        write_safetensors(out / fname, {n: weights[n] for n in part}, dtype)
        weight_map |= dict.fromkeys(part, fname)
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (rows regrouped for interleaved RoPE)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensors(spec: TinySpec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF-named weights -> GGUF-named, with llama.cpp's Q/K permutation for the llama arch."""
    out = {}
    for name, w in weights.items():
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            out["output.weight"] = w
        else:
            _, _, i, rest = name.split(".", 3)
            if spec.arch == "llama" and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                w = llamacpp_permute(w, spec.heads if "q_proj" in rest else spec.kv_heads)
            out[f"blk.{i}.{_GGUF_NAMES[rest]}"] = w
    return out


def write_gguf(
    path: Path,
    spec: TinySpec,
    weights: dict[str, np.ndarray],
    dtype: str = "F32",
    arch_name: str | None = None,
    skip: tuple[str, ...] = (),
    raw: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
    pre: str = "default",
    hook: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Write `weights` (HF names) as a GGUF like llama.cpp's converter: 2-D weights in `dtype`, 1-D in F32.

    `skip` leaves GGUF tensors out; `raw` replaces a tensor by raw bytes of a given GGML type;
    `hook(writer)` may add metadata or tensors before the file is written.
    """
    tokens, merges = tiny_vocab()
    w = gguf.GGUFWriter(str(path), arch_name or spec.arch)
    a = arch_name or spec.arch
    w.add_uint32(f"{a}.block_count", spec.layers)
    w.add_uint32(f"{a}.context_length", spec.max_pos)
    w.add_uint32(f"{a}.embedding_length", spec.hidden)
    w.add_uint32(f"{a}.feed_forward_length", spec.ffn)
    w.add_uint32(f"{a}.attention.head_count", spec.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.kv_heads)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for name, arr in gguf_tensors(spec, weights).items():
        if name in skip:
            continue
        if raw and name in raw:
            data, qtype = raw[name]
            w.add_tensor(name, data, raw_dtype=qtype)
        elif arr.ndim == 1 or dtype == "F32":
            w.add_tensor(name, arr.astype(np.float32))
        elif dtype == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        else:
            bits = (arr.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(name, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    if hook:
        hook(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_pair(tmp_path: Path, arch: str = "llama", dtype: str = "F32", seed: int = 0) -> tuple[Path, Path]:
    """The same tiny random model as a HF directory and as a GGUF file: (hf_dir, gguf_path).

    llama: untied lm_head, Q/K permuted in the GGUF; qwen2: tied embeddings, q/k/v bias, no permutation.
    Both carry the same byte-level BPE tokenizer and a ChatML template.
    """
    spec = spec_for(arch)
    tokens, _ = tiny_vocab()
    weights = hf_weights(spec, len(tokens), seed=seed, dtype=dtype)
    hf_dir = write_hf_dir(tmp_path / f"hf-{arch}-{dtype}", spec, weights, dtype=dtype)
    gguf_path = write_gguf(tmp_path / f"tiny-{arch}-{dtype}.gguf", spec, weights, dtype=dtype)
    return hf_dir, gguf_path


def patch_tensor_type(path: Path, tensor: str, type_id: int) -> None:
    """Overwrite the GGML type id of `tensor` in a GGUF file's tensor table (for bad-input tests)."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(tensor)) + tensor.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))


@lru_cache(maxsize=1)
def default_loaded():
    """The default model loaded once per test process (shared by the loader/tokenizer tests)."""
    from engine.loader import load_model

    return load_model("default")

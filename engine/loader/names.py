"""Canonical weight names and how GGUF and HF name them."""

from __future__ import annotations

import numpy as np

from engine.config import ModelConfig

# canonical per-layer suffix -> (GGUF name, HF name); {i} is the layer index
LAYER_TENSORS: dict[str, tuple[str, str]] = {
    "attn_norm": ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    "q": ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    "k": ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    "v": ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    "o": ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    "gate": ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    "up": ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    "down": ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
}
BIAS_TENSORS: dict[str, tuple[str, str]] = {
    "q_bias": ("blk.{i}.attn_q.bias", "model.layers.{i}.self_attn.q_proj.bias"),
    "k_bias": ("blk.{i}.attn_k.bias", "model.layers.{i}.self_attn.k_proj.bias"),
    "v_bias": ("blk.{i}.attn_v.bias", "model.layers.{i}.self_attn.v_proj.bias"),
}
GLOBAL_TENSORS: dict[str, tuple[str, str]] = {
    "embed": ("token_embd.weight", "model.embed_tokens.weight"),
    "final_norm": ("output_norm.weight", "model.norm.weight"),
    "lm_head": ("output.weight", "lm_head.weight"),
}


def tensor_plan(num_layers: int, attention_bias: bool, tied: bool, source: int) -> dict[str, str]:
    """canonical name -> file name (source 0: GGUF, 1: HF) for every tensor the model needs."""
    plan = {k: v[source] for k, v in GLOBAL_TENSORS.items() if not (k == "lm_head" and tied)}
    per_layer = LAYER_TENSORS | (BIAS_TENSORS if attention_bias else {})
    for i in range(num_layers):
        for k, v in per_layer.items():
            plan[f"layers.{i}.{k}"] = v[source].format(i=i)
    return plan


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp converter's row permutation of Q/K (HF rotate-half -> GGUF interleaved RoPE)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `permute_qk`: GGUF llama Q/K rows back to the HF layout."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """canonical name suffix (after "layers.N.") -> shape, HF orientation [out, in]."""
    d, q, kv, f = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    return {
        "embed": (c.vocab_size, d),
        "lm_head": (c.vocab_size, d),
        "final_norm": (d,),
        "attn_norm": (d,),
        "ffn_norm": (d,),
        "q": (q, d),
        "k": (kv, d),
        "v": (kv, d),
        "o": (d, q),
        "gate": (f, d),
        "up": (f, d),
        "down": (d, f),
        "q_bias": (q,),
        "k_bias": (kv,),
        "v_bias": (kv,),
    }

"""Tiny random Llama models over `Weight`s of every kind, built in memory (no file, no loader)."""

from __future__ import annotations

import numpy as np

from engine.config import ModelConfig
from kernels.weight import Weight


def random_weight(kind: str, rows: int, cols: int, rng: np.random.Generator) -> Weight:
    """A [rows, cols] weight of `kind` with values of magnitude ~0.05 (q4: groups of 32 with mins; q8: groups of
    16 without)."""
    if kind == "q4":
        data = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        scale = (rng.random((rows, cols // 32)) * 0.01 + 0.001).astype(np.float32)
        return Weight("q4", data, scale, (-7.5 * scale).astype(np.float32), 32)
    if kind == "q8":
        data = rng.integers(-127, 128, (rows, cols), dtype=np.int8)
        return Weight("q8", data, (rng.random((rows, cols // 16)) * 5e-4 + 1e-4).astype(np.float32), None, 16)
    values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if kind == "f16":
        return Weight("f16", values.astype(np.float16))
    if kind == "bf16":
        return Weight("bf16", (values.view(np.uint32) >> 16).astype(np.uint16))
    return Weight("f32", values)


def tiny_config(vocab: int = 100, tied: bool = True) -> ModelConfig:
    """2 layers, hidden 64, 4 heads of 16 over 2 kv heads, FFN 96: K a multiple of 32, N often not of 4."""
    return ModelConfig(
        arch="llama",
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position=512,
        tie_word_embeddings=tied,
        attention_bias=False,
        bos_token_id=1,
        eos_token_ids=[2],
    )


def tiny_weights(config: ModelConfig, kinds: list[str], rng: np.random.Generator) -> dict[str, Weight | np.ndarray]:
    """Canonical names -> weights, the matrices' kinds taken from `kinds` in turn."""
    c, d = config, config.hidden_size
    shapes = {
        "q": c.num_heads * c.head_dim,
        "k": c.num_kv_heads * c.head_dim,
        "v": c.num_kv_heads * c.head_dim,
        "o": d,
        "gate": c.intermediate_size,
        "up": c.intermediate_size,
        "down": d,
    }
    turn = iter(kinds * 100)
    weights: dict[str, Weight | np.ndarray] = {"embed": random_weight(next(turn), c.vocab_size, d, rng)}
    for i in range(c.num_layers):
        for name, rows in shapes.items():
            cols = c.intermediate_size if name == "down" else c.num_heads * c.head_dim if name == "o" else d
            weights[f"layers.{i}.{name}"] = random_weight(next(turn), rows, cols, rng)
        weights[f"layers.{i}.attn_norm"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        weights[f"layers.{i}.ffn_norm"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    weights["final_norm"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    if not c.tie_word_embeddings:
        weights["lm_head"] = random_weight(next(turn), c.vocab_size, d, rng)
    return weights

"""Model hyper-parameters, in Hugging Face terms, whatever file they came from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ModelConfig:
    """One Llama-family model's shape. `arch` is "llama" (also SmolLM, TinyLlama), "mistral" or "qwen2"."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict | None  # HF style, e.g. {"rope_type": "llama3", "factor": 8.0, ...}; None: plain RoPE
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    bos_token_id: int | None
    eos_token_ids: list[int] = field(default_factory=list)

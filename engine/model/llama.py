"""Llama-family forward pass over a flattened varlen batch (Llama 2/3, TinyLlama, SmolLM,
Mistral, Qwen2), reading and writing K/V through the paged cache.

One call runs every scheduled sequence at once: prefill chunks and single decode tokens
are concatenated into T rows; attention finds each sequence's context through its block
table. Logits are computed only for the rows that will be sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.memory import return_freed_memory
from engine.model.rope import rope_inv_freq
from kernels import Backend
from kernels.attention_meta import AttentionMetadata
from kernels.weight import Weight, concat_rows


@dataclass(slots=True)
class LayerWeights:
    """One layer, each matrix prepared by the backend (`backend.prepare_linear`)."""

    attn_norm: Any
    qkv: Any  # q, k and v projections stacked along the output: one product
    qkv_bias: Any | None
    o: Any
    ffn_norm: Any
    gate_up: Any  # gate and up stacked: one product
    down: Any


class LlamaModel:
    """Weights on a backend plus the forward pass. Stateless apart from the KV arrays passed in."""

    def __init__(
        self, config: ModelConfig, weights: dict[str, Weight | np.ndarray], backend: Backend, *, take: bool = False
    ) -> None:
        """`weights`: canonical names (engine/loader/names.py) -> a `Weight` for every matrix, float32
        vectors otherwise. `take=True` pops each one from the dict once prepared and gives the memory
        it held back to the OS after each layer, so that the loader's arrays and the backend's
        copies are never all resident together (lower peak memory)."""
        self.config, self.backend = config, backend
        be = backend
        self.num_params = sum(
            int(w.shape[0] * w.shape[1] if isinstance(w, Weight) else w.size) for w in weights.values()
        )
        self.weight_bytes = sum(
            w.nbytes for w in weights.values()
        )  # as loaded: what a decode step reads on numba and CuPy
        get = weights.pop if take else weights.__getitem__
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            w = lambda name, i=i: get(f"layers.{i}.{name}")
            bias = None
            if config.attention_bias:
                bias = be.asarray(np.concatenate([w("q_bias"), w("k_bias"), w("v_bias")]))
            self.layers.append(
                LayerWeights(
                    attn_norm=be.asarray(w("attn_norm")),
                    qkv=be.prepare_linear(concat_rows([_matrix(w(n)) for n in ("q", "k", "v")])),
                    qkv_bias=bias,
                    o=be.prepare_linear(_matrix(w("o"))),
                    ffn_norm=be.asarray(w("ffn_norm")),
                    gate_up=be.prepare_linear(concat_rows([_matrix(w(n)) for n in ("gate", "up")])),
                    down=be.prepare_linear(_matrix(w("down"))),
                )
            )
            if take:
                return_freed_memory()
        embed = _matrix(get("embed"))
        self.embed = be.prepare_embedding(embed)
        self.lm_head = be.prepare_linear(embed if config.tie_word_embeddings else _matrix(get("lm_head")))
        del embed
        self.final_norm = be.asarray(get("final_norm"))
        self.inv_freq = be.asarray(rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling))
        self.scale = 1.0 / float(np.sqrt(config.head_dim))
        if take:
            return_freed_memory()

    def forward(
        self,
        token_ids: np.ndarray,
        positions: np.ndarray,
        meta: AttentionMetadata,
        kv_caches: list[tuple[Any, Any]],
        logits_rows: np.ndarray,
    ) -> np.ndarray:
        """Run T tokens; return float32 host logits [len(logits_rows), vocab]."""
        self.backend.begin_step()
        return self.backend.to_numpy(self.forward_device(token_ids, positions, meta, kv_caches, logits_rows))

    def forward_device(
        self,
        token_ids: Any,
        positions: Any,
        meta: AttentionMetadata,
        kv_caches: list[tuple[Any, Any]],
        logits_rows: Any,
    ) -> Any:
        """`forward` leaving the logits on the backend, on whatever thread setup or stream is current (no
        `begin_step`). Given backend arrays (meta's plan made), it copies nothing between host and device:
        what a CUDA graph captures (engine/decode_graphs.py)."""
        h, residual = self._layers(token_ids, positions, meta, kv_caches)
        return self._logits(h, residual, logits_rows)

    def forward_hidden(
        self,
        token_ids: np.ndarray,
        positions: np.ndarray,
        meta: AttentionMetadata,
        kv_caches: list[tuple[Any, Any]],
        logits_rows: np.ndarray,
        hidden_rows: np.ndarray,
    ) -> tuple[Any, np.ndarray]:
        """`forward_device` that also returns the final norm's output at `hidden_rows`, float32 on the host
        [len(hidden_rows), hidden_size] (embeddings pool it); logits None when `logits_rows` is empty."""
        be = self.backend
        h, residual = self._layers(token_ids, positions, meta, kv_caches)
        rows = be.asarray(hidden_rows)
        x, _ = be.add_rms_norm(h[rows], residual[rows], self.final_norm, self.config.rms_eps)
        hidden = np.asarray(be.to_numpy(x), dtype=np.float32)
        return (self._logits(h, residual, logits_rows) if len(logits_rows) else None), hidden

    def _layers(
        self, token_ids: Any, positions: Any, meta: AttentionMetadata, kv_caches: list[tuple[Any, Any]]
    ) -> tuple[Any, Any]:
        """Every layer over the T rows: the last one's output and the residual stream, before the final norm."""
        cfg, be = self.config, self.backend
        T, H, Hkv, Dh = len(token_ids), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        cos, sin = be.rope_cos_sin(self.inv_freq, be.asarray(positions))

        h = be.embedding(self.embed, be.asarray(token_ids))
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if residual is None:
                residual = h
                x = be.rms_norm(h, layer.attn_norm, cfg.rms_eps)
            else:
                x, residual = be.add_rms_norm(h, residual, layer.attn_norm, cfg.rms_eps)
            qkv = be.linear(x, layer.qkv, layer.qkv_bias)
            q = be.rope_write_kv(qkv, cos, sin, H, Hkv, k_cache, v_cache, meta.slot_mapping)
            attn = be.paged_attention(q, k_cache, v_cache, meta, self.scale)
            h = be.linear(attn.reshape(T, H * Dh), layer.o)
            x, residual = be.add_rms_norm(h, residual, layer.ffn_norm, cfg.rms_eps)
            h = be.linear(be.silu_mul(be.linear(x, layer.gate_up)), layer.down)
        return h, residual

    def _logits(self, h: Any, residual: Any, logits_rows: Any) -> Any:
        be = self.backend
        rows = be.asarray(logits_rows)
        x, _ = be.add_rms_norm(h[rows], residual[rows], self.final_norm, self.config.rms_eps)
        return be.linear(x, self.lm_head)


def _matrix(w: Weight | np.ndarray) -> Weight:
    """A projection's weight: the loaders give every matrix as a Weight (vectors as arrays)."""
    assert isinstance(w, Weight), f"a projection matrix must be a Weight, got {type(w).__name__}"
    return w

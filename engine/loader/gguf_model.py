"""GGUF file -> LoadedModel (llama and qwen2 architectures)."""

from __future__ import annotations

import math
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.loader.errors import ModelLoadError
from engine.loader.gguf_file import GGUFFile, read_gguf
from engine.loader.loaded import LoadedModel
from engine.loader.names import expected_shapes, tensor_plan, unpermute_qk
from engine.loader.quant import SUPPORTED_TYPES, dequantize, gguf_weight, type_name
from engine.loader.recommended import from_gguf
from engine.loader.tokenizer_build import from_gguf_metadata
from engine.pooling import GGUF_POOLING
from engine.tokenizer import Tokenizer, TokenizerError
from kernels.weight import Weight

# architecture -> whether llama.cpp's converter permuted the Q/K rows (llama does; qwen2 uses NEOX rope and does not)
ARCHS = {"llama": True, "qwen2": False}


def load_gguf(path: Path) -> LoadedModel:
    """Load a GGUF model file; raises ModelLoadError naming the problem."""
    g = read_gguf(path)
    md = g.metadata
    arch = md.get("general.architecture")
    if arch not in ARCHS:
        raise ModelLoadError(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(ARCHS)})")
    try:
        tokenizer = from_gguf_metadata(md)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    config = _config(g, arch, tokenizer)
    plan = tensor_plan(config.num_layers, config.attention_bias, config.tie_word_embeddings, source=0)
    shapes = expected_shapes(config)
    for canon, name in plan.items():  # check everything before reading anything
        t = g.tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{path}: missing tensor {name!r}")
        if t.type_id not in SUPPORTED_TYPES:
            supported = ", ".join(sorted(type_name(i) for i in SUPPORTED_TYPES))
            raise ModelLoadError(f"{path}: tensor {name!r} has unsupported type {t.type_name} (supported: {supported})")
        want = shapes[canon.rsplit(".", 1)[-1]]
        if t.shape != want:
            raise ModelLoadError(f"{path}: tensor {name!r} has shape {t.shape}, expected {want}")
        if t.nbytes is None:
            raise ModelLoadError(
                f"{path}: tensor {name!r} of shape {t.shape} is not a whole number of {t.type_name} blocks"
            )

    def convert(item: tuple[str, str]) -> Weight | np.ndarray:
        canon, name = item
        t = g.tensors[name]
        kind = canon.rsplit(".", 1)[-1]
        if len(t.shape) == 1:
            w = dequantize(g.raw(name), t.type_id, t.shape)
            if ARCHS[arch] and kind in ("q_bias", "k_bias"):
                w = np.ascontiguousarray(unpermute_qk(w, config.num_heads if kind == "q_bias" else config.num_kv_heads))
            return w
        rows, cols = t.shape  # a matrix: its shape was checked against expected_shapes above
        m = gguf_weight(g.raw(name), t.type_id, (rows, cols))
        g.release(name)
        if ARCHS[arch] and kind in ("q", "k"):
            n_heads = config.num_heads if kind == "q" else config.num_kv_heads
            m = m.take_rows(unpermute_qk(np.arange(t.shape[0]), n_heads))
        return m

    # NumPy releases the GIL while splitting blocks: a few threads roughly halve the load time
    with ThreadPoolExecutor(max_workers=min(4, _cpus())) as pool:
        weights = dict(zip(plan, pool.map(convert, plan.items())))
    counts: Counter[str] = Counter()
    for name in plan.values():
        t = g.tensors[name]
        counts[t.type_name] += int(np.prod(t.shape))
    template = md.get("tokenizer.chat_template")
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        chat_template=template if isinstance(template, str) else None,
        path=str(path),
        name=path.stem,
        quant=counts.most_common(1)[0][0],
        sampling=from_gguf(md),
        pooling=GGUF_POOLING.get(int(md.get(f"{arch}.pooling_type", 0))),
    )


def _config(g: GGUFFile, arch: str, tokenizer: Tokenizer) -> ModelConfig:
    md, path = g.metadata, g.path

    def key(name: str, default: Any = ...) -> Any:
        full = f"{arch}.{name}"
        if full in md:
            return md[full]
        if default is ...:
            raise ModelLoadError(f"{path}: missing metadata key {full!r}")
        return default

    def one(name: str, value: Any) -> int:  # some files store a per-layer array
        arr = np.atleast_1d(np.asarray(value))
        if arr.size == 0 or not (arr == arr[0]).all():
            raise ModelLoadError(f"{path}: {arch}.{name} varies per layer ({arr.tolist()}), which is not supported")
        return int(arr[0])

    embed = g.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelLoadError(f"{path}: missing tensor 'token_embd.weight'")
    hidden = int(key("embedding_length"))
    heads = one("attention.head_count", key("attention.head_count"))
    kv_heads = one("attention.head_count_kv", key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden // heads if heads else 0))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or head_dim <= 0 or head_dim % 2:
        raise ModelLoadError(f"{path}: bad attention shape: {heads} heads, {kv_heads} KV heads, head_dim {head_dim}")
    theta = float(key("rope.freq_base", 10000.0))
    n_ctx = int(key("context_length", 2048))
    vocab = int(embed.shape[0])
    if tokenizer.vocab_size > vocab:
        raise ModelLoadError(
            f"{path}: tokenizer has {tokenizer.vocab_size} tokens but token_embd.weight only {vocab} rows"
        )
    eos_ids = []
    for k in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = md.get(f"tokenizer.ggml.{k}")
        if v is not None and 0 <= int(v) < vocab and int(v) not in eos_ids:
            eos_ids.append(int(v))
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=one("feed_forward_length", key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=theta,
        rope_scaling=_rope_scaling(g, arch, head_dim, theta),
        max_position=n_ctx,
        tie_word_embeddings="output.weight" not in g.tensors,
        attention_bias="blk.0.attn_q.bias" in g.tensors,
        bos_token_id=tokenizer.bos_id,
        eos_token_ids=eos_ids,
    )


def _rope_scaling(g: GGUFFile, arch: str, head_dim: int, theta: float) -> dict | None:
    md = g.metadata
    kind = md.get(f"{arch}.rope.scaling.type")
    factor = md.get(f"{arch}.rope.scaling.factor")
    orig = md.get(f"{arch}.rope.scaling.original_context_length")
    if "rope_freqs.weight" in g.tensors:  # Llama 3.x: per-frequency divisors instead of metadata
        t = g.tensors["rope_freqs.weight"]
        if t.type_id != 0 or t.shape != (head_dim // 2,):
            raise ModelLoadError(
                f"{g.path}: rope_freqs.weight must be F32 of shape ({head_dim // 2},), got {t.type_name} {t.shape}"
            )
        freqs = dequantize(g.raw("rope_freqs.weight"), 0, t.shape)
        return llama3_scaling_from_factors(freqs, head_dim, theta, int(orig) if orig else 8192, g.path)
    if kind is None and md.get(f"{arch}.rope.scale_linear") not in (None, 1.0):  # older files
        kind, factor = "linear", md[f"{arch}.rope.scale_linear"]
    if kind in (None, "none") or (factor in (None, 0.0, 1.0) and kind != "yarn"):
        return None
    if kind == "linear":
        assert factor is not None  # a missing factor returned None above
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float(factor or 1.0)}
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        for src, dst in (
            ("yarn_beta_fast", "beta_fast"),
            ("yarn_beta_slow", "beta_slow"),
            ("attn_factor", "attention_factor"),
        ):
            if f"{arch}.rope.scaling.{src}" in md:
                out[dst] = float(md[f"{arch}.rope.scaling.{src}"])
        return out
    raise ModelLoadError(f"{g.path}: unsupported rope scaling type {kind!r}")


def llama3_scaling_from_factors(
    factors: np.ndarray, head_dim: int, theta: float, orig_ctx: int, path: Any = ""
) -> dict | None:
    """Recover HF's llama3 rope_scaling dict from llama.cpp's rope_freqs tensor.

    llama.cpp stores f_i with inv_freq_i / f_i the scaled frequency: f = 1 for short
    wavelengths, `factor` for long ones and 1 / ((1 - s) / factor + s) in between with
    s = (orig_ctx / wavelen - low) / (high - low). The in-between points fix low/high.
    """
    f = np.asarray(factors, dtype=np.float64)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    factor = float(f.max())
    if np.allclose(f, 1.0):
        return None
    tol = 1e-4 * factor
    mid = (f > 1 + tol) & (f < factor - tol)
    if mid.sum() >= 2:
        s = (factor / f[mid] - 1) / (factor - 1)
        a, b = np.polyfit(orig_ctx / wavelen[mid], s, 1)  # s = a * ctx/wavelen + b
        low = -b / a
        high = low + 1 / a
    else:  # no in-between points: put each edge midway (geometrically) between neighbours
        ones, full = wavelen[f <= 1 + tol], wavelen[f >= factor - tol]
        edge_hi = math.sqrt(ones.max() * wavelen[~(f <= 1 + tol)].min()) if len(ones) else wavelen.min() / 2
        edge_lo = math.sqrt(full.min() * wavelen[~(f >= factor - tol)].max()) if len(full) else wavelen.max() * 2
        high, low = orig_ctx / edge_hi, orig_ctx / edge_lo
    out = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": float(round(low, 6)),
        "high_freq_factor": float(round(high, 6)),
        "original_max_position_embeddings": int(orig_ctx),
    }
    if not np.allclose(llama3_factors(out, head_dim, theta), f, rtol=1e-4):
        raise ModelLoadError(f"{path}: rope_freqs.weight does not follow the llama3 rope scaling formula")
    return out


def llama3_factors(scaling: dict, head_dim: int, theta: float) -> np.ndarray:
    """llama.cpp's converter: the rope_freqs divisors for a HF llama3 rope_scaling dict."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    ctx = scaling["original_max_position_embeddings"]
    smooth = (ctx / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < ctx / high, 1.0, np.where(wavelen > ctx / low, factor, mid))


def _cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1

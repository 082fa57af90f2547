"""Synthetic GGUF models for benchmarking: random weights of a chosen Llama shape, in a file that
Forge and llama.cpp both load, so both engines can be timed on the same bytes.

Weights are written as random quantized *blocks* (random integer quants plus chosen float16
scales, in the GGUF block layouts), tensor by tensor in chunks, so even an 8B file needs no
float32 copy of a matrix and is written at the speed of the random-number generator and the disk.
Scales give each matrix zero mean and a standard deviation of gain/sqrt(fan_in) (see the gains
below) and the RMSNorm weights are near 1, so activations stay in a trained model's range: logits
are finite and greedy output varies. The text means nothing; the speed is what a real model of that
shape would have.

The file carries the default model's tokenizer and chat template (copied from its GGUF), so the
vocabulary is 49152 tokens whatever the shape's own `vocab_size` says, unless `vocab_size` asks for more:
the tokenizer's ids are then padded with unused tokens (`[PAD<id>]`, type UNUSED, as llama.cpp's converter
pads a vocabulary) so that the embedding and output matrices have a real model's rows (Llama 3's 128256).
Text never encodes to the padding; sampling may pick it, which decodes to its name.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from engine.loader import resolve_model_path
from engine.loader.gguf_file import read_gguf
from engine.loader.gguf_model import llama3_factors

SYNTH_VOCAB = 49152  # the default model's tokenizer
_CHUNK_BYTES = 1 << 24  # bytes generated and written at a time: bounds memory whatever the tensor size
_NORM_JITTER = 0.05  # RMSNorm weights are their centre times 1 + N(0, this)
# Matrices get std gain/sqrt(fan_in). Q and K at twice that make attention peaked (score std ~4) as in
# trained models; at 1 attention averages the whole context, the last hidden state barely moves from
# token to token and greedy output repeats one token for long runs. A larger embedding makes a tied
# head favour the current token (more repeats), so it stays at 1.
EMBED_GAIN = 1.0
QK_GAIN = 2.0
# The final RMSNorm's weights: the logits' standard deviation. At 1 the next-token distribution is nearly
# flat (top probability ~1e-3), which makes nucleus sampling keep tens of thousands of tokens; at 4 the top
# tokens carry most of the mass, as in a trained model. Greedy ids do not depend on it.
LOGIT_GAIN = 4.0


class SynthError(ValueError):
    """A bad shape, config, quant type or output path; the message names the problem."""


@dataclass(frozen=True, slots=True)
class SynthShape:
    """A Llama-architecture model's shape (what a HF config.json's LlamaForCausalLM fields give)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    head_dim: int
    tied: bool
    rope_theta: float
    rms_eps: float
    context: int
    rope_scaling: dict | None = None


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Values from each model's HF config.json (vocab_size aside: the file carries the default model's tokenizer).
PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_scaling": _LLAMA3_ROPE | {"factor": 32.0},
    },
    "llama-3.2-3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_scaling": _LLAMA3_ROPE | {"factor": 32.0},
    },
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "rope_scaling": _LLAMA3_ROPE | {"factor": 8.0},
    },
}

Q = gguf.GGMLQuantizationType
QUANTS: dict[str, Q] = {"q4_0": Q.Q4_0, "q4_1": Q.Q4_1, "q8_0": Q.Q8_0, "q4_k": Q.Q4_K, "q6_k": Q.Q6_K, "f16": Q.F16}
# llama-quantize's fallback for rows that are not a whole number of 256-value super-blocks
_K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}
_FILE_TYPE = {
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
}


def preset(name: str) -> SynthShape:
    """A named preset's shape; raises SynthError for an unknown name."""
    if name not in PRESET_CONFIGS:
        raise SynthError(f"unknown shape {name!r} (presets: {', '.join(PRESET_CONFIGS)})")
    return shape_from_hf(PRESET_CONFIGS[name], name)


def shape_from_config_file(path: str | Path) -> SynthShape:
    """The shape in a HF config.json (LlamaForCausalLM fields); raises SynthError naming the problem."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SynthError(f"cannot read config {p}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SynthError(f"config {p} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise SynthError(f"config {p} is not a JSON object")
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return shape_from_hf(cfg, name or "custom", where=str(p))


def shape_from_hf(cfg: dict[str, Any], name: str, where: str = "config") -> SynthShape:
    """HF LlamaConfig fields -> SynthShape, with HF's defaults for the optional ones."""

    def num(key: str, kind: type, default: Any = ...) -> Any:
        v = cfg.get(key, default)
        if v is ... or v is None:
            if default is ...:
                raise SynthError(f"{where}: missing {key!r}")
            v = default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and int(v) != v):
            raise SynthError(f"{where}: {key!r} must be a number{' (integer)' if kind is int else ''}, got {v!r}")
        v = kind(v)
        if not v > 0:
            raise SynthError(f"{where}: {key!r} must be positive, got {v}")
        return v

    hidden = num("hidden_size", int)
    heads = num("num_attention_heads", int)
    kv_heads = num("num_key_value_heads", int, heads)
    if cfg.get("head_dim") is None and hidden % heads:
        raise SynthError(
            f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; give head_dim"
        )
    head_dim = num("head_dim", int, hidden // heads)
    if heads % kv_heads:
        raise SynthError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if head_dim % 2:
        raise SynthError(f"{where}: head_dim {head_dim} must be even (rotary embedding)")
    shape = SynthShape(
        name=name,
        layers=num("num_hidden_layers", int),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=num("intermediate_size", int),
        head_dim=head_dim,
        tied=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=num("rope_theta", float, 10000.0),
        rms_eps=num("rms_norm_eps", float, 1e-6),
        context=num("max_position_embeddings", int, 2048),
        rope_scaling=_rope_scaling(cfg.get("rope_scaling"), where),
    )
    for what, n in (
        ("hidden_size", shape.hidden),
        ("num_attention_heads * head_dim", shape.heads * shape.head_dim),
        ("intermediate_size", shape.ffn),
    ):
        if n % 32:
            raise SynthError(f"{where}: {what} = {n} is not a multiple of 32 (the quantization block)")
    return shape


def _rope_scaling(rs: Any, where: str) -> dict | None:
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise SynthError(f"{where}: rope_scaling must be an object or null, got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))
    try:
        if kind in (None, "default"):
            return None
        if kind == "llama3":
            return {
                "rope_type": "llama3",
                "factor": float(rs["factor"]),
                "low_freq_factor": float(rs["low_freq_factor"]),
                "high_freq_factor": float(rs["high_freq_factor"]),
                "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
            }
        if kind in ("linear", "yarn"):
            out = {"rope_type": kind, "factor": float(rs["factor"])}
            if rs.get("original_max_position_embeddings"):
                out["original_max_position_embeddings"] = int(rs["original_max_position_embeddings"])
            return out
    except (KeyError, TypeError, ValueError) as exc:
        raise SynthError(f"{where}: rope_scaling {rs!r} is incomplete or malformed ({exc})") from None
    raise SynthError(f"{where}: unsupported rope_scaling type {kind!r} (supported: llama3, linear, yarn)")


# ---- random blocks -------------------------------------------------------------------------------------
#
# Each writer fills blocks with random bytes (the quants), then overwrites the scale fields. Scales
# take one magnitude per tensor (or a small random spread for the K-quants' sub-block scales) with a
# random sign where the format has one, so that every block has zero mean, as trained weights do.


def _set_f16(blocks: np.ndarray, at: int, value: float, random_sign: bool) -> None:
    """Set the float16 at byte `at` of every block to `value`, negated where the block's random bits say."""
    bits = np.array([value], dtype=np.float16).view(np.uint16)[0]
    field = blocks[:, at : at + 2].copy().view(np.uint16)  # the random bytes there give the sign
    field = (field & np.uint16(0x8000)) | bits if random_sign else np.full_like(field, bits)
    blocks[:, at : at + 2] = field.view(np.uint8)


def _mean_sq_uniform(lo: int, hi: int) -> float:
    """E[k^2] for k uniform on the integers lo..hi."""
    k = np.arange(lo, hi + 1, dtype=np.float64)
    return float((k * k).mean())


# Q4_K sub-block scales are drawn from 32..63 and the mins set to cancel each sub-block's mean (dmin = 8 d)
_Q4K_SC = np.arange(32, 64)
_Q4K_M = (_Q4K_SC * 15 + 8) // 16
_Q4K_MEAN_SQ = float(np.mean(_Q4K_SC**2 * 77.5 - 16 * _Q4K_SC * _Q4K_M * 7.5 + 64 * _Q4K_M**2))  # E[(sc q - 8 m)^2]
_Q6K_MAG = (64, 127)  # |sub-block scale|, random sign


def mean_square_unit(qtype: Q) -> float:
    """E[w^2] of this type's random blocks per unit of the super/block scale d squared."""
    return {
        Q.Q4_0: _mean_sq_uniform(-8, 7),
        Q.Q4_1: _mean_sq_uniform(0, 15) - 7.5**2,
        Q.Q5_0: _mean_sq_uniform(-16, 15),
        Q.Q8_0: _mean_sq_uniform(-128, 127),
        Q.Q4_K: _Q4K_MEAN_SQ,
        Q.Q6_K: _mean_sq_uniform(*_Q6K_MAG) * _mean_sq_uniform(-32, 31),
    }[qtype]


def block_scale(qtype: Q, std: float) -> float:
    """The float16 d that gives random blocks of this type the standard deviation `std`."""
    return float(np.float16(std / math.sqrt(mean_square_unit(qtype))))


def random_blocks(qtype: Q, n_blocks: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """`n_blocks` random blocks of a GGUF block type as (n_blocks, type_size) uint8, zero mean, std ~ `std`."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = block_scale(qtype, std)
    if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):  # d * (q - offset): symmetric, sign of d random
        _set_f16(b, 0, d, random_sign=True)
    elif qtype == Q.Q4_1:  # d * q + m with m = -7.5 d
        _set_f16(b, 0, d, random_sign=False)
        _set_f16(b, 2, float(np.float16(-7.5 * d)), random_sign=False)
    elif qtype == Q.Q4_K:  # d * sc_j * q - dmin * m_j, 8 sub-blocks of 32
        _set_f16(b, 0, d, random_sign=False)
        _set_f16(b, 2, 8 * d, random_sign=False)
        sc = np.uint8(32) | (b[:, 4:12] & np.uint8(31))
        m = ((sc.astype(np.uint16) * 15 + 8) // 16).astype(np.uint8)
        b[:, 4:8] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
        b[:, 8:12] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
        b[:, 12:16] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    elif qtype == Q.Q6_K:  # d * s_j * (q - 32), 16 sub-blocks of 16, s_j int8
        r = b[:, 192:208]
        mag = (np.uint8(_Q6K_MAG[0]) | (r & np.uint8(_Q6K_MAG[1] - _Q6K_MAG[0]))).astype(np.int8)
        b[:, 192:208] = np.where(r & np.uint8(0x80), -mag, mag).view(np.uint8)
        _set_f16(b, 208, d, random_sign=False)
    else:
        raise SynthError(f"no random block writer for {qtype.name}")
    return b


# ---- the file ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # [rows, cols] (HF orientation): GGUF's ne is reversed
    qtype: Q
    std: float  # matrices: target std; RMSNorm weights: relative jitter around `center`
    values: np.ndarray | None = None  # fixed F32 contents (rope_freqs)
    center: float = 1.0

    @property
    def nbytes(self) -> int:
        bs, ts = gguf.GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) // bs * ts


@dataclass(frozen=True, slots=True)
class SynthResult:
    path: Path
    file_bytes: int
    params: int
    seconds: float


def plan_tensors(shape: SynthShape, quant: str, vocab: int = SYNTH_VOCAB) -> list[_Tensor]:
    """Every tensor of the file, in llama.cpp's converter order, with its type and target statistics."""
    qtype = QUANTS[quant]
    d, q, kv, f = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.ffn

    def mat(name: str, rows: int, cols: int, gain: float = 1.0) -> _Tensor:
        t = qtype
        if t in _K_FALLBACK and cols % 256:
            t = _K_FALLBACK[t]
        return _Tensor(name, (rows, cols), t, gain / math.sqrt(cols))

    out = [mat("token_embd.weight", vocab, d, EMBED_GAIN)]
    rs = shape.rope_scaling
    if rs and rs["rope_type"] == "llama3":
        freqs = llama3_factors(rs, shape.head_dim, shape.rope_theta).astype(np.float32)
        out.append(_Tensor("rope_freqs.weight", (shape.head_dim // 2,), Q.F32, 0.0, freqs))
    for i in range(shape.layers):
        out += [
            _Tensor(f"blk.{i}.attn_norm.weight", (d,), Q.F32, _NORM_JITTER),
            mat(f"blk.{i}.attn_q.weight", q, d, QK_GAIN),
            mat(f"blk.{i}.attn_k.weight", kv, d, QK_GAIN),
            mat(f"blk.{i}.attn_v.weight", kv, d),
            mat(f"blk.{i}.attn_output.weight", d, q),
            _Tensor(f"blk.{i}.ffn_norm.weight", (d,), Q.F32, _NORM_JITTER),
            mat(f"blk.{i}.ffn_gate.weight", f, d),
            mat(f"blk.{i}.ffn_up.weight", f, d),
            mat(f"blk.{i}.ffn_down.weight", d, f),
        ]
    out.append(_Tensor("output_norm.weight", (d,), Q.F32, _NORM_JITTER, center=LOGIT_GAIN))
    if not shape.tied:
        out.append(mat("output.weight", vocab, d, EMBED_GAIN))
    return out


def _chunks(t: _Tensor, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The tensor's bytes, a chunk of whole rows at a time."""
    if t.values is not None:
        yield t.values.astype(np.float32).view(np.uint8)
        return
    if t.qtype == Q.F32:  # RMSNorm weights
        w = t.center * (1.0 + t.std * rng.standard_normal(t.shape, dtype=np.float32))
        yield w.astype(np.float32).view(np.uint8)
        return
    rows, cols = t.shape
    bs, ts = gguf.GGML_QUANT_SIZES[t.qtype]
    row_bytes = cols // bs * ts
    step = max(1, _CHUNK_BYTES // row_bytes)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        if t.qtype == Q.F16:
            w = rng.standard_normal((n, cols), dtype=np.float32)
            w *= t.std
            yield w.astype(np.float16).view(np.uint8).reshape(-1)
        else:
            yield random_blocks(t.qtype, n * cols // bs, t.std, rng).reshape(-1)


_VT = gguf.GGUFValueType
_ARRAY_TYPES = {
    np.dtype(k): v
    for k, v in (
        ("<i4", _VT.INT32),
        ("<u4", _VT.UINT32),
        ("<f4", _VT.FLOAT32),
        ("<i8", _VT.INT64),
        ("<u8", _VT.UINT64),
        ("<f8", _VT.FLOAT64),
        ("<u1", _VT.UINT8),
        ("<i1", _VT.INT8),
    )
}


def _value_type(v: Any) -> _VT:
    if isinstance(v, bool):
        return _VT.BOOL
    if isinstance(v, str):
        return _VT.STRING
    if isinstance(v, int):
        return _VT.UINT32 if 0 <= v < 1 << 32 else _VT.INT64  # token ids are UINT32 in llama.cpp's files
    if isinstance(v, float):
        return _VT.FLOAT32
    raise SynthError(f"cannot copy a metadata value of type {type(v).__name__}")


@functools.lru_cache(maxsize=2)
def _tokenizer_fields(source: Path) -> list[tuple[str, Any, _VT, _VT | None]]:
    """The `tokenizer.*` metadata of a GGUF file (vocabulary, merges, special ids, chat template) as
    (key, value, type, array item type) for GGUFWriter. Read with our own parser: gguf-py's GGUFReader
    takes seconds on a 49k-token vocabulary."""
    out: list[tuple[str, Any, _VT, _VT | None]] = []
    for key, v in read_gguf(source).metadata.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(v, np.ndarray):
            out.append((key, v.tolist(), _VT.ARRAY, _ARRAY_TYPES[v.dtype.newbyteorder("<")]))
        elif isinstance(v, list):
            out.append((key, v, _VT.ARRAY, _value_type(v[0]) if v else _VT.STRING))
        else:
            out.append((key, v, _value_type(v), None))
    return out


# GGUF token type of the padding (llama.cpp's LLAMA_TOKEN_TYPE_UNUSED): an ordinary token no text encodes to.
_UNUSED = 5


def _padded(fields: list[tuple[str, Any, _VT, _VT | None]], vocab: int | None) -> tuple[list, int]:
    """The tokenizer fields with the token list (and its per-token arrays) padded to `vocab` ids, and that size
    (the tokenizer's own when `vocab` is None)."""
    tokens = next((v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"), None)
    if tokens is None:
        raise SynthError("the tokenizer source has no tokenizer.ggml.tokens")
    n = len(tokens)
    if vocab is None or vocab == n:
        return fields, n
    if vocab < n:
        raise SynthError(f"--vocab-size {vocab} is smaller than the tokenizer's {n} tokens")
    extra = vocab - n
    pad: dict[str, list[Any]] = {
        "tokenizer.ggml.tokens": [f"[PAD{i}]" for i in range(n, vocab)],
        "tokenizer.ggml.token_type": [_UNUSED] * extra,
        "tokenizer.ggml.scores": [-1000.0] * extra,
    }
    out = [(k, list(v) + pad[k] if k in pad else v, t, sub) for k, v, t, sub in fields]
    if not any(k == "tokenizer.ggml.token_type" for k, _, _, _ in fields):
        out.append(("tokenizer.ggml.token_type", [1] * n + pad["tokenizer.ggml.token_type"], _VT.ARRAY, _VT.INT32))
    return out, vocab


def write_synthetic(
    shape: SynthShape,
    quant: str,
    out: str | Path,
    seed: int = 0,
    tokenizer_source: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    vocab_size: int | None = None,
) -> SynthResult:
    """Write a GGUF file of `shape` with random `quant` weights to `out` (atomically: a .part file renamed).

    `vocab_size`: pad the tokenizer's ids with unused tokens up to this many (None: the tokenizer's own).
    Deterministic: the same shape, quant, vocabulary and seed give the same bytes. Raises SynthError for a bad
    quant, a vocabulary smaller than the tokenizer's or an output path that cannot be written.
    """
    if quant not in QUANTS:
        raise SynthError(f"unknown quant {quant!r} (choose from: {', '.join(QUANTS)})")
    if not isinstance(seed, int) or seed < 0:
        raise SynthError(f"--seed must be a non-negative integer, got {seed!r}")
    out = Path(out).expanduser()
    if out.is_dir():
        raise SynthError(f"--out {out} is a directory; give a file name such as {out / (shape.name + '.gguf')}")
    if not out.parent.is_dir():
        raise SynthError(f"cannot write {out}: directory {out.parent} does not exist")
    start = time.perf_counter()
    source = Path(tokenizer_source) if tokenizer_source else resolve_model_path("default")
    tokenizer, vocab = _padded(_tokenizer_fields(source), vocab_size)
    tensors = plan_tensors(shape, quant, vocab)

    part = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(part, "llama")
    arch = "llama"
    w.add_type("model")
    w.add_name(f"synthetic {shape.name} {quant}")
    w.add_description(f"random weights for benchmarking (forge synth, seed {seed}); the text means nothing")
    w.add_uint32(f"{arch}.block_count", shape.layers)
    w.add_uint32(f"{arch}.context_length", shape.context)
    w.add_uint32(f"{arch}.embedding_length", shape.hidden)
    w.add_uint32(f"{arch}.feed_forward_length", shape.ffn)
    w.add_uint32(f"{arch}.attention.head_count", shape.heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", shape.kv_heads)
    w.add_uint32(f"{arch}.attention.key_length", shape.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", shape.head_dim)
    w.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    w.add_uint32(f"{arch}.vocab_size", vocab)
    w.add_uint32(f"{arch}.rope.dimension_count", shape.head_dim)
    rs = shape.rope_scaling
    if rs and rs["rope_type"] in ("linear", "yarn"):
        w.add_string(f"{arch}.rope.scaling.type", rs["rope_type"])
        w.add_float32(f"{arch}.rope.scaling.factor", rs["factor"])
    if rs and "original_max_position_embeddings" in rs:  # llama3: the context rope_freqs.weight is made for
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", rs["original_max_position_embeddings"])
    w.add_file_type(int(_FILE_TYPE[quant]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype, sub in tokenizer:
        w.add_key_value(key, value, vtype, sub)
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)

    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        for i, t in enumerate(tensors):
            rng = np.random.default_rng([seed, i])  # an independent stream per tensor
            w.write_padding(fout, fout.tell())
            for chunk in _chunks(t, rng):
                fout.write(chunk.data)
            if progress and t.name.endswith("ffn_down.weight"):
                done = int(t.name.split(".")[1]) + 1
                if done % max(1, shape.layers // 4) == 0 or done == shape.layers:
                    progress(f"synth: {done}/{shape.layers} layers written")
        w.write_padding(fout, fout.tell())
        w.close()
        os.replace(part, out)
    except OSError as exc:
        w.close()
        part.unlink(missing_ok=True)
        raise SynthError(f"cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        w.close()
        part.unlink(missing_ok=True)
        raise
    params = sum(int(np.prod(t.shape)) for t in tensors)
    return SynthResult(out, out.stat().st_size, params, time.perf_counter() - start)

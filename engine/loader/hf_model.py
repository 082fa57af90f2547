"""Hugging Face model directory (config.json + *.safetensors + tokenizer.json) -> LoadedModel."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from engine.config import ModelConfig
from engine.loader.errors import ModelLoadError
from engine.loader.loaded import LoadedModel
from engine.loader.names import expected_shapes, tensor_plan
from engine.loader.recommended import from_generation_config
from engine.loader.safetensors_file import SafetensorsFile, read_safetensors
from engine.loader.tokenizer_build import from_hf_dir
from engine.tokenizer import Tokenizer, TokenizerError

# config.json model_type -> our arch name
ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}


def load_hf_dir(path: Path) -> LoadedModel:
    """Load a HF checkpoint directory; raises ModelLoadError naming the problem."""
    cfg = _json(path / "config.json", required=True)
    model_type = cfg.get("model_type")
    if model_type not in ARCHS:
        raise ModelLoadError(
            f"{path}: unsupported architecture {model_type!r} (config.json model_type; supported: {', '.join(ARCHS)})"
        )
    gen = _json(path / "generation_config.json", required=False)
    files = _shards(path)
    try:
        tokenizer = from_hf_dir(path)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    config = _config(path, cfg, gen, ARCHS[model_type], tokenizer)
    plan = tensor_plan(config.num_layers, config.attention_bias, config.tie_word_embeddings, source=1)
    shapes = expected_shapes(config)
    where: dict[str, SafetensorsFile] = {}
    for f in files:
        for name in f.tensors:
            where.setdefault(name, f)
    for canon, name in plan.items():
        if name not in where:
            raise ModelLoadError(f"{path}: missing tensor {name!r}")
        t = where[name].tensors[name]
        if t.dtype not in ("F32", "F16", "BF16"):
            raise ModelLoadError(f"{path}: tensor {name!r} has unsupported dtype {t.dtype} (supported: F32, F16, BF16)")
        want = shapes[canon.rsplit(".", 1)[-1]]
        if t.shape != want:
            raise ModelLoadError(f"{path}: tensor {name!r} has shape {t.shape}, expected {want}")
    weights = {
        canon: where[name].weight(name) if len(shapes[canon.rsplit(".", 1)[-1]]) == 2 else where[name].get(name)
        for canon, name in plan.items()
    }
    counts: Counter[str] = Counter()
    for name in plan.values():
        t = where[name].tensors[name]
        counts[t.dtype] += int(np.prod(t.shape))
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        chat_template=_chat_template(path),
        path=str(path),
        name=path.name,
        quant=counts.most_common(1)[0][0],
        sampling=from_generation_config(gen),
    )


def _json(p: Path, required: bool) -> dict:
    if not p.is_file():
        if required:
            raise ModelLoadError(f"{p.parent}: missing {p.name}")
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{p}: cannot parse JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{p}: expected a JSON object")
    return data


def _shards(path: Path) -> list[SafetensorsFile]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json(index, required=True).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: no weight_map")
        names = sorted(set(weight_map.values()))
        for n in names:
            if not (path / n).is_file():
                raise ModelLoadError(f"{path}: missing shard {n} named in {index.name}")
        return [read_safetensors(path / n) for n in names]
    names = sorted(path.glob("*.safetensors"))
    if not names:
        extra = " (PyTorch .bin checkpoints are not supported)" if list(path.glob("*.bin")) else ""
        raise ModelLoadError(f"{path}: no *.safetensors weights{extra}")
    return [read_safetensors(n) for n in names]


def _config(path: Path, cfg: dict, gen: dict, arch: str, tokenizer: Tokenizer) -> ModelConfig:
    def need(key: str) -> Any:
        if key not in cfg:
            raise ModelLoadError(f"{path}: config.json has no {key!r}")
        return cfg[key]

    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    if heads <= 0 or heads % kv_heads or head_dim % 2:
        raise ModelLoadError(f"{path}: bad attention shape: {heads} heads, {kv_heads} KV heads, head_dim {head_dim}")
    rope_params = p if isinstance(p := cfg.get("rope_parameters"), dict) else {}
    theta = cfg.get("rope_theta") or rope_params.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling") or rope_params or None
    if isinstance(scaling, dict):
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
        kind = scaling.pop("type", None)
        scaling.setdefault("rope_type", kind)
        if scaling["rope_type"] in (None, "default"):
            scaling = None
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    if not eos_ids and tokenizer.eos_id is not None:
        eos_ids = [tokenizer.eos_id]
    bos = cfg.get("bos_token_id", tokenizer.bos_id)
    return ModelConfig(
        arch=arch,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=eos_ids,
    )


def _chat_template(path: Path) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tpl = _json(path / "tokenizer_config.json", required=False).get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl if isinstance(tpl, str) else None

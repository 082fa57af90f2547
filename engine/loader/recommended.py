"""The sampling settings a model's files recommend, as SamplingParams field names.

GGUF: llama.cpp's `general.sampling.*` keys (temp, top_p, top_k, min_p, penalty_repeat). A Hugging Face
directory: `generation_config.json` (temperature, top_p, top_k, min_p, repetition_penalty; an explicit
`"do_sample": false` recommends greedy decoding). Values the engine would refuse are left out.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.types import InvalidRequest, SamplingParams

log = logging.getLogger("forge.loader")

GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
HF_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def from_gguf(metadata: dict[str, Any]) -> dict[str, float]:
    return _checked({name: metadata[key] for key, name in GGUF_KEYS.items() if key in metadata}, "GGUF metadata")


def from_generation_config(gen: dict[str, Any]) -> dict[str, float]:
    found = {k: gen[k] for k in HF_KEYS if gen.get(k) is not None}
    if gen.get("do_sample") is False:
        found["temperature"] = 0.0
    return _checked(found, "generation_config.json")


def _checked(found: dict[str, Any], source: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in found.items():
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidRequest(f"{name} is not a number")
            value = int(value) if name == "top_k" else float(value)
            setting: dict[str, Any] = {name: value}
            SamplingParams(**setting).validate(vocab_size=1)
        except (InvalidRequest, ValueError, TypeError, OverflowError) as e:
            log.warning("ignoring the %s recommendation %s=%r: %s", source, name, value, e)
            continue
        out[name] = value
    return out

"""What a loader hands the engine."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.config import ModelConfig
from engine.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    """Config, float32 weights under canonical names (see engine/loader/names.py), tokenizer, template."""

    config: ModelConfig
    weights: dict[str, np.ndarray]  # float32, C-contiguous, HF orientation [out, in]
    tokenizer: Tokenizer
    chat_template: str | None
    path: str  # the resolved file (GGUF) or directory (HF)
    name: str  # e.g. "SmolLM2-135M-Instruct.Q4_1"
    quant: str  # dominant tensor type in the file: "Q4_1", "F32", "BF16", ...

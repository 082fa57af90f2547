"""What a loader hands the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.config import ModelConfig
from engine.tokenizer import Tokenizer
from kernels.weight import Weight


@dataclass(slots=True)
class LoadedModel:
    """Config, weights under canonical names (see engine/loader/names.py), tokenizer, template."""

    config: ModelConfig
    weights: dict[str, Weight | np.ndarray]  # matrices: Weight, HF orientation [out, in]; vectors: float32
    tokenizer: Tokenizer
    chat_template: str | None
    path: str  # the resolved file (GGUF) or directory (HF)
    name: str  # e.g. "SmolLM2-135M-Instruct.Q4_1"
    quant: str  # dominant tensor type in the file: "Q4_1", "F32", "BF16", ...
    sampling: dict[str, float] = field(default_factory=dict)  # what the files recommend (loader/recommended.py)
    pooling: str | None = None  # embeddings' pooling the file names (GGUF `pooling_type`): "mean" | "last" | "cls"

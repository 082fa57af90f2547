"""Shared fixtures: the fixture reference file and the real default model, loaded once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def reference() -> dict:
    """Hugging Face transformers' float32 outputs for the default model (tests/fixtures)."""
    return json.loads((FIXTURES / "smollm2_reference.json").read_text())


@pytest.fixture(scope="session")
def loaded_default():
    """The default GGUF, loaded once (weights stay quantized)."""
    from engine.loader import load_model

    return load_model("default")


@pytest.fixture(scope="session")
def default_model(loaded_default):
    """(LoadedModel, LlamaModel) for the default GGUF on the numba backend (the product's CPU path)."""
    from engine.model.llama import LlamaModel
    from kernels import get_backend

    return loaded_default, LlamaModel(loaded_default.config, loaded_default.weights, get_backend("numba"))


@pytest.fixture(scope="session")
def reference_model(loaded_default):
    """The same weights dequantized to float32 on the NumPy (OpenBLAS) reference backend."""
    from engine.model.llama import LlamaModel
    from kernels import get_backend

    return loaded_default, LlamaModel(loaded_default.config, loaded_default.weights, get_backend("numpy"))

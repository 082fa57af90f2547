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
def default_model():
    """(LoadedModel, LlamaModel) for the default GGUF on the NumPy backend, shared by the session."""
    from engine.loader import load_model
    from engine.model.llama import LlamaModel
    from kernels import get_backend

    loaded = load_model("default")
    return loaded, LlamaModel(loaded.config, loaded.weights, get_backend("numpy"))

"""The sampling settings a model's files recommend, and what a request leaving them out gets (app.domain.defaults)."""

from __future__ import annotations

import json

import gguf
import pytest
from _gguf_helpers import default_loaded, hf_weights, spec_for, tiny_vocab, write_gguf, write_tiny_pair

from app.api.bodies import SessionFields
from app.domain.defaults import DEFAULT_SETTINGS, OPENAI, openai_defaults, session_defaults, turn_extras
from engine import Engine
from engine.loader import load_model


def _gguf_recommending(path, values: dict) -> str:
    spec = spec_for("llama")

    def hook(w: gguf.GGUFWriter) -> None:
        for key, value in values.items():
            (w.add_uint32 if isinstance(value, int) else w.add_float32)(key, value)

    return str(write_gguf(path, spec, hf_weights(spec, len(tiny_vocab()[0])), hook=hook))


def test_gguf_sampling_metadata_is_the_recommendation(tmp_path, caplog):
    path = _gguf_recommending(
        tmp_path / "rec.gguf",
        {
            "general.sampling.temp": 0.25,
            "general.sampling.top_p": 0.75,
            "general.sampling.top_k": 40,
            "general.sampling.penalty_repeat": 1.125,
            "general.sampling.min_p": 7.0,
        },
    )  # min_p out of range
    assert load_model(path).sampling == {"temperature": 0.25, "top_p": 0.75, "top_k": 40, "repetition_penalty": 1.125}
    assert "ignoring the GGUF metadata recommendation min_p=7.0" in caplog.text


def test_generation_config_is_the_recommendation(tmp_path):
    hf_dir, _ = write_tiny_pair(tmp_path)
    assert load_model(hf_dir).sampling == {}  # only token ids in it
    (hf_dir / "generation_config.json").write_text(
        json.dumps(
            {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "min_p": 0.05, "top_k": "many", "eos_token_id": 2}
        )
    )
    assert load_model(hf_dir).sampling == {"temperature": 0.6, "top_p": 0.9, "min_p": 0.05}
    (hf_dir / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert load_model(hf_dir).sampling == {"temperature": 0.0}  # greedy, as transformers would decode it


def test_the_default_model_recommends_nothing():
    assert default_loaded().sampling == {}  # SmolLM2's GGUF carries no general.sampling.* keys


@pytest.fixture
async def recommending_engine(tmp_path):
    engine = Engine.load(
        _gguf_recommending(tmp_path / "e.gguf", {"general.sampling.temp": 0.25, "general.sampling.top_k": 40}),
        backend="numpy",
        kv_memory="4MiB",
    )
    yield engine
    await engine.shutdown()


def test_requests_leaving_parameters_out_get_the_recommendation_first(recommending_engine):
    assert recommending_engine.model_info["sampling_defaults"] == {"temperature": 0.25, "top_k": 40}
    assert openai_defaults(recommending_engine) == {**OPENAI, "temperature": 0.25, "top_k": 40}
    assert session_defaults(recommending_engine) == {**DEFAULT_SETTINGS, "temperature": 0.25}
    assert turn_extras(recommending_engine) == {"top_k": 40}  # sessions store no top_k: every turn takes it
    made = SessionFields().new_session(session_defaults(recommending_engine))
    assert made["settings"] == {"temperature": 0.25, "top_p": 0.95, "max_tokens": 512}

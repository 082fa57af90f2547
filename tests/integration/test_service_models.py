"""Several models in one server (app/domain/models.py), against a real server: the default model and a tiny
synthetic GGUF (`forge synth`) served under two names, `tiny` and `other`, with a --model-memory that holds one
model at a time. /v1 routes by `model`, an unknown one is a 404 naming it, a session stores its model (and
export/import keep it), and the budget unloads an idle model (the default too), but waits for one with a running
stream."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.loader.synth import shape_from_hf, write_synthetic
from tests.integration.conftest import DEFAULT_MAX_TOKENS, ServerProcess, serving

KV = 64 << 20  # each model's KV budget
TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
NO_EOS = {"0": -100, "1": -100, "2": -100}  # the default tokenizer's special ids: the reply runs to max_tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("forge-models")
    tiny = tmp / "tiny.gguf"
    write_synthetic(shape_from_hf(TINY, "tiny"), "q4_0", tiny)
    one = tiny.stat().st_size + KV
    # One model at a time: tiny or other; the default is over the budget alone (it loads when nothing else is).
    budget = one + one // 2
    env = {
        "FORGE_MODELS": f"default,tiny={tiny},other={tiny}",
        "FORGE_MODEL_MEMORY": str(budget),
        "FORGE_KV_MEMORY": str(KV),
        "FORGE_QUEUE_TIMEOUT_S": "60",
        "FORGE_DEFAULT_MAX_TOKENS": str(DEFAULT_MAX_TOKENS),
        "FORGE_SPEC_ROW_COST": "0.5",
    }
    with serving(tmp, env) as srv:
        yield srv


@pytest.fixture
def http(served: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=180, headers=served.auth) as client:
        yield client


def states(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in srv.stats()["models"]}


def scrape(srv: ServerProcess) -> str:
    return httpx.get(srv.url + "/metrics", headers=srv.admin_headers(), timeout=10).text


def chat(http: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    return http.post("/v1/chat/completions", json={"temperature": 0, **body, **extra})


def test_models_are_listed_and_model_routes_each_request(served: ServerProcess, http: httpx.Client) -> None:
    listed = http.get("/v1/models").json()["data"]
    default_id = served.stats()["model"]["name"]
    assert [m["id"] for m in listed] == [default_id, "tiny", "other"]
    assert [m["state"] for m in listed] == ["ready", "on disk", "on disk"]  # the others load on demand

    on_default = chat(http, "default")
    metrics = {"default": scrape(served)}
    on_tiny = chat(http, "tiny")  # the default makes room for it
    metrics["tiny"] = scrape(served)
    assert on_default.status_code == on_tiny.status_code == 200, on_tiny.text
    assert on_default.json()["model"] == default_id and on_tiny.json()["model"] == "tiny"
    texts = [r.json()["choices"][0]["message"]["content"] for r in (on_default, on_tiny)]
    assert texts[0] != texts[1]  # two engines: a trained model and random weights
    assert http.get("/v1/models/tiny").json()["state"] == "ready"
    assert [states(served)[m]["state"] for m in (default_id, "tiny", "other")] == ["on disk", "ready", "on disk"]
    assert http.get("/ready").status_code == 200  # the default still answers: it loads on its next request

    missing = chat(http, "nope")
    assert missing.status_code == 404
    err = missing.json()["error"]
    assert err["code"] == "model_not_found" and err["message"].startswith("model 'nope' not found")
    assert err["type"] == "not_found_error" and err["param"] == "model"
    assert http.get("/v1/models/nope").status_code == 404
    # each loaded model's engine has its own series: the tokens each reply generated counted on its model alone
    for model, reply, text in ((default_id, on_default, metrics["default"]), ("tiny", on_tiny, metrics["tiny"])):
        generated = re.search(rf'^forge_generated_tokens_total\{{model="{re.escape(model)}"\}} (\S+)$', text, re.M)
        assert generated and float(generated.group(1)) >= reply.json()["usage"]["completion_tokens"], model
        assert f'forge_request_latency_seconds_count{{model="{model}"}}' in text
    after = metrics["tiny"]
    assert 'forge_model_state{model="tiny",state="ready"} 1.0' in after
    assert f'forge_model_state{{model="{default_id}",state="on disk"}} 1.0' in after
    for gone in (default_id, "other"):  # not loaded: no engine series
        assert f'forge_generated_tokens_total{{model="{gone}"}}' not in after


def test_a_session_keeps_its_model_through_turns_export_and_import(served: ServerProcess, http: httpx.Client) -> None:
    created = http.post("/api/sessions", json={"model": "other", "settings": {"temperature": 0, "max_tokens": 4}})
    assert created.status_code == 201 and created.json()["model"] == "other"
    sid = created.json()["id"]
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Hi"}) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1]["type"] == "done" and events[-1]["status"] == "complete", events[-1]
    now = states(served)
    # the turn ran on `other`, loaded for it; `tiny` (idle) made room for it
    assert now["other"]["state"] == "ready" and now["tiny"]["state"] == "on disk"

    assert http.patch(f"/api/sessions/{sid}", json={"model": "tiny"}).json()["model"] == "tiny"
    refused = http.patch(f"/api/sessions/{sid}", json={"model": "nope"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
    assert refused.json()["error"]["message"].startswith("model 'nope' not found")
    exported = http.get(f"/api/sessions/{sid}/export").json()
    assert exported["session"]["model"] == "tiny"
    imported = http.post("/api/sessions/import", json=exported)
    assert imported.status_code == 201 and imported.json()["model"] == "tiny"
    exported["session"]["model"] = "nope"
    assert http.post("/api/sessions/import", json=exported).status_code == 400
    assert http.post("/api/sessions", json={}).json()["model"] is None  # left out: the default


def test_the_budget_unloads_a_model_only_after_its_running_stream(served: ServerProcess, http: httpx.Client) -> None:
    assert chat(http, "tiny").status_code == 200  # tiny loaded (and other unloaded)
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 600, "temperature": 0, "logit_bias": NO_EOS}
    other: dict[str, Any] = {}

    def ask_other() -> None:
        other["response"] = chat(http, "other")
        other["at"] = time.monotonic()

    asker = threading.Thread(target=ask_other)
    chunks: list[dict[str, Any]] = []
    seen_waiting = False
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[5:]))
            if len(chunks) == 1:
                asker.start()  # other's load needs tiny's memory: it waits for this stream
            elif not seen_waiting and len(chunks) % 20 == 0:
                now = states(served)
                seen_waiting = now["other"]["requests"] == 1 and now["other"]["state"] == "on disk"
                assert now["tiny"]["state"] == "ready"  # never unloaded under a running stream
        ended = time.monotonic()
    asker.join(120)
    assert seen_waiting, "the second model's request never waited for the running stream"
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and len(text) > 0
    assert other["response"].status_code == 200 and other["response"].json()["model"] == "other"
    assert other["at"] >= ended - 0.5  # answered only once the stream was over
    after = states(served)
    assert after["tiny"]["state"] == "on disk" and after["other"]["state"] == "ready"


def test_serve_flag_takes_names_and_files(tmp_path: Path) -> None:
    from app.cli import build_parser
    from app.config import settings_from_flags

    args = build_parser().parse_args(["serve", "--model", "a=/x.gguf", "--model", "default", "--model-memory", "4GiB"])
    settings = settings_from_flags(args)
    assert [(s.alias, s.source) for s in settings.model_specs()] == [("a", "/x.gguf"), ("default", "default")]
    assert settings.model_budget() == 4 << 30

"""The OpenAI-compatible shim through the official `openai` client, against the real server and model."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.integration.conftest import API_KEY, DEFAULT_MAX_TOKENS, ServerProcess, finished, post_and_leave, wait_idle


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _france(reference: dict) -> tuple[list[dict], str]:
    case = reference["prompts"][0]
    return case["messages"], case["generated_text_skip_special"]


def test_models_lists_the_served_model(client: openai.OpenAI, server: ServerProcess) -> None:
    models = client.models.list().data
    assert len(models) == 1
    stats = server.stats()
    assert models[0].id == stats["model"]["name"]
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_chat_non_streaming_greedy_matches_reference(client: openai.OpenAI, model_id: str, reference: dict) -> None:
    messages, expected = _france(reference)
    r = client.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=32)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == reference["prompts"][0]["n_prompt"]
    assert r.usage.completion_tokens == reference["prompts"][0]["n_generated"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_equals_non_streaming_and_reuses_prefix(
    client: openai.OpenAI, model_id: str, reference: dict
) -> None:
    messages, expected = _france(reference)
    client.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=32)
    stream = client.chat.completions.create(
        model=model_id,
        messages=messages,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    usage = usage_chunks[0].usage
    assert usage.completion_tokens == reference["prompts"][0]["n_generated"]
    # Stateless requests still share the prompt's KV blocks through the prefix cache.
    assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_completions_endpoint_stop_and_logprobs(client: openai.OpenAI, model_id: str) -> None:
    r = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2
    )
    text = r.choices[0].text
    assert r.object == "text_completion" and text
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == text
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    # A stop string taken from the greedy text truncates it there.
    word = text.split()[1] if len(text.split()) > 1 else text.strip()
    stopped = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0, stop=[word]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(word)]


def test_chat_logprobs_and_n(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=4,
        temperature=0,
        n=2,
        logprobs=True,
        top_logprobs=3,
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy: both samples agree
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens // 2
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),  # the legacy spelling of tools
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"uniqueItems": True}}}},
            "response_format",
        ),
        ({"response_format": {"type": "regex", "pattern": "a(b"}}, "response_format"),
        ({"speculative": "eagle"}, "speculative"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"temperature": 3.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"logit_bias": {"not-a-token": 5}}, "logit_bias"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_refused_parameters_name_the_parameter(client: openai.OpenAI, model_id: str, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], extra_body=extra)
    assert exc.value.status_code == 400
    body = exc.value.body
    assert body["param"] == param and param in body["message"]


def test_unknown_model_and_tool_role_are_refused(client: openai.OpenAI, model_id: str) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert exc.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=model_id, max_tokens=2, messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]
        )
    assert exc.value.body["param"].startswith("messages[0]")


def test_api_key_is_required(server: ServerProcess, model_id: str) -> None:
    anonymous = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        anonymous.models.list()
    assert exc.value.status_code == 401
    r = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=30,
        json={"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_streaming_keepalive_comments_have_no_empty_data_lines(server: ServerProcess, model_id: str) -> None:
    # The shared server sends `: keep-alive` every 0.05 s while no token is ready (e.g. during prefill).
    long_prompt = "Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 60
    lines: list[str] = []
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        timeout=120,
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={
            "model": model_id,
            "messages": [{"role": "user", "content": long_prompt}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        },
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    assert ": keep-alive" in lines
    assert "data:" not in [ln.strip() for ln in lines]
    events = [ln for ln in lines if ln]
    assert all(ln == ": keep-alive" or ln.startswith("data: ") for ln in events)
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1  # nothing after the end marker
    chunks = [json.loads(ln[len("data: ") :]) for ln in events[:-1] if ln.startswith("data: ")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # the reply's end precedes [DONE]


def test_seed_and_logit_bias_are_honoured(client: openai.OpenAI, model_id: str, reference: dict) -> None:
    messages, _ = _france(reference)
    sampled = [
        client.chat.completions.create(model=model_id, messages=messages, temperature=1.0, max_tokens=8, seed=1234)
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]  # same seed, same sample

    def first_token(**extra) -> str:  # type: ignore[no-untyped-def]
        r = client.chat.completions.create(
            model=model_id, messages=messages, temperature=0, max_tokens=1, logprobs=True, **extra
        )
        return r.choices[0].logprobs.content[0].token

    greedy_id = reference["prompts"][0]["generated_ids"][0]
    assert first_token() != first_token(logit_bias={str(greedy_id): -100})  # the banned token can't come first


def test_non_streaming_client_gone_aborts_the_generation(server: ServerProcess, model_id: str) -> None:
    wait_idle(server)
    aborted, completed = finished(server, "abort"), finished(server, "length")
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Write a very long story about a cat."}],
        "temperature": 0,
        "max_tokens": 300,
    }
    with post_and_leave(server, "/v1/chat/completions", body, {"Authorization": f"Bearer {API_KEY}"}):
        deadline = time.monotonic() + 60
        while server.stats()["engine"]["running"] == 0:  # generating: now the client leaves
            assert time.monotonic() < deadline
            time.sleep(0.02)
    wait_idle(server)
    assert finished(server, "length") == completed  # it never ran to max_tokens ...
    assert finished(server, "abort") == aborted + 1  # ... it was aborted


def test_null_for_an_unknown_key_counts_as_not_given(server: ServerProcess, model_id: str) -> None:
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Hi", "name": None}],
        "max_tokens": 2,
        "tools": None,
        "response_format": None,
    }
    r = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    )
    assert r.status_code == 200, r.text
    body["tools"] = []
    r = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_parameters_left_out_take_the_defaults(client: openai.OpenAI, model_id: str) -> None:
    messages = [{"role": "user", "content": "Write a long story about a dragon who learns to fly."}]
    # the default model's files recommend no sampling settings: OpenAI's temperature 1.0 applies ...
    left_out, explicit = (
        client.chat.completions.create(model=model_id, messages=messages, max_tokens=10, seed=99, **extra)
        .choices[0]
        .message.content
        for extra in ({}, {"temperature": 1.0})
    )
    assert left_out == explicit
    # ... and a reply without max_tokens stops at the cap (FORGE_DEFAULT_MAX_TOKENS), not at the context's end
    r = client.chat.completions.create(model=model_id, messages=messages, temperature=0)
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", DEFAULT_MAX_TOKENS)

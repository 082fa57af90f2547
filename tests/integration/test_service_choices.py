"""n = 16 streamed through the official `openai` client on /v1/completions and /v1/chat/completions against the
real server: every choice arrives and ends with a finish_reason (a lost sibling used to leave the stream open)."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import API_KEY, ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def finish_reasons(stream) -> dict[int, str]:  # type: ignore[no-untyped-def]
    ends: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            assert choice.index not in ends, f"choice {choice.index} went on after its finish_reason"
            if choice.finish_reason is not None:
                ends[choice.index] = choice.finish_reason
    return ends


def test_sixteen_streamed_completions_each_finish(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="default",
        prompt="Once upon a time",
        max_tokens=4,
        n=16,
        temperature=0.9,
        seed=19,
        stop=["."],
        stream=True,
    )
    ends = finish_reasons(stream)
    assert sorted(ends) == list(range(16)) and set(ends.values()) <= {"stop", "length"}, ends


def test_sixteen_streamed_chat_choices_each_finish(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=4,
        n=16,
        temperature=0.9,
        seed=19,
        stream=True,
    )
    ends = finish_reasons(stream)
    assert sorted(ends) == list(range(16)) and set(ends.values()) <= {"stop", "length"}, ends


@pytest.mark.parametrize("stream", [False, True])
def test_samples_that_could_never_fit_the_kv_cache_are_a_400_naming_the_parameter(
    client: openai.OpenAI, stream: bool
) -> None:
    # 16 samples of up to 4000 tokens: far past the KV budget, though each alone fits the context.
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="default", prompt="Once upon a time", max_tokens=4000, n=16, stream=stream)
    assert info.value.status_code == 400 and info.value.body["param"] == "max_tokens", info.value.body

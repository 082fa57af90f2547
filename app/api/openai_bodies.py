"""The OpenAI shim's request bodies as msgspec Structs (decoded by app.api.bodies.decode, unsupported=True).

`null` counts as not given, as OpenAI treats it. OpenAI parameters Forge does not implement are typed
`None`: sent with a value they are refused by name (`unsupported_parameter`); so is any unknown field.
Ranges that are the engine's own (n, logprobs, stop strings, logit bias, top_k, min_p, ...) are checked
once, by the engine (SamplingParams.validate).
"""
from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from app.api.bodies import Int
from app.api.response_format import ResponseFormatField

Penalty = Annotated[float, Meta(ge=-2, le=2)]
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class TextPart(Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class ChatMessage(Struct, forbid_unknown_fields=True, kw_only=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: None = None
    tool_calls: None = None
    tool_call_id: None = None
    refusal: None = None

    def plain(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": CHAT_ROLES[self.role], "content": text}


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None


class Sampling(Struct, forbid_unknown_fields=True, kw_only=True):
    """What /v1/chat/completions and /v1/completions share."""

    model: str
    max_tokens: Annotated[int, Meta(ge=1, le=1 << 31)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    n: Int | None = None
    stop: str | list[str] | None = None
    seed: Int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[Int, float] | None = None  # token id (as a string) -> bias
    user: Annotated[str, Meta(max_length=256)] | None = None  # logged
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormatField | None = None  # with Forge's `regex` and `grammar` kinds
    # Forge extensions the engine honours (vLLM spells the first three the same way)
    top_k: Int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    speculative: Literal["off", "ngram"] | None = None  # None: the server's --speculative
    # Refused by name when given.
    tools: None = None
    tool_choice: None = None
    parallel_tool_calls: None = None
    functions: None = None
    function_call: None = None
    suffix: None = None
    service_tier: None = None
    store: None = None
    metadata: None = None
    modalities: None = None
    audio: None = None
    prediction: None = None
    reasoning_effort: None = None


class ChatRequest(Sampling, kw_only=True):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1, le=1 << 31)] | None = None
    logprobs: bool | None = None
    top_logprobs: Int | None = None


class CompletionRequest(Sampling, kw_only=True):
    """`POST /v1/completions`. `prompt`: a string, token ids, or a batch of exactly one of those."""

    prompt: str | list[str | Int | list[Int]]
    echo: bool | None = None
    best_of: Int | None = None
    logprobs: Int | None = None

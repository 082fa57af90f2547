"""Request bodies of /v1/chat/completions and /v1/completions → a checked `Call` for the engine.

Every parameter is either honoured or refused with a 400 naming it; nothing is silently ignored.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.api import tools
from app.api.openai_bodies import ChatRequest, CompletionRequest, Sampling
from app.api.response_format import compile_response_format
from app.api.served import OnModel
from app.domain.defaults import openai_defaults
from app.domain.errors import ServiceError
from engine.types import SamplingParams


def _unsupported(name: str, why: str) -> ServiceError:
    return ServiceError("unsupported_parameter", f"'{name}' is not supported by Forge: {why}", param=name)


def _invalid(name: str, why: str) -> ServiceError:
    return ServiceError("invalid_parameter", f"'{name}' {why}", param=name)


@dataclass(slots=True)
class Call:
    """A checked request, ready for the engine."""

    prompt: list[int]
    params: SamplingParams
    model: str
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None  # chat: alternatives per token
    echo_text: str = ""  # completions: prompt text to prepend
    tools: tools.ToolPlan | None = None  # chat: app.api.tools
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


async def _sampling(
    body: Sampling, svc: OnModel, prompt_len: int, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """SamplingParams from the body, its `response_format` compiled and parameters left out taken from
    app.defaults (the model's recommendation, else OpenAI's; `max_tokens` capped by
    Settings.default_max_tokens); the engine checks its own ranges when the request is admitted."""
    room = int(svc.engine.max_context) - prompt_len
    if room < 1:
        raise ServiceError(
            "context_length_exceeded",
            f"the prompt is {prompt_len} tokens; this model's maximum context "
            f"length is {svc.engine.max_context} tokens",
            param="messages" if isinstance(body, ChatRequest) else "prompt",
        )
    if max_tokens is not None and max_tokens > room:
        raise ServiceError(
            "context_length_exceeded",
            f"this model's maximum context length is {svc.engine.max_context} "
            f"tokens; you requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
            f"{max_tokens} for the completion)",
            param="max_tokens",
        )
    if body.stream_options is not None and not body.stream:
        raise _invalid("stream_options", "is only allowed when 'stream' is true")
    response_format = await compile_response_format(svc.engine, body.response_format)

    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    defaults = openai_defaults(svc.engine)
    return SamplingParams(
        max_tokens=given(max_tokens, min(room, svc.settings.default_max_tokens)),
        temperature=given(body.temperature, defaults["temperature"]),
        top_p=given(body.top_p, defaults["top_p"]),
        n=given(body.n, 1),
        presence_penalty=given(body.presence_penalty, 0.0),
        frequency_penalty=given(body.frequency_penalty, 0.0),
        top_k=given(body.top_k, defaults["top_k"]),
        min_p=given(body.min_p, defaults["min_p"]),
        repetition_penalty=given(body.repetition_penalty, defaults["repetition_penalty"]),
        logit_bias=dict(body.logit_bias or {}),
        seed=body.seed,
        stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        logprobs=logprobs,
        response_format=response_format,
        speculative=body.speculative,
    )


def _include_usage(body: Sampling) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


async def parse_chat(body: ChatRequest, svc: OnModel) -> Call:
    """A chat request checked, its messages rendered by the model's template and tokenized (`svc`: on the model
    the body names)."""
    model = svc.model_id
    mct = body.max_completion_tokens
    if body.max_tokens is not None and mct is not None and body.max_tokens != mct:
        raise _invalid("max_completion_tokens", "and 'max_tokens' disagree; give one of them")
    top = body.top_logprobs
    if top is not None and not body.logprobs:
        raise _invalid("top_logprobs", "requires 'logprobs': true")
    logprobs = (top or 0) if body.logprobs else None
    tools.check_messages(body.messages)
    plan = await tools.plan(svc.engine, body)
    try:  # a long conversation takes a while to render and tokenize: not on the event loop
        prompt = await asyncio.to_thread(
            svc.engine.render_chat, [m.plain() for m in body.messages], True, plan.render if plan else None
        )
    except ValueError as e:
        raise _invalid("messages", f"were refused by the model's chat template: {e}") from None
    params = await _sampling(body, svc, len(prompt), mct if mct is not None else body.max_tokens, logprobs)
    if plan is not None:
        plan.constrain(params)
    return Call(
        prompt=list(prompt),
        params=params,
        model=model,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        top_logprobs=logprobs,
        tools=plan if plan and plan.grammar else None,
    )  # tool_choice "none": the reply is text


async def parse_completion(body: CompletionRequest, svc: OnModel) -> Call:
    """A completion request checked; its prompt (text, or token ids) tokenized or decoded for `echo`."""
    model = svc.model_id
    # msgspec allows one array type in a union (app/api/openai_bodies.py): the list's shapes are told apart here
    raw: Any = body.prompt
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        if not raw:
            raise _invalid("prompt", "must not be empty")
        prompt = await asyncio.to_thread(svc.engine.tokenizer.encode, raw, True)
        text = raw
    elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        prompt = list(raw)  # the engine checks the ids are in its vocabulary
        text = svc.engine.tokenizer.decode([t for t in prompt if 0 <= t < svc.engine.tokenizer.vocab_size])
    elif isinstance(raw, list) and len(raw) > 1 and not any(isinstance(t, int) for t in raw):
        raise _unsupported("prompt", "a batch of several prompts; send one request per prompt")
    else:
        raise ServiceError("bad_request", "'prompt' must be a non-empty string or array of token ids", param="prompt")
    if body.logprobs is not None and not 0 <= body.logprobs <= 5:
        raise _invalid("logprobs", f"must be in [0, 5], got {body.logprobs}")
    if body.echo and body.logprobs is not None:
        raise _unsupported("echo", "together with 'logprobs' (prompt logprobs are not computed)")
    n = 1 if body.n is None else body.n
    if body.best_of is not None and body.best_of != n:
        raise _unsupported("best_of", "only best_of == n (no server-side ranking)")
    params = await _sampling(
        body, svc, len(prompt), body.max_tokens if body.max_tokens is not None else 16, body.logprobs
    )
    return Call(
        prompt=list(prompt),
        params=params,
        model=model,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        echo_text=text if body.echo else "",
    )

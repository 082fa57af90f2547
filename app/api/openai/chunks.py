"""The OpenAI shim's answers: a whole response, or the chunks of a stream, for chat and for plain completions;
the usage and logprobs they carry, and the model card of /v1/models."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from app.api import tools
from app.api.openai.parse import Call
from app.api.served import OnModel
from app.domain.models import ModelSlot
from engine.types import GenerationEvent, TokenLogprob

encode = msgspec.json.Encoder().encode  # chunks are framed here: one JSON line each, no SSE encoder per token


@dataclass(slots=True)
class Choice:
    """One sample of a response not streamed, gathered."""

    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class Usage:
    """A request's token counts, from its samples' final events."""

    def __init__(self, prompt_len: int) -> None:
        self.prompt = prompt_len
        self.cached = 0
        self.completion = 0
        self.seen_prompt = False

    def add(self, ev: GenerationEvent) -> None:
        if ev.usage is None:
            return
        if not self.seen_prompt:  # samples share the prompt: count it once
            self.prompt, self.cached, self.seen_prompt = ev.usage.prompt_tokens, ev.usage.cached_tokens, True
        self.completion += ev.usage.completion_tokens

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


def _token_text(svc: OnModel, token_id: int) -> str:
    return svc.engine.tokenizer.decode([token_id])


def _chat_logprobs(svc: OnModel, items: list[TokenLogprob], top: int) -> list[dict[str, Any]]:
    out = []
    for lp in items:
        tok = _token_text(svc, lp.token_id)
        alts = [
            {"token": (t := _token_text(svc, tid)), "logprob": v, "bytes": list(t.encode())} for tid, v in lp.top[:top]
        ]
        out.append({"token": tok, "logprob": lp.logprob, "bytes": list(tok.encode()), "top_logprobs": alts})
    return out


def _completion_logprobs(svc: OnModel, items: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens, values, tops, offsets = [], [], [], []
    for lp in items:
        tok = _token_text(svc, lp.token_id)
        tokens.append(tok)
        values.append(lp.logprob)
        tops.append({_token_text(svc, tid): v for tid, v in lp.top})
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


class Format:
    """One route's answers for one call: `response` when not streamed; else `first` (the chunks before any token),
    then `chunk` per engine event (None: nothing to send; `chunk(None)` is the head a usage chunk builds on)."""

    chat: ClassVar[bool]  # chat spells the engine's `logprobs` count `top_logprobs`
    what: ClassVar[str]  # the request's kind, for the log
    id_prefix: ClassVar[str]
    object: ClassVar[str]
    chunk_object: ClassVar[str]

    def __init__(self, svc: OnModel, call: Call) -> None:
        self.svc = svc
        self.call = call
        self.base = {
            "id": f"{self.id_prefix}{call.request_id}",
            "created": int(time.time()),
            "model": call.model,
            "system_fingerprint": None,
        }
        self.usage_null = {"usage": None} if call.include_usage else {}

    def head(self) -> dict[str, Any]:
        return {**self.base, "object": self.chunk_object, **self.usage_null}

    def response(self, choices: list[Choice], usage: Usage) -> dict[str, Any]:
        return {**self.base, "object": self.object, "usage": usage.body(), "choices": self.choices(choices)}

    def choices(self, choices: list[Choice]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def first(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def chunk(self, ev: GenerationEvent | None) -> dict[str, Any] | None:
        raise NotImplementedError


class ChatFormat(Format):
    """/v1/chat/completions: messages and deltas, with tool calls split out of the text when tools are on."""

    chat = True
    what = "chat completion"
    id_prefix = "chatcmpl-"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, svc: OnModel, call: Call) -> None:
        super().__init__(svc, call)
        plan = call.tools
        self.replies = [tools.ToolReply(plan.fmt) for _ in range(call.params.n)] if plan else None

    def _logprobs(self, items: list[TokenLogprob] | None) -> dict[str, Any] | None:
        top = self.call.top_logprobs
        return {"content": _chat_logprobs(self.svc, items or [], top)} if top is not None else None

    def choices(self, choices: list[Choice]) -> list[dict[str, Any]]:
        plan, out = self.call.tools, []
        for i, c in enumerate(choices):
            text, r = "".join(c.text), tools.ToolReply(plan.fmt) if plan else None
            out.append(
                {
                    "index": i,
                    "message": r.message(text) if r else {"role": "assistant", "content": text},
                    "finish_reason": r.finish_reason(c.finish_reason) if r else c.finish_reason,
                    "logprobs": self._logprobs(c.logprobs),
                }
            )
        return out

    def first(self) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [
            {**self.head(), "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]}
            for i in range(self.call.params.n)
        ]

    def chunk(self, ev: GenerationEvent | None) -> dict[str, Any] | None:
        head = self.head()
        if ev is None:
            return head
        delta: dict[str, Any] = {"content": ev.text} if ev.text else {}
        reason = ev.finish_reason
        if self.replies is not None:  # content and tool calls
            reply = self.replies[ev.index]
            delta, reason = reply.delta(ev.text, reason), reply.finish_reason(reason)
        with_lp = self.call.top_logprobs is not None and bool(ev.logprobs)
        if not delta and reason is None and not with_lp:
            return None
        lp = self._logprobs(ev.logprobs) if with_lp else None
        return {**head, "choices": [{"index": ev.index, "delta": delta, "logprobs": lp, "finish_reason": reason}]}


class CompletionFormat(Format):
    """/v1/completions: text (after the echoed prompt) and its logprobs with text offsets."""

    chat = False
    what = "completion"
    id_prefix = "cmpl-"
    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, svc: OnModel, call: Call) -> None:
        super().__init__(svc, call)
        self.want_lp = call.params.logprobs is not None
        self.offsets = [len(call.echo_text)] * call.params.n  # each sample's text so far, for `text_offset`

    def choices(self, choices: list[Choice]) -> list[dict[str, Any]]:
        echo = self.call.echo_text
        return [
            {
                "index": i,
                "text": echo + "".join(c.text),
                "finish_reason": c.finish_reason,
                "logprobs": _completion_logprobs(self.svc, c.logprobs, len(echo)) if self.want_lp else None,
            }
            for i, c in enumerate(choices)
        ]

    def first(self) -> list[dict[str, Any]]:
        echo = self.call.echo_text
        if not echo:
            return []
        return [
            {**self.head(), "choices": [{"index": i, "text": echo, "logprobs": None, "finish_reason": None}]}
            for i in range(self.call.params.n)
        ]

    def chunk(self, ev: GenerationEvent | None) -> dict[str, Any] | None:
        head = self.head()
        if ev is None:
            return head
        if not ev.text and ev.finish_reason is None:
            return None
        lp = None
        if self.want_lp:
            lp = _completion_logprobs(self.svc, ev.logprobs or [], self.offsets[ev.index])
        self.offsets[ev.index] += len(ev.text)
        return {
            **head,
            "choices": [{"index": ev.index, "text": ev.text, "logprobs": lp, "finish_reason": ev.finish_reason}],
        }


def model_card(slot: ModelSlot, created: float) -> dict[str, Any]:
    """One served model as /v1/models lists it: what is known of it before it loads, the rest once loaded."""
    card: dict[str, Any] = {
        "id": slot.id,
        "object": "model",
        "created": int(created),
        "owned_by": "forge",
        "state": slot.state,
    }
    engine = slot.engine
    if engine is not None:
        info = engine.model_info
        card.update(
            max_model_len=int(engine.max_context),
            quantization=info.get("quant"),
            backend=info.get("backend"),
            tool_format=engine.tool_format.name,
        )
    return card

"""OpenAI-compatible shim: /v1/chat/completions, /v1/completions, /v1/models (stateless).

Every parameter is either honoured or refused with a 400 naming it; nothing is silently ignored.
Prefix reuse still applies across requests: the engine's cache keys on token ids, not on sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from app.api import tools
from app.api.gate import owner
from app.api.openai_bodies import ChatRequest, CompletionRequest, Sampling
from app.api.openapi import BODY, GENERATION, KEYED, JsonOrEvents, errors
from app.api.outbox import Outbox
from app.api.response_format import compile_response_format
from app.api.sse import with_keepalives
from app.api.state import Ready
from app.domain.defaults import openai_defaults
from app.domain.errors import ServiceError
from engine.types import EngineOverloaded, GenerationRequest, InvalidRequest, SamplingParams

log = logging.getLogger("forge.openai")


def _unsupported(name: str, why: str) -> ServiceError:
    return ServiceError("unsupported_parameter", f"'{name}' is not supported by Forge: {why}", param=name)


def _invalid(name: str, why: str) -> ServiceError:
    return ServiceError("invalid_parameter", f"'{name}' {why}", param=name)


@dataclass(slots=True)
class _Call:
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


def _model_id(svc: Ready) -> str:
    return str(svc.engine.model_info.get("name") or "default")


def _check_model(model: str, svc: Ready) -> str:
    served = _model_id(svc)
    if model not in (served, "default"):
        raise ServiceError(
            "model_not_found", f"the model '{model}' does not exist; this server serves '{served}'", param="model"
        )
    return served


async def _sampling(
    body: Sampling, svc: Ready, prompt_len: int, max_tokens: int | None, logprobs: int | None
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


async def _parse_chat(body: ChatRequest, svc: Ready) -> _Call:
    model = _check_model(body.model, svc)
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
    if plan is not None and plan.grammar is not None:
        params.response_format = plan.grammar
    return _Call(
        prompt=list(prompt),
        params=params,
        model=model,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        top_logprobs=logprobs,
        tools=plan if plan and plan.grammar else None,
    )  # tool_choice "none": the reply is text


async def _parse_completion(body: CompletionRequest, svc: Ready) -> _Call:
    model = _check_model(body.model, svc)
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
    return _Call(
        prompt=list(prompt),
        params=params,
        model=model,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        echo_text=text if body.echo else "",
    )


# -- running against the engine -------------------------------------------------------------


class _Job:
    """An engine request pumped into a bounded outbox by its own task (so a slow reader can time out and
    send keep-alives without cancelling the engine stream; a stalled one has its request aborted).
    `enter` takes its place in admission (app/admission.py; True when admitted at once, else `wait`), `start`
    hands it to the engine (both raise a ServiceError); `cancel` aborts it or leaves the queue."""

    def __init__(self, svc: Ready, call: _Call, owner_id: str, chat: bool) -> None:
        self.svc = svc
        self.chat = chat  # chat spells the engine's `logprobs` count `top_logprobs`
        self.owner = owner_id
        self.req = GenerationRequest(prompt_token_ids=call.prompt, params=call.params, request_id=call.request_id)
        self.outbox = Outbox(svc.settings.outbox_events, svc.settings.outbox_bytes, self.cancel)
        self.task: asyncio.Task | None = None
        self.ticket: Any = None

    def enter(self) -> bool:
        self.ticket = self.svc.chat.enter(self.owner, self.req.params.n)
        return self.ticket.granted

    async def wait(self) -> None:
        await self.svc.chat.wait(self.ticket)

    def start(self) -> None:
        assert self.ticket is not None and self.ticket.granted, "start() follows admission"
        try:
            gen = self.svc.engine.generate(self.req)
        except Exception as e:
            self.svc.chat.release(self.ticket)
            raise _engine_error(e, self.chat) from None
        self.tracker = self.svc.metrics.tracker("openai")
        self.task = asyncio.create_task(self._pump(gen), name=f"openai-{self.req.request_id}")

    async def _pump(self, gen: Any) -> None:
        try:
            async for ev in gen:
                self.tracker.observe(ev)
                self.outbox.put(ev)
        except Exception as e:
            self.outbox.put(e)
        finally:
            await gen.aclose()
            self.tracker.close()
            self.svc.chat.release(self.ticket)
            self.outbox.put(None)

    def cancel(self) -> None:
        # An abort, not task.cancel(): the pump then ends on the engine's final event and always cleans up.
        if self.task is not None:
            if not self.task.done():
                self.svc.engine.abort(self.req.request_id)
        elif self.ticket is not None:  # never started: leave the queue, or give back what was granted
            self.svc.chat.release(self.ticket)


def _engine_error(e: Exception, chat: bool = False) -> ServiceError:
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, EngineOverloaded):
        return ServiceError("overloaded", f"the server is overloaded: {e}")
    if isinstance(e, InvalidRequest):
        if e.param == "logprobs" and chat:
            return ServiceError("invalid_parameter", f"top_{e}", param="top_logprobs")
        return ServiceError("invalid_parameter", str(e), param=e.param)
    log.error("generation failed: %r", e)
    return ServiceError("internal", "generation failed")


@dataclass(slots=True)
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None


class _Usage:
    def __init__(self, prompt_len: int) -> None:
        self.prompt = prompt_len
        self.cached = 0
        self.completion = 0
        self.seen_prompt = False

    def add(self, ev: Any) -> None:
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


def _token_text(svc: Ready, token_id: int) -> str:
    return svc.engine.tokenizer.decode([token_id])


def _chat_logprobs(svc: Ready, items: list[Any], top: int) -> list[dict[str, Any]]:
    out = []
    for lp in items:
        tok = _token_text(svc, lp.token_id)
        alts = [
            {"token": (t := _token_text(svc, tid)), "logprob": v, "bytes": list(t.encode())} for tid, v in lp.top[:top]
        ]
        out.append({"token": tok, "logprob": lp.logprob, "bytes": list(tok.encode()), "top_logprobs": alts})
    return out


def _completion_logprobs(svc: Ready, items: list[Any], offset: int) -> dict[str, Any]:
    tokens, values, tops, offsets = [], [], [], []
    for lp in items:
        tok = _token_text(svc, lp.token_id)
        tokens.append(tok)
        values.append(lp.logprob)
        tops.append({_token_text(svc, tid): v for tid, v in lp.top})
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


async def _watch_disconnect(request: Request, job: _Job) -> None:
    """Cancel `job` when the client goes away (the body has been read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    log.debug("client left; aborting %s", job.req.request_id)
    job.cancel()


def _generation_failed(item: Any) -> ServiceError:
    log.error("generation %s failed: %s", item.request_id, item.error)
    return ServiceError("internal", "generation failed")  # the engine's detail stays in the log


async def _collect(request: Request, job: _Job, n: int) -> tuple[list[_Choice], _Usage]:
    choices = [_Choice() for _ in range(n)]
    usage = _Usage(len(job.req.prompt_token_ids))
    admitted = job.enter()
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        if not admitted:  # wait in the queue (a 503 past the deadline) unless the client leaves first
            waiting = asyncio.ensure_future(job.wait())
            await asyncio.wait({waiting, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                raise ServiceError("bad_request", "the client went away while waiting")  # nobody reads it
            waiting.result()
        job.start()
        while (item := await job.outbox.get()) is not None:
            if isinstance(item, Exception):
                raise _engine_error(item)
            c = choices[item.index]
            c.text.append(item.text)
            if item.logprobs:
                c.logprobs.extend(item.logprobs)
            if item.finish_reason is not None:
                if item.finish_reason == "error":
                    raise _generation_failed(item)
                c.finish_reason = item.finish_reason
                usage.add(item)
    finally:
        watcher.cancel()
        job.cancel()
    return choices, usage


_KEEPALIVE = b": keep-alive\r\n\r\n"  # a comment line, never an empty `data:` (the openai client fails on one)
_SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}
_encode = msgspec.json.Encoder().encode  # chunks are framed here: one JSON line each, no SSE encoder per token


def _sse(job: _Job, stream: AsyncIterator[bytes | None]) -> Stream:
    async def events() -> AsyncIterator[bytes]:
        async for data in stream:
            yield _KEEPALIVE if data is None else b"data: " + data + b"\r\n\r\n"

    async def after() -> None:  # runs once the response is over, however it ended (a client gone early too)
        job.cancel()

    return Stream(events(), media_type="text/event-stream", headers=_SSE_HEADERS, background=BackgroundTask(after))


async def _admitted(job: _Job, keepalive_s: float) -> AsyncIterator[None]:
    """For a job waiting in the admission queue: a None (a keep-alive comment) every `keepalive_s` until it
    is admitted, then start it. Raises ServiceError (the deadline passed, the engine refused it); leaving
    early leaves the queue."""
    waiting = asyncio.ensure_future(job.wait())
    try:
        while not (await asyncio.wait({waiting}, timeout=keepalive_s))[0]:
            yield None
        waiting.result()
        job.start()
    finally:
        waiting.cancel()


async def _stream_chunks(
    job: _Job, call: _Call, keepalive_s: float, make_chunk: Any, first: list[bytes] | None
) -> AsyncIterator[bytes | None]:
    """JSON chunks for an OpenAI stream of a job that is started, or waits to be admitted (keep-alives until
    then; the refusal as an error chunk past the deadline); None for a keep-alive comment. Leaving early
    aborts it."""
    usage = _Usage(len(call.prompt))
    failed = False
    try:
        if job.task is None:
            try:
                async for _ in _admitted(job, keepalive_s):
                    yield None
            except ServiceError as e:
                yield _encode(e.body())
                yield b"[DONE]"
                return
        for data in first or []:
            yield data
        async for item in with_keepalives(job.outbox, keepalive_s):
            if item is None:
                yield None
                continue
            if isinstance(item, Exception) or item.finish_reason == "error":
                err = _engine_error(item) if isinstance(item, Exception) else _generation_failed(item)
                yield _encode(err.body())
                failed = True
                break
            chunk = make_chunk(item)
            if chunk is not None:
                yield _encode(chunk)
            if item.finish_reason is not None:
                usage.add(item)
        if call.include_usage and not failed:
            yield _encode({**make_chunk(None), "choices": [], "usage": usage.body()})
        yield b"[DONE]"
    finally:
        job.cancel()


@post(
    "/chat/completions",
    status_code=200,
    responses=errors(*KEYED, *BODY, *GENERATION, 404),
    operation_class=JsonOrEvents,
)
async def chat_completions(request: Request, svc: NamedDependency[Ready], data: JSONBody[ChatRequest]) -> Response:
    """Chat completion; with `stream`, SSE chunks ending in `data: [DONE]`. Refusals come before any byte."""
    call = await _parse_chat(data, svc)
    if data.user:
        log.info("chat completion %s for user %r", call.request_id, data.user)
    job = _Job(svc, call, owner(request.scope), chat=True)
    cid, created = f"chatcmpl-{call.request_id}", int(time.time())
    base = {"id": cid, "created": created, "model": call.model, "system_fingerprint": None}
    if not call.stream:
        choices, usage = await _collect(request, job, call.params.n)
        tool_replies = [tools.ToolReply(call.tools.fmt) if call.tools else None for _ in choices]
        return Response(
            {
                **base,
                "object": "chat.completion",
                "usage": usage.body(),
                "choices": [
                    {
                        "index": i,
                        "message": r.message("".join(c.text))
                        if r
                        else {"role": "assistant", "content": "".join(c.text)},
                        "finish_reason": r.finish_reason(c.finish_reason) if r else c.finish_reason,
                        "logprobs": {"content": _chat_logprobs(svc, c.logprobs, call.top_logprobs)}
                        if call.top_logprobs is not None
                        else None,
                    }
                    for (i, c), r in zip(enumerate(choices), tool_replies)
                ],
            }
        )

    usage_null = {"usage": None} if call.include_usage else {}
    replies = [tools.ToolReply(call.tools.fmt) for _ in range(call.params.n)] if call.tools else None

    def chunk(ev: Any) -> dict[str, Any] | None:
        head = {**base, "object": "chat.completion.chunk", **usage_null}
        if ev is None:
            return head
        delta = {"content": ev.text} if ev.text else {}
        reason = ev.finish_reason
        if replies is not None:  # content and tool calls
            delta, reason = replies[ev.index].delta(ev.text, reason), replies[ev.index].finish_reason(reason)
        if not delta and reason is None and not (call.top_logprobs is not None and ev.logprobs):
            return None
        lp = None
        if call.top_logprobs is not None and ev.logprobs:
            lp = {"content": _chat_logprobs(svc, ev.logprobs, call.top_logprobs)}
        return {**head, "choices": [{"index": ev.index, "delta": delta, "logprobs": lp, "finish_reason": reason}]}

    first = [
        _encode(
            {
                **base,
                "object": "chat.completion.chunk",
                **usage_null,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
        )
        for i in range(call.params.n)
    ]
    if job.enter():  # admitted at once: the engine's refusals are still an HTTP status
        job.start()
    return _sse(job, _stream_chunks(job, call, svc.settings.keepalive_s, chunk, first))


@post("/completions", status_code=200, responses=errors(*KEYED, *BODY, *GENERATION, 404), operation_class=JsonOrEvents)
async def completions(request: Request, svc: NamedDependency[Ready], data: JSONBody[CompletionRequest]) -> Response:
    """Plain text completion; with `stream`, SSE chunks ending in `data: [DONE]`."""
    call = await _parse_completion(data, svc)
    if data.user:
        log.info("completion %s for user %r", call.request_id, data.user)
    job = _Job(svc, call, owner(request.scope), chat=False)
    base = {
        "id": f"cmpl-{call.request_id}",
        "created": int(time.time()),
        "model": call.model,
        "system_fingerprint": None,
    }
    want_lp = call.params.logprobs is not None
    if not call.stream:
        choices, usage = await _collect(request, job, call.params.n)
        return Response(
            {
                **base,
                "object": "text_completion",
                "usage": usage.body(),
                "choices": [
                    {
                        "index": i,
                        "text": call.echo_text + "".join(c.text),
                        "finish_reason": c.finish_reason,
                        "logprobs": _completion_logprobs(svc, c.logprobs, len(call.echo_text)) if want_lp else None,
                    }
                    for i, c in enumerate(choices)
                ],
            }
        )

    usage_null = {"usage": None} if call.include_usage else {}
    offsets = [len(call.echo_text)] * call.params.n

    def chunk(ev: Any) -> dict[str, Any] | None:
        head = {**base, "object": "text_completion", **usage_null}
        if ev is None:
            return head
        if not ev.text and ev.finish_reason is None:
            return None
        lp = None
        if want_lp:
            lp = _completion_logprobs(svc, ev.logprobs or [], offsets[ev.index])
        offsets[ev.index] += len(ev.text)
        return {
            **head,
            "choices": [{"index": ev.index, "text": ev.text, "logprobs": lp, "finish_reason": ev.finish_reason}],
        }

    first = None
    if call.echo_text:
        first = [
            _encode(
                {
                    **base,
                    "object": "text_completion",
                    **usage_null,
                    "choices": [{"index": i, "text": call.echo_text, "logprobs": None, "finish_reason": None}],
                }
            )
            for i in range(call.params.n)
        ]
    if job.enter():  # admitted at once: the engine's refusals are still an HTTP status
        job.start()
    return _sse(job, _stream_chunks(job, call, svc.settings.keepalive_s, chunk, first))


def _model_card(svc: Ready) -> dict[str, Any]:
    info = svc.engine.model_info
    return {
        "id": _model_id(svc),
        "object": "model",
        "created": int(svc.started_at),
        "owned_by": "forge",
        "max_model_len": int(svc.engine.max_context),
        "quantization": info.get("quant"),
        "backend": info.get("backend"),
        "tool_format": svc.engine.tool_format.name,
    }


@get("/models", responses=errors(*KEYED))
async def list_models(svc: NamedDependency[Ready]) -> dict[str, Any]:
    """The one model served."""
    return {"object": "list", "data": [_model_card(svc)]}


@get("/models/{model_id:path}", responses=errors(*KEYED, 404))
async def read_model(svc: NamedDependency[Ready], model_id: FromPath[str]) -> dict[str, Any]:
    """The served model's card (`default` is an alias)."""
    model_id = model_id.lstrip("/")
    if model_id not in (_model_id(svc), "default"):
        raise ServiceError("model_not_found", f"the model '{model_id}' does not exist", param="model")
    return _model_card(svc)


router = Router(path="/v1", route_handlers=[chat_completions, completions, list_models, read_model])

"""OpenAI-compatible shim: /v1/chat/completions, /v1/completions, /v1/models (stateless).

Every parameter is either honoured or refused with a 400 naming it; nothing is silently ignored.
Prefix reuse still applies across requests: the engine's cache keys on token ids, not on sessions.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.params import FromPath
from litestar.response import ServerSentEvent, ServerSentEventMessage

from engine.types import EngineOverloaded, GenerationRequest, InvalidRequest, SamplingParams

from app.api.errors import ServiceError
from app.api.fields import get_int, get_number, json_body, json_type
from app.api.response_format import compile_response_format, parse_response_format, parse_speculative
from app.api.sse import keepalive, with_keepalives
from app.api.state import Services, api_key_guard, ready_services
from app.chat import aclose_stream

log = logging.getLogger("forge.openai")

_SAMPLING_KEYS = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                  "frequency_penalty", "logit_bias", "logprobs", "user", "stream", "stream_options", "response_format",
                  # Forge extensions the engine honours (vLLM spells the first three the same way)
                  "top_k", "min_p", "repetition_penalty", "speculative"}
CHAT_KEYS = frozenset(_SAMPLING_KEYS | {"messages", "max_completion_tokens", "top_logprobs"})
COMPLETION_KEYS = frozenset(_SAMPLING_KEYS | {"prompt", "echo", "best_of"})
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP = 16


def _unsupported(name: str, why: str = "") -> ServiceError:
    return ServiceError("unsupported_parameter", f"'{name}' is not supported by Forge{': ' + why if why else ''}",
                        param=name)


def _invalid(name: str, why: str) -> ServiceError:
    return ServiceError("invalid_parameter", f"'{name}' {why}", param=name)


def _given(body: dict[str, Any], key: str) -> bool:
    return body.get(key) is not None  # null means "not given", as OpenAI treats it


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    if not _given(body, key):
        return default
    v = body[key]
    if not isinstance(v, bool):
        raise ServiceError("bad_request", f"'{key}' must be a boolean, got {json_type(v)}", param=key)
    return v


def _ranged(body: dict[str, Any], key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    if not _given(body, key):
        return default
    v = get_number(body[key], key)
    if v > hi or v < lo or (lo_open and v == lo):
        raise _invalid(key, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v:g}")
    return v


def _int_at_least(body: dict[str, Any], key: str, lo: int) -> int | None:
    if not _given(body, key):
        return None
    v = get_int(body[key], key)
    if v < lo:
        raise _invalid(key, f"must be >= {lo}, got {v}")
    return v


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
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


def _model_id(svc: Services) -> str:
    return str(svc.engine.model_info.get("name") or "default")


def _check_model(body: dict[str, Any], svc: Services) -> str:
    model = body.get("model")
    if model is None:
        raise ServiceError("bad_request", "'model' is required", param="model")
    if not isinstance(model, str):
        raise ServiceError("bad_request", f"'model' must be a string, got {json_type(model)}", param="model")
    served = _model_id(svc)
    if model not in (served, "default"):
        raise ServiceError("model_not_found", f"the model '{model}' does not exist; this server serves '{served}'",
                           param="model")
    return served


def _sampling(body: dict[str, Any], svc: Services, prompt_len: int, max_tokens: int | None,
              logprobs: int | None) -> SamplingParams:
    room = int(svc.engine.max_context) - prompt_len
    if room < 1:
        raise ServiceError("context_length_exceeded", f"the prompt is {prompt_len} tokens; this model's maximum context "
                           f"length is {svc.engine.max_context} tokens", param="messages" if "messages" in body else "prompt")
    if max_tokens is not None and max_tokens > room:
        raise ServiceError("context_length_exceeded", f"this model's maximum context length is {svc.engine.max_context} "
                           f"tokens; you requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                           f"{max_tokens} for the completion)", param="max_tokens")
    stop: list[str] = []
    if _given(body, "stop"):
        raw = body["stop"]
        stop = [raw] if isinstance(raw, str) else raw
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ServiceError("bad_request", "'stop' must be a string or an array of strings", param="stop")
        if len(stop) > MAX_STOP or not all(stop):
            raise _invalid("stop", f"must hold at most {MAX_STOP} non-empty strings")
    bias: dict[int, float] = {}
    if _given(body, "logit_bias"):
        raw_bias = body["logit_bias"]
        if not isinstance(raw_bias, dict):
            raise ServiceError("bad_request", f"'logit_bias' must be an object, got {json_type(raw_bias)}", param="logit_bias")
        for k, v in raw_bias.items():
            try:
                tok = int(k)
            except ValueError:
                raise _invalid("logit_bias", f"keys must be token ids, got {k!r}") from None
            bias[tok] = get_number(v, f"logit_bias.{k}")
    seed = None
    if _given(body, "seed"):
        seed = get_int(body["seed"], "seed")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ServiceError("bad_request", f"'user' must be a string, got {json_type(user)}", param="user")
    params = SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else room,
        temperature=_ranged(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_ranged(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        n=get_int(body["n"], "n") if _given(body, "n") else 1,
        presence_penalty=_ranged(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_ranged(body, "frequency_penalty", 0.0, -2.0, 2.0),
        top_k=_int_at_least(body, "top_k", 0) or 0,
        min_p=_ranged(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_ranged(body, "repetition_penalty", 1.0, 0.0, 10.0, lo_open=True),
        logit_bias=bias, seed=seed, stop=stop, logprobs=logprobs,
        response_format=parse_response_format(body.get("response_format")),
        speculative=parse_speculative(body.get("speculative")),
    )
    try:
        params.validate(int(svc.engine.model_info.get("vocab_size", 1 << 31)))
    except InvalidRequest as e:
        raise ServiceError("invalid_parameter", str(e), param=e.param) from None
    return params


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    include_usage = False
    if _given(body, "stream_options"):
        opts = body["stream_options"]
        if not stream:
            raise _invalid("stream_options", "is only allowed when 'stream' is true")
        if not isinstance(opts, dict):
            raise ServiceError("bad_request", f"'stream_options' must be an object, got {json_type(opts)}",
                               param="stream_options")
        for key, value in opts.items():
            if key != "include_usage" and value is not None:
                raise _unsupported(f"stream_options.{key}")
        include_usage = _bool(opts, "include_usage")
    return stream, include_usage


def _check_keys(body: dict[str, Any], allowed: frozenset[str]) -> None:
    for key, value in body.items():
        if key not in allowed and value is not None:  # null means "not given", for unknown keys too
            raise _unsupported(key)


def _chat_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise ServiceError("bad_request", "'messages' must be a non-empty array", param="messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ServiceError("bad_request", f"'{where}' must be an object, got {json_type(m)}", param=where)
        for key, value in m.items():
            if key not in ("role", "content") and value is not None:
                raise _unsupported(f"{where}.{key}")
        role = m.get("role")
        if not isinstance(role, str):
            raise ServiceError("bad_request", f"'{where}.role' is required and must be a string", param=f"{where}.role")
        if role not in CHAT_ROLES:
            if role in ("tool", "function"):
                raise _unsupported(f"{where}.role", f"role '{role}' (tool calls) is not available")
            raise _invalid(f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                pwhere = f"{where}.content[{j}]"
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else json_type(part)
                    raise _unsupported(f"{pwhere}.type", f"only text parts are accepted, got {kind!r}")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ServiceError("bad_request", f"'{where}.content' must be a string or an array of text parts",
                               param=f"{where}.content")
        out.append({"role": CHAT_ROLES[role], "content": content})
    return out


def _parse_chat(body: dict[str, Any], svc: Services) -> _Call:
    _check_keys(body, CHAT_KEYS)
    model = _check_model(body, svc)
    messages = _chat_messages(body.get("messages"))
    stream, include_usage = _stream_flags(body)
    max_tokens = _int_at_least(body, "max_tokens", 1)
    mct = _int_at_least(body, "max_completion_tokens", 1)
    if max_tokens is not None and mct is not None and max_tokens != mct:
        raise _invalid("max_completion_tokens", "and 'max_tokens' disagree; give one of them")
    logprobs_on = _bool(body, "logprobs")
    top = _int_at_least(body, "top_logprobs", 0)
    if top is not None and top > 20:
        raise _invalid("top_logprobs", f"must be in [0, 20], got {top}")
    if top is not None and not logprobs_on:
        raise _invalid("top_logprobs", "requires 'logprobs': true")
    try:
        prompt = list(svc.engine.render_chat(messages, add_generation_prompt=True))
    except ValueError as e:
        raise _invalid("messages", f"were refused by the model's chat template: {e}") from None
    params = _sampling(body, svc, len(prompt), mct if mct is not None else max_tokens,
                       (top or 0) if logprobs_on else None)
    svc.chat.check_capacity()  # a 503 now, not an error in the middle of a stream
    return _Call(prompt=prompt, params=params, model=model, stream=stream, include_usage=include_usage,
                 top_logprobs=(top or 0) if logprobs_on else None)


def _parse_completion(body: dict[str, Any], svc: Services) -> _Call:
    _check_keys(body, COMPLETION_KEYS)
    model = _check_model(body, svc)
    raw = body.get("prompt")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        if not raw:
            raise _invalid("prompt", "must not be empty")
        prompt = list(svc.engine.tokenizer.encode(raw, add_special=True))
        text = raw
    elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        vocab = int(svc.engine.model_info.get("vocab_size", 1 << 31))
        bad = next((t for t in raw if not 0 <= t < vocab), None)
        if bad is not None:
            raise _invalid("prompt", f"token id {bad} is not in [0, {vocab})")
        prompt = list(raw)
        text = svc.engine.tokenizer.decode(prompt)
    elif isinstance(raw, list) and len(raw) > 1:
        raise _unsupported("prompt", "a batch of several prompts; send one request per prompt")
    else:
        raise ServiceError("bad_request", "'prompt' is required: a string or an array of token ids", param="prompt")
    stream, include_usage = _stream_flags(body)
    max_tokens = _int_at_least(body, "max_tokens", 1)
    logprobs = _int_at_least(body, "logprobs", 0)
    if logprobs is not None and logprobs > 5:
        raise _invalid("logprobs", f"must be in [0, 5], got {logprobs}")
    echo = _bool(body, "echo")
    if echo and logprobs is not None:
        raise _unsupported("echo", "together with 'logprobs' (prompt logprobs are not computed)")
    n = get_int(body["n"], "n") if _given(body, "n") else 1
    if _given(body, "best_of") and get_int(body["best_of"], "best_of") != n:
        raise _unsupported("best_of", "only best_of == n (no server-side ranking)")
    params = _sampling(body, svc, len(prompt), max_tokens if max_tokens is not None else 16, logprobs)
    svc.chat.check_capacity()
    return _Call(prompt=prompt, params=params, model=model, stream=stream, include_usage=include_usage,
                 echo_text=text if echo else "")


# -- running against the engine -------------------------------------------------------------


class _Job:
    """An engine request pumped into a queue by its own task (so a slow reader can time out and send
    keep-alives without cancelling the engine stream). Nothing runs before `start`; `cancel` aborts it."""

    def __init__(self, svc: Services, call: _Call, api: str) -> None:
        self.svc = svc
        self.engine = svc.engine
        self.api = api
        self.req = GenerationRequest(prompt_token_ids=call.prompt, params=call.params, request_id=call.request_id)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.tracker = self.svc.metrics.tracker(self.api)
        self.task = asyncio.create_task(self._pump(), name=f"openai-{self.req.request_id}")

    async def _pump(self) -> None:
        gen: Any = None
        try:
            gen = self.engine.generate(self.req)
            try:
                async for ev in gen:
                    self.tracker.observe(ev)
                    self.queue.put_nowait(ev)
            finally:
                await aclose_stream(gen)
        except Exception as e:
            self.queue.put_nowait(e)
        finally:
            self.tracker.close()
            self.queue.put_nowait(None)

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.engine.abort(self.req.request_id)
            self.task.cancel()


def _engine_error(e: Exception) -> ServiceError:
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, EngineOverloaded):
        return ServiceError("overloaded", f"the server is overloaded: {e}")
    if isinstance(e, InvalidRequest):
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
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion,
                "prompt_tokens_details": {"cached_tokens": self.cached}}


def _token_text(svc: Services, token_id: int) -> str:
    return svc.engine.tokenizer.decode([token_id])


def _chat_logprobs(svc: Services, items: list[Any], top: int) -> list[dict[str, Any]]:
    out = []
    for lp in items:
        tok = _token_text(svc, lp.token_id)
        alts = [{"token": (t := _token_text(svc, tid)), "logprob": v, "bytes": list(t.encode())}
                for tid, v in lp.top[:top]]
        out.append({"token": tok, "logprob": lp.logprob, "bytes": list(tok.encode()), "top_logprobs": alts})
    return out


def _completion_logprobs(svc: Services, items: list[Any], offset: int) -> dict[str, Any]:
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
    job.start()
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    try:
        while (item := await job.queue.get()) is not None:
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


def _sse(stream: AsyncIterator[str | None]) -> ServerSentEvent:
    async def events() -> AsyncIterator[ServerSentEventMessage]:
        async for data in stream:
            yield keepalive() if data is None else ServerSentEventMessage(data=data)

    return ServerSentEvent(events())


async def _stream_chunks(job: _Job, call: _Call, keepalive_s: float, make_chunk: Any,
                         first: list[str] | None) -> AsyncIterator[str | None]:
    """JSON chunks for an OpenAI stream; None for a keep-alive comment. The job starts with the body
    (a client gone before it never costs a generation); leaving early aborts it."""
    usage = _Usage(len(call.prompt))
    failed = False
    job.start()
    try:
        for data in first or []:
            yield data
        async for item in with_keepalives(job.queue, keepalive_s):
            if item is None:
                yield None
                continue
            if isinstance(item, Exception) or item.finish_reason == "error":
                err = _engine_error(item) if isinstance(item, Exception) else _generation_failed(item)
                yield json.dumps(err.body())
                failed = True
                break
            chunk = make_chunk(item)
            if chunk is not None:
                yield json.dumps(chunk, ensure_ascii=False)
            if item.finish_reason is not None:
                usage.add(item)
        if call.include_usage and not failed:
            yield json.dumps({**make_chunk(None), "choices": [], "usage": usage.body()})
        yield "[DONE]"
    finally:
        job.cancel()


@post("/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Response:
    svc = ready_services(request)
    body = await json_body(request)
    call = _parse_chat(body, svc)
    await compile_response_format(svc.engine, call.params.response_format)
    if body.get("user"):
        log.info("chat completion %s for user %r", call.request_id, body["user"])
    job = _Job(svc, call, "openai")
    cid, created = f"chatcmpl-{call.request_id}", int(time.time())
    base = {"id": cid, "created": created, "model": call.model, "system_fingerprint": None}
    if not call.stream:
        choices, usage = await _collect(request, job, call.params.n)
        return Response({**base, "object": "chat.completion", "usage": usage.body(), "choices": [
            {"index": i, "message": {"role": "assistant", "content": "".join(c.text)}, "finish_reason": c.finish_reason,
             "logprobs": {"content": _chat_logprobs(svc, c.logprobs, call.top_logprobs)}
             if call.top_logprobs is not None else None}
            for i, c in enumerate(choices)]})

    usage_null = {"usage": None} if call.include_usage else {}

    def chunk(ev: Any) -> dict[str, Any] | None:
        head = {**base, "object": "chat.completion.chunk", **usage_null}
        if ev is None:
            return head
        if not ev.text and ev.finish_reason is None and not (call.top_logprobs is not None and ev.logprobs):
            return None
        delta = {"content": ev.text} if ev.text else {}
        lp = None
        if call.top_logprobs is not None and ev.logprobs:
            lp = {"content": _chat_logprobs(svc, ev.logprobs, call.top_logprobs)}
        return {**head, "choices": [{"index": ev.index, "delta": delta, "logprobs": lp,
                                     "finish_reason": ev.finish_reason}]}

    first = [json.dumps({**base, "object": "chat.completion.chunk", **usage_null, "choices": [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
        for i in range(call.params.n)]
    return _sse(_stream_chunks(job, call, svc.settings.keepalive_s, chunk, first))


@post("/completions", status_code=200)
async def completions(request: Request) -> Response:
    svc = ready_services(request)
    body = await json_body(request)
    call = _parse_completion(body, svc)
    await compile_response_format(svc.engine, call.params.response_format)
    if body.get("user"):
        log.info("completion %s for user %r", call.request_id, body["user"])
    job = _Job(svc, call, "openai")
    base = {"id": f"cmpl-{call.request_id}", "created": int(time.time()), "model": call.model,
            "system_fingerprint": None}
    want_lp = call.params.logprobs is not None
    if not call.stream:
        choices, usage = await _collect(request, job, call.params.n)
        return Response({**base, "object": "text_completion", "usage": usage.body(), "choices": [
            {"index": i, "text": call.echo_text + "".join(c.text), "finish_reason": c.finish_reason,
             "logprobs": _completion_logprobs(svc, c.logprobs, len(call.echo_text)) if want_lp else None}
            for i, c in enumerate(choices)]})

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
        return {**head, "choices": [{"index": ev.index, "text": ev.text, "logprobs": lp,
                                     "finish_reason": ev.finish_reason}]}

    first = None
    if call.echo_text:
        first = [json.dumps({**base, "object": "text_completion", **usage_null, "choices": [
            {"index": i, "text": call.echo_text, "logprobs": None, "finish_reason": None}]})
            for i in range(call.params.n)]
    return _sse(_stream_chunks(job, call, svc.settings.keepalive_s, chunk, first))


def _model_card(svc: Services) -> dict[str, Any]:
    info = svc.engine.model_info
    return {"id": _model_id(svc), "object": "model", "created": int(svc.started_at), "owned_by": "forge",
            "max_model_len": int(svc.engine.max_context), "quantization": info.get("quant"),
            "backend": info.get("backend")}


@get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    svc = ready_services(request)
    return {"object": "list", "data": [_model_card(svc)]}


@get("/models/{model_id:path}")
async def read_model(request: Request, model_id: FromPath[str]) -> dict[str, Any]:
    svc = ready_services(request)
    model_id = model_id.lstrip("/")
    if model_id not in (_model_id(svc), "default"):
        raise ServiceError("model_not_found", f"the model '{model_id}' does not exist", param="model")
    return _model_card(svc)


router = Router(path="/v1", route_handlers=[chat_completions, completions, list_models, read_model],
                guards=[api_key_guard])

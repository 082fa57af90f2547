"""The /v1 routes: chat and plain completions through one shape (parse → run → format), and the model list."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from app.api.gate import owner
from app.api.openai.chunks import ChatFormat, CompletionFormat, Format, model_card
from app.api.openai.job import Job, collect, stream_chunks
from app.api.openai.parse import Call, parse_chat, parse_completion
from app.api.openai_bodies import ChatRequest, CompletionRequest
from app.api.openapi import BODY, GENERATION, KEYED, JsonOrEvents, errors
from app.api.served import OnModel, on_model
from app.api.state import Ready

log = logging.getLogger("forge.openai")

Parse = Callable[[Any, OnModel], Awaitable[Call]]  # a body on its model -> a checked call

_KEEPALIVE = b": keep-alive\r\n\r\n"  # a comment line, never an empty `data:` (the openai client fails on one)
_SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


def _sse(job: Job, stream: AsyncIterator[bytes | None]) -> Stream:
    async def events() -> AsyncIterator[bytes]:
        async for data in stream:
            yield _KEEPALIVE if data is None else b"data: " + data + b"\r\n\r\n"

    async def after() -> None:  # runs once the response is over, however it ended (a client gone early too)
        job.cancel()

    return Stream(events(), media_type="text/event-stream", headers=_SSE_HEADERS, background=BackgroundTask(after))


async def _respond(
    request: Request, svc: Ready, body: ChatRequest | CompletionRequest, parse: Parse, shape: type[Format]
) -> Response:
    """Parse `body` on the model it names and run it: the model is held until the generation ends (a refusal
    before it starts lets it go)."""
    on = await on_model(svc, body.model)
    try:
        return await _run(request, on, await parse(body, on), shape, body.user)
    except BaseException:
        on.lease.release()  # a started job lets it go itself when its generation ends
        raise


async def _run(request: Request, svc: OnModel, call: Call, shape: type[Format], user: str | None) -> Response:
    """Run `call` and answer in `shape`: the whole response, or (with `stream`) SSE chunks ending in `[DONE]`."""
    if user:
        log.info("%s %s for user %r", shape.what, call.request_id, user)
    job = Job(svc, call, owner(request.scope), chat=shape.chat)
    fmt = shape(svc, call)
    if not call.stream:
        choices, usage = await collect(request, job, call.params.n)
        return Response(fmt.response(choices, usage))
    first = fmt.first()
    if job.enter():  # admitted at once: the engine's refusals are still an HTTP status
        job.start()
    return _sse(job, stream_chunks(job, call, svc.settings.keepalive_s, fmt.chunk, first))


@post(
    "/chat/completions",
    status_code=200,
    responses=errors(*KEYED, *BODY, *GENERATION, 404),
    operation_class=JsonOrEvents,
)
async def chat_completions(request: Request, svc: NamedDependency[Ready], data: JSONBody[ChatRequest]) -> Response:
    """Chat completion; with `stream`, SSE chunks ending in `data: [DONE]`. Refusals come before any byte."""
    return await _respond(request, svc, data, parse_chat, ChatFormat)


@post("/completions", status_code=200, responses=errors(*KEYED, *BODY, *GENERATION, 404), operation_class=JsonOrEvents)
async def completions(request: Request, svc: NamedDependency[Ready], data: JSONBody[CompletionRequest]) -> Response:
    """Plain text completion; with `stream`, SSE chunks ending in `data: [DONE]`."""
    return await _respond(request, svc, data, parse_completion, CompletionFormat)


@get("/models", responses=errors(*KEYED))
async def list_models(svc: NamedDependency[Ready]) -> dict[str, Any]:
    """Every model served, the default first, loaded or not (`state`)."""
    return {"object": "list", "data": [model_card(slot, svc.started_at) for slot in svc.chat.models.slots]}


@get("/models/{model_id:path}", responses=errors(*KEYED, 404))
async def read_model(svc: NamedDependency[Ready], model_id: FromPath[str]) -> dict[str, Any]:
    """A served model's card (`default` names the default model)."""
    return model_card(svc.chat.models.find(model_id.lstrip("/")), svc.started_at)


router = Router(path="/v1", route_handlers=[chat_completions, completions, list_models, read_model])

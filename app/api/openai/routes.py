"""The /v1 routes: chat and plain completions through one shape (parse → run → format), and the model list."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
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
from app.api.openai.parse import model_id as served_id  # the name `model_id` is read_model's path parameter
from app.api.openai_bodies import ChatRequest, CompletionRequest
from app.api.openapi import BODY, GENERATION, KEYED, JsonOrEvents, errors
from app.api.state import Ready
from app.domain.errors import ServiceError

log = logging.getLogger("forge.openai")

_KEEPALIVE = b": keep-alive\r\n\r\n"  # a comment line, never an empty `data:` (the openai client fails on one)
_SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


def _sse(job: Job, stream: AsyncIterator[bytes | None]) -> Stream:
    async def events() -> AsyncIterator[bytes]:
        async for data in stream:
            yield _KEEPALIVE if data is None else b"data: " + data + b"\r\n\r\n"

    async def after() -> None:  # runs once the response is over, however it ended (a client gone early too)
        job.cancel()

    return Stream(events(), media_type="text/event-stream", headers=_SSE_HEADERS, background=BackgroundTask(after))


async def _respond(request: Request, svc: Ready, call: Call, shape: type[Format], user: str | None) -> Response:
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
    return await _respond(request, svc, await parse_chat(data, svc), ChatFormat, data.user)


@post("/completions", status_code=200, responses=errors(*KEYED, *BODY, *GENERATION, 404), operation_class=JsonOrEvents)
async def completions(request: Request, svc: NamedDependency[Ready], data: JSONBody[CompletionRequest]) -> Response:
    """Plain text completion; with `stream`, SSE chunks ending in `data: [DONE]`."""
    return await _respond(request, svc, await parse_completion(data, svc), CompletionFormat, data.user)


@get("/models", responses=errors(*KEYED))
async def list_models(svc: NamedDependency[Ready]) -> dict[str, Any]:
    """The one model served."""
    return {"object": "list", "data": [model_card(svc)]}


@get("/models/{model_id:path}", responses=errors(*KEYED, 404))
async def read_model(svc: NamedDependency[Ready], model_id: FromPath[str]) -> dict[str, Any]:
    """The served model's card (`default` is an alias)."""
    model_id = model_id.lstrip("/")
    if model_id not in (served_id(svc), "default"):
        raise ServiceError("model_not_found", f"the model '{model_id}' does not exist", param="model")
    return model_card(svc)


router = Router(path="/v1", route_handlers=[chat_completions, completions, list_models, read_model])

"""Running a checked call: its place in admission, the engine stream pumped into a bounded outbox, and reading
that outbox whole (`collect`) or as a stream's chunks (`stream_chunks`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request

from app.api.openai.chunks import Choice, Usage, encode
from app.api.openai.parse import Call
from app.api.outbox import Outbox
from app.api.served import OnModel
from app.api.sse import with_keepalives
from app.domain.errors import ServiceError
from engine.types import EngineOverloaded, GenerationEvent, GenerationRequest, InvalidRequest

log = logging.getLogger("forge.openai")


class Job:
    """An engine request pumped into a bounded outbox by its own task (so a slow reader can time out and
    send keep-alives without cancelling the engine stream; a stalled one has its request aborted).
    `enter` takes its place in admission (app/admission.py; True when admitted at once, else `wait`), `start`
    hands it to the engine (both raise a ServiceError); `cancel` aborts it or leaves the queue."""

    def __init__(self, svc: OnModel, call: Call, owner_id: str, chat: bool) -> None:
        self.svc = svc  # on the model the request named: its engine, its admission queue, the hold on it
        self.chat = chat  # chat spells the engine's `logprobs` count `top_logprobs`
        self.owner = owner_id
        self.req = GenerationRequest(prompt_token_ids=call.prompt, params=call.params, request_id=call.request_id)
        self.outbox = Outbox(svc.settings.outbox_events, svc.settings.outbox_bytes, self.cancel)
        self.task: asyncio.Task | None = None
        self.ticket: Any = None

    def enter(self) -> bool:
        self.ticket = self.svc.admitter.enter(self.owner, self.req.params.n)
        return self.ticket.granted

    async def wait(self) -> None:
        await self.svc.admitter.wait(self.ticket)

    def start(self) -> None:
        assert self.ticket is not None and self.ticket.granted, "start() follows admission"
        try:
            gen = self.svc.engine.generate(self.req)
        except Exception as e:
            self.svc.admitter.release(self.ticket)
            self.svc.lease.release()
            raise engine_error(e, self.chat) from None
        self.tracker = self.svc.metrics.tracker("openai", self.svc.lease.id)
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
            self.svc.admitter.release(self.ticket)
            self.svc.lease.release()  # the model may unload now
            self.outbox.put(None)

    def cancel(self) -> None:
        # An abort, not task.cancel(): the pump then ends on the engine's final event and always cleans up.
        if self.task is not None:
            if not self.task.done():
                self.svc.engine.abort(self.req.request_id)
        else:  # never started: leave the queue, or give back what was granted, and the model
            if self.ticket is not None:
                self.svc.admitter.release(self.ticket)
            self.svc.lease.release()


def engine_error(e: Exception, chat: bool = False) -> ServiceError:
    """The engine's refusal or failure as the ServiceError its answer carries."""
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


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` when the client goes away (the body has been read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    log.debug("client left; aborting %s", job.req.request_id)
    job.cancel()


def _generation_failed(item: GenerationEvent) -> ServiceError:
    log.error("generation %s failed: %s", item.request_id, item.error)
    return ServiceError("internal", "generation failed")  # the engine's detail stays in the log


async def collect(request: Request, job: Job, n: int) -> tuple[list[Choice], Usage]:
    """Admit and run `job` to its end, its `n` samples gathered; the client leaving aborts it."""
    choices = [Choice() for _ in range(n)]
    usage = Usage(len(job.req.prompt_token_ids))
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
                raise engine_error(item)
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


async def _admitted(job: Job, keepalive_s: float) -> AsyncIterator[None]:
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


async def stream_chunks(
    job: Job,
    call: Call,
    keepalive_s: float,
    make_chunk: Callable[[GenerationEvent | None], dict[str, Any] | None],
    first: list[dict[str, Any]],
) -> AsyncIterator[bytes | None]:
    """JSON chunks for an OpenAI stream of a job that is started, or waits to be admitted (keep-alives until
    then; the refusal as an error chunk past the deadline); None for a keep-alive comment. `first` comes
    before any token. Leaving early aborts it."""
    usage = Usage(len(call.prompt))
    failed = False
    try:
        if job.task is None:
            try:
                async for _ in _admitted(job, keepalive_s):
                    yield None
            except ServiceError as e:
                yield encode(e.body())
                yield b"[DONE]"
                return
        for chunk in first:
            yield encode(chunk)
        async for item in with_keepalives(job.outbox, keepalive_s):
            if item is None:
                yield None
                continue
            if isinstance(item, Exception) or item.finish_reason == "error":
                err = engine_error(item) if isinstance(item, Exception) else _generation_failed(item)
                yield encode(err.body())
                failed = True
                break
            data = make_chunk(item)
            if data is not None:
                yield encode(data)
            if item.finish_reason is not None:
                usage.add(item)
        if call.include_usage and not failed:
            yield encode({**(make_chunk(None) or {}), "choices": [], "usage": usage.body()})
        yield b"[DONE]"
    finally:
        job.cancel()

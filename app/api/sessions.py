"""REST for chat sessions under /api/sessions, and the SSE stream of a chat turn. Every route sees only
the sessions of the caller's API key (app.api.gate.owner); another key's are "not found"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Request, Router, delete, get, patch, post
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.response import ServerSentEvent, ServerSentEventMessage

from app.api.bodies import EditBody, Empty, Export, SendBody, SessionFields, ToolResultBody
from app.api.gate import owner
from app.api.openapi import BODY, GENERATION, KEYED, Events, OptionalBody, OptionalBodyEvents, errors
from app.api.outbox import Outbox
from app.api.response_format import plain
from app.api.sse import event_sink, keepalive, with_keepalives
from app.api.tools import check_settings
from app.api.turn_events import turn_events
from app.config import Settings
from app.domain.chat import ChatService
from app.domain.defaults import DEFAULT_TITLE, session_defaults
from app.domain.errors import ServiceError, not_found
from app.domain.models import ModelRegistry
from app.domain.turn import Queued, Sink, Turn
from app.store import Conflict, Store

log = logging.getLogger("forge.sessions")


@get("/", responses=errors(*KEYED))
async def list_sessions(request: Request, store: NamedDependency[Store]) -> dict[str, Any]:
    """The caller's sessions, most recently active first."""
    return {"data": [s.to_dict() for s in await store.list_sessions(owner(request.scope))]}


@post("/", responses=errors(*KEYED, *BODY), operation_class=OptionalBody)
async def create_session(
    request: Request,
    store: NamedDependency[Store],
    chat: NamedDependency[ChatService],
    data: JSONBody[SessionFields | None] = None,
) -> dict[str, Any]:
    """A new session (the body may be left out) on `model` (one of /v1/models; left out: the default)."""
    data = data or SessionFields()
    session = await store.create_session(owner(request.scope), **await new_session(chat.models, data))
    return session.to_dict()


async def new_session(models: ModelRegistry, data: SessionFields) -> dict[str, Any]:
    """Store.create_session's fields for `data`: its model checked (400 when not served), its settings over the
    model's recommendations."""
    model = models.session_model(data.model if isinstance(data.model, str) else None)
    engine = await models.engine_of(model)
    await check_settings(engine, data.settings)
    return {**data.new_session(session_defaults(engine)), "model": model}


@get("/{session_id:str}", responses=errors(*KEYED, 404))
async def read_session(request: Request, store: NamedDependency[Store], session_id: FromPath[str]) -> dict[str, Any]:
    """A session and its chosen branch of messages."""
    found = await store.get_history(session_id, owner(request.scope))
    if found is None:
        raise not_found(session_id)
    session, messages = found
    return {**session.to_dict(), "messages": [m.to_dict() for m in messages]}


@patch("/{session_id:str}", responses=errors(*KEYED, *BODY, 404, 409))
async def update_session(
    request: Request,
    store: NamedDependency[Store],
    chat: NamedDependency[ChatService],
    session_id: FromPath[str],
    data: JSONBody[SessionFields],
) -> dict[str, Any]:
    """Change title, system prompt, model (null: the default) or settings (merged over the current ones)."""
    changes = data.changes()
    if "model" in changes:
        changes["model"] = chat.models.session_model(changes["model"])
    await check_settings(await chat.models.engine_of(changes.get("model")), data.settings)
    try:
        updated = await store.update_session(session_id, owner(request.scope), **changes)
    except Conflict as e:
        raise ServiceError("busy", str(e), param="session_id") from None
    if updated is None:
        raise not_found(session_id)
    return updated.to_dict()


@delete("/{session_id:str}", responses=errors(*KEYED, 404, 409, 415))
async def delete_session(request: Request, chat: NamedDependency[ChatService], session_id: FromPath[str]) -> None:
    """Delete a session and its messages; a running reply is stopped first (busy: running on another replica)."""
    who = owner(request.scope)
    if not await chat.delete_session(session_id, who):
        raise not_found(session_id)


@get("/{session_id:str}/export", responses=errors(*KEYED, 404))
async def export_session(request: Request, store: NamedDependency[Store], session_id: FromPath[str]) -> dict[str, Any]:
    """The session and every branch of its messages, in the import format."""
    data = await store.export_session(session_id, owner(request.scope))
    if data is None:
        raise not_found(session_id)
    return data


@post("/import", responses=errors(*KEYED, *BODY))
async def import_session(
    request: Request,
    store: NamedDependency[Store],
    chat: NamedDependency[ChatService],
    settings: NamedDependency[Settings],
    data: JSONBody[Export],
) -> dict[str, Any]:
    """A new session (new ids) holding an export's messages (version 1 or 2)."""
    limit = settings.import_messages
    if len(data.messages) > limit:
        raise ServiceError(
            "invalid_parameter",
            f"'messages' holds {len(data.messages)} messages; the limit is {limit}",
            param="messages",
        )
    s = data.session
    model = chat.models.session_model(s.model)
    engine = await chat.models.engine_of(model)
    await check_settings(engine, s.settings)
    session = {
        "title": (s.title or "").strip() or DEFAULT_TITLE,
        "system_prompt": s.system_prompt,
        "settings": {**session_defaults(engine), **(s.settings.given() if s.settings else {})},
        "model": model,
    }
    return (await store.import_session(owner(request.scope), session, data.tree())).to_dict()


@post(
    "/{session_id:str}/messages/{message_id:str}/select",
    status_code=200,
    responses=errors(*KEYED, *BODY, 404, 409),
    operation_class=OptionalBody,
)
async def select_branch(
    request: Request,
    chat: NamedDependency[ChatService],
    session_id: FromPath[str],
    message_id: FromPath[str],
    data: JSONBody[Empty | None] = None,
) -> dict[str, Any]:
    """Choose the branch through a message (any of the session's): the session and its chosen branch."""
    session, messages = await chat.select(session_id, owner(request.scope), message_id)
    return {**session.to_dict(), "messages": [m.to_dict() for m in messages]}


# -- turns over SSE ---------------------------------------------------------------------------


async def turn_stream(
    chat: ChatService, settings: Settings, start: Callable[[Sink, Queued], Awaitable[Turn | None]]
) -> ServerSentEvent:
    """Start a turn whose events go to a bounded outbox, and stream them as named SSE events with ids;
    `: keep-alive` comments while none is ready.

    Refusals are an HTTP status, except for a turn that has to wait to be admitted: its stream starts at
    once with keep-alives, and a passed deadline is an `error` event (with `retry_after_s`) ending it.
    The client going away at any point (even before the body starts, when the generator never runs)
    leaves the turn running without it (GET .../events reattaches; app/domain/replay.py), or takes it out of
    the queue while it waits. So does a client that stops reading until `outbox_events` events (or
    `outbox_bytes`) wait for it: the stream then ends without `done`.
    """
    turn: Turn | None = None
    starting: asyncio.Task | None = None

    def stop() -> None:
        if turn is not None:
            chat.detach(turn, sink)
        elif starting is not None:
            starting.cancel()  # still waiting to be admitted: leave the queue

    outbox = Outbox(settings.outbox_events, settings.outbox_bytes, stop)
    sink = event_sink(outbox)

    queued = asyncio.Event()
    starting = asyncio.ensure_future(start(sink, queued.set))
    signal = asyncio.ensure_future(queued.wait())
    try:
        await asyncio.wait({starting, signal}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        starting.cancel()  # the request itself was cancelled: so is its turn's start
        raise
    finally:
        signal.cancel()
    waiting = not starting.done()
    if not waiting:
        turn = starting.result()  # refused before it could wait: an HTTP status

    async def admitted() -> AsyncIterator[ServerSentEventMessage]:
        nonlocal turn
        while not (await asyncio.wait({starting}, timeout=settings.keepalive_s))[0]:
            yield keepalive()
        try:
            turn = starting.result()
        except ServiceError as e:  # the deadline passed (or a refusal after waiting): told, then the end
            sink(e.event())
            sink(None)
        except Exception:
            log.exception("a queued turn failed to start")
            sink(ServiceError("internal", "internal error").event())
            sink(None)

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        try:
            if waiting:
                async for item in admitted():
                    yield item
            async for item in with_keepalives(outbox, settings.keepalive_s):
                if item is None:
                    yield keepalive()
                    continue
                yield ServerSentEventMessage(data=item[1], event=item[0], id=item[2])
        finally:
            stop()

    async def after() -> None:  # runs once the response is over, however it ended (a no-op after `done`)
        stop()

    return ServerSentEvent(events(), headers={"Cache-Control": "no-cache"}, background=BackgroundTask(after))


@post(
    "/{session_id:str}/messages",
    status_code=200,
    responses=errors(*KEYED, *BODY, *GENERATION, 404, 409),
    operation_class=Events,
)
async def send_message(
    request: Request,
    chat: NamedDependency[ChatService],
    settings: NamedDependency[Settings],
    session_id: FromPath[str],
    data: JSONBody[SendBody],
) -> ServerSentEvent:
    """SSE: one turn (docs/protocol.md#sse). A repeated `idempotency_key` answers `history` instead."""
    who = owner(request.scope)
    return await turn_stream(
        chat,
        settings,
        lambda sink, queued: chat.send(
            session_id,
            who,
            data.content,
            sink=sink,
            idempotency_key=data.idempotency_key,
            response_format=plain(data.response_format),
            queued=queued,
            tools=data.overrides(),
        ),
    )


@post("/{session_id:str}/tool_results", status_code=201, responses=errors(*KEYED, *BODY, 404, 409))
async def post_tool_result(
    request: Request, chat: NamedDependency[ChatService], session_id: FromPath[str], data: JSONBody[ToolResultBody]
) -> dict[str, Any]:
    """Store the result of a call of the session's last reply as a `tool` message (docs/api.md#tools-in-chat-
    sessions); the reply continues with `POST .../continue` once every call has one."""
    _, message = await chat.tool_result(session_id, owner(request.scope), data.tool_call_id, data.content)
    return message.to_dict()


@post(
    "/{session_id:str}/continue",
    status_code=200,
    responses=errors(*KEYED, *BODY, *GENERATION, 404, 409),
    operation_class=OptionalBodyEvents,
)
async def continue_reply(
    request: Request,
    chat: NamedDependency[ChatService],
    settings: NamedDependency[Settings],
    session_id: FromPath[str],
    data: JSONBody[Empty | None] = None,
) -> ServerSentEvent:
    """SSE: a reply after the results of every call of the last one."""
    who = owner(request.scope)
    return await turn_stream(
        chat, settings, lambda sink, queued: chat.resume(session_id, who, sink=sink, queued=queued)
    )


@post(
    "/{session_id:str}/messages/{message_id:str}/edit",
    status_code=200,
    responses=errors(*KEYED, *BODY, *GENERATION, 404, 409),
    operation_class=Events,
)
async def edit_message(
    request: Request,
    chat: NamedDependency[ChatService],
    settings: NamedDependency[Settings],
    session_id: FromPath[str],
    message_id: FromPath[str],
    data: JSONBody[EditBody],
) -> ServerSentEvent:
    """SSE: a new branch with the user message edited, and a reply to it."""
    who = owner(request.scope)
    return await turn_stream(
        chat,
        settings,
        lambda sink, queued: chat.edit(session_id, who, message_id, data.content, sink=sink, queued=queued),
    )


@post(
    "/{session_id:str}/regenerate",
    status_code=200,
    responses=errors(*KEYED, *BODY, *GENERATION, 404, 409),
    operation_class=OptionalBodyEvents,
)
async def regenerate(
    request: Request,
    chat: NamedDependency[ChatService],
    settings: NamedDependency[Settings],
    session_id: FromPath[str],
    data: JSONBody[Empty | None] = None,
) -> ServerSentEvent:
    """SSE: a new branch with another reply in place of the last one."""
    who = owner(request.scope)
    return await turn_stream(
        chat, settings, lambda sink, queued: chat.regenerate(session_id, who, sink=sink, queued=queued)
    )


@post("/{session_id:str}/cancel", status_code=200, responses=errors(*KEYED, 404, 415))
async def cancel(
    request: Request, store: NamedDependency[Store], chat: NamedDependency[ChatService], session_id: FromPath[str]
) -> dict[str, Any]:
    """Stop the running reply (stored as "stopped")."""
    who = owner(request.scope)
    if await store.get_session(session_id, who) is None:
        raise not_found(session_id)
    return {"cancelled": chat.cancel(session_id, who)}


router = Router(
    path="/api/sessions",
    route_handlers=[
        list_sessions,
        create_session,
        import_session,
        read_session,
        update_session,
        delete_session,
        export_session,
        select_branch,
        send_message,
        edit_message,
        regenerate,
        cancel,
        post_tool_result,
        continue_reply,
        turn_events,
    ],
)

"""REST for chat sessions under /api/sessions, and the SSE stream of a chat turn."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Router, delete, get, patch, post
from litestar.background_tasks import BackgroundTask
from litestar.params import FromPath
from litestar.response import ServerSentEvent, ServerSentEventMessage

from app.api.errors import ServiceError
from app.api.fields import (DEFAULT_TITLE, check_keys, content_field, json_body, json_type, parse_json_object,
                            session_fields, session_settings)
from app.api.response_format import parse_response_format
from app.api.sse import keepalive, with_keepalives
from app.api.state import ready_services
from app.chat import ChatService, Turn


def _not_found(session_id: str) -> ServiceError:
    return ServiceError("not_found", f"session '{session_id}' not found", param="session_id")


@get("/")
async def list_sessions(request: Request) -> dict[str, Any]:
    svc = ready_services(request)
    return {"data": await svc.store.list_sessions()}


@post("/")
async def create_session(request: Request) -> dict[str, Any]:
    svc = ready_services(request)
    raw = await request.body()
    body = parse_json_object(raw) if raw.strip() else {}
    fields = session_fields(body)
    return await svc.store.create_session(title=fields.get("title", DEFAULT_TITLE),
                                          system_prompt=fields.get("system_prompt"),
                                          settings=session_settings(fields.get("settings")))


@get("/{session_id:str}")
async def read_session(request: Request, session_id: FromPath[str]) -> dict[str, Any]:
    svc = ready_services(request)
    found = await svc.store.get_history(session_id)
    if found is None:
        raise _not_found(session_id)
    session, messages = found
    return {**session, "messages": messages}


@patch("/{session_id:str}")
async def update_session(request: Request, session_id: FromPath[str]) -> dict[str, Any]:
    svc = ready_services(request)
    fields = session_fields(await json_body(request))
    if "settings" in fields:
        current = await svc.store.get_session(session_id)
        if current is None:
            raise _not_found(session_id)
        fields["settings"] = session_settings(fields["settings"], base=current["settings"])
    updated = await svc.store.update_session(session_id, **fields)
    if updated is None:
        raise _not_found(session_id)
    return updated


@delete("/{session_id:str}")
async def delete_session(request: Request, session_id: FromPath[str]) -> None:
    svc = ready_services(request)
    await svc.chat.cancel_and_wait(session_id)
    if not await svc.store.delete_session(session_id):
        raise _not_found(session_id)


@get("/{session_id:str}/export")
async def export_session(request: Request, session_id: FromPath[str]) -> dict[str, Any]:
    svc = ready_services(request)
    data = await svc.store.export_session(session_id)
    if data is None:
        raise _not_found(session_id)
    return data


@post("/import")
async def import_session(request: Request) -> dict[str, Any]:
    svc = ready_services(request)
    body = await json_body(request)
    check_keys(body, frozenset({"forge_export", "session", "messages"}))
    if body.get("forge_export") != 1:
        raise ServiceError("invalid_parameter", f"'forge_export' must be 1 (the export format version), got "
                           f"{body.get('forge_export')!r}", param="forge_export")
    session, messages = body.get("session"), body.get("messages")
    if not isinstance(session, dict):
        raise ServiceError("bad_request", f"'session' must be an object, got {json_type(session)}", param="session")
    if not isinstance(messages, list):
        raise ServiceError("bad_request", f"'messages' must be an array, got {json_type(messages)}", param="messages")
    # An export carries read-only fields too (id, dates); only these are taken over.
    wanted = {k: session[k] for k in ("title", "system_prompt", "settings") if k in session}
    fields = session_fields(wanted)
    clean = {"title": fields.get("title", DEFAULT_TITLE), "system_prompt": fields.get("system_prompt"),
             "settings": session_settings(fields.get("settings"))}
    try:
        return await svc.store.import_session({"session": clean, "messages": messages})
    except ValueError as e:
        raise ServiceError("invalid_parameter", str(e), param="messages") from None


# -- turns over SSE ---------------------------------------------------------------------------


def turn_stream(chat: ChatService, turn: Turn, queue: asyncio.Queue, keepalive_s: float) -> ServerSentEvent:
    """The turn's events as named SSE events with ids; `: keep-alive` comments while none is ready.

    The client going away at any point (even before the body starts, when the generator never runs)
    cancels the turn: its partial reply is stored as "stopped".
    """

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        seq = 0
        try:
            async for ev in with_keepalives(queue, keepalive_s):
                if ev is None:
                    yield keepalive()
                    continue
                seq += 1
                yield ServerSentEventMessage(data=json.dumps(ev, ensure_ascii=False), event=ev["type"], id=seq)
        finally:
            chat.cancel_turn(turn)

    async def after() -> None:  # runs once the response is over, however it ended (a no-op after `done`)
        chat.cancel_turn(turn)

    return ServerSentEvent(events(), headers={"Cache-Control": "no-cache"}, background=BackgroundTask(after))


@post("/{session_id:str}/messages", status_code=200)
async def send_message(request: Request, session_id: FromPath[str]) -> ServerSentEvent:
    svc = ready_services(request)
    body = await json_body(request)
    check_keys(body, frozenset({"content", "response_format"}))
    content = content_field(body)
    fmt = parse_response_format(body.get("response_format"))
    queue: asyncio.Queue = asyncio.Queue()
    turn = await svc.chat.send(session_id, content, sink=queue.put_nowait, response_format=fmt)
    return turn_stream(svc.chat, turn, queue, svc.settings.keepalive_s)


@post("/{session_id:str}/messages/{message_id:str}/edit", status_code=200)
async def edit_message(request: Request, session_id: FromPath[str], message_id: FromPath[str]) -> ServerSentEvent:
    svc = ready_services(request)
    body = await json_body(request)
    check_keys(body, frozenset({"content"}))
    content = content_field(body)
    queue: asyncio.Queue = asyncio.Queue()
    turn = await svc.chat.edit(session_id, message_id, content, sink=queue.put_nowait)
    return turn_stream(svc.chat, turn, queue, svc.settings.keepalive_s)


@post("/{session_id:str}/regenerate", status_code=200)
async def regenerate(request: Request, session_id: FromPath[str]) -> ServerSentEvent:
    svc = ready_services(request)
    raw = await request.body()
    if raw.strip():
        check_keys(parse_json_object(raw), frozenset())  # an empty object at most
    queue: asyncio.Queue = asyncio.Queue()
    turn = await svc.chat.regenerate(session_id, sink=queue.put_nowait)
    return turn_stream(svc.chat, turn, queue, svc.settings.keepalive_s)


@post("/{session_id:str}/cancel", status_code=200)
async def cancel(request: Request, session_id: FromPath[str]) -> dict[str, Any]:
    svc = ready_services(request)
    if await svc.store.get_session(session_id) is None:
        raise _not_found(session_id)
    return {"cancelled": svc.chat.cancel(session_id)}


router = Router(path="/api/sessions", route_handlers=[
    list_sessions, create_session, import_session, read_session, update_session, delete_session, export_session,
    send_message, edit_message, regenerate, cancel,
])

"""`GET /api/sessions/{sid}/messages/{mid}/events`: the SSE stream of a reply, (re)attached. A running turn's
events after `Last-Event-ID` (or `?after=`) are replayed, then its new ones follow; an ended turn's answer is
its stored message and `done`. The client going away leaves the turn running (app/domain/replay.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Request, get
from litestar.background_tasks import BackgroundTask
from litestar.di import NamedDependency
from litestar.params import FromPath, HeaderParameter, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from app.api.gate import owner
from app.api.openapi import KEYED, Events, errors
from app.api.outbox import Outbox
from app.api.sse import event_sink, keepalive, with_keepalives
from app.config import Settings
from app.domain.chat import ChatService
from app.domain.errors import ServiceError, not_found
from app.domain.replay import Replay
from app.store import Store

MAX_SEQ = 1 << 40
AT_LEAST_0 = {"minimum": 0}  # Litestar leaves a bound of 0 out of the schema (as if unset)
AFTER = QueryParameter(ge=0, le=MAX_SEQ, schema_extra=AT_LEAST_0)
LAST_EVENT_ID = HeaderParameter(name="Last-Event-ID", ge=0, le=MAX_SEQ, schema_extra=AT_LEAST_0)


@get("/{session_id:str}/messages/{message_id:str}/events", responses=errors(*KEYED, 404), operation_class=Events)
async def turn_events(
    request: Request,
    chat: NamedDependency[ChatService],
    store: NamedDependency[Store],
    settings: NamedDependency[Settings],
    session_id: FromPath[str],
    message_id: FromPath[str],
    after: Annotated[int | None, AFTER] = None,
    last_event_id: Annotated[int | None, LAST_EVENT_ID] = None,
) -> ServerSentEvent:
    """SSE: the events of reply `message_id` after event `Last-Event-ID` (or `after`; neither: from the start),
    then the new ones while it is generated. A reply no longer generated: its stored message (`message`) and
    `done`. Leaving does not stop the reply (POST .../cancel does)."""
    who = owner(request.scope)
    start = last_event_id if last_event_id is not None else after if after is not None else 0
    replay = chat.replay(session_id, who, message_id)
    if replay is None:
        found = await store.get_history(session_id, who)
        if found is None:
            raise not_found(session_id)
        replay = chat.replay(session_id, who, message_id)  # it may have started meanwhile
        if replay is None:
            message = next((m for m in found[1] if m.id == message_id and m.role == "assistant"), None)
            if message is None:
                raise ServiceError(
                    "not_found",
                    f"no reply '{message_id}' on the chosen branch of session '{session_id}'",
                    param="message_id",
                )
            return _stored(session_id, message.to_dict())
    if start > replay.seq:
        raise ServiceError(
            "invalid_parameter",
            f"the reply's last event is {replay.seq}; asked for the ones after {start}",
            param="after",
        )
    return _follow(chat, settings, replay, start)


def _follow(chat: ChatService, settings: Settings, replay: Replay, after: int) -> ServerSentEvent:
    def stop() -> None:
        replay.detach(sink)

    outbox = Outbox(settings.outbox_events, settings.outbox_bytes, stop)
    sink = event_sink(outbox)

    if not replay.attach(sink, after):
        # Those events are gone: the reply as far as it got, then what follows it
        sink(
            {
                "type": "message",
                "session_id": replay.session_id,
                "seq": replay.text_seq,
                "message": {
                    "id": replay.message_id,
                    "session_id": replay.session_id,
                    "role": "assistant",
                    "content": replay.text(),
                    "status": "streaming",
                },
            }
        )
        replay.attach(sink, replay.text_seq)

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        try:
            async for item in with_keepalives(outbox, settings.keepalive_s):
                if item is None:
                    yield keepalive()
                    continue
                yield ServerSentEventMessage(data=item[1], event=item[0], id=item[2])
        finally:
            stop()

    return ServerSentEvent(events(), headers={"Cache-Control": "no-cache"}, background=BackgroundTask(_after, stop))


async def _after(stop: Any) -> None:  # runs once the response is over, however it ended
    stop()


def _stored(session_id: str, message: dict[str, Any]) -> ServerSentEvent:
    """An ended reply: its stored message, and `done` as its turn ended it."""
    ids = {"session_id": session_id, "message_id": message["id"]}
    out = [
        ServerSentEventMessage(
            event="message",
            data=json.dumps({"type": "message", "session_id": session_id, "message": message}, ensure_ascii=False),
        )
    ]
    if message["status"] != "streaming":  # else another process generates it: nothing more is known here
        done = {
            "type": "done",
            **ids,
            "status": message["status"],
            "finish_reason": message.get("finish_reason"),
            "usage": {
                "prompt_tokens": message.get("prompt_tokens"),
                "cached_tokens": message.get("cached_tokens"),
                "completion_tokens": message.get("completion_tokens"),
            },
            "timings": {
                "ttft_ms": message.get("ttft_ms"),
                "total_ms": None,
                "tokens_per_s": message.get("tokens_per_s"),
            },
        }
        out.append(ServerSentEventMessage(event="done", data=json.dumps(done, ensure_ascii=False)))
    return ServerSentEvent(iter(out), headers={"Cache-Control": "no-cache"})

"""The WebSocket commands that start and stop turns (docs/protocol.md), each a function of the socket's
Connection (app/api/ws.py) and its command: send, continue, edit, regenerate, a tool's result or approval, cancel.

A turn refused at once answers the command with an `error`; one queued for admission lets the socket go on reading
commands, and its events (or the refusal past the deadline) come when it is admitted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from app.api import bodies
from app.api.response_format import plain
from app.api.state import Ready
from app.domain.errors import ServiceError
from app.domain.turn import Queued, Turn

log = logging.getLogger("forge.ws")


class Connection(Protocol):
    """What these commands use of the socket's connection (app/api/ws.py::Connection)."""

    svc: Ready
    owner: str
    turns: list[Turn]
    waiting: dict[asyncio.Future, str]  # turns waiting to be admitted -> their session ids
    gone: bool  # the socket closed

    def send(self, event: dict[str, Any] | None) -> None: ...

    def reply(self, event: dict[str, Any], client_id: str | None) -> None: ...

    def room_for(self, session_id: str | None) -> None: ...

    def track(self, turn: Turn | None) -> None: ...


async def start_turn(conn: Connection, cmd: Any, begin: Callable[[Queued], Awaitable[Turn | None]]) -> None:
    """Start a turn. Refused at once: raises (an `error` for this command). Queued for admission: the
    socket goes on reading commands, and the turn's events (or the refusal past the deadline, with
    `retry_after_s`) come when it is admitted."""
    queued = asyncio.Event()
    starting = asyncio.ensure_future(begin(queued.set))
    signal = asyncio.ensure_future(queued.wait())
    try:
        await asyncio.wait({starting, signal}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        starting.cancel()
        raise
    finally:
        signal.cancel()
    if starting.done():
        conn.track(starting.result())
        return
    conn.waiting[starting] = cmd.session_id
    starting.add_done_callback(lambda task: _started(conn, task, cmd.client_id, cmd.session_id))


def _started(conn: Connection, task: asyncio.Future, client_id: str | None, session_id: str) -> None:
    conn.waiting.pop(task, None)
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, ServiceError):
        conn.send(exc.event(session_id=session_id, client_id=client_id))
    elif exc is not None:
        log.error("a queued turn failed to start: %r", exc)
        conn.send(ServiceError("internal", "internal error").event(session_id=session_id, client_id=client_id))
    else:
        turn = task.result()
        conn.track(turn)
        if conn.gone and turn is not None:  # admitted as the socket closed
            conn.svc.chat.cancel_turn(turn)


async def message_send(conn: Connection, cmd: bodies.MessageSend) -> None:
    conn.room_for(cmd.session_id)
    await start_turn(
        conn,
        cmd,
        lambda queued: conn.svc.chat.send(
            cmd.session_id,
            conn.owner,
            cmd.content,
            sink=conn.send,
            client_id=cmd.client_id,
            idempotency_key=cmd.idempotency_key,
            response_format=plain(cmd.response_format),
            queued=queued,
            tools=cmd.overrides(),
        ),
    )


async def tool_result(conn: Connection, cmd: bodies.ToolResult) -> None:
    conn.room_for(cmd.session_id)
    _, message = await conn.svc.chat.tool_result(cmd.session_id, conn.owner, cmd.tool_call_id, cmd.content)
    conn.reply({"type": "message.created", "session_id": cmd.session_id, "message": message.to_dict()}, cmd.client_id)


async def tool_approve(conn: Connection, cmd: bodies.ToolApprove) -> None:
    session = await conn.svc.chat.approve(cmd.session_id, conn.owner, cmd.tool_call_id, cmd.decision)
    if session is not None:  # "always": the tool joined the session's mcp_allowed
        conn.reply({"type": "session", "session": session.to_dict()}, cmd.client_id)


async def message_continue(conn: Connection, cmd: bodies.MessageContinue) -> None:
    conn.room_for(cmd.session_id)
    await start_turn(
        conn,
        cmd,
        lambda queued: conn.svc.chat.resume(
            cmd.session_id, conn.owner, sink=conn.send, client_id=cmd.client_id, queued=queued
        ),
    )


async def message_edit(conn: Connection, cmd: bodies.MessageEdit) -> None:
    conn.room_for(cmd.session_id)
    await start_turn(
        conn,
        cmd,
        lambda queued: conn.svc.chat.edit(
            cmd.session_id,
            conn.owner,
            cmd.message_id,
            cmd.content,
            sink=conn.send,
            client_id=cmd.client_id,
            queued=queued,
        ),
    )


async def message_regenerate(conn: Connection, cmd: bodies.MessageRegenerate) -> None:
    conn.room_for(cmd.session_id)
    await start_turn(
        conn,
        cmd,
        lambda queued: conn.svc.chat.regenerate(
            cmd.session_id, conn.owner, sink=conn.send, client_id=cmd.client_id, queued=queued
        ),
    )


async def generation_cancel(conn: Connection, cmd: bodies.GenerationCancel) -> None:
    turn = conn.svc.chat.running(cmd.session_id, conn.owner)
    if turn is None and conn.svc.chat.cancel(cmd.session_id, conn.owner):  # an MCP tool call was running
        cancelled = {"type": "generation.cancelled", "session_id": cmd.session_id, "message_id": None}
        conn.reply(cancelled, cmd.client_id)
        return
    if turn is None:
        queued = [task for task, sid in conn.waiting.items() if sid == cmd.session_id]
        if queued:  # still waiting for admission: it leaves the queue, and nothing was stored
            for task in queued:
                task.cancel()
            conn.reply(
                {"type": "generation.cancelled", "session_id": cmd.session_id, "message_id": None}, cmd.client_id
            )
            return
    if turn is None or not conn.svc.chat.cancel(cmd.session_id, conn.owner):
        raise ServiceError(
            "not_found", f"no reply is being generated in session '{cmd.session_id}'", param="session_id"
        )
    # The turn's own socket gets its `done` event (status "stopped"); another socket gets an acknowledgement.
    if not any(t is turn for t in conn.turns):
        conn.reply(
            {"type": "generation.cancelled", "session_id": cmd.session_id, "message_id": turn.message_id},
            cmd.client_id,
        )

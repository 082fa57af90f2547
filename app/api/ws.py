"""The WebSocket chat protocol at /ws (docs/protocol.md): JSON text frames, many sessions per socket."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from litestar import WebSocket, websocket

from app.api.errors import ServiceError
from app.api.fields import (DEFAULT_TITLE, check_keys, content_field, get_str, parse_json_object, session_fields,
                            session_settings)
from app.api.response_format import parse_response_format
from app.api.state import Services, services
from app.chat import Turn

log = logging.getLogger("forge.ws")

MAX_FRAME_BYTES = 1 << 20  # larger frames close the socket with 1009 (uvicorn's ws_max_size too)
WS_MESSAGE_TOO_BIG = 1009
_BASE_KEYS = frozenset({"type", "client_id"})


class Connection:
    """One socket: a reader loop handling commands, a sender task writing events in order."""

    def __init__(self, socket: WebSocket, svc: Services) -> None:
        self.socket = socket
        self.svc = svc
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sender: asyncio.Task | None = None
        self.turns: list[Turn] = []
        self.opened: set[str] = set()  # sessions this client showed interest in (admin "active sessions")
        self.handlers: dict[str, Callable[[dict[str, Any], str | None], Awaitable[None]]] = {
            "session.create": self.session_create,
            "session.open": self.session_open,
            "message.send": self.message_send,
            "message.edit": self.message_edit,
            "message.regenerate": self.message_regenerate,
            "generation.cancel": self.generation_cancel,
            "ping": self.ping,
        }

    def send(self, event: dict[str, Any] | None) -> None:
        if event is not None:
            self.outbox.put_nowait(event)

    async def run(self) -> None:
        sender = self.sender = asyncio.create_task(self._send_loop())
        close_code: int | None = 1000
        try:
            while True:
                msg = await self.socket.receive()
                if msg["type"] == "websocket.disconnect":
                    close_code = None
                    break
                if msg.get("text") is not None:
                    raw: str | bytes = msg["text"]
                    size = len(raw.encode()) if len(raw) > MAX_FRAME_BYTES // 4 else len(raw)
                else:
                    raw = msg.get("bytes") or b""
                    size = len(raw)
                if size > MAX_FRAME_BYTES:
                    close_code = WS_MESSAGE_TOO_BIG
                    break
                if isinstance(raw, bytes):
                    self.send(ServiceError("bad_request", "binary frames are not supported: send JSON as text frames")
                              .event())
                    continue
                await self.handle(raw)
        finally:
            # The socket is gone or closing: abort its generations (partial replies are stored as "stopped").
            for turn in self.turns:
                self.svc.chat.cancel_turn(turn)
            for sid in self.opened:
                self.svc.chat.closed(sid)
            if close_code is not None:
                await self.flush()
                try:
                    await self.socket.close(code=close_code,
                                            reason="frame too large" if close_code == WS_MESSAGE_TOO_BIG else None)
                except Exception:
                    pass
            sender.cancel()

    async def flush(self) -> None:
        """Wait (up to a second) until the events queued so far are sent."""
        if self.sender is None or self.sender.done():
            return
        sent = asyncio.ensure_future(self.outbox.join())
        await asyncio.wait({sent, self.sender}, timeout=1.0)
        sent.cancel()

    async def _send_loop(self) -> None:
        try:
            while True:
                ev = await self.outbox.get()
                await self.socket.send_text(json.dumps(ev, ensure_ascii=False))
                self.outbox.task_done()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # disconnected
            log.debug("websocket send stopped: %s", e)

    async def handle(self, raw: str) -> None:
        client_id: str | None = None
        session_id: str | None = None
        try:
            msg = parse_json_object(raw, "message")
            cid = msg.get("client_id")
            if cid is not None and not isinstance(cid, str):
                raise ServiceError("bad_request", "'client_id' must be a string", param="client_id")
            client_id = cid
            sid = msg.get("session_id")
            session_id = sid if isinstance(sid, str) else None
            kind = msg.get("type")
            if not isinstance(kind, str):
                raise ServiceError("bad_request", "'type' is required and must be a string", param="type")
            handler = self.handlers.get(kind)
            if handler is None:
                raise ServiceError("bad_request", f"unknown message type {kind!r}; expected one of: "
                                   + ", ".join(self.handlers), param="type")
            if self.svc.chat is None or self.svc.store is None:
                raise ServiceError("unavailable", "the model is still loading; retry shortly")
            await handler(msg, client_id)
        except ServiceError as e:
            self.send(e.event(session_id=session_id, client_id=client_id))
        except Exception:
            log.exception("websocket command failed")
            self.send(ServiceError("internal", "internal error").event(session_id=session_id, client_id=client_id))

    # -- commands -------------------------------------------------------------------------

    def _reply(self, event: dict[str, Any], client_id: str | None) -> None:
        if client_id is not None:
            event["client_id"] = client_id
        self.send(event)

    def _session_id(self, msg: dict[str, Any]) -> str:
        sid = get_str(msg, "session_id", required=True)
        assert sid is not None
        return sid

    def _track(self, turn: Turn) -> None:
        self.turns = [t for t in self.turns if not t.done] + [turn]
        self._watch(turn.session_id, turn.title)

    def _watch(self, session_id: str, title: str) -> None:
        if session_id not in self.opened:
            self.opened.add(session_id)
            self.svc.chat.opened(session_id, title)

    async def session_create(self, msg: dict[str, Any], client_id: str | None) -> None:
        fields = session_fields(msg, extra_keys=_BASE_KEYS)
        session = await self.svc.store.create_session(title=fields.get("title", DEFAULT_TITLE),
                                                      system_prompt=fields.get("system_prompt"),
                                                      settings=session_settings(fields.get("settings")))
        self._watch(session["id"], session["title"])
        self._reply({"type": "session", "session": session}, client_id)

    async def session_open(self, msg: dict[str, Any], client_id: str | None) -> None:
        check_keys(msg, _BASE_KEYS | {"session_id"})
        sid = self._session_id(msg)
        found = await self.svc.store.get_history(sid)
        if found is None:
            raise ServiceError("not_found", f"session '{sid}' not found", param="session_id")
        session, messages = found
        self._watch(sid, session["title"])
        self._reply({"type": "session", "session": session}, client_id)
        self._reply({"type": "history", "session_id": sid, "messages": messages}, client_id)

    async def message_send(self, msg: dict[str, Any], client_id: str | None) -> None:
        check_keys(msg, _BASE_KEYS | {"session_id", "content", "response_format"})
        sid = self._session_id(msg)
        content = content_field(msg)
        fmt = parse_response_format(msg.get("response_format"))
        self._track(await self.svc.chat.send(sid, content, sink=self.send, client_id=client_id, response_format=fmt))

    async def message_edit(self, msg: dict[str, Any], client_id: str | None) -> None:
        check_keys(msg, _BASE_KEYS | {"session_id", "message_id", "content"})
        sid = self._session_id(msg)
        mid = get_str(msg, "message_id", required=True)
        assert mid is not None
        content = content_field(msg)
        self._track(await self.svc.chat.edit(sid, mid, content, sink=self.send, client_id=client_id))

    async def message_regenerate(self, msg: dict[str, Any], client_id: str | None) -> None:
        check_keys(msg, _BASE_KEYS | {"session_id"})
        sid = self._session_id(msg)
        self._track(await self.svc.chat.regenerate(sid, sink=self.send, client_id=client_id))

    async def generation_cancel(self, msg: dict[str, Any], client_id: str | None) -> None:
        check_keys(msg, _BASE_KEYS | {"session_id"})
        sid = self._session_id(msg)
        turn = self.svc.chat.turns.get(sid)
        if turn is None or not self.svc.chat.cancel(sid):
            raise ServiceError("not_found", f"no reply is being generated in session '{sid}'", param="session_id")
        # The turn's own socket gets its `done` event (status "stopped"); another socket gets an acknowledgement.
        if not any(t is turn for t in self.turns):
            self._reply({"type": "generation.cancelled", "session_id": sid, "message_id": turn.message_id}, client_id)

    async def ping(self, msg: dict[str, Any], client_id: str | None) -> None:
        check_keys(msg, _BASE_KEYS)
        self._reply({"type": "pong"}, client_id)


@websocket("/ws")
async def chat_socket(socket: WebSocket) -> None:
    svc = services(socket)
    await socket.accept()
    svc.metrics.ws_opened()
    conn = Connection(socket, svc)
    svc.connections.add(conn)
    try:
        await conn.run()
    finally:
        svc.connections.discard(conn)
        svc.metrics.ws_closed()

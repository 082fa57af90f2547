"""The WebSocket chat protocol at /ws (docs/protocol.md): JSON text frames, many sessions per socket.

Bounded per socket: a bounded outbox (a reader that lets it fill has its turns stopped and the socket
closed with 4008), a command rate, a number of sessions it may watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import msgspec
from litestar import WebSocket, websocket
from litestar.di import NamedDependency

from app.api import bodies
from app.api import ws_turns as turns
from app.api.bodies import AnyCommand, Envelope
from app.api.errors import busy_database
from app.api.gate import WS_PROTOCOL, owner
from app.api.outbox import Outbox
from app.api.sessions import new_session
from app.api.state import Ready, Services
from app.domain.errors import ServiceError, not_found
from app.domain.rate import TokenBucket
from app.domain.replay import Replay
from app.domain.turn import Turn
from app.store.records import MessageRecord

log = logging.getLogger("forge.ws")

MAX_FRAME_BYTES = 1 << 20  # larger frames close the socket with 1009 (uvicorn's ws_max_size too)
WS_MESSAGE_TOO_BIG = 1009
WS_TOO_SLOW = 4008  # the client stopped reading: its outbox filled up
_ENCODER = msgspec.json.Encoder()


class Connection:
    """One socket: a reader loop handling commands, a sender task writing events in order."""

    def __init__(self, socket: WebSocket, svc: Services) -> None:
        self.socket = socket
        # Typed as loaded: `handle` refuses every command until it is, and only commands open sessions and turns.
        self.svc = cast(Ready, svc)
        self.owner = owner(socket.scope)
        self.outbox = Outbox(svc.settings.outbox_events, svc.settings.outbox_bytes, self._stalled)
        self.bucket = TokenBucket(svc.settings.ws_commands_per_s)
        self.sender: asyncio.Task | None = None
        self.close_code: int | None = 1000
        self.turns: list[Turn] = []
        self.waiting: dict[asyncio.Future, str] = {}  # turns waiting to be admitted -> their session ids
        self.gone = False
        self.opened: set[str] = set()  # sessions this client showed interest in (admin "active sessions")
        self.handlers: dict[type, Callable[[Any], Awaitable[None]]] = {
            bodies.SessionCreate: self.session_create,
            bodies.SessionOpen: self.session_open,
            bodies.MessageSend: partial(turns.message_send, self),
            bodies.MessageEdit: partial(turns.message_edit, self),
            bodies.MessageRegenerate: partial(turns.message_regenerate, self),
            bodies.BranchSelect: self.branch_select,
            bodies.GenerationCancel: partial(turns.generation_cancel, self),
            bodies.Ping: self.ping,
            bodies.ToolResult: partial(turns.tool_result, self),
            bodies.ToolApprove: partial(turns.tool_approve, self),
            bodies.MessageContinue: partial(turns.message_continue, self),
            bodies.TurnResume: self.turn_resume,
        }

    def send(self, event: dict[str, Any] | None) -> None:
        """A turn's sink: its events go out in order; its closing None is not for the socket."""
        if event is not None:
            text = _ENCODER.encode(event).decode()
            self.outbox.put(text, len(text))

    async def run(self) -> None:
        sender = self.sender = asyncio.create_task(self._send_loop())
        try:
            while True:
                msg = await self.socket.receive()
                if msg["type"] == "websocket.disconnect":
                    self.close_code = None
                    break
                if self.outbox.stalled:
                    break
                if msg["type"] != "websocket.receive":  # nothing else comes after the accept
                    continue
                if (text := msg.get("text")) is not None:
                    raw: str | bytes = text
                    size = len(text.encode()) if len(text) > MAX_FRAME_BYTES // 4 else len(text)
                else:
                    raw = msg.get("bytes") or b""
                    size = len(raw)
                if size > MAX_FRAME_BYTES:
                    self.close_code = WS_MESSAGE_TOO_BIG
                    break
                if isinstance(raw, bytes):
                    self.send(
                        ServiceError("bad_request", "binary frames are not supported: send JSON as text frames").event()
                    )
                    continue
                await self.handle(raw)
        finally:
            # The socket is gone or closing: its generations go on without it (for a while: app/domain/replay.py)
            # and it leaves the admission queue.
            self.gone = True
            for starting in list(self.waiting):
                starting.cancel()
            self._stop_turns()
            for sid in self.opened:
                self.svc.chat.presence.closed(sid)
            if self.close_code is not None:
                await self.flush()
                await self._close(self.close_code)
            sender.cancel()

    def _stop_turns(self) -> None:
        for turn in self.turns:
            self.svc.chat.detach(turn, self.send)

    def _stalled(self) -> None:
        log.info("websocket client stopped reading; closing it with %d", WS_TOO_SLOW)
        self.close_code = WS_TOO_SLOW
        self._stop_turns()

    async def _close(self, code: int) -> None:
        reason = {WS_MESSAGE_TOO_BIG: "frame too large", WS_TOO_SLOW: "client too slow"}.get(code)
        try:
            await asyncio.wait_for(self.socket.close(code=code, reason=reason), 5.0)
        except Exception:
            pass

    async def flush(self) -> None:
        """Wait (up to a second) until the events queued so far are sent."""
        if self.sender is None or self.sender.done() or self.outbox.stalled:
            return
        sent = asyncio.ensure_future(self.outbox.queue.join())
        await asyncio.wait({sent, self.sender}, timeout=1.0)
        sent.cancel()

    async def _send_loop(self) -> None:
        try:
            while (text := await self.outbox.get()) is not None:
                await self.socket.send_text(text)
                self.outbox.queue.task_done()
            # The outbox filled up (the client stopped reading): close now, the reader may be idle.
            await self._close(WS_TOO_SLOW)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # disconnected
            log.debug("websocket send stopped: %s", e)

    async def handle(self, raw: str) -> None:
        envelope = Envelope()
        try:
            if not self.bucket.take():
                envelope = _envelope(raw)
                raise ServiceError(
                    "rate_limited", f"more than {self.svc.settings.ws_commands_per_s:g} commands a second; slow down"
                )
            try:
                cmd: AnyCommand = bodies.decode(raw, AnyCommand, "message")
            except ServiceError:
                envelope = _envelope(raw)
                raise
            envelope = Envelope(client_id=cmd.client_id, session_id=getattr(cmd, "session_id", None))
            if self.svc.chat is None or self.svc.store is None:
                raise ServiceError("unavailable", "the model is still loading; retry shortly")
            await self.handlers[type(cmd)](cmd)
        except ServiceError as e:
            self.send(e.event(session_id=envelope.session_id, client_id=envelope.client_id))
        except Exception as e:
            err = busy_database(e)
            if err is None:
                log.exception("websocket command failed")
                err = ServiceError("internal", "internal error")
            self.send(err.event(session_id=envelope.session_id, client_id=envelope.client_id))

    # -- commands -------------------------------------------------------------------------

    def reply(self, event: dict[str, Any], client_id: str | None) -> None:
        if client_id is not None:
            event["client_id"] = client_id
        self.send(event)

    def room_for(self, session_id: str | None) -> None:
        """Refuse watching one more session past the per-socket limit."""
        limit = self.svc.settings.ws_sessions
        if session_id not in self.opened and len(self.opened) >= limit:
            raise ServiceError("rate_limited", f"this socket already watches {limit} sessions; open another socket")

    def track(self, turn: Turn | None) -> None:
        if turn is not None:
            self.turns = [t for t in self.turns if not t.done] + [turn]
            self._watch(turn.session_id, turn.title)

    def _watch(self, session_id: str, title: str) -> None:
        if session_id not in self.opened:
            self.opened.add(session_id)
            self.svc.chat.presence.opened(session_id, title)

    async def session_create(self, cmd: bodies.SessionCreate) -> None:
        self.room_for(None)
        session = await self.svc.store.create_session(
            self.owner, **await new_session(self.svc.chat.models, cmd.fields())
        )
        self._watch(session.id, session.title)
        self.reply({"type": "session", "session": session.to_dict()}, cmd.client_id)

    async def session_open(self, cmd: bodies.SessionOpen) -> None:
        self.room_for(cmd.session_id)
        found = await self.svc.store.get_history(cmd.session_id, self.owner)
        if found is None:
            raise not_found(cmd.session_id)
        session, messages = found
        self._watch(cmd.session_id, session.title)
        self.reply({"type": "session", "session": session.to_dict()}, cmd.client_id)
        self._history(cmd.session_id, messages, cmd.client_id)
        asking = self.svc.chat.asking(cmd.session_id, self.owner, self.send)
        if asking is not None:  # a call awaits the user's decision: this client gives it and follows the rounds
            self.send(asking)

    def _history(self, session_id: str, branch: list[MessageRecord], client_id: str | None) -> None:
        """Answer `history`; a reply being generated in it is shown as far as it got (`seq`: its last event in
        there) and this socket follows it from there. No await in here: nothing happens in between."""
        replay = self.svc.chat.replay(session_id, self.owner)
        messages = [m.to_dict() for m in branch]
        at = next((i for i, m in enumerate(messages) if replay is not None and m["id"] == replay.message_id), None)
        event: dict[str, Any] = {"type": "history", "session_id": session_id, "messages": messages}
        stored_final = at is not None and messages[at]["status"] != "streaming"
        if replay is None or (at is None and replay.ended) or stored_final:
            # no turn, one that ended off this branch, or its reply is stored complete: the history says it all
            self.reply(event, client_id)
            return
        after = 0  # a running reply not in there started after the history was read: all of its events follow
        if at is not None:
            messages[at] = {**messages[at], "content": replay.text(), "status": "streaming"}
            after = replay.text_seq
        event["seq"] = after
        self.reply(event, client_id)
        self._follow(replay, after)

    def _follow(self, replay: Replay, after: int) -> bool:
        """This socket watches the turn of `replay` from event `after` on."""
        if not replay.attach(self.send, after):
            return False
        turn = self.svc.chat.running(replay.session_id, self.owner)
        if turn is not None and turn.replay is replay and not any(t is turn for t in self.turns):
            self.turns = [t for t in self.turns if not t.done] + [turn]
        return True

    async def turn_resume(self, cmd: bodies.TurnResume) -> None:
        self.room_for(cmd.session_id)
        replay = self.svc.chat.replay(cmd.session_id, self.owner, cmd.message_id)
        if replay is not None and cmd.after_seq > replay.seq:
            raise ServiceError(
                "invalid_parameter",
                f"'after_seq' is {cmd.after_seq}; the turn's last event is {replay.seq}",
                param="after_seq",
            )
        if replay is None or not replay.can_replay(cmd.after_seq):
            # The turn ended long ago (or its events from there are gone): the stored state, as session.open does
            found = await self.svc.store.get_history(cmd.session_id, self.owner)
            if found is None:
                raise not_found(cmd.session_id)
            self._watch(cmd.session_id, found[0].title)
            self._history(cmd.session_id, found[1], cmd.client_id)
            return
        turn = self.svc.chat.running(cmd.session_id, self.owner)
        self._watch(cmd.session_id, turn.title if turn is not None else "")
        self.reply(
            {"type": "turn.resumed", "session_id": cmd.session_id, "message_id": replay.message_id, "seq": replay.seq},
            cmd.client_id,
        )
        self._follow(replay, cmd.after_seq)

    async def branch_select(self, cmd: bodies.BranchSelect) -> None:
        _, messages = await self.svc.chat.select(cmd.session_id, self.owner, cmd.message_id)
        self.reply(
            {"type": "history", "session_id": cmd.session_id, "messages": [m.to_dict() for m in messages]},
            cmd.client_id,
        )

    async def ping(self, cmd: bodies.Ping) -> None:
        self.reply({"type": "pong"}, cmd.client_id)


def _envelope(raw: str) -> Envelope:
    """client_id and session_id of a command that failed to decode, when they can be read at all."""
    try:
        return msgspec.json.decode(raw, type=Envelope)
    except Exception:  # not JSON, not an object, wrong types, nested too deeply: address the error to no one
        return Envelope()


@websocket("/ws")
async def chat_socket(socket: WebSocket, services: NamedDependency[Services]) -> None:
    """The chat protocol (docs/protocol.md). Browsers authenticate with the subprotocols
    `forge` + `forge.bearer.<base64url key>`; other clients with `Authorization: Bearer <key>`. The socket may
    open while the model loads: its commands are refused ("unavailable") until it is ready."""
    offered = socket.scope.get("subprotocols") or []
    await socket.accept(subprotocols=WS_PROTOCOL if WS_PROTOCOL in offered else None)
    services.metrics.ws_opened()
    conn = Connection(socket, services)
    services.connections.add(conn)
    try:
        await conn.run()
    finally:
        services.connections.discard(conn)
        services.metrics.ws_closed()

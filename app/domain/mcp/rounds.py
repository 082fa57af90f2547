"""A message's tool rounds: when a session's reply calls MCP tools, the server runs them, stores each result below
the reply (as a client's `tool.result` would be stored), and continues the reply by itself, up to a bounded number
of rounds.

`Rounds` is the sink of every turn of those rounds: the turns' events pass through to the client's sink, and the
turn's end (None) is held back while a round follows. Between two turns the session stays reserved (no other
turn starts in it) and Stop cancels the running call.

A session that asks for approval (`settings.mcp_approval`) has each call wait for the user's `tool.approve`
(allow once, always allow that tool in the session, deny) unless its tool is in `settings.mcp_allowed`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.domain.errors import ServiceError
from app.domain.guard import Guard
from app.domain.mcp.registry import McpRegistry
from app.domain.turn import Sink
from app.store import Store

log = logging.getLogger("forge.mcp")

STOPPED = "error: the call was stopped by the user"
DENIED = "error: the call was denied by the user"
APPROVAL_WAIT_S = 300.0  # a call nobody approves or denies this long gets an error result: no turn waits forever
DECISIONS = ("once", "always", "deny")


@dataclass(slots=True, eq=False)
class Rounds:
    """The rounds of one message in `session_id`: `names` are the MCP tools its turns may call, `start` begins the
    turn that continues after a round's results (with this object as its sink), `limit` bounds the rounds."""

    session_id: str
    owner: str
    sink: Sink  # the client's
    client_id: str | None
    names: set[str]
    registry: McpRegistry
    store: Store
    guard: Guard
    start: Callable[[Rounds], Awaitable[Any]]
    limit: int
    done: Callable[[Rounds], None] = lambda r: None  # told when the rounds are over
    round: int = 0
    gone: bool = False  # the client went away: a round's results are stored, but the reply is not continued
    pending: tuple[str, list[dict[str, Any]]] | None = None  # (reply id, its calls) to run when its turn ends
    task: asyncio.Task | None = None
    stopped: bool = False
    calling: asyncio.Future | None = field(default=None)  # the call running (or awaiting approval) now
    allowed: set[str] | None = None  # run without asking; None: every call runs without asking
    asking: dict[str, Any] | None = None  # the `tool.approval` event of the call awaiting the user's decision

    def __call__(self, event: dict[str, Any] | None) -> None:
        if event is None:
            if self.pending is not None:
                self.task = asyncio.create_task(self._run(), name=f"mcp-rounds-{self.session_id}")
            else:
                self._end()
            return
        if (event["type"], event.get("finish_reason"), event.get("status")) == ("done", "tool_calls", "complete"):
            calls = event.get("tool_calls") or []
            if any(c["function"]["name"] in self.names for c in calls) and not self.guard.shutting_down:
                # Reserved at once (the turn has just freed the session): nothing else starts in it meanwhile.
                self.guard.reserved.add(self.session_id)
                self.pending = (event["message_id"], calls)
        self.sink(event)

    def _emit(self, event: dict[str, Any]) -> None:
        if self.client_id is not None:
            event["client_id"] = self.client_id
        try:
            self.sink(event)
        except Exception:
            log.exception("event sink failed for session %s", self.session_id)

    def _end(self) -> None:
        self.done(self)
        self.sink(None)

    def stop(self) -> bool:
        """Stop the running call (its result says so); False when no round is running its tools."""
        if self.task is None or self.task.done():
            return False
        self.stopped = True  # the calls not started yet get the same result
        if self.calling is not None:
            self.calling.cancel()  # only the call: the round goes on to store its result and end
        return True

    def approve(self, call_id: str, decision: str) -> bool:
        """The user's decision (DECISIONS) on the call awaiting approval; False when `call_id` awaits none."""
        asking, waiting = self.asking, self.calling
        if asking is None or asking["tool_call_id"] != call_id or waiting is None or waiting.done():
            return False
        if decision == "always" and self.allowed is not None:
            self.allowed.add(asking["name"])
        waiting.set_result(decision)
        return True

    async def _run(self) -> None:
        assert self.pending is not None
        reply_id, calls = self.pending
        self.pending = None
        parent = reply_id
        try:
            for call in calls:
                name, call_id = call["function"]["name"], call["id"]
                if name not in self.names:
                    continue  # a client's tool: its client posts the result
                content = STOPPED
                if not self.stopped:
                    content = await self._call(reply_id, call_id, name, call["function"]["arguments"])
                added = await self.store.add_tool_result(
                    self.session_id, self.owner, parent_id=parent, tool_call_id=call_id, content=content
                )
                if added is None:  # the session was deleted meanwhile
                    self.stopped = True
                    break
                parent = added[1].id
                self._emit({"type": "message.created", "session_id": self.session_id, "message": added[1].to_dict()})
            self.guard.reserved.discard(self.session_id)
            answered = all(c["function"]["name"] in self.names for c in calls)
            if self.stopped or self.gone or not answered or self.round >= self.limit or self.guard.shutting_down:
                self._end()
                return
            self.round += 1
            await self.start(self)  # reserves the session again at once: nothing slips in between
        except ServiceError as e:  # the next turn was refused (overloaded, shutting down...)
            self.guard.reserved.discard(self.session_id)
            self._emit(e.event(session_id=self.session_id))
            self._end()
        except Exception:
            log.exception("the tool round in session %s failed", self.session_id)
            self.guard.reserved.discard(self.session_id)
            self._emit(ServiceError("internal", "the tool round failed").event(session_id=self.session_id))
            self._end()

    async def _approval(self, reply_id: str, call_id: str, name: str, arguments: str) -> str | None:
        """Ask the user about a call (unless its tool is allowed): None when it may run, else its result."""
        if self.allowed is None or name in self.allowed:
            return None
        self.asking = {
            "type": "tool.approval",
            "session_id": self.session_id,
            "message_id": reply_id,
            "tool_call_id": call_id,
            "name": name,
            "arguments": arguments,
        }
        waiting = self.calling = asyncio.get_running_loop().create_future()
        self._emit(dict(self.asking))
        try:
            await asyncio.wait({waiting}, timeout=APPROVAL_WAIT_S)
        finally:
            self.calling = self.asking = None
        if waiting.cancelled():  # Stop
            return STOPPED
        if not waiting.done():
            waiting.cancel()
            return f"error: the call was not approved within {APPROVAL_WAIT_S:g} s"
        return DENIED if waiting.result() == "deny" else None

    async def _call(self, reply_id: str, call_id: str, name: str, arguments: str) -> str:
        refused = await self._approval(reply_id, call_id, name, arguments)
        if refused is not None:
            return refused
        if self.stopped:  # Stop came as the call was approved
            return STOPPED
        self._emit(
            {
                "type": "tool.running",
                "session_id": self.session_id,
                "message_id": reply_id,
                "tool_call_id": call_id,
                "name": name,
            }
        )
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            return "error: the arguments are not JSON"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        self.calling = asyncio.ensure_future(self.registry.call(name, args))
        try:
            outcome = await self.calling
        except asyncio.CancelledError:
            if not self.calling.cancelled():
                raise  # this round itself was cancelled
            return STOPPED
        finally:
            self.calling = None
        return outcome.content

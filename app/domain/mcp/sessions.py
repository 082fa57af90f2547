"""McpSessions: the MCP side of chat sessions, which ChatService holds. It knows which MCP tools a session's turn
offers (`settings.mcp_tools`) and keeps each session's message's tool rounds (rounds.py) while they last: the
turn's sink that runs the calls, the call awaiting the user's approval, Stop on a running call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.domain.errors import ServiceError
from app.domain.guard import Guard
from app.domain.mcp.registry import McpRegistry
from app.domain.mcp.rounds import Rounds
from app.domain.turn import Sink
from app.store import Store
from app.store.records import SessionRecord


@dataclass(slots=True, eq=False)
class McpSessions:
    """`registry`: the MCP servers whose tools sessions may choose (None: no server configured); `limit`: the tool
    rounds one message runs by itself; `rounds`: session id -> its message's tool rounds, while they last."""

    store: Store
    guard: Guard
    registry: McpRegistry | None = None
    limit: int = 4
    rounds: dict[str, Rounds] = field(default_factory=dict)

    def tools(self, settings: dict[str, Any]) -> list[dict[str, Any]]:
        """The MCP tools the session chose (`settings.mcp_tools`) that a server lists now, as OpenAI tool objects;
        a tool no server lists now is left out of the turn."""
        chosen = settings.get("mcp_tools") or []
        listed = self.registry.tools() if self.registry is not None else {}
        return [listed[name].openai() for name in chosen if name in listed]

    def wrap(
        self,
        session_id: str,
        owner: str,
        sink: Sink,
        client_id: str | None,
        names: set[str],
        settings: dict[str, Any],
        start: Callable[[Rounds], Awaitable[Any]],
    ) -> Rounds:
        """The sink of a turn whose reply may call the MCP tools `names`: it runs them and continues with `start`
        (rounds.py); with `settings.mcp_approval`, each call not in `settings.mcp_allowed` waits for the user's
        decision."""
        assert self.registry is not None

        def done(rounds: Rounds) -> None:
            if self.rounds.get(session_id) is rounds:
                del self.rounds[session_id]

        rounds = Rounds(
            session_id, owner, sink, client_id, names, self.registry, self.store, self.guard, start, self.limit, done
        )
        if settings.get("mcp_approval"):
            rounds.allowed = set(settings.get("mcp_allowed") or [])
        self.rounds[session_id] = rounds
        return rounds

    def asking(self, session_id: str, owner: str, sink: Sink) -> dict[str, Any] | None:
        """The `tool.approval` event of the MCP call in `session_id` awaiting the user's decision, if any. The
        rounds' events go to `sink` from now on (a reloaded page: the client that sent the message may be gone), and
        they continue after the decision."""
        rounds = self.rounds.get(session_id)
        if rounds is None or rounds.owner != owner or rounds.asking is None:
            return None
        rounds.sink, rounds.client_id, rounds.gone = sink, None, False
        return dict(rounds.asking)

    async def approve(self, session_id: str, owner: str, call_id: str, decision: str) -> SessionRecord | None:
        """The user's decision on the MCP call awaiting approval (rounds.py); "always" also stores the tool in the
        session's `mcp_allowed` and returns the session. ServiceError when no such call waits."""
        rounds = self.rounds.get(session_id)
        if rounds is None or rounds.owner != owner or not rounds.approve(call_id, decision):
            raise ServiceError(
                "not_found", f"no tool call '{call_id}' awaits approval in session '{session_id}'", param="tool_call_id"
            )
        if decision != "always" or rounds.allowed is None:
            return None
        return await self.store.update_session(session_id, owner, settings={"mcp_allowed": sorted(rounds.allowed)})

    def watcher(self, session_id: str, sink: Sink) -> Sink:
        """The sink a turn in `session_id` was given for `sink`'s client, now gone: the rounds around `sink` (told
        that the client left, so no round follows), else `sink` itself."""
        rounds = self.rounds.get(session_id)
        if rounds is not None and rounds.sink == sink:
            rounds.gone = True
            return rounds
        return sink

    def stop(self, session_id: str, owner: str) -> bool:
        """Stop `owner`'s running MCP call in the session (its result says it was stopped, and the reply does not
        continue); False when none runs."""
        rounds = self.rounds.get(session_id)
        return rounds is not None and rounds.owner == owner and rounds.stop()

    def task(self, session_id: str) -> asyncio.Task | None:
        """The session's round running its calls (or awaiting approval), if any."""
        rounds = self.rounds.get(session_id)
        return rounds.task if rounds is not None else None

    def stop_all(self) -> None:
        """Server shutdown: stop every running call."""
        for rounds in list(self.rounds.values()):
            rounds.stop()

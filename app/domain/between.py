"""Changes to a session made between its turns: choosing a branch, storing a tool's result, deleting it. Each holds
the session off turns while it writes (in this process, and through the session's lease on every replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from app.domain.errors import ServiceError, not_found
from app.domain.guard import Guard
from app.domain.tools import check_result
from app.store import Store
from app.store.records import MessageRecord, SessionRecord


@dataclass(slots=True, eq=False)
class BetweenTurns:
    """A session's changes that no turn may run beside. `stop(session_id, owner)` stops the session's running
    turn (or MCP call) and waits for it: deleting a session does that first."""

    store: Store
    guard: Guard
    stop: Callable[[str, str], Awaitable[None]]

    async def tool_result(
        self, session_id: str, owner: str, tool_call_id: str, content: str
    ) -> tuple[SessionRecord, MessageRecord]:
        """Store the result of a call of the chosen branch's last reply (a `tool` message below it and the
        results before); returns the session and the message. Refused while a reply is being generated."""
        with self.guard.reserve(session_id):
            found = await self.store.get_history(session_id, owner)
            if found is None:
                raise not_found(session_id)
            _, branch = found
            check_result(branch, tool_call_id)
            added = await self.store.add_tool_result(
                session_id, owner, parent_id=branch[-1].id, tool_call_id=tool_call_id, content=content
            )
            if added is None:
                raise not_found(session_id)
            return added

    async def select(self, session_id: str, owner: str, message_id: str) -> tuple[SessionRecord, list[MessageRecord]]:
        """Choose the branch through `message_id` (any message of the session); returns the session and its
        chosen branch. Refused (busy) while a reply is being generated in the session, on any replica."""
        busy = ServiceError(
            "busy",
            f"a reply is being generated in session '{session_id}'; switch branches when it is done",
            param="session_id",
        )
        if self.guard.running(session_id, owner) is not None or session_id in self.guard.reserved:
            raise busy
        async with self._held(session_id, owner, busy):
            found = await self.store.select(session_id, owner, message_id)
        if found is not None:
            return found
        if await self.store.get_session(session_id, owner) is None:
            raise not_found(session_id)
        raise ServiceError(
            "not_found", f"message '{message_id}' not found in session '{session_id}'", param="message_id"
        )

    async def delete_session(self, session_id: str, owner: str) -> bool:
        """Delete a session (False: not found); a reply running here is stopped first, one running on another
        replica refuses (busy) as a concurrent turn would."""
        await self.stop(session_id, owner)
        busy = ServiceError(
            "busy", f"a reply is being generated in session '{session_id}' on another replica", param="session_id"
        )
        async with self._held(session_id, owner, busy):
            return await self.store.delete_session(session_id, owner)

    @asynccontextmanager
    async def _held(self, session_id: str, owner: str, busy: ServiceError) -> AsyncIterator[None]:
        """Hold the session's lease (with replicas) so no turn starts on any replica meanwhile; `busy` while one
        runs. Another owner's session is not found, busy or not."""
        try:
            lease = await self.guard.take(session_id)
        except ServiceError:
            if await self.store.get_session(session_id, owner) is None:
                raise not_found(session_id) from None
            raise busy from None
        try:
            yield
        finally:
            await self.guard.give_back(lease)

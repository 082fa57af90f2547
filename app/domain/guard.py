"""Which turns may start: at most one reply generating per session, none once the server is shutting down."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from app.domain.errors import ServiceError
from app.domain.turn import Turn


class Guard:
    """The running turns by session, and the sessions whose turn is being set up (or waits to be admitted):
    both count as busy."""

    def __init__(self) -> None:
        self.turns: dict[str, Turn] = {}  # session id -> running turn
        self.reserved: set[str] = set()
        self.shutting_down = False

    def check_open(self) -> None:
        """ServiceError("unavailable") once the server is shutting down."""
        if self.shutting_down:
            raise ServiceError("unavailable", "the server is shutting down")

    def busy(self, session_id: str) -> bool:
        return session_id in self.turns or session_id in self.reserved

    @contextmanager
    def reserve(self, session_id: str) -> Iterator[None]:
        """Hold `session_id` while its turn is set up; refused (unavailable, busy) as a new turn would be."""
        self.check_open()
        if self.busy(session_id):
            raise ServiceError("busy", f"a reply is already being generated in session '{session_id}'",
                               param="session_id")
        self.reserved.add(session_id)
        try:
            yield
        finally:
            self.reserved.discard(session_id)

    def running(self, session_id: str, owner: str) -> Turn | None:
        """The running turn of one of `owner`'s sessions."""
        turn = self.turns.get(session_id)
        return turn if turn is not None and turn.owner == owner and not turn.done else None

    def forget(self, turn: Turn) -> None:
        """The turn's session is free again."""
        if self.turns.get(turn.session_id) is turn:
            del self.turns[turn.session_id]

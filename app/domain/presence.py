"""Which sessions people are looking at: the admin page's active sessions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.domain.turn import Turn


class Presence:
    """Sessions shown by connected clients (WebSockets), with how many show each."""

    def __init__(self) -> None:
        self._open: dict[str, list[Any]] = {}  # session id -> [title, clients showing it]

    def opened(self, session_id: str, title: str) -> None:
        """A client (WebSocket) shows this session."""
        entry = self._open.setdefault(session_id, [title, 0])
        entry[0] = title
        entry[1] += 1

    def closed(self, session_id: str) -> None:
        entry = self._open.get(session_id)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._open[session_id]

    def active(self, turns: Iterable[Turn]) -> list[dict[str, Any]]:
        """Sessions generating a reply (`turns`: "generating") or open on a connected client ("open")."""
        out = [
            {
                "id": t.session_id,
                "title": t.title,
                "status": "generating",
                "message_id": t.message_id,
                "viewers": self._open.get(t.session_id, [None, 0])[1],
            }
            for t in turns
        ]
        generating = {t["id"] for t in out}
        out += [
            {"id": sid, "title": title, "status": "open", "message_id": None, "viewers": count}
            for sid, (title, count) in self._open.items()
            if sid not in generating
        ]
        return out

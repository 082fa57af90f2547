"""How one MCP tool call ended."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Outcome:
    """A call's end: the text the model reads as the tool's result, whether the call succeeded, its latency."""

    content: str
    ok: bool
    seconds: float
    why: str = "ok"  # ok | error (the tool's own) | timeout | failed (the server or its connection) | stopped

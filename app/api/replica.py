"""`X-Forge-Replica` on every answer (HTTP, SSE, the WebSocket's handshake): which replica served it, for
clients and operators behind a load balancer (docs/scale-out.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from litestar.types import Message, Scope

HEADER = b"x-forge-replica"
_STARTS = ("http.response.start", "websocket.accept", "websocket.http.response.start")


def replica_header(name: str) -> Callable[[Message, Scope], Awaitable[None]]:
    """A Litestar `before_send` hook naming this replica on every response start and WebSocket accept."""
    value = name.encode("utf-8", "replace")  # a printable name (app.config); HTTP carries its bytes as they are

    async def hook(message: Message, scope: Scope) -> None:
        if message["type"] in _STARTS:
            given: list[tuple[bytes, bytes]] = list(message.get("headers") or [])  # type: ignore[call-overload]
            headers = [(k, v) for k, v in given if k.lower() != HEADER]
            message["headers"] = [*headers, (HEADER, value)]  # type: ignore[typeddict-unknown-key]

    return hook

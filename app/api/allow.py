"""`Allow` on OPTIONS answers: every method of the path. Litestar builds a path's OPTIONS answer when the first
handler of that path is registered and keeps it when more handlers (PATCH, DELETE) join the path later, so its
`Allow` would list only the first one's methods."""

from __future__ import annotations

from litestar.types import Message, Scope


async def allow_header(message: Message, scope: Scope) -> None:
    """Litestar `before_send` hook: the `Allow` of an OPTIONS answer lists the methods of every handler of the path."""
    if message["type"] != "http.response.start" or scope.get("method") != "OPTIONS":
        return
    app, template = scope.get("litestar_app"), scope.get("path_template")
    if app is None or template is None:
        return
    methods = {m for route in app.routes if route.path_format == template for m in getattr(route, "methods", ())}
    if not methods:
        return
    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
    message["headers"] = [*headers, (b"allow", ", ".join(sorted(methods)).encode())]

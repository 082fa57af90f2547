"""What the handlers share (settings, store, engine, chat service, metrics) and the auth guards."""
from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from app.api.errors import ServiceError
from app.chat import ChatService
from app.config import Settings
from app.metrics import Metrics
from app.store import Store


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    store: Store | None = None
    engine: Any = None
    chat: ChatService | None = None
    started_at: float = 0.0  # unix time the model was ready
    connections: set[Any] = field(default_factory=set)  # open WebSocket connections (app.api.ws.Connection)


def services(conn: ASGIConnection) -> Services:
    return conn.app.state.forge


def ready_services(conn: ASGIConnection) -> Services:
    """Services with the model loaded and the database open, else 503."""
    svc = services(conn)
    if svc.chat is None or svc.store is None:
        raise ServiceError("unavailable", "the model is still loading; retry shortly")
    return svc


def _bearer(conn: ASGIConnection) -> str | None:
    auth = conn.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def api_key_guard(conn: ASGIConnection, _: BaseRouteHandler) -> None:
    """OpenAI shim: `Authorization: Bearer <api key>` when the server has one."""
    key = services(conn).settings.api_key
    if key and not _matches(_bearer(conn), key):
        raise ServiceError("invalid_api_key", "missing or invalid API key: send 'Authorization: Bearer <key>'")


def admin_guard(conn: ASGIConnection, _: BaseRouteHandler) -> None:
    """Admin page, its feed and /metrics: the admin token as a bearer token or `?token=`."""
    token = services(conn).settings.admin_token
    if token and not (_matches(_bearer(conn), token) or _matches(conn.query_params.get("token"), token)):
        raise ServiceError("unauthorized", "missing or invalid admin token: send 'Authorization: Bearer <token>' "
                           "or add '?token=<token>'")

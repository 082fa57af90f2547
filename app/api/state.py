"""What the handlers share: settings, store, engine, chat service, metrics (access rules live in app.api.gate)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar.connection import ASGIConnection

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

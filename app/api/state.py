"""What the handlers share (`Services`, the app's state) and how they receive it: Litestar dependencies, typed,
each by its parameter name (`DEPENDENCIES`). Those of a loaded model answer 503 while it is still loading."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from litestar.datastructures import State
from litestar.di import Provide

from app.config import Settings
from app.domain.chat import ChatService
from app.domain.errors import ServiceError
from app.domain.models import ModelRegistry
from app.metrics import Metrics
from app.store import Store
from app.store.membership import Membership


@dataclass(slots=True)
class Services:
    settings: Settings
    metrics: Metrics
    store: Store | None = None
    chat: ChatService | None = None
    started_at: float = 0.0  # unix time the model was ready
    connections: set[Any] = field(default_factory=set)  # open WebSocket connections (app.api.ws.Connection)
    membership: Membership | None = None  # this process as a replica of its database (app.store.membership)
    models: ModelRegistry | None = None  # the served models and their state (app.domain.models)


@runtime_checkable  # Litestar checks a dependency's type with isinstance
class Ready(Protocol):
    """`Services` with the models served (the default loaded at start) and the database open: what the `svc`
    dependency gives."""

    @property
    def settings(self) -> Settings: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def store(self) -> Store: ...
    @property
    def chat(self) -> ChatService: ...
    @property
    def started_at(self) -> float: ...


def provide_services(state: State) -> Services:
    """The services as they are now (the model may still be loading)."""
    return state.forge


def provide_ready(state: State) -> Ready:
    """The services with the models served and the database open, else 503 (still starting)."""
    svc: Services = state.forge
    if svc.chat is None or svc.store is None:
        raise ServiceError("unavailable", "the model is still loading; retry shortly")
    return cast(Ready, svc)  # the check above: none of them is None


def provide_store(state: State) -> Store:
    store = provide_ready(state).store
    assert store is not None
    return store


def provide_chat(state: State) -> ChatService:
    chat = provide_ready(state).chat
    assert chat is not None
    return chat


def provide_settings(state: State) -> Settings:
    return provide_services(state).settings


def provide_metrics(state: State) -> Metrics:
    return provide_services(state).metrics


DEPENDENCIES = {
    "services": Provide(provide_services, sync_to_thread=False),
    "svc": Provide(provide_ready, sync_to_thread=False),
    "store": Provide(provide_store, sync_to_thread=False),
    "chat": Provide(provide_chat, sync_to_thread=False),
    "settings": Provide(provide_settings, sync_to_thread=False),
    "metrics": Provide(provide_metrics, sync_to_thread=False),
}

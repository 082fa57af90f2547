"""What a /v1 request runs against: the services with the engine and admission queue of the model its `model`
names (app.domain.models), held from before parsing until its generation ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.api.state import Ready
from app.config import Settings
from app.domain.chat import ChatService
from app.domain.models import ModelLease
from app.metrics import Metrics
from app.store import Store
from engine import Engine


@dataclass(slots=True)
class OnModel:
    """`Ready` with one model's engine in place of the default's, its admission queue (`admitter`) and the hold
    on it (`lease`: released once the request is over)."""

    settings: Settings
    metrics: Metrics
    store: Store
    chat: ChatService
    started_at: float
    lease: ModelLease

    @property
    def engine(self) -> Engine:
        return self.lease.engine

    @property
    def admitter(self) -> Any:
        return self.lease.slot.admitter

    @property
    def model_id(self) -> str:
        """The id the answer names: the model's name as /v1/models lists it."""
        return self.lease.slot.id


async def on_model(svc: Ready, model: str | None) -> OnModel:
    """The services on `model`'s engine, loaded first when it is not. ServiceError: model_not_found (404), or
    unavailable (503) when it cannot be loaded now."""
    lease = await svc.chat.models.acquire(model)
    return OnModel(svc.settings, svc.metrics, svc.store, svc.chat, svc.started_at, lease)

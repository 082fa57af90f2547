"""Health, readiness, Prometheus metrics and the admin page's JSON feed."""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.openapi import errors
from app.api.state import Services
from app.domain.errors import ServiceError
from app.metrics import Metrics

# Litestar adds the charset to text types itself: without this it would be named twice
METRICS_TYPE = CONTENT_TYPE_LATEST.replace("; charset=utf-8", "")

log = logging.getLogger("forge.admin")


@get("/health", responses=errors())
async def health() -> dict[str, str]:
    """Alive: the process answers."""
    return {"status": "ok"}


@get(
    "/ready",
    responses={
        **errors(),
        503: ResponseSpec(
            dict[str, Any],
            generate_examples=False,
            description="Not ready: the model is loading or the database does not answer",
        ),
    },
)
async def ready(services: NamedDependency[Services]) -> Response:
    """Ready: the models are served (the default loaded at start), the database answers and this replica is a
    member of it; 503 otherwise."""
    facts = _default_facts(services)
    model = facts.get("name")
    db = "not open"
    if services.store is not None:
        try:
            await services.store.ping()
            db = "ok"
        except Exception as e:
            log.warning("readiness: database unreachable: %s", e)
            db = "unreachable"
    joined = services.membership is not None and services.membership.member is not None
    ok = services.chat is not None and db == "ok" and joined
    body = {
        "status": "ready" if ok else "not_ready",
        "model": model,
        "db": db,
        "replica": services.settings.replica,
        "member": joined,
        # which kernels serve now, and the background compile while the float32 reference serves (else None)
        "backend": facts.get("backend"),
        "background_compile": facts.get("background_compile"),
    }
    if services.chat is None:
        body["detail"] = "the model is loading"
    elif not joined:
        body["detail"] = "not a member of the database's replicas (joining or leaving)"
    return Response(body, status_code=200 if ok else 503)


@get("/metrics", media_type=METRICS_TYPE, responses=errors(401))
async def metrics(metrics: NamedDependency[Metrics]) -> Response:
    """Prometheus text format (admin token)."""
    return Response(metrics.render(), media_type=METRICS_TYPE)


@get("/admin/api/stats", responses=errors(401, 503))
async def stats(services: NamedDependency[Services]) -> dict[str, Any]:
    """One snapshot for the admin page (polled every second): engine, model, latencies, sessions."""
    if services.chat is None:
        raise ServiceError("unavailable", "the model is still loading; retry shortly")
    default = services.chat.models.default.engine
    return {
        "time": time.time(),
        "model": _default_facts(services),
        "engine": default.stats() if default is not None else {},
        "mcp": services.chat.mcp.snapshot() if services.chat.mcp is not None else [],  # MCP servers and tools
        "models": services.chat.models.snapshot(),  # every served model: state, memory, requests
        "model_memory": services.chat.models.budget_info(),
        **services.metrics.snapshot(),
        "active_sessions": services.chat.active(),
    }


def _default_facts(services: Services) -> dict[str, Any]:
    """The default model's facts: its engine's while loaded, else its name and state (it loads on its next
    request); {} before the models are served."""
    if services.models is None:
        return {}
    slot = services.models.default
    if slot.engine is not None:
        return slot.engine.model_info
    return {"name": slot.name or slot.id, "state": slot.state}

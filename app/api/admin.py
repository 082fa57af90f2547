"""Health, readiness, Prometheus metrics and the admin page's JSON feed."""
from __future__ import annotations

import logging
import time
from typing import Any

from litestar import Request, Response, get
from litestar.openapi.datastructures import ResponseSpec
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.errors import ServiceError
from app.api.openapi import errors
from app.api.state import services

# Litestar adds the charset to text types itself: without this it would be named twice
METRICS_TYPE = CONTENT_TYPE_LATEST.replace("; charset=utf-8", "")

log = logging.getLogger("forge.admin")


@get("/health", responses=errors())
async def health() -> dict[str, str]:
    """Alive: the process answers."""
    return {"status": "ok"}


@get("/ready", responses={**errors(), 503: ResponseSpec(dict[str, Any], generate_examples=False,
     description="Not ready: the model is loading or the database does not answer")})
async def ready(request: Request) -> Response:
    """Ready: the model is loaded and the database answers; 503 otherwise."""
    svc = services(request)
    model = svc.engine.model_info.get("name") if svc.engine is not None else None
    db = "not open"
    if svc.store is not None:
        try:
            await svc.store.ping()
            db = "ok"
        except Exception as e:
            log.warning("readiness: database unreachable: %s", e)
            db = "unreachable"
    ok = svc.chat is not None and db == "ok"
    body = {"status": "ready" if ok else "not_ready", "model": model, "db": db}
    if svc.chat is None:
        body["detail"] = "the model is loading"
    return Response(body, status_code=200 if ok else 503)


@get("/metrics", media_type=METRICS_TYPE, responses=errors(401))
async def metrics(request: Request) -> Response:
    """Prometheus text format (admin token)."""
    return Response(services(request).metrics.render(), media_type=METRICS_TYPE)


@get("/admin/api/stats", responses=errors(401, 503))
async def stats(request: Request) -> dict[str, Any]:
    """One snapshot for the admin page (polled every second): engine, model, latencies, sessions."""
    svc = services(request)
    if svc.engine is None or svc.chat is None:
        raise ServiceError("unavailable", "the model is still loading; retry shortly")
    return {
        "time": time.time(),
        "model": svc.engine.model_info,
        "engine": svc.engine.stats(),
        **svc.metrics.snapshot(),
        "active_sessions": svc.chat.active(),
    }

"""`create_app(settings, engine=None) -> Litestar`: routes, error handlers and the lifespan that
opens the database (after migrating it), joins it as a replica (sweeping the replies of replicas that died),
loads the engine and, on shutdown, stores in-flight replies as "interrupted" and leaves before stopping the
engine."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.datastructures import State
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.types import ControllerRouterHandler

from app.api import admin, embeddings, mcp, openai, pages, search, sessions, ws
from app.api.allow import allow_header
from app.api.errors import EXCEPTION_HANDLERS
from app.api.gate import Gate, security_headers
from app.api.links import add_links
from app.api.openapi import StructSchemas
from app.api.reference import ApiReference
from app.api.replica import replica_header
from app.api.schema_rules import add_rules
from app.api.state import DEPENDENCIES, Services
from app.api.typed import TypedRequest
from app.config import Settings
from app.domain.admission import Admission
from app.domain.chat import ChatService
from app.domain.mcp.registry import McpRegistry
from app.domain.mcp.spec import ServerSpec
from app.domain.models import ModelRegistry, ModelSpec
from app.domain.relay import open_relay
from app.metrics import Metrics
from app.models.catalog import size_on_disk
from app.store import Store
from app.store.membership import Membership
from app.store.migrate import upgrade
from engine import Engine, parse_size

log = logging.getLogger("forge.app")

MAX_BODY_BYTES = 8 << 20  # an imported session can be large; chat content is capped separately


def _load_engine(
    settings: Settings, model: str = "default", progress: Callable[[str], None] | None = None, folder: str = ""
) -> Engine:
    return Engine.load(
        model=model,
        backend=settings.backend,
        kv_memory=settings.kv_memory,
        max_waiting=settings.max_waiting,
        threads=settings.threads,
        quantize=settings.quantize,
        activations=settings.activations,
        speculative=settings.speculative,
        spec_row_cost=settings.spec_row_cost,
        kv_spill_dir=os.path.join(settings.spill_dir(), folder) if folder else settings.spill_dir(),
        kv_spill_size=settings.kv_spill_size,
        quick_start=True,  # a new machine answers while its CPU kernels compile (engine/backend_swap.py)
        progress=progress,
    )


def _registry(settings: Settings) -> ModelRegistry:
    """The served models (the default first), each loaded on demand within the budget."""
    kv = parse_size(settings.kv_memory)
    default = settings.model_specs()[0]
    return ModelRegistry.of(
        settings.model_specs(),
        # each model's spill files in a folder of its own (the default's where a one-model server keeps them)
        load=lambda spec, progress: _load_engine(settings, spec.source, progress, _folder(spec, default)),
        footprint=lambda spec: size_on_disk(spec.source) + kv,
        budget=settings.model_budget(),
        wait_s=settings.queue_timeout_s,
    )


def _folder(spec: ModelSpec, default: ModelSpec) -> str:
    return "" if spec == default else os.path.join("models", spec.alias)


async def _open_models(settings: Settings, engine: Engine | None) -> tuple[ModelRegistry, Engine]:
    """The served models with the default loaded now (or `engine`, the caller's, serving it), and the default's
    engine; the others load on demand."""
    models = _registry(settings)
    if engine is not None:
        models.adopt(models.default, engine, owned=False)
    else:
        (await models.acquire(None)).release()  # the default loads now (and unloads only to make room)
    assert models.default.engine is not None
    return models, models.default.engine


# Every route of the service (the composition root's list, kept out of create_app to keep it short).
ROUTES: list[ControllerRouterHandler] = [
    admin.health,
    admin.ready,
    admin.metrics,
    admin.stats,
    pages.index,
    pages.admin_page,
    pages.static_router,
    sessions.router,
    search.search,
    mcp.mcp_tools,
    openai.router,
    ws.chat_socket,
    embeddings.embeddings,
]


def create_app(settings: Settings | None = None, engine: Engine | None = None, *, migrate: bool = True) -> Litestar:
    """The Forge service. With `engine=None` the lifespan loads (and later shuts down) the model itself;
    a passed engine stays the caller's to shut down. `migrate=False` when the caller already upgraded."""
    settings = settings or Settings.from_env()
    svc = Services(settings=settings, metrics=Metrics())

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        if migrate:
            await asyncio.to_thread(upgrade, settings.database_url)
        store = Store(settings.database_url, lease_ttl_s=settings.lease_ttl_s)
        await store.ping()
        # Only replies of replicas that are dead (their lock free, or their lease passed) are interrupted: others
        # sharing the database stream on.
        membership = Membership(
            store.leases,
            settings.replica,
            f"{settings.host}:{settings.port}",
            on_lost=lambda: svc.chat.abandon() if svc.chat is not None else None,
            reaper=store.reaper,
        )
        await membership.start()
        if membership.swept:
            log.warning("marked %d reply(ies) of stopped replicas as interrupted", membership.swept)
        svc.membership = membership
        try:
            models, eng = await _open_models(settings, engine)
        except BaseException:
            await membership.stop()
            await store.close()
            raise
        svc.store, svc.models = store, models
        svc.chat = ChatService(
            eng,
            store,
            svc.metrics,
            Admission(
                eng.max_num_seqs,
                queue_size=settings.queue_size,
                timeout_s=settings.queue_timeout_s,
                per_owner=settings.max_concurrent_per_key,
            ),
            detached_s=settings.detached_turn_s,
            replica=settings.replica,
            holding=lambda: membership.holding,
            models=models,
        )
        if settings.mcp_servers:  # their tools are listed before the first turn may choose them
            svc.chat.mcp = McpRegistry(
                [ServerSpec.parse(text) for text in settings.mcp_servers],
                timeout_s=settings.mcp_timeout_s,
                result_bytes=settings.mcp_result_bytes,
                observe=svc.metrics.mcp_call,
            )
            svc.chat.mcp_rounds = settings.mcp_rounds
            svc.metrics.mcp_servers = svc.chat.mcp.snapshot
            await svc.chat.mcp.start()
        # Before anything is generated: a turn's events reach the other replicas from its first one.
        svc.chat.relay = await open_relay(svc.chat.replays, store)
        svc.started_at = time.time()
        log.info(
            "ready: %s on %s, database %s",
            eng.model_info.get("name"),
            eng.model_info.get("backend"),
            store.engine.url.render_as_string(hide_password=True),
        )
        try:
            yield
        finally:
            svc.chat.interrupt_all()
            await svc.chat.drain(settings.shutdown_grace_s)
            await svc.chat.close()
            if svc.chat.relay is not None:  # after the drain: the turns' last events go out first
                await svc.chat.relay.close()
            await membership.stop()  # after the drain: the replies are stored, the session leases released
            if svc.chat.mcp is not None:
                await svc.chat.mcp.close()
            await models.close()  # the engines it loaded (a passed engine stays the caller's)
            await store.close()
            log.info("stopped")

    app = Litestar(
        route_handlers=ROUTES,
        lifespan=[lifespan],
        state=State({"forge": svc}),
        dependencies=DEPENDENCIES,
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        middleware=[DefineMiddleware(Gate, settings=settings)],
        before_send=[security_headers, allow_header, replica_header(settings.replica)],
        plugins=[StructSchemas()],  # before Litestar's own: refused extra fields in the schema
        request_class=TypedRequest,
        request_max_body_size=MAX_BODY_BYTES,
        openapi_config=OpenAPIConfig(
            title="Forge",
            version="0.1.0",
            path="/schema",
            description="Chat sessions, SSE turns and an OpenAI-compatible shim. "
            "The WebSocket protocol is in docs/protocol.md.",
            render_plugins=[ApiReference()],
        ),
        logging_config=None,
    )
    add_links(app.openapi_schema)  # before the first request renders the schema
    add_rules(app.openapi_schema)
    return app


async def drain(app: Litestar, timeout: float) -> None:
    """Server is stopping: abort the running turns, wait (up to `timeout`) for them to store their
    replies as interrupted, and for the WebSockets to send out their `done` events."""
    svc: Services = app.state.forge
    if svc.chat is None:
        return
    svc.chat.interrupt_all()
    await svc.chat.drain(timeout)
    await asyncio.gather(*(conn.flush() for conn in list(svc.connections)))


def interrupt(app: Litestar) -> None:
    """Server is stopping (SIGTERM): refuse new turns, abort running ones so they are stored as interrupted."""
    svc: Services = app.state.forge
    if svc.chat is not None:
        svc.chat.interrupt_all()

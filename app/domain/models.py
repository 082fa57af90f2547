"""Which models this server serves and their state: on disk, loading (with the loader's last progress line),
ready, unloading; the memory each counts against `--model-memory`, the requests holding it, when it was last used.

Each model has its own Engine (its own KV cache, prefix cache and spill folder). A request holds its model with a
lease (`acquire` ... `ModelLease.release`) from before it waits for admission until its generation ends: a model
with leases is never unloaded. A model that is not loaded loads on its first lease; when it would not fit in the
budget, idle models (no lease) are unloaded, least recently used first. When every model that could make room is
busy, the load waits for one to finish, up to `wait_s`, then refuses (`unavailable`, with `retry_after_s`).

The first model (the default: sessions without a model, requests naming `default`) loads at start; like the
others it is unloaded when idle and another needs its room, and loads again on its next request. An engine handed
in by a caller (tests, `create_app(engine=...)`) is the caller's and is never unloaded. A model bigger than the
whole budget still loads when no other model is loaded.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from app.domain.errors import ServiceError
from engine import Engine  # at run time: the app's dependency injection reads these dataclasses' hints

log = logging.getLogger("forge.models")

ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what `--model NAME=...` may call a model
DEFAULT = "default"
RETRY_S = 5  # a refused load's Retry-After: a running turn takes seconds


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """One `--model` value: `NAME=SOURCE` or just `SOURCE` ("default", a path, `hf:OWNER/REPO[/FILE][:QUANT]`),
    whose name is then the file's stem. `named` False (the default model given without a name): the id /v1 lists
    is the model's own name once loaded, as a one-model server has always listed it."""

    alias: str
    source: str
    named: bool = True

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """ValueError naming the value when it holds no source or a bad name."""
        text = text.strip()
        name, eq, source = text.partition("=")
        if eq and ALIAS.fullmatch(name.strip()):
            if not source.strip():
                raise ValueError(f"--model {text!r} names no model after '='")
            return cls(name.strip(), source.strip())
        if eq and "/" not in name and ":" not in name:
            raise ValueError(f"--model {text!r}: a model's name is 1-64 letters, digits, '.', '_' or '-'")
        if not text:
            raise ValueError("--model is empty")
        return cls(stem(text), text, named=text != DEFAULT)


def stem(source: str) -> str:
    """The name a model given without one answers to: `default`, a file's stem, a hub repository's last part."""
    if source == DEFAULT:
        return DEFAULT
    base = source[3:] if source.startswith("hf:") else source
    base = base.rsplit(":", 1)[0] if source.startswith("hf:") else base
    name = PurePath(base.rstrip("/")).name
    name = name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    name = re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip("._-")[:64]
    return name or "model"


def parse_specs(values: tuple[str, ...] | list[str], fallback: str = DEFAULT) -> list[ModelSpec]:
    """The served models, the default first: each `--model` value, or `fallback` alone. ValueError on a name
    given twice."""
    specs = [ModelSpec.parse(v) for v in values] or [ModelSpec.parse(fallback)]
    names = [s.alias for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two --model values share the name {twice[0]!r}: give each its own (NAME=MODEL)")
    return specs


@dataclass(slots=True, eq=False)
class ModelSlot:
    """One served model and its state."""

    spec: ModelSpec
    memory: int  # bytes it counts against the budget while loaded (its file and its KV budget)
    state: str = "on disk"  # on disk | loading | ready | unloading
    engine: Engine | None = None
    name: str | None = None  # the model's own name, once loaded
    leases: int = 0  # requests holding it: running, or waiting for admission or for it to load
    last_used: float = 0.0
    progress: str | None = None  # the loader's last line while loading
    error: str | None = None  # why the last load failed
    owned: bool = True  # shut down on unload (False: a caller's engine, never unloaded)
    admitter: Any = None  # its own admission queue (app.domain.admit.Admitter), set by ChatService

    @property
    def alias(self) -> str:
        return self.spec.alias

    @property
    def id(self) -> str:
        """The id /v1 lists: the given name, else the model's own name once known."""
        return self.spec.alias if self.spec.named or self.name is None else self.name

    def answers_to(self, name: str) -> bool:
        return name in (self.spec.alias, self.name, self.id)


@dataclass(slots=True, eq=False)
class ModelLease:
    """A request's hold on a loaded model; `release` once (later calls do nothing)."""

    registry: ModelRegistry
    slot: ModelSlot
    released: bool = False

    @property
    def engine(self) -> Engine:
        assert self.slot.engine is not None, "a leased model is loaded"
        return self.slot.engine

    @property
    def alias(self) -> str:
        return self.slot.alias

    @property
    def id(self) -> str:
        return self.slot.id

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.registry.let_go(self.slot)


Loader = Callable[[ModelSpec, Callable[[str], None]], "Engine"]  # blocking: runs on a worker thread


@dataclass(slots=True, eq=False)
class ModelRegistry:
    """The served models (`slots`, the default first). `load(spec, progress)` builds an Engine (blocking);
    `footprint(spec)` the bytes a model counts; `budget` their sum's limit; `wait_s` how long a load waits for
    busy models to finish."""

    slots: list[ModelSlot]
    load: Loader
    footprint: Callable[[ModelSpec], int]
    budget: int
    wait_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _changed: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) on every change
    _loading: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def of(
        cls, specs: list[ModelSpec], load: Loader, footprint: Callable[[ModelSpec], int], budget: int, **kw: Any
    ) -> ModelRegistry:
        """The registry of `specs`, none loaded; the first is the default."""
        return cls([ModelSlot(spec, footprint(spec)) for spec in specs], load, footprint, budget, **kw)

    @property
    def default(self) -> ModelSlot:
        return self.slots[0]

    def find(self, name: str | None) -> ModelSlot:
        """The model `name` names (None or "default": the default); ServiceError model_not_found otherwise."""
        if name is None:
            return self.default
        for slot in self.slots:  # a name given wins over a model's own name
            if slot.alias == name:
                return slot
        for slot in self.slots:
            if slot.answers_to(name):
                return slot
        if name == DEFAULT:
            return self.default
        served = ", ".join(s.id for s in self.slots)
        raise ServiceError("model_not_found", f"model '{name}' not found; this server serves: {served}", param="model")

    def session_model(self, name: str | None) -> str | None:
        """What a session stores for the model `name` names: its alias (None: the default, left unnamed).
        ServiceError invalid_parameter naming `model` when this server serves no such model (a 400: the session
        itself is there)."""
        try:
            return None if name is None else self.find(name).alias
        except ServiceError as e:
            raise ServiceError("invalid_parameter", e.message, param="model") from None

    async def engine_of(self, name: str | None) -> Engine:
        """The engine whose recommendations and tokenizer a session of `name`'s model is checked with: its own when
        loaded, else the default's, else any loaded one (a session is not worth loading a model for); the default,
        loaded now, when none is."""
        loaded = [self.find(name).engine, self.default.engine] + [s.engine for s in self.slots]
        engine = next((e for e in loaded if e is not None), None)
        if engine is None:
            lease = await self.acquire(None)
            engine = lease.engine
            lease.release()
        return engine

    def used(self) -> int:
        """Bytes the loaded (or loading, or unloading) models count."""
        return sum(s.memory for s in self.slots if s.state != "on disk")

    def adopt(self, slot: ModelSlot, engine: Engine, owned: bool = True) -> None:
        """`engine`, loaded elsewhere, serves `slot` (the default at start)."""
        slot.engine, slot.owned, slot.state, slot.error = engine, owned, "ready", None
        slot.name = str(getattr(engine, "model_info", {}).get("name") or slot.alias)
        slot.last_used = self.clock()

    # -- leases ---------------------------------------------------------------------------------

    async def acquire(self, name: str | None) -> ModelLease:
        """A hold on the model `name` names, loaded first when it is not (making room, or waiting for it).
        ServiceError: model_not_found, or unavailable when it cannot be loaded (now)."""
        slot = self.find(name)
        slot.leases += 1  # from now on: never unloaded under this request
        try:
            await self._ready(slot)
        except BaseException:
            self.let_go(slot)
            raise
        slot.last_used = self.clock()
        return ModelLease(self, slot)

    def let_go(self, slot: ModelSlot) -> None:
        slot.leases = max(0, slot.leases - 1)
        slot.last_used = self.clock()
        self._notify()

    # -- loading and unloading --------------------------------------------------------------------

    async def _ready(self, slot: ModelSlot) -> None:
        while slot.state != "ready":
            if slot.state in ("loading", "unloading"):
                await self._changed.wait()
                continue
            async with self._loading:  # one load at a time: each one's room is counted against the others
                if slot.state != "on disk":
                    continue
                await self._make_room(slot)
                # shielded: a request that goes away mid-load leaves the load to finish for the next one
                await asyncio.shield(asyncio.ensure_future(self._load(slot)))

    async def _make_room(self, slot: ModelSlot) -> None:
        slot.memory = self.footprint(slot.spec)  # a hub model pulled since start has a size now
        deadline = self.clock() + self.wait_s
        while self.used() + slot.memory > self.budget:
            changed = self._changed  # taken before looking: a change after the look sets this one
            idle = [s for s in self.slots if s.state == "ready" and s.leases == 0 and s.owned]
            if idle:
                await asyncio.shield(asyncio.ensure_future(self._unload(min(idle, key=lambda s: s.last_used))))
                continue
            busy = [s for s in self.slots if s.state != "on disk" and s is not slot and s.owned]
            if not busy:  # bigger than the whole budget (beside a caller's engine): it runs over it
                log.warning("model %s (%d bytes) is over --model-memory; loading it alone", slot.alias, slot.memory)
                return
            left = deadline - self.clock()
            if left <= 0:
                names = ", ".join(s.alias for s in busy)
                raise ServiceError(
                    "unavailable",
                    f"model '{slot.alias}' does not fit in the model memory while {names} "
                    f"{'is' if len(busy) == 1 else 'are'} busy; retry later",
                    param="model",
                    retry_after_s=RETRY_S,
                )
            try:
                await asyncio.wait_for(changed.wait(), timeout=left)
            except TimeoutError:
                pass

    async def _load(self, slot: ModelSlot) -> None:
        slot.state, slot.progress, slot.error = "loading", None, None
        self._notify()
        log.info("loading model %s (%s)", slot.alias, slot.spec.source)

        def progress(line: str) -> None:
            slot.progress = line  # from the loading thread: one reference assigned

        try:
            engine = await asyncio.to_thread(self.load, slot.spec, progress)
        except Exception as e:
            slot.state, slot.error, slot.progress = "on disk", str(e), None
            self._notify()
            log.error("model %s failed to load: %s", slot.alias, e)
            raise ServiceError("unavailable", f"model '{slot.alias}' could not be loaded: {e}", param="model") from None
        slot.progress = None
        slot.memory = self.footprint(slot.spec)
        self.adopt(slot, engine)
        self._notify()
        log.info("model %s ready", slot.alias)

    async def _unload(self, slot: ModelSlot) -> None:
        log.info("unloading model %s (idle since %.0f s)", slot.alias, self.clock() - slot.last_used)
        slot.state = "unloading"
        self._notify()
        engine, slot.engine = slot.engine, None
        try:
            if engine is not None and slot.owned:
                await engine.shutdown()
        finally:
            slot.state = "on disk"
            self._notify()

    async def close(self) -> None:
        """Shut down every engine this registry loaded."""
        for slot in self.slots:
            if slot.engine is not None and slot.owned:
                await slot.engine.shutdown()
            slot.engine, slot.state = None, "on disk"

    def _notify(self) -> None:
        """Wake everything waiting on a state or a lease: they look again."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- what /admin and /metrics show ---------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        """Each model: id, name, source, state, progress, memory, requests (leases; running and queued from its
        admission), last used (seconds ago), and while loaded its engine's decode tokens/s and KV use."""
        now = self.clock()
        out = []
        for s in self.slots:
            adm = s.admitter.admission if s.admitter is not None else None
            stats = s.engine.stats() if s.engine is not None else {}
            out.append(
                {
                    "id": s.id,
                    "alias": s.alias,
                    "source": s.spec.source,
                    "default": s is self.default,
                    "state": s.state,
                    "progress": s.progress,
                    "error": s.error,
                    "memory_bytes": s.memory,
                    "requests": s.leases,
                    "running": adm.in_use if adm is not None and s.state == "ready" else 0,
                    "queued": adm.depth if adm is not None else 0,
                    "idle_s": round(now - s.last_used, 3) if s.last_used else None,
                    "backend": s.engine.model_info.get("backend") if s.engine is not None else None,
                    "decode_tok_s": stats.get("decode_tok_s"),
                    "kv_usage": stats.get("kv_usage"),
                }
            )
        return out

    def engines(self) -> list[tuple[str, Engine]]:
        """(id, engine) of each loaded model (the metrics' engine series)."""
        return [(s.id, s.engine) for s in self.slots if s.engine is not None]

    def admissions(self) -> list[tuple[str, Any]]:
        """(id, admission queue) of each model (the metrics' admission series)."""
        return [(s.id, s.admitter.admission) for s in self.slots if s.admitter is not None]

    def budget_info(self) -> dict[str, int]:
        return {"budget_bytes": self.budget, "used_bytes": self.used()}

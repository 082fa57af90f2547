"""`StepThread`: the thread that drives `LLMEngine.step()`, and the bridge between it and asyncio.

The model math releases the GIL in BLAS / on the GPU, so one long-lived thread runs the steps while the
event loops serve. Commands (typed, below) cross into it through a thread-safe queue and are applied between
two steps; events go back to each caller's event loop with `loop.call_soon_threadsafe`, one wake-up per loop
per step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from threadpoolctl import threadpool_limits

from engine.backend_swap import BackendSwap
from engine.llm_engine import LLMEngine
from engine.memory import return_freed_memory
from engine.types import EngineOverloaded, GenerationEvent
from kernels import RouteCheck

log = logging.getLogger("forge.engine")


@dataclass(slots=True)
class Route:
    """Where one request's events go: its caller's loop and queue."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    samples: int = 1
    finished: set[int] = field(default_factory=set)  # sample indices whose final event was sent


@dataclass(slots=True)
class Submit:
    """Add a validated request to the core: `admit(arrival)` does it; its events go to `route`."""

    request_id: str
    admit: Callable[[float], None]
    arrival: float
    route: Route


@dataclass(slots=True)
class Abort:
    request_id: str


@dataclass(slots=True)
class ResetPrefixCache:
    done: concurrent.futures.Future
    spill: bool = False


@dataclass(slots=True)
class Call:
    """Run `fn(core)` between two steps (an option that must not change mid-step); its result goes to `done`."""

    fn: Callable[[LLMEngine], Any]
    done: concurrent.futures.Future


@dataclass(slots=True)
class Stop:
    pass


Command = Submit | Abort | ResetPrefixCache | Call | Stop


class StepThread:
    """Runs the core's steps on its own thread; `put` a command from any thread. `switched(routes)` is told when
    the background compile's model (`swap`) took over."""

    def __init__(
        self, core: LLMEngine, threads: int, switched: Callable[[list[RouteCheck]], None] | None = None
    ) -> None:
        self.core = core
        self.threads = threads
        self.swap: BackendSwap | None = None  # the compiled backend being built while the reference serves
        self._switched = switched
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._routes: dict[str, Route] = {}  # request id -> its consumer (step-thread side)
        self._submitted = 0  # requests handed to the thread and not yet queued there
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="forge-engine", daemon=True)
        self._thread.start()

    def put(self, command: Command) -> None:
        self._commands.put(command)

    def submit(self, command: Submit) -> None:
        """Queue a request, or raise EngineOverloaded when the waiting queue (with what is in flight to it) is
        full."""
        limit = self.core.config.max_waiting
        with self._lock:
            if len(self.core.scheduler.waiting) + self._submitted >= limit:
                raise EngineOverloaded(f"server overloaded: {limit} requests are already waiting")
            self._submitted += 1
        self._commands.put(command)

    def join(self) -> None:
        self._thread.join()

    # ---- on the thread ------------------------------------------------------------
    def _loop(self) -> None:
        with threadpool_limits(limits=self.core.backend.blas_threads or self.threads):
            busy = False  # whether the last step had work
            while True:
                try:
                    idle = not self.core.has_work()
                    if idle and busy:  # what the steps freed goes back to the OS while nothing runs
                        return_freed_memory()
                    if not self._drain(block=idle):
                        break
                    if self.swap is not None and self.swap.ready:  # between two steps: the KV cache carries over
                        self._use_compiled()
                    busy = self.core.has_work()
                    events = self.core.step()
                except Exception as exc:  # a bug outside any one request: fail what runs, keep serving
                    log.exception("engine step failed")
                    events = self.core.fail_all(f"engine step failed: {exc}")
                self._dispatch(events)
        self._dispatch(self.core.abort_all())

    def _use_compiled(self) -> None:
        """Switch the core to the model the background compile built (engine/backend_swap.py)."""
        assert self.swap is not None
        model, routes = self.swap.take()
        self.core.use_model(model)
        if self._switched is not None:
            self._switched(routes)
        # Process-wide, on this thread as the step loop's own limit was: what the new backend's kernels want.
        threadpool_limits(limits=model.backend.blas_threads or self.threads)
        return_freed_memory()  # the float32 reference's weights
        log.info("now serving on %s", model.backend.choice)

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; False once asked to stop."""
        while True:
            try:
                cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return True
            block = False
            match cmd:
                case Stop():
                    return False
                case Submit():
                    self._admit(cmd)
                case Abort():
                    self._dispatch(self.core.abort(cmd.request_id))
                case ResetPrefixCache():
                    _settle(cmd.done, self.core.blocks.reset_prefix_cache, cmd.spill)
                case Call():
                    _settle(cmd.done, cmd.fn, self.core)

    def _admit(self, cmd: Submit) -> None:
        with self._lock:
            self._submitted -= 1
        self._routes[cmd.request_id] = cmd.route
        try:
            cmd.admit(cmd.arrival)
        except Exception as exc:
            self._send(cmd.request_id, exc)
            self._routes.pop(cmd.request_id, None)

    def _dispatch(self, events: list[GenerationEvent]) -> None:
        """Send a step's events: one wake-up per caller's event loop, however many streams it serves."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        ended: set[str] = set()  # requests with a final event in this batch: only these can have ended
        for event in events:
            route = self._routes.get(event.request_id)
            if route is None:
                continue
            if event.final:
                route.finished.add(event.index)
                ended.add(event.request_id)
            batches.setdefault(route.loop, []).append((route.events, event))
        # Routes go only after the whole batch is queued: samples of one request that finish in the same
        # step all leave the core's group inside the step, before the first of their final events is sent.
        for request_id in [r for r in ended if not self.core.is_running(r)]:
            route = self._routes.pop(request_id)
            # A backstop: a sample whose final event never came (a bug) gets one; no consumer waits forever.
            for index in sorted(set(range(route.samples)) - route.finished):
                log.error("request %s ended without a final event for sample %d", request_id, index)
                lost = GenerationEvent(request_id, index, finish_reason="error", error="the sample's end was lost")
                batches.setdefault(route.loop, []).append((route.events, lost))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                self._drop_loop(loop)

    def _send(self, request_id: str, item: GenerationEvent | BaseException) -> None:
        route = self._routes.get(request_id)
        if route is None:
            return
        try:
            route.loop.call_soon_threadsafe(route.events.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self._drop_loop(route.loop)

    def _drop_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Abort every request whose events would go to `loop` (closed)."""
        for request_id in [r for r, s in self._routes.items() if s.loop is loop]:
            self._routes.pop(request_id, None)
            self.core.abort(request_id)


def _settle(done: concurrent.futures.Future, fn: Callable[..., Any], *args: Any) -> None:
    """`fn(*args)`'s result, or its exception, to whoever waits on `done`."""
    try:
        done.set_result(fn(*args))
    except Exception as exc:
        done.set_exception(exc)


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for events, item in items:
        events.put_nowait(item)

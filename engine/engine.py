"""`Engine`: the asyncio-friendly façade the app talks to.

One step loop runs on its own thread (the model math releases the GIL in BLAS / on the
GPU). Requests and aborts cross into it through a thread-safe queue; events come back to
each caller's event loop with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from engine import tool_render
from engine.chat_template import render_chat
from engine.llm_engine import EngineConfig, LLMEngine
from engine.loader import LoadedModel, load_model
from engine.memory import return_freed_memory, share_one_arena
from engine.model.llama import LlamaModel
from engine.speculative import SpecConfig
from engine.tool_calls import Tool, ToolFormat
from engine.types import EngineOverloaded, GenerationEvent, GenerationRequest, InvalidRequest, ResponseFormat
from kernels import check_activations, get_backend, resolve_backend

log = logging.getLogger("forge.engine")

SPILL_CLOSE_S = 10.0  # how long shutdown waits for the cached blocks' spill files
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "t": 1e12,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """'1GiB', '512MiB', '2G', 1073741824 -> bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 512MiB, 1GiB)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    samples: int = 1
    finished: set[int] = field(default_factory=set)  # sample indices whose final event was sent


class RequestStream:
    """The events of one admitted request (`Engine.generate`). Closing it, or dropping it, before its
    last final event aborts the request."""

    def __init__(self, engine: Engine, request_id: str, samples: int, events: asyncio.Queue) -> None:
        self._engine = engine
        self._request_id = request_id
        self._remaining = samples
        self._events = events

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if not self._remaining:
            raise StopAsyncIteration
        try:
            event = await self._events.get()
        except BaseException:  # cancelled while waiting
            self._close()
            raise
        if isinstance(event, BaseException):
            self._close()
            raise event
        self._remaining -= event.final
        if not self._remaining:
            self._close()
        return event

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._remaining:
            self._remaining = 0
            self._engine.abort(self._request_id)
        self._engine._active.discard(self._request_id)

    def __del__(self) -> None:
        if self._remaining:
            self._close()


class Engine:
    """Load once, then `generate` from any number of asyncio tasks at once."""

    def __init__(self, core: LLMEngine, threads: int | None = None) -> None:
        self.core = core
        self.tokenizer = core.tokenizer
        self.threads = threads or len(os.sched_getaffinity(0))
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._active: set[str] = set()  # request ids with a consumer (asyncio side)
        self._routes: dict[str, _Stream] = {}  # request id -> its consumer (step-thread side)
        self._submitted = 0  # requests handed to the thread and not yet queued there
        self._tool_format: ToolFormat | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="forge-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(
        cls,
        model: str = "default",
        backend: str = "auto",
        kv_memory: str | int = "1GiB",
        max_waiting: int = 256,
        max_num_seqs: int = 64,
        max_batched_tokens: int = 512,
        block_size: int = 16,
        threads: int | None = None,
        quantize: str | None = None,
        activations: str = "f32",
        progress: Callable[[str], None] | None = None,
        speculative: str = "ngram",
        spec_row_cost: float | None = None,
        kv_spill_dir: str | None = None,
        kv_spill_size: str | int = 0,
    ) -> Engine:
        """Load weights and tokenizer, compile or load the CPU kernels (blocking: seconds, a minute
        the first time on a machine) and start the step loop. Raises kernels.BackendUnavailable at
        once, before loading anything, when `backend` cannot run here ("cupy" without a usable GPU).

        `threads`: kernel and BLAS threads (default: the cores available). `quantize="q8_0"`:
        quantize float matrices at load. `activations="q8"`: int8 activations in the numba backend's
        products, prompts included (kernels.ACTIVATIONS; ValueError on another backend). `progress` receives one
        line per stage (also logged). `speculative` ("ngram" | "off"): the default for requests that do not choose;
        `spec_row_cost`: a draft row's cost relative to a one-row step, fixed (None: measured online, so what is
        drafted depends on this machine's load). `kv_spill_dir` / `kv_spill_size` (e.g. "2GiB"; 0: off): the
        spill tier, where evicted prefix blocks go and are read back from (engine/kv_spill.py).
        """
        t0 = time.perf_counter()
        spill_size = parse_size(kv_spill_size)  # a bad size fails before the weights load
        if spill_size and not kv_spill_dir:
            raise ValueError("kv_spill_size needs a kv_spill_dir")

        def say(line: str) -> None:
            log.info("%s", line)
            if progress:
                progress(line)

        # an unusable choice fails here, before the weights load
        check_activations(activations, resolve_backend(backend)[0])
        share_one_arena()
        loaded = load_model(model, quantize=quantize)
        be = get_backend(backend, threads, activations)
        if progress:
            progress(f"kernel backend: {be.choice}")  # get_backend logged it
        llama = LlamaModel(loaded.config, loaded.weights, be, take=True)  # fused, on the backend: parts let go
        t1 = time.perf_counter()
        # After the weights: the kernels compile for their scale dtypes (a no-op where nothing compiles).
        where = {"numba": "CPU ", "cupy": "GPU "}.get(be.name, "")
        be.warm_up(lambda i, n, what: say(f"compiling {where}kernels {i}/{n} ({what}) ..."))
        if where:
            say(f"{where}kernels ready in {time.perf_counter() - t1:.1f}s")
        config = EngineConfig(
            block_size,
            parse_size(kv_memory),
            max_num_seqs,
            max_batched_tokens,
            max_waiting,
            SpecConfig(mode=speculative, row_cost=spec_row_cost),
            kv_spill_dir=kv_spill_dir,
            kv_spill_size=spill_size,
        )
        engine = cls(LLMEngine(loaded, llama, config), threads)
        log.info(
            "loaded %s (%s, %s) on %s in %.2fs: %d KV blocks of %d tokens",
            loaded.name,
            loaded.config.arch,
            loaded.quant,
            be.name,
            time.perf_counter() - t0,
            engine.core.blocks.num_blocks,
            block_size,
        )
        return engine

    # ---- facts ---------------------------------------------------------------------
    @property
    def loaded(self) -> LoadedModel:
        return self.core.loaded

    @property
    def max_context(self) -> int:
        return self.core.max_context

    @property
    def max_num_seqs(self) -> int:
        """Sequences one step runs at most: the capacity callers admit against."""
        return self.core.config.max_num_seqs

    @property
    def sampling_defaults(self) -> dict[str, float]:
        """The sampling settings the model's files recommend (SamplingParams names; engine/loader/recommended.py)."""
        return dict(self.core.loaded.sampling)

    @property
    def model_info(self) -> dict[str, Any]:
        m, c = self.core.loaded, self.core.loaded.config
        return {
            "name": m.name,
            "path": m.path,
            "arch": c.arch,
            "quant": m.quant,
            "backend": self.core.backend.name,
            "activations": getattr(self.core.backend, "activations", "f32"),
            "context_length": self.max_context,
            "vocab_size": c.vocab_size,
            "num_layers": c.num_layers,
            "hidden_size": c.hidden_size,
            "num_heads": c.num_heads,
            "num_kv_heads": c.num_kv_heads,
            "num_params": self.core.model.num_params,
            "weight_bytes": self.core.model.weight_bytes,
            "kv_block_size": self.core.blocks.block_size,
            "kv_blocks": self.core.blocks.num_blocks,
            "threads": self.threads,
            "sampling_defaults": self.sampling_defaults,
        }

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (engine/tool_render.py)."""
        if self._tool_format is None:
            tok = self.tokenizer
            self._tool_format = tool_render.format_for(
                self.core.loaded.chat_template, lambda s: tok.decode(tok.encode_chat(s)) == s
            )
        return self._tool_format

    def render_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[Tool] | None = None
    ) -> list[int]:
        """The conversation in the model's own chat template, as token ids. Message content is text: only
        the template's own markup yields special tokens (content spelling "<|im_end|>" stays those characters).
        `tools` (and tool turns in `messages`) are rendered in `tool_format` (engine/tool_render.py)."""
        tok = self.tokenizer
        extra: dict[str, Any] = {}
        if tools or any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages):
            messages, extra = tool_render.prepare(self.tool_format, messages, tools)
            extra = tool_render.escape_strings(extra, tok.escape_content)
            messages = tool_render.escape_strings(messages, tok.escape_content)
        else:
            messages = [
                {**m, "content": tok.escape_content(m["content"])}
                if isinstance(m, dict) and isinstance(m.get("content"), str)
                else m
                for m in messages
            ]
        text = render_chat(
            self.core.loaded.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok.bos_token,
            eos_token=tok.eos_token,
            **extra,
        )
        return tok.encode_chat(text)

    def stats(self) -> dict[str, Any]:
        return self.core.stats()

    # ---- generation ----------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> RequestStream:
        """Admit `request` now and return its events: token deltas, then one final event per sample.

        Raises InvalidRequest or EngineOverloaded here, before anything is queued, so a caller can refuse
        before it answers anyone. Leaving the iteration early, or `aclose()`, aborts the request. A
        `response_format` is compiled here unless `compile_response_format` did it first (await that from
        the event loop: compiling is CPU work, done on a worker thread there)."""
        if self._stopping:
            raise EngineOverloaded("engine is shutting down")
        self.core.validate(request)
        return self._submit(
            request.request_id, request.params.n, lambda arrival: self.core.add_request(request, arrival)
        )

    async def embed(self, inputs: list[list[int]], pooling: str = "mean", truncate: bool = False) -> list[np.ndarray]:
        """One float32, L2-normalised vector per input (token ids): the final norm's output pooled over the input
        ("mean" | "last"; the model's own pooling, its GGUF `pooling_type`, wins when it names one). The inputs run
        through the step loop's batched, chunked prefill beside everything else; their KV is dropped after and
        nothing is sampled. An input longer than the context is refused (InvalidRequest), or cut to its first
        `max_context` tokens when `truncate`. Raises InvalidRequest or EngineOverloaded before anything is queued."""
        if self._stopping:
            raise EngineOverloaded("engine is shutting down")
        inputs = self.core.validate.embedding(inputs, pooling, truncate)
        request_id = uuid.uuid4().hex
        vectors: list[Any] = [None] * len(inputs)
        stream = self._submit(
            request_id,
            len(inputs),
            lambda arrival: self.core.add_embedding(request_id, inputs, pooling, arrival=arrival),
        )
        try:
            async for event in stream:
                if event.finish_reason == "abort":
                    raise EngineOverloaded("engine is shutting down")
                if event.embedding is None:
                    raise RuntimeError(f"embedding failed: {event.error or event.finish_reason}")
                vectors[event.index] = event.embedding
        finally:
            await stream.aclose()  # a failure ends the request's other inputs too
        return vectors

    @property
    def pooling(self) -> str | None:
        """The pooling the model's files name for embeddings (None: the caller's choice holds)."""
        return self.core.loaded.pooling

    def _submit(self, request_id: str, samples: int, admit: Callable[[float], None]) -> RequestStream:
        """Queue a validated request for the step thread, which calls `admit(arrival)` (adding it to the core);
        its events come back on the caller's loop."""
        if request_id in self._active:
            raise InvalidRequest(f"request id {request_id!r} is already in use", param="request_id")
        with self._lock:
            if len(self.core.scheduler.waiting) + self._submitted >= self.core.config.max_waiting:
                raise EngineOverloaded(
                    f"server overloaded: {self.core.config.max_waiting} requests are already waiting"
                )
            self._submitted += 1
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), samples)
        self._active.add(request_id)
        # The stream travels with the request: the step thread routes its events (an abort of an
        # earlier request with the same id can never reach this one).
        self._commands.put(("admit", request_id, admit, time.monotonic(), stream))
        return RequestStream(self, request_id, samples, stream.events)

    async def compile_response_format(self, fmt: ResponseFormat) -> None:
        """Compile a constraint ahead of `generate` (cached; a worker thread, not the event loop).
        Raises InvalidRequest naming what cannot be enforced."""
        await asyncio.to_thread(self.core.grammars.compile, fmt)

    async def reset_prefix_cache(self, spill: bool = False) -> None:
        """Forget every cached prefix (blocks in use stay valid); applied between two steps. `spill`: evict them
        to the spill tier, as a full cache would (it returns once they are written)."""
        if self._stopping:
            raise RuntimeError("engine is shut down")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("reset_prefix_cache", done, spill))
        await asyncio.wrap_future(done)
        if spill and self.core.blocks.spill is not None:
            await asyncio.to_thread(self.core.blocks.spill.flush)

    def abort(self, request_id: str) -> None:
        """End a request (finish reason "abort") within one step. Thread-safe."""
        self._commands.put(("abort", request_id))

    async def shutdown(self) -> None:
        """Stop the loop; in-flight requests end with finish reason "abort"."""
        if self._stopping:
            return
        self._stopping = True
        self._commands.put(("stop",))
        await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.core.close, SPILL_CLOSE_S)

    # ---- the step thread -----------------------------------------------------------
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
                    busy = self.core.has_work()
                    events = self.core.step()
                except Exception as exc:  # a bug outside any one request: fail what runs, keep serving
                    log.exception("engine step failed")
                    events = self.core.fail_all(f"engine step failed: {exc}")
                self._dispatch(events)
        self._dispatch(self.core.abort_all())

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; False once asked to stop."""
        while True:
            try:
                cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return True
            block = False
            if cmd[0] == "stop":
                return False
            if cmd[0] == "admit":
                _, request_id, admit, arrival, stream = cmd
                with self._lock:
                    self._submitted -= 1
                self._routes[request_id] = stream
                try:
                    admit(arrival)
                except Exception as exc:
                    self._send(request_id, exc)
                    self._routes.pop(request_id, None)
            elif cmd[0] == "abort":
                self._dispatch(self.core.abort(cmd[1]))
            elif cmd[0] == "reset_prefix_cache":
                try:
                    self.core.blocks.reset_prefix_cache(spill=cmd[2])
                    cmd[1].set_result(None)
                except Exception as exc:
                    cmd[1].set_exception(exc)

    def _dispatch(self, events: list[GenerationEvent]) -> None:
        """Send a step's events: one wake-up per caller's event loop, however many streams it serves."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        ended: set[str] = set()  # requests with a final event in this batch: only these can have ended
        for event in events:
            stream = self._routes.get(event.request_id)
            if stream is None:
                continue
            if event.final:
                stream.finished.add(event.index)
                ended.add(event.request_id)
            batches.setdefault(stream.loop, []).append((stream.events, event))
        # Routes go only after the whole batch is queued: samples of one request that finish in the same
        # step all leave the core's group inside the step, before the first of their final events is sent.
        for request_id in [r for r in ended if not self.core.is_running(r)]:
            stream = self._routes.pop(request_id)
            # A backstop: a sample whose final event never came (a bug) gets one; no consumer waits forever.
            for index in sorted(set(range(stream.samples)) - stream.finished):
                log.error("request %s ended without a final event for sample %d", request_id, index)
                lost = GenerationEvent(request_id, index, finish_reason="error", error="the sample's end was lost")
                batches.setdefault(stream.loop, []).append((stream.events, lost))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                self._drop_loop(loop)

    def _send(self, request_id: str, item: GenerationEvent | BaseException) -> None:
        stream = self._routes.get(request_id)
        if stream is None:
            return
        try:
            stream.loop.call_soon_threadsafe(stream.events.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            self._drop_loop(stream.loop)

    def _drop_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Abort every request whose events would go to `loop` (closed)."""
        for request_id in [r for r, s in self._routes.items() if s.loop is loop]:
            self._routes.pop(request_id, None)
            self.core.abort(request_id)


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for events, item in items:
        events.put_nowait(item)

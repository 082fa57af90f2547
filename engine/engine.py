"""`Engine`: the asyncio-friendly façade the app talks to.

It loads the model (`load`), states its facts and renders chats; the steps run on the step thread
(engine/step_thread.py), which it hands typed commands and which sends each request's events back to
its `RequestStream` (engine/request_stream.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.backend_swap import BackendSwap, model_key
from engine.chat_prompt import ChatPrompt
from engine.kv_spill import KVSpill, spill_tier
from engine.llm_engine import EngineConfig, LLMEngine
from engine.loader import LoadedModel, load_model
from engine.memory import share_one_arena
from engine.model.llama import LlamaModel
from engine.op_profile import OpProfile
from engine.request_stream import RequestStream
from engine.sizes import parse_size
from engine.speculative import SpecConfig
from engine.step_thread import Abort, Call, ResetPrefixCache, Route, StepThread, Stop, Submit
from engine.tool_calls import Tool, ToolFormat
from engine.types import EngineOverloaded, GenerationRequest, InvalidRequest, ResponseFormat
from kernels import RouteCheck, check_activations, get_backend, resolve_backend
from kernels.compile_stamp import mark_compiled

__all__ = ["Engine", "RequestStream", "parse_size"]

log = logging.getLogger("forge.engine")

SPILL_CLOSE_S = 10.0  # how long shutdown waits for the cached blocks' spill files


class Engine:
    """Load once, then `generate` from any number of asyncio tasks at once."""

    def __init__(self, core: LLMEngine, threads: int | None = None) -> None:
        self.core = core
        self.tokenizer = core.tokenizer
        self.threads = threads or len(os.sched_getaffinity(0))
        self._active: set[str] = set()  # request ids with a consumer (asyncio side)
        self._chat = ChatPrompt(core.tokenizer, core.loaded.chat_template)
        self.kernel_routes: list[RouteCheck] = []  # the start-up parity gate's checks (Engine.load)
        self._stopping = False
        self._steps = StepThread(core, self.threads, self._switched)

    @property
    def swap(self) -> BackendSwap | None:
        """The compiled backend being built while the reference serves (None: no quick start)."""
        return self._steps.swap

    @swap.setter
    def swap(self, swap: BackendSwap | None) -> None:
        self._steps.swap = swap

    def _switched(self, routes: list[RouteCheck]) -> None:
        """The background compile's model took over (on the step thread): its parity gate's checks now hold."""
        self.kernel_routes = routes

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
        quick_start: bool = False,
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
        spill tier, where evicted prefix blocks go and are read back from (engine/kv_spill.py). `quick_start`: when
        the numba kernels are not compiled here yet, serve at once on the float32 reference and switch once they
        are (engine/backend_swap.py; `swap` then tells how far it is).
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
        key = model_key(loaded, quantize, activations)
        # A cold kernel cache: the float32 reference serves while the kernels compile (engine/backend_swap.py).
        swap = BackendSwap.plan(loaded, be, key, say, quantize) if quick_start else None
        if swap is not None:
            llama, routes = swap.reference_model()
        else:
            llama = LlamaModel(loaded.config, loaded.weights, be, take=True)  # fused, on the backend: parts let go
            t1 = time.perf_counter()
            # After the weights: the kernels compile for their scale dtypes (a no-op where nothing compiles).
            where = {"numba": "CPU ", "cupy": "GPU "}.get(be.name, "")
            be.warm_up(lambda i, n, what: say(f"compiling {where}kernels {i}/{n} ({what}) ..."))
            if where:
                say(f"{where}kernels ready in {time.perf_counter() - t1:.1f}s")
            # The parity gate: each product route the model will take, once against the NumPy reference.
            routes = be.check_routes()
            for check in routes:
                (say if check.ok else log.warning)(f"kernel route {check}")
            if be.name == "numba":
                mark_compiled(key)
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
        engine.kernel_routes = routes
        if swap is not None:
            engine.swap = swap
            swap.start()
        log.info(
            "loaded %s (%s, %s) on %s in %.2fs: %d KV blocks of %d tokens",
            loaded.name,
            loaded.config.arch,
            loaded.quant,
            engine.core.backend.name,
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
            "kernel_cpu": caps.label if (caps := getattr(self.core.backend, "caps", None)) else None,
            "kernel_routes": [c.as_dict() for c in self.kernel_routes],
            "background_compile": self.swap.info() if self.swap is not None else None,
        }

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (engine/tool_render.py)."""
        return self._chat.tool_format

    def render_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[Tool] | None = None
    ) -> list[int]:
        """The conversation in the model's own chat template, as token ids (engine/chat_prompt.py)."""
        return self._chat(messages, add_generation_prompt, tools)

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
        route = Route(asyncio.get_running_loop(), asyncio.Queue(), samples)
        # The route travels with the request: the step thread sends its events there (an abort of an
        # earlier request with the same id can never reach this one).
        self._steps.submit(Submit(request_id, admit, time.monotonic(), route))
        self._active.add(request_id)
        return RequestStream(request_id, samples, route.events, self.abort, self._active)

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
        self._steps.put(ResetPrefixCache(done, spill))
        await asyncio.wrap_future(done)
        if spill and self.core.blocks.spill is not None:
            await asyncio.to_thread(self.core.blocks.spill.flush)

    # ---- options for measurements (engine/bench.py) -------------------------------------
    def spill_tier(self, directory: str, capacity: int) -> KVSpill:
        """A spill tier for this engine's blocks in `directory`, at most `capacity` bytes (engine/kv_spill.py);
        `use_spill_tier` puts it in service."""
        return spill_tier(self.core.loaded, self.core.runner, directory, capacity)

    async def use_spill_tier(self, tier: KVSpill | None) -> KVSpill | None:
        """Evict prefix blocks to `tier` (None: nowhere) from the next step on; returns the tier it replaces."""
        return await self._between_steps(lambda core: _swap_spill(core, tier))

    async def profile_ops(self, profile: OpProfile | None) -> None:
        """Time the ops of every eager forward into `profile` from the next step on (None: stop)."""
        await self._between_steps(lambda core: setattr(core.runner, "profile", profile))

    async def _between_steps(self, fn: Callable[[LLMEngine], Any]) -> Any:
        if self._stopping:
            raise RuntimeError("engine is shut down")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._steps.put(Call(fn, done))
        return await asyncio.wrap_future(done)

    def abort(self, request_id: str) -> None:
        """End a request (finish reason "abort") within one step. Thread-safe."""
        self._steps.put(Abort(request_id))

    async def shutdown(self) -> None:
        """Stop the loop; in-flight requests end with finish reason "abort"."""
        if self._stopping:
            return
        self._stopping = True
        if self.swap is not None:
            self.swap.close()
        self._steps.put(Stop())
        await asyncio.to_thread(self._steps.join)
        await asyncio.to_thread(self.core.close, SPILL_CLOSE_S)


def _swap_spill(core: LLMEngine, tier: KVSpill | None) -> KVSpill | None:
    previous, core.blocks.spill = core.blocks.spill, tier
    return previous

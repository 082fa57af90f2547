"""`OpProfile`: where a forward's time goes, op by op (`forge bench --profile`; `Engine.profile_ops`)."""

from __future__ import annotations

import collections
import time
from typing import Any

from engine.model.llama import LlamaModel
from kernels import Backend


class OpProfile:
    """Times every op call of the forwards it runs (`forward`), and the forwards themselves: the difference is
    Python between the kernels. The model itself is unchanged; it runs on this stand-in backend for the call.
    `skip`: forwards to run untimed first (a request's prompt, when only its decode steps are wanted); `forwards`
    and `rows` count the timed ones and the token rows they ran."""

    OPS = (
        "embedding",
        "rms_norm",
        "add_rms_norm",
        "linear",
        "rope_write_kv",
        "paged_attention",
        "silu_mul",
        "to_numpy",
    )

    def __init__(self, backend: Backend, skip: int = 0) -> None:
        self.backend, self.skip = backend, skip
        self.forwards = self.rows = 0
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.forward_s = 0.0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.backend, name)
        if name not in self.OPS:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = attr(*args, **kwargs)
            self.seconds[name] += time.perf_counter() - t
            self.calls[name] += 1
            return out

        return timed

    def forward(self, model: LlamaModel, *args: Any) -> Any:
        """`model.forward_device(*args)` with its ops timed (on the step thread, between two steps' changes); args
        as `forward_device` takes them, token ids first."""
        if self.skip:
            self.skip -= 1
            return model.forward_device(*args)
        own, model.backend = model.backend, self
        t = time.perf_counter()
        try:
            return model.forward_device(*args)
        finally:
            self.forward_s += time.perf_counter() - t
            self.forwards += 1
            self.rows += len(args[0])
            model.backend = own

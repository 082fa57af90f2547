"""The engine's own counters: tokens, steps, finishes, speculative decoding and recent throughput.

Written by the step thread only; `snapshot()` copies what it reads, so any thread may call it.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

WINDOW_S = 10.0  # decode tokens/s covers this much recent history


@dataclass(slots=True)
class EngineMetrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    spec_steps: int = 0  # (sequence, step) pairs that verified a draft
    spec_drafted: int = 0
    spec_accepted: int = 0
    finished: collections.Counter[str] = field(default_factory=collections.Counter)
    _window: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)

    def step_done(self, generated: int) -> None:
        self.steps += 1
        self.generated_tokens += generated
        now = time.monotonic()
        window = self._window
        window.append((now, generated))
        while window[0][0] < now - WINDOW_S:
            window.popleft()

    def verified(self, drafted: int, accepted: int) -> None:
        self.spec_steps += 1
        self.spec_drafted += drafted
        self.spec_accepted += accepted

    def snapshot(self) -> dict:
        now = time.monotonic()
        window = [(t, n) for t, n in list(self._window) if now - t <= WINDOW_S]
        span = (now - window[0][0]) if window else 0.0
        return {
            "prompt_tokens_total": self.prompt_tokens,
            "cached_tokens_total": self.cached_tokens,
            "generated_tokens_total": self.generated_tokens,
            "requests_finished": dict(self.finished.copy()),
            "decode_tok_s": sum(n for _, n in window) / span if span > 0.5 else 0.0,
            "steps": self.steps,
            "spec_drafted_tokens": self.spec_drafted,
            "spec_accepted_tokens": self.spec_accepted,
            "spec_acceptance_rate": self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0,
            # tokens a verifying sequence gains per step: its accepted drafts + the one token every step yields
            "spec_mean_accepted_length": (self.spec_accepted + self.spec_steps) / self.spec_steps
            if self.spec_steps
            else 0.0,
        }

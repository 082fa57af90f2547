"""Plain data types that cross the engine's façade: requests in, events out."""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

class EngineOverloaded(RuntimeError):
    """The waiting queue is full: the request was refused without being queued."""


class InvalidRequest(ValueError):
    """A request the engine cannot run (bad sampling parameter, prompt too long, ...).

    `param` names the offending field so the service can report it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class SamplingParams:
    """Per-request decoding settings. temperature == 0 means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF-style, over prompt + output
    presence_penalty: float = 0.0  # OpenAI-style, over output
    frequency_penalty: float = 0.0  # OpenAI-style, over output
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: off; k >= 0: chosen token plus top-k alternatives
    n: int = 1

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidRequest naming the first bad field."""
        checks: list[tuple[bool, str, str]] = [
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]"),
            (self.top_k >= 0, "top_k", "must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]"),
            (1 <= self.n <= 16, "n", "must be in [1, 16]"),
            (len(self.stop) <= 16 and all(isinstance(s, str) and s for s in self.stop), "stop", "at most 16 non-empty strings"),
            (all(0 <= t < vocab_size for t in self.stop_token_ids), "stop_token_ids", f"ids must be in [0, {vocab_size})"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidRequest(f"{name} {why}", param=name)
        for tok, bias in self.logit_bias.items():
            if not (isinstance(tok, int) and 0 <= tok < vocab_size):
                raise InvalidRequest(f"logit_bias token id {tok!r} is not in [0, {vocab_size})", param="logit_bias")
            if not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
                raise InvalidRequest(f"logit_bias value for token {tok} must be in [-100, 100]", param="logit_bias")


@dataclass(slots=True)
class GenerationRequest:
    """One prompt to complete. With params.n > 1 the samples share the prompt's KV blocks."""

    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    timeout_s: float | None = None  # wall-clock deadline from submission; expiry ends with "timeout"


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    completion_tokens: int = 0


@dataclass(slots=True)
class Timings:
    """Seconds: waiting before the first step, submission to first token, submission to end."""

    queued: float = 0.0
    ttft: float = 0.0
    total: float = 0.0


@dataclass(slots=True)
class GenerationEvent:
    """A token delta of sample `index`, or (finish_reason set) that sample's final event.

    `text` is always a whole-character UTF-8-safe delta; held-back text (a possible stop
    string prefix, an incomplete character) arrives in a later event or the final one.
    """

    request_id: str
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

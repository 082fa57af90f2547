"""Plain data types that cross the engine's façade: requests in, events out."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from engine.tool_calls import ToolFormat

RESPONSE_FORMAT_KINDS = ("json_object", "json_schema", "regex", "grammar")
SPECULATIVE_MODES = ("off", "ngram")


class EngineOverloaded(RuntimeError):
    """The waiting queue is full: the request was refused without being queued."""


class InvalidRequest(ValueError):
    """A request the engine cannot run (bad sampling parameter, prompt too long, ...).

    `param` names the offending field so the service can report it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True, frozen=True)
class ResponseFormat:
    """A constraint on the reply: every token is checked against it and EOS needs a complete match.

    kind "json_object": any JSON object (spec is ignored); "json_schema": spec is the schema as
    JSON text; "regex": spec is a regular expression the whole reply matches; "grammar": spec
    is a Lark grammar (llguidance's dialect) whose `start` rule the reply matches.
    """

    kind: str
    spec: str = ""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
    response_format: ResponseFormat | None = None  # None: free text
    speculative: str | None = None  # "off" | "ngram"; None: the engine's default
    # The reply's tool calls are written in this format: the first call that repeats an earlier one (same name,
    # same arguments) ends the sample before it, with none of its text (engine/call_repeats.py).
    tool_format: ToolFormat | None = None

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidRequest naming the first bad field. The engine checks this once, at admission;
        the sampler relies on it (types and ranges)."""
        real = lambda v, lo, hi: _is_real(v) and lo <= v <= hi
        checks: list[tuple[bool, str, str]] = [
            (_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1"),
            (real(self.temperature, 0.0, 100.0), "temperature", "must be a number in [0, 100]"),
            (_is_int(self.top_k) and self.top_k >= 0, "top_k", "must be an integer >= 0"),
            (real(self.top_p, 0.0, 1.0) and self.top_p > 0.0, "top_p", "must be a number in (0, 1]"),
            (real(self.min_p, 0.0, 1.0), "min_p", "must be a number in [0, 1]"),
            (
                real(self.repetition_penalty, 0.01, 10.0),
                "repetition_penalty",  # dividing by less overflows float32
                "must be a number in [0.01, 10]",
            ),
            (real(self.presence_penalty, -2.0, 2.0), "presence_penalty", "must be a number in [-2, 2]"),
            (real(self.frequency_penalty, -2.0, 2.0), "frequency_penalty", "must be a number in [-2, 2]"),
            (
                self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
                "logprobs",
                "must be null or an integer in [0, 20]",
            ),
            (_is_int(self.n) and 1 <= self.n <= 16, "n", "must be an integer in [1, 16]"),
            (self.seed is None or _is_int(self.seed), "seed", "must be null or an integer"),
            (
                isinstance(self.stop, list)
                and len(self.stop) <= 16
                and all(isinstance(s, str) and s for s in self.stop),
                "stop",
                "at most 16 non-empty strings",
            ),
            (
                isinstance(self.stop_token_ids, list)
                and len(self.stop_token_ids) <= 64
                and all(_is_int(t) and 0 <= t < vocab_size for t in self.stop_token_ids),
                "stop_token_ids",
                f"at most 64 ids in [0, {vocab_size})",
            ),
            (
                self.speculative is None or self.speculative in SPECULATIVE_MODES,
                "speculative",
                f"must be one of {', '.join(SPECULATIVE_MODES)}",
            ),
            (
                self.response_format is None
                or (
                    isinstance(self.response_format, ResponseFormat)
                    and self.response_format.kind in RESPONSE_FORMAT_KINDS
                ),
                "response_format",
                f"type must be one of {', '.join(RESPONSE_FORMAT_KINDS)}",
            ),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidRequest(f"{name} {why}", param=name)
        if self.response_format is not None and self.ignore_eos:
            raise InvalidRequest(
                "ignore_eos cannot be combined with response_format: the grammar decides where the reply ends",
                param="ignore_eos",
            )
        if not isinstance(self.logit_bias, dict):
            raise InvalidRequest("logit_bias must map token ids to numbers", param="logit_bias")
        for tok, bias in self.logit_bias.items():
            if not (_is_int(tok) and 0 <= tok < vocab_size):
                raise InvalidRequest(f"logit_bias token id {tok!r} is not in [0, {vocab_size})", param="logit_bias")
            if not real(bias, -100.0, 100.0):
                raise InvalidRequest(
                    f"logit_bias value for token {tok} must be a number in [-100, 100]", param="logit_bias"
                )


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
    With `params.tool_format`, `token_ids` and `logprobs` are held with the text they spell (a
    dropped repeated call's tokens come out in `usage` only).
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
    embedding: np.ndarray | None = None  # an embedding's final event: its float32 L2-normalised vector

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

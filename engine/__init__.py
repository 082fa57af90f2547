"""Forge's inference engine. The app depends on `Engine` and the plain types below only."""

from engine.engine import Engine, parse_size
from engine.types import (
    EngineOverloaded,
    GenerationEvent,
    GenerationRequest,
    InvalidRequest,
    ResponseFormat,
    SamplingParams,
    Timings,
    TokenLogprob,
    Usage,
)
from kernels import BackendUnavailable, resolve_backend  # `forge serve` checks the backend before loading

__all__ = [
    "BackendUnavailable",
    "Engine",
    "EngineOverloaded",
    "GenerationEvent",
    "GenerationRequest",
    "InvalidRequest",
    "ResponseFormat",
    "SamplingParams",
    "Timings",
    "TokenLogprob",
    "Usage",
    "parse_size",
    "resolve_backend",
]

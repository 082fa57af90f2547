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

__all__ = [
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
]

"""What a request that leaves something out gets: a session's title and settings, and each sampling parameter
(docs/api.md#sampling-defaults).

First the model's own recommendation (Engine.sampling_defaults: GGUF `general.sampling.*` or
`generation_config.json`), then Forge's: OpenAI's values on /v1, the session defaults in chat sessions.
The length of a reply is capped wherever `max_tokens` is left out (Settings.default_max_tokens on /v1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine import Engine

DEFAULT_TITLE = "New chat"  # a session's title until its first message names it
DEFAULT_SETTINGS: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512}  # a session's, left out
OPENAI = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
SESSION_KEYS = ("temperature", "top_p")  # the sampling settings a session stores (besides max_tokens)


def openai_defaults(engine: Engine) -> dict[str, Any]:
    """/v1: the model's recommendation over OpenAI's defaults."""
    return {**OPENAI, **engine.sampling_defaults}


def session_defaults(engine: Engine) -> dict[str, Any]:
    """A new session's settings: the model's recommended temperature and top_p over DEFAULT_SETTINGS."""
    return {**DEFAULT_SETTINGS, **{k: v for k, v in engine.sampling_defaults.items() if k in SESSION_KEYS}}


def turn_extras(engine: Engine) -> dict[str, Any]:
    """What a chat turn takes from the model's recommendation beyond the session's settings (top_k, ...)."""
    return {k: v for k, v in engine.sampling_defaults.items() if k not in SESSION_KEYS}

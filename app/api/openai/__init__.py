"""OpenAI-compatible shim: /v1/chat/completions, /v1/completions, /v1/models (stateless).

Every parameter is either honoured or refused with a 400 naming it; nothing is silently ignored.
Prefix reuse still applies across requests: the engine's cache keys on token ids, not on sessions.

`parse` turns a body into a checked call, `job` runs it against admission and the engine, `chunks` formats the
answers, `routes` holds the handlers (one shape for both generation routes).
"""

from app.api.openai.routes import router

__all__ = ["router"]

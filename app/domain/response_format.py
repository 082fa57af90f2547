"""Compiling a reply's constraint (the engine's ResponseFormat) before anything is answered or stored.

The api layer decodes `response_format` (its msgspec types and their size bounds: app/api/response_format.py)
into the engine's plain ResponseFormat; what the engine cannot compile or enforce is refused here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.domain.errors import ServiceError
from engine.types import InvalidRequest, ResponseFormat

if TYPE_CHECKING:
    from engine import Engine

PARAM = "response_format"
# A JSON schema a reply is held to (response_format's, a tool's parameters): bounds checked before compiling.
SCHEMA_MAX_BYTES = 64 << 10
SCHEMA_MAX_DEPTH = 64  # JSON nesting of the schema document (an object property costs two levels)


def schema_depth(value: Any) -> int:
    """How deeply `value` (decoded JSON) nests its arrays and objects; iterative (no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack += [(item, d + 1) for item in (v.values() if isinstance(v, dict) else v)]
    return deepest


async def compile_response_format(engine: Engine, fmt: ResponseFormat | None) -> ResponseFormat | None:
    """`fmt`, compiled now (off the event loop, cached for the generation): a bad one is refused (a 400 / `error`
    event) before any byte of a stream, never a failed stream."""
    if fmt is not None:
        try:
            await engine.compile_response_format(fmt)
        except InvalidRequest as e:
            raise ServiceError("invalid_parameter", str(e), param=PARAM) from None
    return fmt

"""Compiling a reply's constraint (the engine's ResponseFormat) before anything is answered or stored.

The api layer decodes `response_format` (its msgspec types and their size bounds: app/api/response_format.py)
into the engine's plain ResponseFormat; what the engine cannot compile or enforce is refused here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.domain.errors import ServiceError
from engine.types import InvalidRequest, ResponseFormat

if TYPE_CHECKING:
    from engine import Engine

PARAM = "response_format"


async def compile_response_format(engine: Engine, fmt: ResponseFormat | None) -> ResponseFormat | None:
    """`fmt`, compiled now (off the event loop, cached for the generation): a bad one is refused (a 400 / `error`
    event) before any byte of a stream, never a failed stream."""
    if fmt is not None:
        try:
            await engine.compile_response_format(fmt)
        except InvalidRequest as e:
            raise ServiceError("invalid_parameter", str(e), param=PARAM) from None
    return fmt

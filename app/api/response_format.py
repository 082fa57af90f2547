"""`response_format` (OpenAI's, plus Forge's regex and grammar kinds) and `speculative` in request
bodies -> the engine's values. Refusals are 400s (WebSocket `error` events) naming the param."""
from __future__ import annotations

import json
from typing import Any

from engine.types import InvalidRequest, ResponseFormat

from app.api.errors import ServiceError
from app.api.fields import json_type

PARAM = "response_format"
_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"},
         "regex": {"type", "pattern"}, "grammar": {"type", "lark"}}


def parse_response_format(value: Any) -> ResponseFormat | None:
    """The body's `response_format` (None or {"type": "text"}: free text)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ServiceError("bad_request", f"'{PARAM}' must be an object, got {json_type(value)}", param=PARAM)
    kind = value.get("type")
    if kind not in _KEYS:
        raise ServiceError("invalid_parameter", f"'{PARAM}.type' must be one of {', '.join(_KEYS)}, got {kind!r}",
                           param=f"{PARAM}.type")
    for key, v in value.items():
        if key not in _KEYS[kind] and v is not None:
            raise ServiceError("bad_request", f"unknown field '{PARAM}.{key}' for type {kind!r}", param=f"{PARAM}.{key}")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise ServiceError("bad_request", f"'{PARAM}.json_schema' must be an object with a 'schema'",
                               param=f"{PARAM}.json_schema")
        for key in spec:
            if key not in ("name", "schema", "strict", "description"):
                raise ServiceError("bad_request", f"unknown field '{PARAM}.json_schema.{key}'",
                                   param=f"{PARAM}.json_schema.{key}")
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise ServiceError("bad_request", f"'{PARAM}.json_schema.schema' must be an object, got {json_type(schema)}",
                               param=f"{PARAM}.json_schema.schema")
        if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
            raise ServiceError("bad_request", f"'{PARAM}.json_schema.strict' must be a boolean",
                               param=f"{PARAM}.json_schema.strict")
        return ResponseFormat("json_schema", json.dumps(schema, sort_keys=True))
    field = "pattern" if kind == "regex" else "lark"
    text = value.get(field)
    if not isinstance(text, str) or not text:
        raise ServiceError("bad_request", f"'{PARAM}.{field}' must be a non-empty string", param=f"{PARAM}.{field}")
    return ResponseFormat(kind, text)


def parse_speculative(value: Any) -> str | None:
    """The body's `speculative` ("off" | "ngram"; None: the server's default)."""
    if value is None or value in ("off", "ngram"):
        return value
    raise ServiceError("invalid_parameter", f"'speculative' must be \"off\" or \"ngram\", got {value!r}", param="speculative")


async def compile_response_format(engine: Any, fmt: ResponseFormat | None) -> None:
    """Compile `fmt` now (cached for the generation) so that a bad one is a 400, not a failed stream."""
    if fmt is None:
        return
    try:
        await engine.compile_response_format(fmt)
    except InvalidRequest as e:
        raise ServiceError("invalid_parameter", str(e), param=PARAM) from None

"""Explicit checks for JSON bodies and WebSocket messages; every refusal names the field."""
from __future__ import annotations

import json
import math
from typing import Any

from litestar import Request

from app.api.errors import ServiceError

MAX_CONTENT_CHARS = 100_000
MAX_TITLE_CHARS = 200
MAX_SYSTEM_PROMPT_CHARS = 50_000
DEFAULT_TITLE = "New chat"
DEFAULT_SETTINGS: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512}
MAX_TOKENS_LIMIT = 1 << 20  # the engine's context is the real bound, checked per turn


def parse_json_object(raw: bytes | str, what: str = "request body") -> dict[str, Any]:
    if not raw:
        raise ServiceError("bad_request", f"{what} is empty; expected a JSON object")
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ServiceError("bad_request", f"{what} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ServiceError("bad_request", f"{what} must be a JSON object, got {json_type(obj)}")
    return obj


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object body (Litestar enforces the size limit: 413)."""
    return parse_json_object(await request.body())


def json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def check_keys(obj: dict[str, Any], allowed: set[str] | frozenset[str], where: str = "") -> None:
    for key in obj:
        if key not in allowed:
            name = f"{where}.{key}" if where else key
            raise ServiceError("bad_request", f"unknown field '{name}'", param=name)


def get_str(obj: dict[str, Any], key: str, *, required: bool = False, nullable: bool = False,
            max_len: int | None = None, non_empty: bool = False) -> str | None:
    if key not in obj:
        if required:
            raise ServiceError("bad_request", f"'{key}' is required", param=key)
        return None
    v = obj[key]
    if v is None and nullable:
        return None
    if not isinstance(v, str):
        raise ServiceError("bad_request", f"'{key}' must be a string, got {json_type(v)}", param=key)
    if non_empty and not v.strip():
        raise ServiceError("invalid_parameter", f"'{key}' must not be empty", param=key)
    if max_len is not None and len(v) > max_len:
        raise ServiceError("invalid_parameter", f"'{key}' is {len(v)} characters; the limit is {max_len}", param=key)
    return v


def get_number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ServiceError("bad_request", f"'{name}' must be a number, got {json_type(v)}", param=name)
    if not math.isfinite(v):
        raise ServiceError("invalid_parameter", f"'{name}' must be finite", param=name)
    return float(v)


def get_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise ServiceError("bad_request", f"'{name}' must be an integer, got {json_type(v)} {v!r}", param=name)
    return int(v)


def session_settings(value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate a (partial) settings object and merge it over `base` (default: DEFAULT_SETTINGS)."""
    merged = dict(DEFAULT_SETTINGS if base is None else base)
    if value is None:
        return merged
    if not isinstance(value, dict):
        raise ServiceError("bad_request", f"'settings' must be an object, got {json_type(value)}", param="settings")
    check_keys(value, frozenset(DEFAULT_SETTINGS), "settings")
    if "temperature" in value:
        t = get_number(value["temperature"], "settings.temperature")
        if not 0.0 <= t <= 2.0:
            raise ServiceError("invalid_parameter", f"'settings.temperature' must be in [0, 2], got {t}", param="settings.temperature")
        merged["temperature"] = t
    if "top_p" in value:
        p = get_number(value["top_p"], "settings.top_p")
        if not 0.0 < p <= 1.0:
            raise ServiceError("invalid_parameter", f"'settings.top_p' must be in (0, 1], got {p}", param="settings.top_p")
        merged["top_p"] = p
    if "max_tokens" in value:
        n = get_int(value["max_tokens"], "settings.max_tokens")
        if not 1 <= n <= MAX_TOKENS_LIMIT:
            raise ServiceError("invalid_parameter", f"'settings.max_tokens' must be >= 1, got {n}", param="settings.max_tokens")
        merged["max_tokens"] = n
    return merged


def session_fields(obj: dict[str, Any], *, extra_keys: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The session fields present in `obj` (title, system_prompt, settings), checked; settings stay partial."""
    check_keys(obj, frozenset({"title", "system_prompt", "settings"}) | extra_keys)
    out: dict[str, Any] = {}
    if "title" in obj:
        title = get_str(obj, "title", max_len=MAX_TITLE_CHARS)
        out["title"] = title.strip() or DEFAULT_TITLE if title is not None else DEFAULT_TITLE
    if "system_prompt" in obj:
        out["system_prompt"] = get_str(obj, "system_prompt", nullable=True, max_len=MAX_SYSTEM_PROMPT_CHARS)
    if "settings" in obj:
        session_settings(obj["settings"])  # validate now; merged by the caller
        out["settings"] = obj["settings"]
    return out


def content_field(obj: dict[str, Any]) -> str:
    v = get_str(obj, "content", required=True, max_len=MAX_CONTENT_CHARS, non_empty=True)
    assert v is not None
    return v

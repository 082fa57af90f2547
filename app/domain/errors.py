"""ServiceError: the one refusal (or failure) every layer raises, without HTTP: a stable `code`, a message naming
the problem, the field at fault (`param`) and when to retry (`retry_after_s`). app/api/errors.py maps each code to
an HTTP status; the codes are the WebSocket protocol's error codes too (docs/protocol.md)."""

from __future__ import annotations

from typing import Any

# code -> the OpenAI error `type` its JSON body names (OpenAI's classes of error, not statuses)
TYPES = {
    "bad_request": "invalid_request_error",
    "invalid_parameter": "invalid_request_error",
    "unauthorized": "authentication_error",
    "forbidden": "permission_error",
    "not_found": "not_found_error",
    "busy": "conflict_error",
    "payload_too_large": "invalid_request_error",
    "unsupported_media_type": "invalid_request_error",
    "rate_limited": "rate_limit_error",
    "queue_full": "rate_limit_error",
    "overloaded": "overloaded_error",
    "unavailable": "overloaded_error",
    "queue_timeout": "overloaded_error",
    "internal": "server_error",
    # the OpenAI shim's codes
    "unsupported_parameter": "invalid_request_error",
    "context_length_exceeded": "invalid_request_error",
    "invalid_api_key": "authentication_error",
    "model_not_found": "not_found_error",
}
CODES = frozenset(TYPES)


class ServiceError(Exception):
    """A refusal with a stable `code`, a message naming the problem and, where one field is at fault, `param`;
    `retry_after_s` when trying again later can succeed."""

    def __init__(self, code: str, message: str, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        assert code in CODES, code
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s  # the `Retry-After` header / the event's `retry_after_s`

    def body(self) -> dict[str, Any]:
        """OpenAI's error object: an HTTP error's body, a /v1 stream's error chunk."""
        return {"error": {"message": self.message, "type": TYPES[self.code], "param": self.param, "code": self.code}}

    def event(self, **extra: Any) -> dict[str, Any]:
        """As a WebSocket/SSE `error` event."""
        ev: dict[str, Any] = {"type": "error", "code": self.code, "message": self.message}
        if self.param is not None:
            ev["param"] = self.param
        if self.retry_after_s is not None:
            ev["retry_after_s"] = self.retry_after_s
        ev.update({k: v for k, v in extra.items() if v is not None})
        return ev


def not_found(session_id: str) -> ServiceError:
    return ServiceError("not_found", f"session '{session_id}' not found", param="session_id")

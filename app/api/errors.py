"""Errors as HTTP answers: each ServiceError code's status (STATUS, the one table) beside the error's OpenAI-style
body, and the handlers for what Litestar or the database raise."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from sqlalchemy.exc import OperationalError

from app.domain.errors import CODES, ServiceError

log = logging.getLogger("forge.api")

# code -> HTTP status (the codes and what they mean: app/domain/errors.py, docs/protocol.md)
STATUS = {
    "bad_request": 400,
    "invalid_parameter": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "busy": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "rate_limited": 429,
    "queue_full": 429,
    "overloaded": 503,
    "unavailable": 503,
    "queue_timeout": 503,
    "internal": 500,
    # OpenAI shim codes
    "unsupported_parameter": 400,
    "context_length_exceeded": 400,
    "invalid_api_key": 401,
    "model_not_found": 404,
}
assert set(STATUS) == CODES, "every error code has its HTTP status"
_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    500: "server_error",
}  # for Litestar's own refusals


def status_of(err: ServiceError) -> int:
    """The HTTP status of the error (the domain knows no HTTP: its codes map here)."""
    return STATUS[err.code]


def error_response(err: ServiceError, headers: dict[str, str] | None = None) -> Response:
    return Response(err.body(), status_code=status_of(err), headers=headers)


def _service_error_handler(_: Request, exc: ServiceError) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status_of(exc) == 401 else None
    if exc.retry_after_s is not None:
        headers = {"Retry-After": str(exc.retry_after_s)}
    return error_response(exc, headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "bad_request",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def _http_error_handler(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    code = _HTTP_CODES.get(status, "internal" if status >= 500 else "bad_request")
    if status == 404:
        message = f"no route for {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif status == 413:
        message = "request body is too large"
    elif status >= 500:
        if "client disconnected" in str(exc.detail):  # litestar: the body ended early; nobody gets the answer
            log.debug("client left during the request body of %s %s", request.method, request.url.path)
        else:
            log.error("HTTP %s on %s %s: %s", status, request.method, request.url.path, exc.detail)
        message = "internal server error"
    elif isinstance(exc, ValidationException):
        message, param = _validation_message(exc)
        code = "invalid_parameter" if param else code
        body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
        return Response(body, status_code=status)
    else:
        message = str(exc.detail)
    body = {
        "error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": None, "code": code}
    }
    return Response(body, status_code=status, headers=getattr(exc, "headers", None))


def _validation_message(exc: ValidationException) -> tuple[str, str | None]:
    """Litestar's refusal of a query parameter, named; or of a missing body (app.api.typed decodes bodies)."""
    problems = exc.extra if isinstance(exc.extra, list) else []
    for p in problems:
        if isinstance(p, dict) and str(p.get("source", "")).lower().endswith("query") and p.get("key"):
            key = str(p["key"])
            return f"'{key}' is invalid: {p.get('message', '')}", key
    detail = str(exc.detail)
    if detail.startswith("Missing required query parameter '"):
        key = detail.split("'")[1]
        return f"'{key}' is required", key
    return "the request body is missing; expected a JSON object", None


DB_BUSY_RETRY_S = 1


def busy_database(exc: Exception) -> ServiceError | None:
    """A database that stayed locked past its busy timeout (SQLite, another long write): a 503 to retry, not a 500."""
    if isinstance(exc, OperationalError) and "database is locked" in str(exc):
        log.warning("database busy: %s", str(exc).splitlines()[0])
        return ServiceError("unavailable", "the database is busy; retry shortly", retry_after_s=DB_BUSY_RETRY_S)
    return None


def _unexpected_error_handler(request: Request, exc: Exception) -> Response:
    busy = busy_database(exc)
    if busy is not None:
        return _service_error_handler(request, busy)
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(ServiceError("internal", "internal server error"))


EXCEPTION_HANDLERS = {
    ServiceError: _service_error_handler,
    HTTPException: _http_error_handler,
    Exception: _unexpected_error_handler,
}

"""What every request passes before a handler sees it: a path that is valid UTF-8 without NUL bytes (400 here, not a
500 from the file system later), the Host (no DNS rebinding onto a loopback server),
the Origin (no cross-site WebSockets or form posts), the API key or admin token, a JSON Content-Type on
bodies; and (`security_headers`) the security headers on every response. Refusals are OpenAI-style JSON errors; a
refused WebSocket gets its HTTP status before the upgrade."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes, urlsplit

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import status_of
from app.config import Settings
from app.domain.errors import ServiceError

KEYED = ("/v1", "/api", "/ws")  # the API key opens these
ADMIN = ("/admin", "/metrics")  # the admin token opens these
JSON_BODIES = ("/v1", "/api")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WS_PROTOCOL = "forge"  # browsers offer it next to `forge.bearer.<base64url key>` (they cannot set headers)
WS_BEARER = "forge.bearer."
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# The API reference (/schema, RapiDoc from web/vendor) styles itself inline and may try requests from the page.
SCHEMA_CSP = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer")]


def key_id(key: str) -> str:
    """What a session stores as its owner: a digest of the key, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def owner(scope: Any) -> str:
    """The owner id the gate found for this connection ("" when the server has no keys)."""
    return scope["state"]["owner"]


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def _host_name(host: str) -> str:
    if host.startswith("["):  # [::1]:8000
        return host[1:].split("]", 1)[0].lower()
    return host.rsplit(":", 1)[0].lower() if host.count(":") == 1 else host.lower()


class Gate:
    """ASGI middleware holding the service's access rules (docs/api.md#access)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.keys = [(k.encode(), key_id(k)) for k in settings.api_keys]
        self.admin = settings.admin_token.encode() if settings.admin_token else None
        self.origins = {urlsplit(o).netloc.lower() for o in settings.allowed_origins}
        self.loopback = _host_name(settings.host) in LOOPBACK
        self.hosts = LOOPBACK | {_host_name(o) for o in self.origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            scope.setdefault("state", {})["owner"] = self._check(scope, headers)
        except ServiceError as err:
            await self._refuse(scope, receive, send, err)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope, headers: dict[str, str]) -> str:
        path, host = scope["path"], headers.get("host", "")
        _check_path(scope)
        if self.loopback and _host_name(host) not in self.hosts:
            raise ServiceError("forbidden", f"this server answers to loopback addresses only, not host {host!r}")
        method = scope.get("method", "GET")
        origin = headers.get("origin")
        if origin is not None and (scope["type"] == "websocket" or method not in SAFE_METHODS):
            netloc = urlsplit(origin).netloc.lower() if origin != "null" else ""
            if netloc != host.lower() and netloc not in self.origins:
                raise ServiceError("forbidden", f"origin {origin!r} may not use this server (see --allow-origin)")
        if scope["type"] == "http" and method not in SAFE_METHODS and _under(path, JSON_BODIES):
            has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if has_body and media != "application/json":
                raise ServiceError(
                    "unsupported_media_type",
                    f"the body must be JSON sent as 'Content-Type: application/json', got {media or 'none'!r}",
                )
        if _under(path, ADMIN) and self.admin is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
            # a list, not a generator: both comparisons run, so the time does not tell which one matched
            if not any([hmac.compare_digest(t.encode(), self.admin) for t in (_bearer(headers), query)]):  # noqa: C419
                raise ServiceError(
                    "unauthorized",
                    "missing or invalid admin token: send 'Authorization: Bearer <token>' or add '?token=<token>'",
                )
        if not self.keys:
            return ""
        given = (_bearer(headers) or _ws_bearer(headers)).encode()
        found = ""
        for key, kid in self.keys:  # compare with every key: the time taken tells nothing
            if hmac.compare_digest(given, key):
                found = kid
        if _under(path, KEYED) and not found:
            raise ServiceError("invalid_api_key", "missing or invalid API key: send 'Authorization: Bearer <key>'")
        return found

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, err: ServiceError) -> None:
        body = json.dumps(err.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status_of(err) == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": status_of(err), "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": status_of(err), "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": err.code})


async def security_headers(message: Message, scope: Scope) -> None:
    """Litestar `before_send` hook: CSP, nosniff and framing rules on every HTTP response (404s included)."""
    if message["type"] == "http.response.start":
        csp = SCHEMA_CSP if _under(scope["path"], ("/schema",)) else CSP
        present = {k.lower() for k, _ in message.get("headers", [])}
        extra = [(k, v) for k, v in [(b"content-security-policy", csp.encode()), *HEADERS] if k not in present]
        message["headers"] = [*message.get("headers", []), *extra]


def _check_path(scope: Scope) -> None:
    """The decoded path must be UTF-8 without NUL bytes: the server decodes %ff to U+FFFD and would pass %00 on
    to the file system and the database."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogatepass")
    path = unquote_to_bytes(raw)
    if b"\0" in path:
        raise ServiceError("bad_request", "the path holds a NUL byte (%00)")
    try:
        path.decode("utf-8")
    except UnicodeDecodeError:
        raise ServiceError("bad_request", "the path is not valid UTF-8 once percent-decoded") from None


def _bearer(headers: dict[str, str]) -> str:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _ws_bearer(headers: dict[str, str]) -> str:
    for proto in headers.get("sec-websocket-protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith(WS_BEARER):
            encoded = proto[len(WS_BEARER) :]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return ""
    return ""

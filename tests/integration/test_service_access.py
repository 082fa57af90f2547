"""Who may use the service, and from where: one key on every surface, sessions owned by the key that made
them, browser-origin rules, security headers, tokens kept out of the access log (the shared real server,
which has two API keys and an admin token)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.integration.conftest import ADMIN_TOKEN, API_KEY, OTHER_KEY, REPO, ServerProcess

MINE = {"Authorization": f"Bearer {API_KEY}"}
THEIRS = {"Authorization": f"Bearer {OTHER_KEY}"}


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def mine(http: httpx.Client) -> dict:
    r = http.post("/api/sessions", json={"title": "private", "settings": {"max_tokens": 2}}, headers=MINE)
    assert r.status_code == 201
    return r.json()


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/api/sessions"), ("POST", "/api/sessions"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")],
)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic " + API_KEY}])
def test_every_http_surface_needs_a_key(http: httpx.Client, method: str, path: str, headers: dict) -> None:
    r = http.request(method, path, headers=headers, json={})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key"


async def test_the_websocket_is_refused_with_401_before_the_upgrade(server: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server.ws_url, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"


async def test_browsers_send_the_key_as_a_subprotocol(server: ServerProcess) -> None:
    token = base64.urlsafe_b64encode(API_KEY.encode()).decode().rstrip("=")
    async with connect(server.ws_url, subprotocols=["forge", f"forge.bearer.{token}"]) as ws:
        assert ws.subprotocol == "forge"  # the key is never echoed back
        await ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30)) == {"type": "pong"}
    with pytest.raises(InvalidStatus) as refused:
        async with connect(server.ws_url, subprotocols=["forge", "forge.bearer.bm9wZQ"]):  # "nope"
            pass
    assert refused.value.response.status_code == 401


async def test_sessions_belong_to_the_key_that_made_them(http: httpx.Client, server: ServerProcess, mine: dict) -> None:
    sid = mine["id"]
    assert sid not in [s["id"] for s in http.get("/api/sessions", headers=THEIRS).json()["data"]]
    assert sid in [s["id"] for s in http.get("/api/sessions", headers=MINE).json()["data"]]
    for method, path, body in [
        ("GET", f"/api/sessions/{sid}", None),
        ("PATCH", f"/api/sessions/{sid}", {"title": "x"}),
        ("GET", f"/api/sessions/{sid}/export", None),
        ("DELETE", f"/api/sessions/{sid}", None),
        ("POST", f"/api/sessions/{sid}/messages", {"content": "hi"}),
        ("POST", f"/api/sessions/{sid}/cancel", None),
    ]:
        r = http.request(method, path, json=body, headers=THEIRS)
        assert r.status_code == 404 and r.json()["error"]["param"] == "session_id", (method, path)
    async with connect(server.ws_url, additional_headers=THEIRS) as ws:
        for cmd in (
            {"type": "session.open", "session_id": sid},
            {"type": "message.send", "session_id": sid, "content": "hi"},
            {"type": "generation.cancel", "session_id": sid},
        ):
            await ws.send(json.dumps(cmd))
            ev = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert (ev["type"], ev["code"]) == ("error", "not_found"), cmd
    assert http.get(f"/api/sessions/{sid}", headers=MINE).json()["messages"] == []  # untouched


def test_json_routes_want_json(http: httpx.Client, mine: dict) -> None:
    for path in ("/api/sessions", f"/api/sessions/{mine['id']}/messages", "/v1/chat/completions"):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {**MINE, **({"Content-Type": ctype} if ctype else {})}
            r = http.post(path, content=b'{"content": "hi"}', headers=headers)
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (path, ctype)
    assert http.get(f"/api/sessions/{mine['id']}", headers=MINE).json()["messages"] == []


async def test_foreign_origins_and_hosts_are_refused(http: httpx.Client, server: ServerProcess) -> None:
    evil = {**MINE, "Origin": "http://evil.example"}
    assert http.post("/api/sessions", json={}, headers=evil).status_code == 403
    assert http.get("/api/sessions", headers=evil).status_code == 200  # a read is not a cross-site write
    same = {**MINE, "Origin": server.url}
    assert http.post("/api/sessions", json={}, headers=same).status_code == 201
    with pytest.raises(InvalidStatus) as refused:
        async with connect(server.ws_url, additional_headers=MINE, origin="http://evil.example"):
            pass
    assert refused.value.response.status_code == 403
    async with connect(server.ws_url, additional_headers=MINE, origin=server.url) as ws:
        await ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "pong"
    # DNS rebinding: a loopback server answers to loopback names only.
    r = http.get("/api/sessions", headers={**MINE, "Host": f"rebind.example:{server.port}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert http.get("/health", headers={"Host": f"localhost:{server.port}"}).status_code == 200


def test_security_headers_and_no_tokens_in_the_access_log(http: httpx.Client, server: ServerProcess) -> None:
    r = http.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
    assert http.get("/api/nothing", headers=MINE).headers["x-content-type-options"] == "nosniff"
    assert http.get(f"/admin?token={ADMIN_TOKEN}").status_code == 200
    assert http.get("/admin/api/stats", params={"token": ADMIN_TOKEN}).status_code == 200
    # The access log is written after each response, in order: once a later request's line is there, so are theirs.
    marker = f"marker={time.monotonic_ns()}"
    assert http.get(f"/health?{marker}").status_code == 200
    deadline = time.monotonic() + 60
    while marker not in (log := server.log_path.read_text(errors="replace")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "token=***" in log
    assert ADMIN_TOKEN not in log and API_KEY not in log and OTHER_KEY not in log


def test_the_schema_documents_every_route(http: httpx.Client) -> None:
    paths = http.get("/schema/openapi.json").json()["paths"]
    assert {
        "/api/sessions",
        "/api/sessions/{session_id}/messages",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
    } <= set(paths)
    body = paths["/v1/chat/completions"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]
    assert http.get("/schema").status_code == 200


@pytest.mark.parametrize("flags", [["--api-key", ""], ["--api-key", "k", "--api-key", " "], ["--admin-token", ""]])
def test_an_empty_key_is_refused_at_start_up(flags: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.server", "--port", "0", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "empty" in done.stderr

"""Bad input everywhere: clear 4xx answers naming the problem, nothing stored half-way, the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.conftest import API_KEY, ServerProcess

MISSING = "0" * 32


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=180, headers=server.auth) as client:
        yield client


@pytest.fixture(scope="module")
def session(http: httpx.Client) -> dict:
    r = http.post("/api/sessions", json={"title": "target", "settings": {"temperature": 0, "max_tokens": 4}})
    assert r.status_code == 201
    return r.json()


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["code"] and "Traceback" not in err["message"]
    return err


def snapshot(http: httpx.Client) -> tuple[list, dict]:
    sessions = http.get("/api/sessions").json()["data"]
    return sessions, {s["id"]: http.get(f"/api/sessions/{s['id']}").json()["messages"] for s in sessions}


@pytest.mark.parametrize(
    "method, path, body, status, param",
    [
        ("POST", "/api/sessions", b"{nope", 400, None),
        ("POST", "/api/sessions", b"[]", 400, None),
        ("POST", "/api/sessions", {"title": 5}, 400, "title"),
        ("POST", "/api/sessions", {"colour": "red"}, 400, "colour"),
        ("POST", "/api/sessions", {"settings": {"max_tokens": -1}}, 400, "settings.max_tokens"),
        ("POST", "/api/sessions", {"settings": {"temperature": 2.5}}, 400, "settings.temperature"),
        ("POST", "/api/sessions", {"settings": {"temperature": "warm"}}, 400, "settings.temperature"),
        ("POST", "/api/sessions", {"settings": {"top_p": 1.5}}, 400, "settings.top_p"),
        ("POST", "/api/sessions", {"system_prompt": ["a"]}, 400, "system_prompt"),
        ("POST", "/api/sessions/import", {"forge_export": 3, "session": {}, "messages": []}, 400, "forge_export"),
        (
            "POST",
            "/api/sessions/import",
            {"forge_export": 2, "session": {}, "messages": [{"role": "user", "content": "x", "parent_id": "nope"}]},
            400,
            "messages[0].parent_id",
        ),
        (
            "POST",
            "/api/sessions/import",
            {"forge_export": 1, "session": {}, "messages": [{"role": "x", "content": ""}]},
            400,
            "messages[0].role",
        ),
        (
            "POST",
            "/api/sessions/import",
            {"forge_export": 1, "session": {}, "messages": [{"role": "user", "content": "x"}] * 10_001},
            400,
            "messages",
        ),
        (
            "POST",
            "/api/sessions/import",
            b'{"forge_export": 1, "session": {}, "messages": [{"role": "user", "content": "x", "ttft_ms": 1e400}]}',
            400,
            "messages[0].ttft_ms",
        ),
        ("POST", "/api/sessions", b'{"settings": {"max_tokens": ' + b"9" * 400 + b"}}", 400, "settings.max_tokens"),
        ("POST", "/api/sessions", b"[" * 100_000 + b"]" * 100_000, 400, None),
        ("POST", "/api/sessions", b'{"title": "\\ud800"}', 400, None),
        ("GET", f"/api/sessions/{MISSING}", None, 404, "session_id"),
        ("POST", f"/api/sessions/{MISSING}/messages/{MISSING}/select", None, 404, "session_id"),
        ("PATCH", f"/api/sessions/{MISSING}", {"title": "x"}, 404, "session_id"),
        ("DELETE", f"/api/sessions/{MISSING}", None, 404, "session_id"),
        ("GET", f"/api/sessions/{MISSING}/export", None, 404, "session_id"),
        ("POST", f"/api/sessions/{MISSING}/messages", {"content": "hi"}, 404, "session_id"),
        ("POST", f"/api/sessions/{MISSING}/regenerate", None, 404, "session_id"),
        ("GET", "/api/nothing-here", None, 404, None),
    ],
)
def test_rest_refusals(http: httpx.Client, method: str, path: str, body, status: int, param: str | None) -> None:
    before = snapshot(http)
    content = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    err = error_of(http.request(method, path, content=content, headers={"content-type": "application/json"}), status)
    assert err["param"] == param
    assert snapshot(http) == before  # nothing stored


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{", 400, None),
        ({}, 400, "content"),
        ({"content": 7}, 400, "content"),
        ({"content": "   "}, 400, "content"),
        ({"content": "x" * 100_001}, 400, "content"),
        ({"content": "hi", "stream": True}, 400, "stream"),
    ],
)
def test_bad_turns_store_nothing(http: httpx.Client, session: dict, body, status: int, param: str | None) -> None:
    path = f"/api/sessions/{session['id']}/messages"
    before = snapshot(http)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    err = error_of(http.post(path, content=content, headers={"content-type": "application/json"}), status)
    assert err["param"] == param
    assert snapshot(http) == before


def test_conversation_longer_than_the_context_is_refused_whole(http: httpx.Client, session: dict) -> None:
    before = snapshot(http)
    err = error_of(http.post(f"/api/sessions/{session['id']}/messages", json={"content": "word " * 9000}), 400)
    assert err["param"] == "content" and "context" in err["message"]
    assert snapshot(http) == before


def test_edit_and_regenerate_refusals(http: httpx.Client, session: dict) -> None:
    sid = session["id"]
    err = error_of(http.post(f"/api/sessions/{sid}/regenerate"), 400)  # nothing to regenerate yet
    assert "regenerate" in err["message"]
    err = error_of(http.post(f"/api/sessions/{sid}/messages/{MISSING}/edit", json={"content": "x"}), 404)
    assert err["param"] == "message_id"


def test_oversized_bodies_are_refused(http: httpx.Client, session: dict) -> None:
    before = snapshot(http)
    huge = json.dumps({"content": "x" * (9 << 20)}).encode()
    err = error_of(
        http.post(
            f"/api/sessions/{session['id']}/messages", content=huge, headers={"content-type": "application/json"}
        ),
        413,
    )
    assert err["code"] == "payload_too_large"
    err = error_of(
        http.post(
            "/v1/chat/completions",
            content=huge,
            headers={"content-type": "application/json", "Authorization": f"Bearer {API_KEY}"},
        ),
        413,
    )
    assert snapshot(http) == before


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"not json", 400, None),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
        ({"model": "default", "messages": "hi"}, 400, "messages"),
        ({"model": "default", "messages": []}, 400, "messages"),
        ({"model": "default", "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content"),
        ({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}, 400, "max_tokens"),
        ({"model": "default", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "stream"),
        (
            {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000},
            400,
            "max_tokens",
        ),
    ],
)
def test_openai_refusals(http: httpx.Client, body, status: int, param: str | None) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    err = error_of(
        http.post(
            "/v1/chat/completions",
            content=content,
            headers={"content-type": "application/json", "Authorization": f"Bearer {API_KEY}"},
        ),
        status,
    )
    assert err["param"] == param


def test_still_serving_after_all_that(http: httpx.Client, session: dict) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    with http.stream("POST", f"/api/sessions/{session['id']}/messages", json={"content": "Hello"}) as r:
        assert r.status_code == 200
        last = [ln for ln in r.iter_lines() if ln.startswith("data: ")][-1]
    assert json.loads(last[6:])["status"] == "complete"
    assert [m["role"] for m in http.get(f"/api/sessions/{session['id']}").json()["messages"]] == ["user", "assistant"]


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/static/index.html%00", 400),
        ("GET", "/static/%ff", 400),
        ("GET", "/static/%2e%2e/%2e%2e/pyproject.toml", 404),
        ("GET", "/static/..%5c..%5cpyproject.toml", 404),
        ("GET", "/static/index.html/x", 404),
        ("GET", "/static/" + "a" * 5000, 404),
        ("GET", "/api/sessions/%00", 400),
        ("GET", "/api/sessions/%c0%ae%c0%ae/export", 400),
        ("DELETE", "/api/sessions/%2e%2e", 404),
        ("POST", f"/api/sessions/{MISSING}/messages/%00/select", 400),
        ("GET", "/v1/models/%ff", 400),
    ],
)
def test_hostile_paths_are_400_or_404(http: httpx.Client, method: str, path: str, status: int) -> None:
    # raw bytes on the wire: no client-side normalisation of `..` or re-encoding
    url = httpx.URL(str(http.base_url)).copy_with(raw_path=path.encode())
    error_of(http.request(method, url), status)


def test_a_billion_choices_are_refused_before_anything_is_sized(http: httpx.Client) -> None:
    for path, body in [
        ("/v1/completions", {"model": "default", "prompt": "Once", "max_tokens": 4, "n": 10**9}),
        (
            "/v1/chat/completions",
            {"model": "default", "messages": [{"role": "user", "content": "x"}], "n": 10**9, "stream": True},
        ),
    ]:
        err = error_of(http.post(path, json=body), 400)
        assert err["param"] == "n"

"""An outside fuzzer against the published API: Schemathesis reads /schema/openapi.json from a real server (default
model, 127.0.0.1) and tries every operation, coverage (boundary values of every field: 0, maximum, maximum + 1,
...) then fuzzing then stateful phases, with valid and invalid data, a fixed seed and a bounded number of examples.
Every check must pass: no 5xx, every status, content type and body as documented, extra fields refused as
documented, valid data accepted. And every answer, whole streams included, within a deadline; the server alive
and its memory bounded afterwards.

Plus each client-supplied count at 0, its maximum, maximum + 1, 10^9 and 2^63, sent by hand: refused with a 400
naming it, or answered, never sized from before it is checked (issue 19: `"n": 1000000000` grew the server past
24 GB).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest

from app.api import openai_bodies as ob
from tests.integration.conftest import REPO, ServerProcess

SEED = 19
EXAMPLES = 5  # per operation and phase; the coverage phase adds its boundary values on top
DEADLINE_S = 60.0  # one answer, a whole stream included: a hang detector, far above any normal answer
RSS_GROWTH_MB = 150  # after warm-up; caches (prefix blocks, compiled shapes) may grow a little
# Valid data is refused (400) for reasons a schema cannot state: the prompt against the model's context, token
# ids against its vocabulary, a regex or grammar that does not compile, references within an export, tools whose
# names repeat or whose parameters cannot be enforced, and what the session holds now (nothing to continue or
# regenerate, no call for a tool result to answer, a message's tool_choice over a session without tools).
# Elsewhere valid data must be accepted: the rules between fields that a schema can state, it states
# (app/api/schema_rules.py).
CONFIG = """
# The stateful phase follows the schema's links (a created session into its routes): enough scenarios to get there.
[phases.stateful.generation]
max-examples = 40

[[operations]]
include-path-regex = "^/(v1/((chat/)?completions|embeddings)|api/sessions(/import|/[^/]+)?)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]

[[operations]]
include-path-regex = "^/api/sessions/[^/]+/(messages|continue|regenerate|tool_results)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory):
    """No API key (the default `forge serve`); keep-alives slower than the client's read timeout, so a stream
    that hangs is seen as one."""
    tmp = tmp_path_factory.mktemp("openapi-fuzz")
    srv = ServerProcess(
        db_path=tmp / "forge.db",
        log_path=tmp / "server.log",
        api_key=None,
        admin_token=None,
        keepalive_s=120.0,
        env={"FORGE_DEFAULT_MAX_TOKENS": "2"},
    ).start()
    yield srv
    srv.stop()


def _warm_up(srv: ServerProcess) -> None:
    """Reach the steady state first (numba's compiled shapes, n sequences at once) so RSS growth means a leak."""
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=120,
        json={"model": "default", "prompt": "Once upon a time", "max_tokens": 2, "n": ob.MAX_N, "logprobs": 5},
    )
    assert r.status_code == 200, r.text


def test_schemathesis_finds_nothing(open_server: ServerProcess, tmp_path: Path) -> None:
    srv = open_server
    _warm_up(srv)
    rss_before = _rss_mb(srv.proc.pid)
    calls = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.integration.openapi_fuzz_hooks",
        "FORGE_FUZZ_LOG": str(calls),
        "PYTHONPATH": str(REPO),
        "NO_COLOR": "1",
    }
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    args = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{srv.url}/schema/openapi.json",
        "--checks",
        "all",
        "--phases",
        "coverage,fuzzing,stateful",
        "--mode",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        str(DEADLINE_S),
        "--max-response-time",
        str(DEADLINE_S),
        "--output-sanitize",
        "false",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path / "report"),
    ]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout[-12000:] + run.stderr[-3000:]
    assert run.returncode == 0, out
    assert srv.proc.poll() is None, srv.log_tail()
    assert httpx.get(srv.url + "/health", timeout=10).json() == {"status": "ok"}

    answered = [json.loads(line) for line in calls.read_text().splitlines()]
    ops = {c["op"].split(" ", 1)[0] + " " + c["op"].split(" ", 1)[1].split("?")[0] for c in answered}
    assert len(answered) > 200 and len(ops) > 20, (len(answered), sorted(ops))
    assert not [c for c in answered if c["status"] >= 500], out
    slow = [c for c in answered if c["s"] > DEADLINE_S]
    assert not slow, slow
    assert {200, 201, 400, 404}.issubset({c["status"] for c in answered})
    # The stateful phase follows the schema's links from a created session into its routes: only a real id opens them.
    reached = {c["op"] for c in answered if c["status"] < 300 and c["op"].split(" ")[0] != "OPTIONS"}
    assert {"GET /api/sessions/{session_id}", "GET /api/sessions/{session_id}/export"} <= reached, sorted(reached)
    growth = _rss_mb(srv.proc.pid) - rss_before
    assert growth < RSS_GROWTH_MB, f"RSS grew {growth:.0f} MB"


# (field, its maximum, where the field goes) for each count a client sends
COUNTS = [
    ("n", ob.MAX_N, "both"),
    ("best_of", ob.MAX_N, "completions"),
    ("max_tokens", ob.MAX_TOKENS, "both"),
    ("max_completion_tokens", ob.MAX_TOKENS, "chat"),
    ("top_logprobs", ob.MAX_TOP_LOGPROBS, "chat"),
    ("logprobs", ob.MAX_COMPLETION_LOGPROBS, "completions"),
    ("top_k", 1 << 20, "both"),
    ("stop", ob.MAX_STOP, "both"),
    ("logit_bias", ob.MAX_LOGIT_BIAS, "both"),
    ("messages", ob.MAX_MESSAGES, "chat"),
    ("prompt", ob.MAX_PROMPT_TOKENS, "completions"),
]
HUGE = [10**9, 2**63]


def _body(route: str, field: str, value: int) -> dict | bytes:
    """A cheap request with `field` set to a count of `value` (lists and maps built only for sizes we can send)."""
    body: dict = {"model": "default", "max_tokens": 1}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hi"
    if field in ("n", "best_of"):
        body.update(n=value, best_of=value) if route == "completions" else body.update(n=value)
    elif field == "top_logprobs":
        body.update(logprobs=True, top_logprobs=value)
    elif field == "stop":
        body["stop"] = [f"s{i}" for i in range(value)]
    elif field == "logit_bias":
        body["logit_bias"] = {str(i): 0 for i in range(value)}
    elif field == "messages":
        body["messages"] = [{"role": "user", "content": "Hi"}] * value
    elif field == "prompt":
        body["prompt"] = [1] * value
    elif field in ("max_tokens", "max_completion_tokens"):
        body.pop("max_tokens")
        body[field] = value
    else:
        body[field] = value
    return body


def _counted(field: str) -> bool:
    return field in ("stop", "logit_bias", "messages", "prompt")  # a size: only sizes that can be sent


CASES = [
    (route, field, value, ok)
    for field, top, where in COUNTS
    for route in (("chat", "completions") if where == "both" else (where,))
    for value, ok in [
        (0, field in ("stop", "logit_bias", "top_logprobs", "logprobs", "top_k")),
        (top, None),
        (top + 1, False),
    ]
    + ([] if _counted(field) else [(v, False) for v in HUGE])
]


@pytest.mark.parametrize("route, field, value, ok", CASES, ids=[f"{r}-{f}-{v}" for r, f, v, _ in CASES])
def test_every_count_is_bounded_before_anything_is_sized_from_it(
    open_server: ServerProcess, route: str, field: str, value: int, ok: bool | None
) -> None:
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    r = httpx.post(open_server.url + path, json=_body(route, field, value), timeout=120)
    if ok is None:  # the maximum: answered, or refused for what the schema cannot know (context, vocabulary)
        assert r.status_code in (200, 400), r.text
        if r.status_code == 400:
            assert r.json()["error"]["code"] in ("context_length_exceeded", "invalid_parameter"), r.text
        return
    if ok:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    param = r.json()["error"]["param"]
    assert param == field or (field == "best_of" and param == "n"), r.text


def test_the_schema_says_what_the_server_refuses_and_links_ids_onward(open_server: ServerProcess) -> None:
    """Requests the schema called valid while the server refused them (Schemathesis, seed 7) now agree: the server
    takes what the schema allows, or the schema states the rule. And the ids an answer carries link onward."""
    srv = open_server
    schema = httpx.get(srv.url + "/schema/openapi.json", timeout=30).json()
    search = next(p for p in schema["paths"]["/api/search"]["get"]["parameters"] if p["name"] == "q")["schema"]
    for q, ok in [("\x85", True), ("a", True), ("\u3000", False), (" \t", False)]:  # U+0085 is no space to JSON Schema
        assert bool(re.search(search["pattern"], q)) is ok, q
        assert httpx.get(srv.url + "/api/search", params={"q": q}, timeout=30).status_code == (200 if ok else 400), q

    message = {**schema["components"]["schemas"]["ImportedMessage"], "components": schema["components"]}
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for role, fields, ok in [
        ("user", {"tool_calls": [call]}, False),
        ("assistant", {"tool_calls": [call]}, True),
        ("tool", {}, False),
        ("tool", {"tool_call_id": "call_1"}, True),
        ("user", {"tool_call_id": "call_1"}, False),
    ]:
        msg = {"role": role, "content": "x", **fields}
        assert jsonschema.Draft202012Validator(message).is_valid(msg) is ok, msg
        history = [{"role": "assistant", "content": "", "tool_calls": [call]}] if role == "tool" else []
        export = {"forge_export": 1, "session": {}, "messages": [*history, msg]}
        r = httpx.post(srv.url + "/api/sessions/import", json=export, timeout=30)
        assert r.status_code == (201 if ok else 400), (msg, r.text)

    send = {**schema["components"]["schemas"]["SendBody"], "components": schema["components"]}
    assert not jsonschema.Draft202012Validator(send).is_valid({"content": "x", "tools": None, "tool_choice": "auto"})
    assert jsonschema.Draft202012Validator(send).is_valid({"content": "x", "tools": None})

    created = schema["paths"]["/api/sessions"]["post"]["responses"]["201"]["links"]
    assert created["ApiSessionsSessionIdReadSession"]["parameters"] == {"session_id": "$response.body#/id"}
    assert {"ApiSessionsSessionIdMessagesSendMessage", "ApiSessionsSessionIdExportExportSession"} <= set(created)
    models = schema["paths"]["/v1/models"]["get"]["responses"]["200"]["links"]
    assert models["V1ModelsModelIdReadModel"]["parameters"] == {"model_id": "$response.body#/data/0/id"}
    model_id = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    assert httpx.get(f"{srv.url}/v1/models/{model_id}", timeout=30).status_code == 200

"""Seeded hostile input against a real server (scripts/hostile.py): zero 5xx, zero dead sockets, the server
alive and serving at the end. Plus a Hypothesis property of the body decoder: whatever the JSON, a Struct
or a ServiceError naming the problem, never another exception."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from app.api.bodies import AnyCommand, Export, SessionFields, decode
from app.api.errors import status_of
from app.api.openai_bodies import ChatRequest, CompletionRequest
from app.domain.errors import ServiceError
from scripts import hostile
from tests.integration.conftest import ServerProcess

CASES = 2000


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("fuzz")
    srv = ServerProcess(
        db_path=tmp / "forge.db", log_path=tmp / "server.log", env={"FORGE_WS_COMMANDS_PER_S": "100000"}
    ).start()  # rate limits would stop the probes
    yield srv
    srv.stop()


async def test_hostile_input_gets_4xx_answers_and_every_socket_keeps_answering(fuzz_server: ServerProcess) -> None:
    srv = fuzz_server
    sid = httpx.post(
        srv.url + "/api/sessions", headers=srv.auth, timeout=60, json={"settings": {"temperature": 0, "max_tokens": 1}}
    ).json()["id"]
    tally = await hostile.run(srv.url, srv.auth, hostile.cases(seed=2024, n=CASES, session_id=sid))
    assert tally.sent == CASES
    assert tally.server_errors == 0, tally.notes
    assert tally.dead_sockets == 0, tally.notes
    assert {400, 404, 415}.issubset(tally.statuses) and tally.statuses["ws:bad_request"] > 0, tally.statuses
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    with httpx.stream(
        "POST",
        f"{srv.url}/api/sessions/{sid}/messages",
        headers=srv.auth,
        timeout=120,
        json={"content": "Still there?"},
    ) as r:
        last = [line for line in r.iter_lines() if line.startswith("data: ")][-1]
    assert json.loads(last[6:])["status"] == "complete"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "title",
    "settings",
    "temperature",
    "content",
    "messages",
    "role",
    "session_id",
    "type",
    "model",
    "prompt",
    "forge_export",
    "session",
    "max_tokens",
    "n",
    "stop",
    "logit_bias",
    "stream",
    "client_id",
    "response_format",
    "json_schema",
    "schema",
    "pattern",
    "lark",
    "speculative",
]
BODIES = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6) | JSON


@seed(9)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES, into=st.sampled_from([SessionFields, Export, AnyCommand, ChatRequest, CompletionRequest]))
def test_the_decoder_returns_a_struct_or_names_the_problem(body, into) -> None:
    raw = json.dumps(body, allow_nan=True)  # NaN and Infinity too: not JSON, refused as such
    try:
        decode(raw, into, unsupported=into in (ChatRequest, CompletionRequest))
    except ServiceError as e:
        assert status_of(e) == 400 and e.message

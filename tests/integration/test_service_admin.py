"""/health, /ready, /metrics (Prometheus text) and the admin feed, against the real server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from tests.integration.conftest import ADMIN_TOKEN, REPO, ServerProcess, wait_idle


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=180, headers=server.auth) as client:
        yield client


def scrape(http: httpx.Client) -> dict[str, float]:
    r = http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_health_and_ready(http: httpx.Client, server: ServerProcess) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    ready = http.get("/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["db"] == "ok" and body["model"] == server.stats()["model"]["name"]


def test_admin_endpoints_need_the_token(http: httpx.Client) -> None:
    for path in ("/metrics", "/admin/api/stats", "/admin"):
        r = http.get(path)
        assert r.status_code == 401, path
        assert "token" in r.json()["error"]["message"]
        assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert http.get("/admin/api/stats", params={"token": ADMIN_TOKEN}).status_code == 200


def test_pages_are_served_from_web(http: httpx.Client) -> None:
    for path, name in (("/", "index.html"), (f"/admin?token={ADMIN_TOKEN}", "admin.html")):
        r = http.get(path)
        if (REPO / "web" / name).is_file():
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert r.content == (REPO / "web" / name).read_bytes()
        else:  # the UI is built separately; without it the service says which file is missing
            assert r.status_code == 404 and f"web/{name}" in r.json()["error"]["message"]


def served_id(http: httpx.Client) -> str:
    """The id /v1/models lists for the server's one model: what the metrics' `model` label carries."""
    (model,) = http.get("/v1/models").json()["data"]
    return model["id"]


def test_metrics_follow_a_generation(http: httpx.Client, server: ServerProcess) -> None:
    wait_idle(server)
    m = f'model="{served_id(http)}"'
    before = scrape(http)
    r = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 5}})
    sid = r.json()["id"]
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Count to ten."}) as resp:
        done = json.loads([ln for ln in resp.iter_lines() if ln.startswith("data: ")][-1][6:])
    # the admin feed's rate covers the last few seconds, which hold at least this reply's last token
    assert server.stats()["tokens_per_s"] > 0
    after = scrape(http)
    used = done["usage"]

    def grew(name: str) -> float:
        return after[f"{name}{{{m}}}"] - before.get(f"{name}{{{m}}}", 0)  # a histogram appears on first use

    assert grew("forge_generated_tokens_total") == used["completion_tokens"]
    assert grew("forge_prompt_tokens_total") == used["prompt_tokens"]
    assert grew("forge_cached_tokens_total") == used["cached_tokens"]
    assert grew("forge_prefix_cache_queries_total") > 0
    assert f"forge_prefix_cache_hits_total{{{m}}}" in after
    assert grew("forge_time_to_first_token_seconds_count") == 1
    assert grew("forge_request_latency_seconds_count") == 1
    assert grew("forge_inter_token_latency_seconds_count") == used["completion_tokens"] - 1  # gaps in one reply
    requests = f'forge_generation_requests_total{{api="chat",{m}}}'
    assert after[requests] == before.get(requests, 0) + 1
    reason = f'forge_requests_finished_total{{{m},reason="{done["finish_reason"]}"}}'
    assert after[reason] == before.get(reason, 0) + 1
    for gauge in ("forge_waiting_sequences", "forge_running_sequences", "forge_kv_blocks_used"):
        assert after[f"{gauge}{{{m}}}"] == 0
    assert after[f"forge_kv_blocks_capacity{{{m}}}"] > 0
    assert {k.partition("{")[2] for k in after if k.startswith("forge_kv_blocks_capacity")} == {m + "}"}  # one model


async def test_stats_feed_and_websocket_counters(http: httpx.Client, server: ServerProcess) -> None:
    before = scrape(http)["forge_websocket_connections_total"]
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        await ws.send(json.dumps({"type": "session.create", "title": "watched"}))
        sid = json.loads(await asyncio.wait_for(ws.recv(), 60))["session"]["id"]
        stats = server.stats()
        assert stats["websocket_connections"] >= 1
        assert {"id": sid, "title": "watched", "status": "open"}.items() <= next(
            s for s in stats["active_sessions"] if s["id"] == sid
        ).items()
    assert scrape(http)["forge_websocket_connections_total"] == before + 1
    for _ in range(200):  # the server notices the close asynchronously
        stats = server.stats()
        if not [s for s in stats["active_sessions"] if s["id"] == sid]:
            break
        await asyncio.sleep(0.02)
    assert not [s for s in stats["active_sessions"] if s["id"] == sid]
    for key in ("waiting", "running", "kv_blocks_used", "kv_blocks_total", "prefix_hit_rate", "decode_tok_s"):
        assert key in stats["engine"]
    for key in ("name", "arch", "quant", "backend", "context_length", "vocab_size"):
        assert key in stats["model"]
    assert set(stats["ttft_ms"]) >= {"p50", "p95"} and set(stats["itl_ms"]) >= {"p50", "p95"}
    assert isinstance(stats["tokens_per_s"], (int, float))  # its value: test_metrics_follow_a_generation


def test_the_kernel_routes_and_their_gate_are_on_admin_metrics_and_the_log(
    http: httpx.Client, server: ServerProcess
) -> None:
    # The default server's start-up gate: each product route the model takes, checked against the reference.
    routes = server.stats()["model"]["kernel_routes"]
    assert routes and all(r["ok"] and r["error"] <= r["bound"] for r in routes), routes
    forms = {r["form"] for r in routes}
    assert any(f.startswith("q4 g32") for f in forms) and any(f.startswith("q8 g32") for f in forms)  # Q4_1, Q8_0
    samples, model = scrape(http), served_id(http)
    for r in routes:
        key = f'forge_kernel_route_ok{{form="{r["form"]}",model="{model}",route="{r["route"]}",rows="{r["rows"]}"}}'
        assert samples[key] == 1.0, key
    assert f"kernel route {routes[0]['form']}, {routes[0]['rows']} rows: {routes[0]['route']} ok" in server.log_tail(
        400
    )

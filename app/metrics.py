"""Prometheus metrics (own registry per app) and the recent-window numbers behind /admin/api/stats."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

disable_created_metrics()  # no `*_created` series next to every counter and histogram

WINDOW_S = 60.0  # percentiles for the admin page cover this much recent history
RATE_WINDOW_S = 5.0  # tokens/s for the admin page
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class _Window:
    """(time, value) samples of the last WINDOW_S seconds."""

    def __init__(self, maxlen: int = 20_000) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=maxlen)

    def add(self, value: float, now: float | None = None) -> None:
        self.samples.append((time.monotonic() if now is None else now, value))

    def recent(self, span: float) -> list[float]:
        cutoff = time.monotonic() - span
        while self.samples and self.samples[0][0] < cutoff:
            self.samples.popleft()
        return [v for _, v in self.samples]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[k]


class Metrics:
    """The service's metrics. `engine_stats` / `model_info` are read at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.started = time.monotonic()
        self.engine_stats: Callable[[], dict[str, Any]] | None = None
        self.model_info: dict[str, Any] = {}
        self.engine_facts: Callable[[], dict[str, Any]] | None = None
        self.ws_open = 0
        r = self.registry
        self.ttft = Histogram(
            "forge_time_to_first_token_seconds",
            "Submission to first generated token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "forge_inter_token_latency_seconds",
            "Time between consecutive generated tokens.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "forge_request_latency_seconds",
            "Submission to the end of a generation request.",
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.ws_connections = Counter("forge_websocket_connections", "WebSocket connections accepted.", registry=r)
        self.ws_active = Gauge("forge_websocket_connections_active", "WebSocket connections open now.", registry=r)
        self.http_requests = Counter(
            "forge_generation_requests", "Generation requests by entry point.", ["api"], registry=r
        )
        self.admission_wait = Histogram(
            "forge_admission_wait_seconds",
            "Time an admitted generation waited in the admission queue (0 when admitted at once).",
            buckets=(0.0,) + LATENCY_BUCKETS,
            registry=r,
        )
        self.admission: Any = None  # app.domain.admission.Admission, read at scrape time
        self.mcp_calls = Counter(
            "forge_mcp_tool_calls",
            "MCP tool calls run for chat sessions, by server, tool and outcome (ok, error, timeout, failed, stopped).",
            ["server", "tool", "outcome"],
            registry=r,
        )
        self.mcp_seconds = Histogram(
            "forge_mcp_tool_call_seconds", "MCP tool call latency.", ["server"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.mcp_servers: Callable[[], list[dict[str, Any]]] | None = None  # McpRegistry.snapshot, at scrape time
        self.models: Callable[[], list[dict[str, Any]]] | None = None  # ModelRegistry.snapshot, at scrape time
        r.register(_EngineCollector(self))
        r.register(_ModelCollector(self))
        self._ttft_window = _Window()
        self._itl_window = _Window()
        self._tokens_window = _Window()

    def ws_opened(self) -> None:
        self.ws_connections.inc()
        self.ws_active.inc()
        self.ws_open += 1

    def ws_closed(self) -> None:
        self.ws_active.dec()
        self.ws_open -= 1

    def bind_admission(self, admission: Any) -> None:
        self.admission = admission

    def admitted(self, waited_s: float) -> None:
        """One generation was admitted after waiting `waited_s` seconds in the queue."""
        self.admission_wait.observe(waited_s)

    def mcp_call(self, server: str, tool: str, outcome: str, seconds: float) -> None:
        """One MCP tool call ended (app.domain.mcp.registry.Observe)."""
        self.mcp_calls.labels(server=server, tool=tool, outcome=outcome).inc()
        self.mcp_seconds.labels(server=server).observe(seconds)

    def bind_engine(self, engine: Any) -> None:
        self.engine_stats = engine.stats
        self.model_info = dict(engine.model_info)
        self.engine_facts = lambda: engine.model_info  # the backend can change while serving (a background compile)

    def tracker(self, api: str) -> RequestTracker:
        """Start timing one generation request from entry point `api` ("chat", "openai")."""
        self.http_requests.labels(api=api).inc()
        return RequestTracker(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, Any]:
        """Recent-window latency percentiles (ms) and generated tokens/s."""
        ttft = self._ttft_window.recent(WINDOW_S)
        itl = self._itl_window.recent(WINDOW_S)
        tokens = sum(self._tokens_window.recent(RATE_WINDOW_S))
        span = min(RATE_WINDOW_S, max(time.monotonic() - self.started, 1e-3))

        def ms(values: list[float], q: float) -> float | None:
            p = percentile(values, q)
            return None if p is None else round(p * 1000.0, 3)

        return {
            "window_s": WINDOW_S,
            "ttft_ms": {"p50": ms(ttft, 50), "p95": ms(ttft, 95), "count": len(ttft)},
            "itl_ms": {"p50": ms(itl, 50), "p95": ms(itl, 95), "count": len(itl)},
            "tokens_per_s": round(tokens / span, 3),
            "websocket_connections": self.ws_open,
            "admission": None
            if self.admission is None
            else {
                "queue_depth": self.admission.depth,
                "in_use": self.admission.in_use,
                "capacity": self.admission.capacity,
            },
            "uptime_s": round(time.monotonic() - self.started, 3),
        }


class RequestTracker:
    """Feeds one request's events into the histograms and windows."""

    __slots__ = ("m", "last", "ttft", "total", "closed")

    def __init__(self, m: Metrics) -> None:
        self.m = m
        self.last: dict[int, float] = {}  # per sample index: when its previous tokens arrived
        self.ttft: float | None = None
        self.total: float | None = None
        self.closed = False

    def observe(self, ev: Any) -> None:
        """Call with every GenerationEvent of the request."""
        n = len(ev.token_ids)
        if n:
            now = time.monotonic()
            prev = self.last.get(ev.index)
            if prev is not None:
                per_token = (now - prev) / n
                for _ in range(n):
                    self.m.itl.observe(per_token)
                    self.m._itl_window.add(per_token, now)
            self.last[ev.index] = now
            self.m._tokens_window.add(n, now)
        if ev.finish_reason is not None and ev.timings is not None:
            if ev.usage is not None and ev.usage.completion_tokens > 0 and ev.timings.ttft > 0:
                self.ttft = ev.timings.ttft if self.ttft is None else min(self.ttft, ev.timings.ttft)
            self.total = ev.timings.total if self.total is None else max(self.total, ev.timings.total)

    def close(self) -> None:
        """The request is over: record its TTFT and latency once."""
        if self.closed:
            return
        self.closed = True
        if self.ttft is not None:
            self.m.ttft.observe(self.ttft)
            self.m._ttft_window.add(self.ttft)
        if self.total is not None:
            self.m.latency.observe(self.total)


class _EngineCollector:
    """Scrape-time view of engine.stats(): queue gauges, KV blocks, token and prefix-cache counters."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def describe(self) -> list:
        return []  # dynamic: don't let the registry call collect() at registration

    def collect(self) -> Iterator[Metric]:
        adm = self.m.admission
        if adm is not None:
            yield GaugeMetricFamily(
                "forge_admission_queue_depth", "Generations waiting to be admitted.", value=float(adm.depth)
            )
            yield GaugeMetricFamily(
                "forge_admission_in_use", "Engine sequences held by admitted generations.", value=float(adm.in_use)
            )
            yield GaugeMetricFamily(
                "forge_admission_capacity", "Engine sequences admission lets in at once.", value=float(adm.capacity)
            )
            refused = CounterMetricFamily(
                "forge_admission_refused",
                "Generations refused by admission, by reason (queue_full: 429, queue_timeout: 503).",
                labels=["reason"],
            )
            refused.add_metric(["queue_full"], float(adm.stats.refused_full))
            refused.add_metric(["queue_timeout"], float(adm.stats.refused_timeout))
            yield refused
            yield CounterMetricFamily(
                "forge_admission_queued", "Generations that had to wait for admission.", value=float(adm.stats.queued)
            )
        if self.m.mcp_servers is not None:
            up = GaugeMetricFamily(
                "forge_mcp_server_ready", "1 while an MCP server is connected, 0 otherwise.", labels=["server", "state"]
            )
            tools = GaugeMetricFamily("forge_mcp_server_tools", "Tools an MCP server lists now.", labels=["server"])
            for srv in self.m.mcp_servers():
                up.add_metric([srv["name"], srv["state"]], float(srv["state"] == "ready"))
                tools.add_metric([srv["name"]], float(len(srv["tools"])))
            yield up
            yield tools
        facts = self.m.engine_facts() if self.m.engine_facts is not None else self.m.model_info
        if facts:
            info = InfoMetricFamily("forge_model", "The model being served.")
            info.add_metric([], {k: str(facts.get(k, "")) for k in ("name", "arch", "quant", "backend")})
            yield info
            phase = (facts.get("background_compile") or {}).get("phase")
            yield GaugeMetricFamily(
                "forge_kernels_compiling",
                "1 while the CPU kernels compile in the background (the float32 reference serves meanwhile), else 0.",
                value=float(phase in ("compiling", "ready")),
            )
            routes = GaugeMetricFamily(
                "forge_kernel_route_ok",
                "The start-up parity gate: 1 where a matrix-product route matched the NumPy reference, 0 where it "
                "failed and another route took its products.",
                labels=["form", "rows", "route"],
            )
            for check in facts.get("kernel_routes", ()):
                routes.add_metric([check["form"], str(check["rows"]), check["route"]], float(check["ok"]))
            yield routes
        if self.m.engine_stats is None:
            return
        s = self.m.engine_stats()
        gauges = (
            ("forge_waiting_sequences", "Sequences waiting to be scheduled.", "waiting"),
            ("forge_running_sequences", "Sequences being generated.", "running"),
            ("forge_kv_blocks_used", "KV cache blocks in use.", "kv_blocks_used"),
            ("forge_kv_blocks_capacity", "KV cache blocks in all (the cache's capacity).", "kv_blocks_total"),
            ("forge_kv_usage_ratio", "Fraction of KV cache blocks in use.", "kv_usage"),
            ("forge_prefix_cache_hit_rate", "Prefix cache hit tokens / queried tokens.", "prefix_hit_rate"),
            ("forge_decode_tokens_per_second", "Recent engine decode throughput.", "decode_tok_s"),
            ("forge_spec_acceptance_rate", "Speculative decoding: accepted / drafted tokens.", "spec_acceptance_rate"),
            (
                "forge_spec_mean_accepted_length",
                "Speculative decoding: tokens a verifying sequence gains per step (accepted drafts + 1).",
                "spec_mean_accepted_length",
            ),
            ("forge_kv_spill_files", "KV spill tier: block files on disk.", "kv_spill_files"),
            ("forge_kv_spill_bytes", "KV spill tier: bytes on disk.", "kv_spill_bytes"),
            ("forge_kv_spill_hit_rate", "KV spill tier: blocks read back / blocks looked up.", "kv_spill_hit_rate"),
        )
        for name, doc, key in gauges:
            if key in s:
                yield GaugeMetricFamily(name, doc, value=float(s[key]))
        counters = (
            ("forge_prompt_tokens", "Prompt tokens submitted.", "prompt_tokens_total"),
            ("forge_cached_tokens", "Prompt tokens served from the prefix cache.", "cached_tokens_total"),
            ("forge_generated_tokens", "Tokens generated.", "generated_tokens_total"),
            ("forge_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_queried_tokens"),
            ("forge_prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_hit_tokens"),
            ("forge_engine_steps", "Engine steps run.", "steps"),
            ("forge_spec_drafted_tokens", "Speculative decoding: draft tokens verified.", "spec_drafted_tokens"),
            ("forge_spec_accepted_tokens", "Speculative decoding: draft tokens accepted.", "spec_accepted_tokens"),
            (
                "forge_kv_spilled_blocks",
                "KV blocks evicted from memory and written to the spill tier.",
                "kv_spilled_blocks",
            ),
            ("forge_kv_spilled_bytes", "Bytes written to the KV spill tier.", "kv_spilled_bytes"),
            (
                "forge_kv_restored_blocks",
                "KV blocks read back from the spill tier instead of recomputed.",
                "kv_restored_blocks",
            ),
            ("forge_kv_restored_bytes", "Bytes read back from the KV spill tier.", "kv_restored_bytes"),
            (
                "forge_kv_spill_lookups",
                "KV blocks missing from memory looked up in the spill tier.",
                "kv_spill_lookups",
            ),
            (
                "forge_kv_spill_restore_seconds",
                "Time spent reading KV blocks back from the spill tier.",
                "kv_spill_restore_seconds",
            ),
            (
                "forge_kv_spill_discarded",
                "KV spill files refused on reading (corrupt or stale): recomputed.",
                "kv_spill_discarded",
            ),
            (
                "forge_kv_spill_dropped",
                "Evicted KV blocks not spilled: the spill writer was behind.",
                "kv_spill_dropped",
            ),
            ("forge_kv_spill_write_errors", "KV spill files that could not be written.", "kv_spill_write_errors"),
        )
        for name, doc, key in counters:
            if key in s:
                yield CounterMetricFamily(name, doc, value=float(s[key]))
        finished = CounterMetricFamily(
            "forge_requests_finished", "Finished requests by finish reason.", labels=["reason"]
        )
        for reason, count in sorted(dict(s.get("requests_finished", {})).items()):
            finished.add_metric([str(reason)], float(count))
        yield finished


class _ModelCollector:
    """Scrape-time view of the served models (app.domain.models): state, memory, requests, by `model`."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        if self.m.models is not None:
            yield from _model_families(self.m.models())


MODEL_STATES = ("on disk", "loading", "ready", "unloading")


def _model_families(models: list[dict[str, Any]]) -> Iterator[Metric]:
    """Each served model's state, memory and requests, labelled by `model` (its /v1 id)."""
    state = GaugeMetricFamily(
        "forge_model_state", "1 for the state a served model is in now (on disk, loading, ready, unloading).",
        labels=["model", "state"],
    )  # fmt: skip
    memory = GaugeMetricFamily(
        "forge_model_memory_bytes", "What a served model counts against --model-memory while loaded.", labels=["model"]
    )
    requests = GaugeMetricFamily(
        "forge_model_requests", "Requests holding a served model: running, or waiting for it.", labels=["model"]
    )
    queued = GaugeMetricFamily(
        "forge_model_queue_depth", "Generations waiting in a served model's admission queue.", labels=["model"]
    )
    for m in models:
        for name in MODEL_STATES:
            state.add_metric([m["id"], name], float(m["state"] == name))
        memory.add_metric([m["id"]], float(m["memory_bytes"]))
        requests.add_metric([m["id"]], float(m["requests"]))
        queued.add_metric([m["id"]], float(m["queued"]))
    yield from (state, memory, requests, queued)

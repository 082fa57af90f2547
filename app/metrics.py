"""Prometheus metrics (own registry per app) and the recent-window numbers behind /admin/api/stats."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import Metric

from app import metrics_families as families

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


Labelled = Callable[[], list[tuple[str, Any]]]  # (model id, its engine or admission), read at scrape time


class Metrics:
    """The service's metrics. What the served models hold (`engines`, `admissions`, `models`) and the MCP servers
    are read at scrape time; requests' latencies are observed as they happen, labelled by model."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.started = time.monotonic()
        self.engines: Labelled | None = None  # each loaded model's Engine (ModelRegistry.engines)
        self.admissions: Labelled | None = None  # each model's Admission (ModelRegistry.admissions)
        self.ws_open = 0
        r = self.registry
        self.ttft = Histogram(
            "forge_time_to_first_token_seconds",
            "Submission to first generated token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "forge_inter_token_latency_seconds",
            "Time between consecutive generated tokens.",
            ["model"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "forge_request_latency_seconds",
            "Submission to the end of a generation request.",
            ["model"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.ws_connections = Counter("forge_websocket_connections", "WebSocket connections accepted.", registry=r)
        self.ws_active = Gauge("forge_websocket_connections_active", "WebSocket connections open now.", registry=r)
        self.http_requests = Counter(
            "forge_generation_requests", "Generation requests by entry point and model.", ["api", "model"], registry=r
        )
        self.admission_wait = Histogram(
            "forge_admission_wait_seconds",
            "Time an admitted generation waited in the admission queue (0 when admitted at once).",
            buckets=(0.0,) + LATENCY_BUCKETS,
            registry=r,
        )
        self.admission: Any = None  # the default model's Admission, for the admin page
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
        r.register(_Collector(self))
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

    def admitted(self, waited_s: float) -> None:
        """One generation was admitted after waiting `waited_s` seconds in the queue."""
        self.admission_wait.observe(waited_s)

    def mcp_call(self, server: str, tool: str, outcome: str, seconds: float) -> None:
        """One MCP tool call ended (app.domain.mcp.registry.Observe)."""
        self.mcp_calls.labels(server=server, tool=tool, outcome=outcome).inc()
        self.mcp_seconds.labels(server=server).observe(seconds)

    def tracker(self, api: str, model: str) -> RequestTracker:
        """Start timing one generation request from entry point `api` ("chat", "openai") on `model` (its /v1 id)."""
        self.http_requests.labels(api=api, model=model).inc()
        return RequestTracker(self, model)

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

    __slots__ = ("m", "itl", "last", "ttft", "total", "closed", "model")

    def __init__(self, m: Metrics, model: str) -> None:
        self.m = m
        self.model = model
        self.itl = m.itl.labels(model=model)
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
                    self.itl.observe(per_token)
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
            self.m.ttft.labels(model=self.model).observe(self.ttft)
            self.m._ttft_window.add(self.ttft)
        if self.total is not None:
            self.m.latency.labels(model=self.model).observe(self.total)


class _Collector:
    """The families read at scrape time (app/metrics_families.py)."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def describe(self) -> list:
        return []  # dynamic: don't let the registry call collect() at registration

    def collect(self) -> Iterator[Metric]:
        m = self.m
        if m.admissions is not None:
            yield from families.admission_families(m.admissions())
        if m.mcp_servers is not None:
            yield from families.mcp_families(m.mcp_servers())
        if m.engines is not None:
            engines = m.engines()
            yield from families.kernel_families(engines)
            yield from families.engine_families(engines)
        if m.models is not None:
            yield from families.model_families(m.models())

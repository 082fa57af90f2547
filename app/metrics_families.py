"""The metric families read at scrape time, every one labelled by `model` (the id /v1 lists) where a served model
owns it: each loaded model's engine (queues, KV blocks, tokens, prefix cache, speculation, KV spill), its kernels
(info, background compile, the start-up gate's routes), each model's admission queue and state; and the MCP
servers. A model that is not loaded has no engine series: its state says so (`forge_model_state`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

# (family, help, key in Engine.stats())
ENGINE_GAUGES = (
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
ENGINE_COUNTERS = (
    ("forge_prompt_tokens", "Prompt tokens submitted.", "prompt_tokens_total"),
    ("forge_cached_tokens", "Prompt tokens served from the prefix cache.", "cached_tokens_total"),
    ("forge_generated_tokens", "Tokens generated.", "generated_tokens_total"),
    ("forge_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_queried_tokens"),
    ("forge_prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_hit_tokens"),
    ("forge_engine_steps", "Engine steps run.", "steps"),
    ("forge_spec_drafted_tokens", "Speculative decoding: draft tokens verified.", "spec_drafted_tokens"),
    ("forge_spec_accepted_tokens", "Speculative decoding: draft tokens accepted.", "spec_accepted_tokens"),
    ("forge_kv_spilled_blocks", "KV blocks evicted from memory and written to the spill tier.", "kv_spilled_blocks"),
    ("forge_kv_spilled_bytes", "Bytes written to the KV spill tier.", "kv_spilled_bytes"),
    (
        "forge_kv_restored_blocks",
        "KV blocks read back from the spill tier instead of recomputed.",
        "kv_restored_blocks",
    ),
    ("forge_kv_restored_bytes", "Bytes read back from the KV spill tier.", "kv_restored_bytes"),
    ("forge_kv_spill_lookups", "KV blocks missing from memory looked up in the spill tier.", "kv_spill_lookups"),
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
    ("forge_kv_spill_dropped", "Evicted KV blocks not spilled: the spill writer was behind.", "kv_spill_dropped"),
    ("forge_kv_spill_write_errors", "KV spill files that could not be written.", "kv_spill_write_errors"),
)
MODEL_STATES = ("on disk", "loading", "ready", "unloading")


def engine_families(engines: list[tuple[str, Any]]) -> Iterator[Metric]:
    """`engines`: (model, Engine) for each loaded model; its stats() read once a scrape."""
    stats = [(model, engine.stats()) for model, engine in engines]
    for kind, table in ((GaugeMetricFamily, ENGINE_GAUGES), (CounterMetricFamily, ENGINE_COUNTERS)):
        for name, doc, key in table:
            family = kind(name, doc, labels=["model"])
            for model, s in stats:
                if key in s:
                    family.add_metric([model], float(s[key]))
            yield family
    finished = CounterMetricFamily(
        "forge_requests_finished", "Finished requests by finish reason.", labels=["model", "reason"]
    )
    for model, s in stats:
        for reason, count in sorted(dict(s.get("requests_finished", {})).items()):
            finished.add_metric([model, str(reason)], float(count))
    yield finished


def kernel_families(engines: list[tuple[str, Any]]) -> Iterator[Metric]:
    """Each loaded model's facts: what serves it (the backend can change while serving: a background compile) and
    the start-up parity gate's routes."""
    info = InfoMetricFamily(
        "forge_model", "A loaded model: its name, architecture, quantization, backend.", labels=["model"]
    )
    compiling = GaugeMetricFamily(
        "forge_kernels_compiling",
        "1 while the CPU kernels compile in the background (the float32 reference serves meanwhile), else 0.",
        labels=["model"],
    )
    routes = GaugeMetricFamily(
        "forge_kernel_route_ok",
        "The start-up parity gate: 1 where a matrix-product route matched the NumPy reference, 0 where it failed and "
        "another route took its products.",
        labels=["model", "form", "rows", "route"],
    )
    for model, engine in engines:
        facts = engine.model_info
        info.add_metric([model], {k: str(facts.get(k, "")) for k in ("name", "arch", "quant", "backend")})
        phase = (facts.get("background_compile") or {}).get("phase")
        compiling.add_metric([model], float(phase in ("compiling", "ready")))
        for check in facts.get("kernel_routes", ()):
            routes.add_metric([model, check["form"], str(check["rows"]), check["route"]], float(check["ok"]))
    yield from (info, compiling, routes)


def admission_families(admissions: list[tuple[str, Any]]) -> Iterator[Metric]:
    """`admissions`: (model, Admission) for each served model (each has its own queue)."""
    depth = GaugeMetricFamily("forge_admission_queue_depth", "Generations waiting to be admitted.", labels=["model"])
    in_use = GaugeMetricFamily(
        "forge_admission_in_use", "Engine sequences held by admitted generations.", labels=["model"]
    )
    capacity = GaugeMetricFamily(
        "forge_admission_capacity", "Engine sequences admission lets in at once.", labels=["model"]
    )
    refused = CounterMetricFamily(
        "forge_admission_refused",
        "Generations refused by admission, by reason (queue_full: 429, queue_timeout: 503).",
        labels=["model", "reason"],
    )
    queued = CounterMetricFamily(
        "forge_admission_queued", "Generations that had to wait for admission.", labels=["model"]
    )
    for model, adm in admissions:
        depth.add_metric([model], float(adm.depth))
        in_use.add_metric([model], float(adm.in_use))
        capacity.add_metric([model], float(adm.capacity))
        refused.add_metric([model, "queue_full"], float(adm.stats.refused_full))
        refused.add_metric([model, "queue_timeout"], float(adm.stats.refused_timeout))
        queued.add_metric([model], float(adm.stats.queued))
    yield from (depth, in_use, capacity, refused, queued)


def model_families(models: list[dict[str, Any]]) -> Iterator[Metric]:
    """Each served model's state, memory and requests (app.domain.models.ModelRegistry.snapshot)."""
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
    for m in models:
        for name in MODEL_STATES:
            state.add_metric([m["id"], name], float(m["state"] == name))
        memory.add_metric([m["id"]], float(m["memory_bytes"]))
        requests.add_metric([m["id"]], float(m["requests"]))
    yield from (state, memory, requests)


def mcp_families(servers: list[dict[str, Any]]) -> Iterator[Metric]:
    """The MCP servers (app.domain.mcp.registry.McpRegistry.snapshot): connected or not, tools listed."""
    up = GaugeMetricFamily(
        "forge_mcp_server_ready", "1 while an MCP server is connected, 0 otherwise.", labels=["server", "state"]
    )
    tools = GaugeMetricFamily("forge_mcp_server_tools", "Tools an MCP server lists now.", labels=["server"])
    for srv in servers:
        up.add_metric([srv["name"], srv["state"]], float(srv["state"] == "ready"))
        tools.add_metric([srv["name"]], float(len(srv["tools"])))
    yield from (up, tools)

"""The engine's numbers for /metrics and the admin page: queues, KV use, prefix cache and the counters."""

from __future__ import annotations

from typing import Any

from engine.kv_cache import BlockManager
from engine.metrics import EngineMetrics
from engine.request_groups import RequestGroups
from engine.scheduler import Scheduler


def engine_stats(
    scheduler: Scheduler, blocks: BlockManager, groups: RequestGroups, metrics: EngineMetrics, speculative: str
) -> dict[str, Any]:
    """A snapshot; safe to call from any thread (it copies what the step thread mutates)."""
    ps = blocks.stats
    return {
        "waiting": len(scheduler.waiting) + groups.num_pending,
        "running": len(scheduler.running),
        "kv_blocks_used": blocks.num_used,
        "kv_blocks_total": blocks.num_blocks,
        "kv_usage": blocks.num_used / blocks.num_blocks,
        "prefix_queried_tokens": ps.queried_tokens,
        "prefix_hit_tokens": ps.hit_tokens,
        "prefix_hit_rate": ps.hit_tokens / ps.queried_tokens if ps.queried_tokens else 0.0,
        "prefix_evictions": ps.evictions,
        "preemptions": scheduler.num_preemptions,
        "kv_spill_enabled": blocks.spill is not None,
        **(blocks.spill.snapshot() if blocks.spill is not None else {}),
        "speculative": speculative,
        **metrics.snapshot(),
    }

"""Where the engine's resident memory goes: RSS after each stage of `Engine.load`, then after a
workload.

    .venv/bin/python scripts/memory_profile.py [--kv-memory 90MiB] [--model default] [--tracemalloc]

The stages are those of `Engine.load` run one by one (imports; the GGUF read and block split; the
backend; the weights prepared for the backend; the kernels compiled or loaded from the cache; the
KV cache), then `forge bench --quick`'s workload. For each stage: RSS after it (anonymous and
file-backed pages: the mapped GGUF, shared libraries) and the stage's own peak (VmHWM, reset
before the stage through /proc/self/clear_refs). `--tracemalloc` adds what Python and NumPy
allocated (current, and peak within the stage); the rest of RSS is native: libraries' code,
LLVM, the tokenizer, allocator slack. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MB = 1 << 20


def status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux >= 4.0)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--kv-memory", default="90MiB")
    ap.add_argument("--tracemalloc", action="store_true", help="also trace Python/NumPy allocations (slower)")
    ap.add_argument("--no-workload", action="store_true", help="stop after the load")
    args = ap.parse_args()
    if args.tracemalloc:
        tracemalloc.start()
    rows: list[tuple[str, dict[str, int], tuple[int, int] | None, float]] = []
    state: dict[str, Any] = {}

    def stage(name: str, run: Callable[[], None]) -> None:
        reset_peak()
        if args.tracemalloc:
            tracemalloc.reset_peak()
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
        rows.append((name, status(), tracemalloc.get_traced_memory() if args.tracemalloc else None, seconds))

    def imports() -> None:
        import numba  # noqa: F401  (Engine.load imports it with the numba backend)

        from engine import Engine  # noqa: F401

    def read() -> None:
        from engine.loader import load_model
        from engine.memory import share_one_arena

        share_one_arena()  # as Engine.load does first
        state["loaded"] = load_model(args.model)

    def backend() -> None:
        from kernels import get_backend

        state["be"] = get_backend("auto")

    def kernels() -> None:
        state["be"].warm_up()

    def prepare() -> None:
        from engine.model.llama import LlamaModel

        loaded = state["loaded"]
        state["llama"] = LlamaModel(loaded.config, loaded.weights, state["be"], take=True)

    def kv() -> None:
        from engine.engine import Engine, parse_size
        from engine.llm_engine import EngineConfig, LLMEngine

        config = EngineConfig(kv_memory=parse_size(args.kv_memory))
        state["engine"] = Engine(LLMEngine(state.pop("loaded"), state.pop("llama"), config))

    def workload() -> None:
        from engine.bench import run_bench

        with contextlib.redirect_stdout(io.StringIO()):
            run_bench(state["engine"], as_json=True, quick=True)

    stages = [
        ("start", lambda: None),
        ("imports (engine, numba)", imports),
        ("GGUF read + split", read),
        ("backend", backend),
        ("weights prepared", prepare),
        ("kernels ready", kernels),
        (f"KV cache ({args.kv_memory})", kv),
    ]
    if not args.no_workload:
        stages.append(("bench --quick workload", workload))
    for name, run in stages:
        stage(name, run)

    head = f"{'stage':<28}{'RSS':>7}{'anon':>7}{'file':>7}{'peak':>7}"
    head += f"{'py now':>8}{'py peak':>8}" if args.tracemalloc else ""
    print(head + f"{'s':>7}   (MB; peak: the stage's own VmHWM)")
    for name, st, traced, seconds in rows:
        line = f"{name:<28}" + "".join(f"{st[k] / MB:7.0f}" for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"))
        if traced:
            line += f"{traced[0] / MB:8.0f}{traced[1] / MB:8.0f}"
        print(line + f"{seconds:7.1f}")
    print(
        "process peak (ru_maxrss, what `forge bench` reports): "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )
    if "engine" in state:
        import asyncio

        asyncio.run(state["engine"].shutdown())


if __name__ == "__main__":
    main()

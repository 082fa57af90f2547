"""Served decode speed against the engine's own: one chat prompt, greedy, no speculation, decoded

  served     streaming `/v1/chat/completions` on a live `forge serve` (its own server on 127.0.0.1,
             temp database), read with the official `openai` client: tokens after the first chunk
             over the time from the first content chunk to the last
  in-process the same rendered prompt through `Engine.generate` in this process: tokens after the first
             step over the same span

Both are loaded at once and their runs alternate, one served then one in-process, the other side idle
meanwhile (so the two never share cores, and a drift of the machine's speed between minutes, common on
shared VMs, weighs on both alike).

    python scripts/served_speed.py [--max-tokens 128] [--repeats 3] [--threads N]

Prints both medians and their ratio (the service's overhead: HTTP, SSE framing, the event loop), and
where the served run's CPU went per token: the server's event-loop thread, its other threads (the
engine's own thread and the kernels' workers), and this client (the openai SDK parsing each chunk). On
a machine with as many cores as engine threads, every other thread's CPU is taken from the kernels.
A measurement script, not a test: the numbers go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from openai import OpenAI

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from engine import Engine, GenerationRequest, SamplingParams  # noqa: E402
from scripts.reliability import Server  # noqa: E402

KEY = "served-speed"
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread of `pid`, by thread name; the main thread runs the event loop."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        key = "event loop" if task.name == str(pid) else name
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


CPU: dict[str, float] = {}  # the measured runs' CPU seconds by where, summed
TOKENS = [0]


def served(srv: Server, max_tokens: int, measure: bool = True) -> float:
    client = OpenAI(base_url=srv.url + "/v1", api_key=KEY)
    assert srv.proc is not None
    before, client_before = thread_cpu_s(srv.proc.pid), time.process_time()
    stream = client.chat.completions.create(
        model="default",
        messages=MESSAGES,
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"speculative": "off"},
    )
    stamps: list[float] = []
    tokens = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if measure:
        after = thread_cpu_s(srv.proc.pid)
        for name, cpu in after.items():
            where = name if name == "event loop" else "other threads (engine, kernels)"
            CPU[where] = CPU.get(where, 0.0) + cpu - before.get(name, 0.0)
        CPU["client"] = CPU.get("client", 0.0) + time.process_time() - client_before
        TOKENS[0] += tokens
    # One token a chunk here (no speculation); the first waits for the prefill.
    return (tokens - 1) / (stamps[-1] - stamps[0])


async def in_process(engine: Engine, max_tokens: int) -> float:
    prompt = engine.render_chat(MESSAGES)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative="off")
    stamps: list[float] = []
    async for ev in engine.generate(GenerationRequest(prompt, params)):
        stamps += [time.perf_counter()] * len(ev.token_ids)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


async def alternating(srv: Server, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """(served runs, in-process runs), taken in turn."""
    engine = Engine.load(threads=args.threads)
    try:
        await asyncio.to_thread(served, srv, 8, False)  # warm-ups
        await in_process(engine, 8)
        over_http: list[float] = []
        direct: list[float] = []
        for _ in range(args.repeats):
            over_http.append(await asyncio.to_thread(served, srv, args.max_tokens))
            direct.append(await in_process(engine, args.max_tokens))
        return over_http, direct
    finally:
        await engine.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    env = {"FORGE_THREADS": str(args.threads)} if args.threads else {}
    with tempfile.TemporaryDirectory() as tmp:
        srv = Server(Path(tmp), [KEY], env).start()
        try:
            over_http, direct = asyncio.run(alternating(srv, args))
        finally:
            srv.stop()
    a, b = statistics.median(over_http), statistics.median(direct)
    print(f"served decode      {a:6.1f} tok/s  (runs: {', '.join(f'{x:.1f}' for x in over_http)})")
    print(f"in-process decode  {b:6.1f} tok/s  (runs: {', '.join(f'{x:.1f}' for x in direct)})")
    print(f"served / in-process  {a / b:.2f}")
    print(
        "served CPU per token: "
        + ", ".join(f"{where} {cpu / TOKENS[0] * 1e6:.0f} us" for where, cpu in sorted(CPU.items()))
    )


if __name__ == "__main__":
    main()

"""Multi-turn chat load against a running server: N clients, each holding one conversation of T turns.

  v1 mode  the official openai SDK, streaming /v1/chat/completions, against any OpenAI-compatible base URL
           (Forge, llama.cpp's llama-server, ...); each client resends its whole conversation every turn
  ws mode  Forge's WebSocket protocol (/ws, the `websockets` client): one session per client, the server
           keeps the conversation

Clients are anonymous (no API key) unless --api-key is given: on a server without keys they are all one
owner. Prints turns completed, errors (by kind), aggregate generated tokens/s, TTFT and inter-token
latency percentiles, and the prefix-cache hit rate (cached prompt tokens / prompt tokens, as the server
reports them).

--session-header (v1 mode): each client sends `X-Forge-Session: <one id per conversation>`, so a front such as
deploy/haproxy.cfg routes its turns to one replica, whose prefix cache holds the conversation; without it the
front balances /v1 by least connections (compare the hit rates).

    python scripts/load_chats.py --base-url http://127.0.0.1:8000/v1 [--mode v1|ws] [--clients 64]
        [--turns 10] [--max-tokens 64] [--time-limit-s 900] [--session-header] [--json]

A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

TOPICS = [
    "the sea",
    "mountains",
    "a small cat",
    "bread",
    "the moon",
    "trains",
    "music",
    "rain",
    "gardens",
    "old maps",
    "bees",
    "winter",
    "a lighthouse",
    "chess",
    "volcanoes",
    "tea",
]
FOLLOW_UPS = [
    "Tell me more.",
    "Why is that?",
    "Give an example.",
    "Say it more simply.",
    "What else?",
    "Can you summarise that?",
    "And then?",
    "Is that always true?",
    "What is surprising about it?",
]


def user_message(client: int, turn: int) -> str:
    if turn == 0:
        return f"Tell me something interesting about {TOPICS[client % len(TOPICS)]}."
    return FOLLOW_UPS[(client + turn) % len(FOLLOW_UPS)]


@dataclass(slots=True)
class Tally:
    """What all clients saw."""

    completed: int = 0
    errors: Counter = field(default_factory=Counter)
    tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)  # per turn: (last token - first token) / (tokens - 1)
    turn_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    replicas: Counter = field(default_factory=Counter)  # turns by X-Forge-Replica (v1 mode)

    def usage(self, prompt: int | None, cached: int | None) -> None:
        self.prompt_tokens += prompt or 0
        self.cached_tokens += cached or 0

    def turn(self, started: float, first: float | None, last: float | None, tokens: int) -> None:
        self.completed += 1
        self.tokens += tokens
        self.turn_s.append(time.perf_counter() - started)
        if first is not None:
            self.ttft_s.append(first - started)
            if last is not None and tokens >= 2 and last > first:
                self.itl_s.append((last - first) / (tokens - 1))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


# -- /v1 through the openai SDK ------------------------------------------------------------------


async def v1_client(i: int, args: argparse.Namespace, tally: Tally, stop_at: float) -> None:
    import openai

    # One id per conversation: the front keeps its turns on one replica (and its prefix cache).
    headers = {"X-Forge-Session": f"load-{args.run_id}-{i}"} if args.session_header else None
    client = openai.AsyncOpenAI(
        base_url=args.base_url,
        api_key=args.api_key or "none",
        max_retries=0,
        timeout=args.turn_timeout_s,
        default_headers=headers,
    )
    messages: list[dict[str, str]] = []
    try:
        for t in range(args.turns):
            if time.perf_counter() > stop_at:
                tally.errors["time limit"] += args.turns - t
                return
            messages.append({"role": "user", "content": user_message(i, t)})
            started = time.perf_counter()
            first = last = None
            chunks, usage_tokens, text = 0, None, []
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=args.model,
                    messages=messages,
                    max_tokens=args.max_tokens,
                    temperature=args.temperature,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                tally.replicas[raw.headers.get("X-Forge-Replica", "?")] += 1
                stream = raw.parse()  # an AsyncStream (awaitable in some openai versions)
                if inspect.isawaitable(stream):
                    stream = await stream
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage_tokens = chunk.usage.completion_tokens
                        details = chunk.usage.prompt_tokens_details
                        tally.usage(chunk.usage.prompt_tokens, details.cached_tokens if details else None)
                    if chunk.choices and chunk.choices[0].delta.content:
                        last = time.perf_counter()
                        first = first or last
                        chunks += 1
                        text.append(chunk.choices[0].delta.content)
            except openai.APIStatusError as e:
                tally.errors[f"HTTP {e.status_code}"] += 1
                messages.pop()
                continue
            except (TimeoutError, openai.APIError) as e:
                tally.errors[type(e).__name__] += 1
                messages.pop()
                continue
            messages.append({"role": "assistant", "content": "".join(text)})
            tally.turn(started, first, last, usage_tokens if usage_tokens is not None else chunks)
    finally:
        await client.close()


# -- Forge's /ws -------------------------------------------------------------------------------------


def ws_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}/ws"


async def ws_client(i: int, args: argparse.Namespace, tally: Tally, stop_at: float) -> None:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None

    async def recv(ws: Any) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(ws.recv(), args.turn_timeout_s))

    try:
        async with connect(ws_url(args.base_url), additional_headers=headers, max_size=None) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "session.create",
                        "title": f"load {i}",
                        "settings": {"max_tokens": args.max_tokens, "temperature": args.temperature},
                    }
                )
            )
            ev = await recv(ws)
            if ev.get("type") != "session":
                tally.errors[f"session.create: {ev.get('code')}"] += args.turns
                return
            sid = ev["session"]["id"]
            for t in range(args.turns):
                if time.perf_counter() > stop_at:
                    tally.errors["time limit"] += args.turns - t
                    return
                started = time.perf_counter()
                first = last = None
                await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": user_message(i, t)}))
                while True:
                    ev = await recv(ws)
                    if ev.get("type") == "delta":
                        last = time.perf_counter()
                        first = first or last
                    elif ev.get("type") == "error":
                        tally.errors[f"error {ev.get('code')}"] += 1
                        if "message_id" not in ev:  # refused before it started: no `done` follows
                            break
                    elif ev.get("type") == "done":
                        if ev["status"] == "complete":
                            tally.usage(ev["usage"]["prompt_tokens"], ev["usage"]["cached_tokens"])
                            tally.turn(started, first, last, int(ev["usage"]["completion_tokens"] or 0))
                        else:
                            tally.errors[f"done {ev['status']}"] += 1
                        break
    except Exception as e:  # the socket died: what is left of this client's turns is lost
        tally.errors[f"socket: {type(e).__name__}"] += 1


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    started = time.perf_counter()
    stop_at = started + args.time_limit_s
    one = v1_client if args.mode == "v1" else ws_client
    tasks = [asyncio.ensure_future(one(i, args, tally, stop_at)) for i in range(args.clients)]
    # Past the time limit no turn starts; past the grace after it, the turns still running are cut off.
    _, late = await asyncio.wait(tasks, timeout=args.time_limit_s + args.grace_s)
    for task in late:
        task.cancel()
    if late:
        tally.errors["clients cut off"] += len(late)
        await asyncio.wait(late, timeout=10)
    wall = time.perf_counter() - started
    return {
        "mode": args.mode,
        "base_url": args.base_url,
        "clients": args.clients,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "completed": tally.completed,
        "expected": args.clients * args.turns,
        "errors": dict(tally.errors),
        "wall_s": round(wall, 1),
        "tokens": tally.tokens,  # over the whole wall time
        "tokens_per_s": round(tally.tokens / wall, 1),
        "ttft_ms": {"p50": ms(pct(tally.ttft_s, 50)), "p95": ms(pct(tally.ttft_s, 95))},
        "itl_ms": {"p50": ms(pct(tally.itl_s, 50)), "p95": ms(pct(tally.itl_s, 95))},
        "turn_s_mean": round(statistics.fmean(tally.turn_s), 2) if tally.turn_s else None,
        "session_header": args.session_header,
        "prefix_hit_rate": round(tally.cached_tokens / tally.prompt_tokens, 3) if tally.prompt_tokens else None,
        "turns_by_replica": dict(tally.replicas),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the OpenAI base URL (ends in /v1)")
    p.add_argument("--mode", choices=["v1", "ws"], default="v1", help="v1: openai SDK; ws: Forge's /ws")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--model", default="default")
    p.add_argument("--api-key", default=None, help="default: anonymous")
    p.add_argument("--time-limit-s", type=float, default=900.0, help="no new turn starts after this")
    p.add_argument("--grace-s", type=float, default=120.0, help="how long turns running at the time limit may go on")
    p.add_argument("--turn-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--session-header",
        action="store_true",
        help="v1 mode: send X-Forge-Session, one id per client conversation (session affinity)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.run_id = uuid.uuid4().hex[:8]
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['mode']} {result['base_url']}: {result['completed']}/{result['expected']} turns in "
        f"{result['wall_s']} s, errors {result['errors'] or 0}"
    )
    print(
        f"  {result['tokens']} tokens, {result['tokens_per_s']} tok/s aggregate; TTFT p50 "
        f"{result['ttft_ms']['p50']} ms p95 {result['ttft_ms']['p95']} ms; ITL p50 {result['itl_ms']['p50']} ms "
        f"p95 {result['itl_ms']['p95']} ms"
    )
    affinity = "on" if args.session_header else "off"
    print(
        f"  prefix-cache hit rate {result['prefix_hit_rate']} (X-Forge-Session {affinity}); turns by replica "
        f"{result['turns_by_replica'] or '-'}"
    )


if __name__ == "__main__":
    main()

"""Time a multi-turn chat through a running server's WebSocket: TTFT and cached tokens per turn.

    .venv/bin/python scripts/ws_turns.py --url ws://127.0.0.1:8000/ws --turns 4

Each turn sends a message of about the same length; with prefix reuse, later turns compute
only their new tokens, so their TTFT stays close to the first turn's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import websockets

QUESTIONS = [
    "Name three rivers in Europe.",
    "Which of them is the longest?",
    "What cities does it flow through?",
    "Which of those cities is the largest?",
    "What is that city famous for?",
    "Suggest one museum to visit there.",
    "What is the best season to go?",
    "Summarise our conversation briefly.",
]


async def main(url: str, turns: int, max_tokens: int) -> None:
    async with websockets.connect(url) as ws:
        settings = {"temperature": 0, "max_tokens": max_tokens}
        await ws.send(json.dumps({"type": "session.create", "title": "ws timing", "settings": settings}))
        session_id = None
        while session_id is None:
            event = json.loads(await ws.recv())
            if event["type"] == "session":
                session_id = event["session"]["id"]
        print(
            f"{'turn':>4}  {'prompt':>6}  {'cached':>6}  {'tokens':>6}  "
            f"{'ttft ms (client)':>16}  {'ttft ms (server)':>16}"
        )
        for turn in range(turns):
            sent = time.perf_counter()
            await ws.send(
                json.dumps(
                    {"type": "message.send", "session_id": session_id, "content": QUESTIONS[turn % len(QUESTIONS)]}
                )
            )
            first = None
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "delta" and first is None:
                    first = time.perf_counter()
                elif event["type"] == "error":
                    raise SystemExit(f"error: {event['message']}")
                elif event["type"] == "done":
                    u, t = event["usage"], event["timings"]
                    client_ttft = ((first or time.perf_counter()) - sent) * 1000
                    print(
                        f"{turn + 1:>4}  {u['prompt_tokens']:>6}  {u['cached_tokens']:>6}  {u['completion_tokens']:>6}"
                        f"  {client_ttft:>16.0f}  {t['ttft_ms']:>16.0f}"
                    )
                    break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/ws")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.turns, args.max_tokens))

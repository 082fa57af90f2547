"""Tool-calling conformance from outside: the cases of tests/fixtures/tool_cases.json (adapted from the Berkeley
Function Calling Leaderboard's simple, multiple and parallel categories; the file names its source) through
`/v1/chat/completions` with the official `openai` client, greedy, tool_choice "required" (parallel calls allowed
in the parallel category only).

    python scripts/tool_conformance.py [--url http://127.0.0.1:8000 --api-key KEY] [--max-tokens 160]

Without --url it starts its own server (127.0.0.1, a temporary database). Prints per category and overall:
  valid     complete calls that parse and validate against their tool's schema (the grammar's promise: must be
            100%; a call that max_tokens cut is counted apart, under `cut`)
  accuracy  replies whose calls match BFCL's expected calls: the same functions (any order for parallel), every
            argument given among its acceptable values, every argument BFCL requires given (reported, not a bar:
            the default 135M model is small)
A measurement script; tests/integration/test_tool_conformance.py asserts the validity on the same cases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import openai

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "tests" / "fixtures" / "tool_cases.json"


def load_cases() -> list[dict[str, Any]]:
    return json.loads(CASES.read_text())["cases"]


def _same(value: Any, acceptable: Any) -> bool:
    if isinstance(acceptable, str) and isinstance(value, str):
        return value.strip().lower() == acceptable.strip().lower()
    if isinstance(acceptable, bool) or isinstance(value, bool):
        return value is acceptable
    if isinstance(acceptable, (int, float)) and isinstance(value, (int, float)):
        return abs(value - acceptable) < 1e-9
    if isinstance(acceptable, list) and isinstance(value, list):
        return len(value) == len(acceptable) and all(_same(v, a) for v, a in zip(value, acceptable, strict=True))
    if isinstance(acceptable, dict) and isinstance(value, dict):
        return value.keys() == acceptable.keys() and all(_same(value[k], acceptable[k]) for k in value)
    return value == acceptable


def _matches(name: str, args: dict[str, Any], expected: dict[str, Any]) -> bool:
    if name != expected["name"]:
        return False
    allowed = expected["arguments"]
    for key, value in args.items():
        if key not in allowed or not any(_same(value, a) for a in allowed[key] if a != ""):
            return False
    return all(key in args for key, options in allowed.items() if "" not in options)


def score(case: dict[str, Any], calls: list[tuple[str, str]], cut: bool) -> tuple[int, int, bool]:
    """(complete calls, those valid against their tool's schema, the calls match the expected ones) for one reply;
    `cut`: max_tokens ended the reply, so its last call is incomplete (not counted either way)."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case["tools"]}
    complete = calls[:-1] if cut and calls else calls
    parsed = []
    for name, arguments in complete:
        try:
            args = json.loads(arguments)
            jsonschema.validate(args, schemas[name])
        except (ValueError, KeyError, jsonschema.ValidationError):
            continue
        parsed.append((name, args))
    left = list(case["expected"])
    correct = not cut and len(parsed) == len(calls)
    for name, args in parsed:
        hit = next((e for e in left if _matches(name, args, e)), None)
        if hit is None:
            correct = False
            break
        left.remove(hit)
    return len(complete), len(parsed), correct and not left


async def run(
    client: openai.AsyncOpenAI,
    cases: list[dict[str, Any]],
    max_tokens: int,
    concurrency: int = 8,
    parallel: bool = True,
) -> list[dict[str, Any]]:
    """One greedy reply per case: its calls, finish reason and scores."""
    gate = asyncio.Semaphore(concurrency)

    async def one(case: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            r = await client.chat.completions.create(
                model="default",
                messages=case["messages"],
                tools=case["tools"],
                tool_choice="required",
                parallel_tool_calls=parallel and case["category"] == "parallel",
                temperature=0,
                max_tokens=max_tokens,
            )
        choice = r.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        cut = choice.finish_reason == "length"
        complete, valid, correct = score(case, calls, cut)
        return {
            "id": case["id"],
            "category": case["category"],
            "finish": choice.finish_reason,
            "calls": calls,
            "complete": complete,
            "valid": valid,
            "cut": cut,
            "correct": correct,
        }

    return await asyncio.gather(*(one(c) for c in cases))


def report(results: list[dict[str, Any]]) -> str:
    lines = [f"{'category':10} {'cases':>5} {'calls':>5} {'valid':>7} {'cut':>4} {'accuracy':>9}"]
    for cat in [*sorted({r["category"] for r in results}), "all"]:
        rs = [r for r in results if cat in ("all", r["category"])]
        complete, valid = sum(r["complete"] for r in rs), sum(r["valid"] for r in rs)
        acc = sum(r["correct"] for r in rs) / len(rs)
        cut = sum(r["cut"] for r in rs)
        lines.append(f"{cat:10} {len(rs):5d} {complete:5d} {valid / max(complete, 1):7.1%} {cut:4d} {acc:9.1%}")
    lines.append(
        "calls: complete calls; valid: of those, valid against their tool's schema; cut: replies that "
        "max_tokens ended (their last call not counted)"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--api-key", default="conformance")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--verbose", action="store_true", help="print each case's calls")
    a = ap.parse_args()
    server = None
    if a.url is None:
        sys.path.insert(0, str(REPO))
        from scripts.reliability import Server

        server = Server(Path(tempfile.mkdtemp(prefix="forge-tools-")), [a.api_key]).start()
        a.url = server.url
    try:
        client = openai.AsyncOpenAI(base_url=a.url + "/v1", api_key=a.api_key, max_retries=0, timeout=600)
        results = asyncio.run(run(client, load_cases(), a.max_tokens))
    finally:
        if server is not None:
            server.stop()
    if a.verbose:
        for r in results:
            print(
                f"{r['id']:18} {r['finish']:10} valid={r['valid']}/{r['complete']} correct={r['correct']!s:5} "
                f"{r['calls']}"
            )
    print(report(results))


if __name__ == "__main__":
    main()

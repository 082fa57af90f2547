"""`forge bench`: the engine in-process on a fixed workload; prints a table or JSON.

Numbers are wall-clock on whatever machine runs it: compare them within one run or
across runs on the same kind of machine, never as absolute truths.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from engine import Engine, GenerationRequest, ResponseFormat, SamplingParams
from engine.op_profile import OpProfile
from engine.tool_calls import Tool, ToolChoice, tool_grammar

WORDS = (
    "river",
    "mountain",
    "quiet",
    "lantern",
    "harbor",
    "copper",
    "meadow",
    "signal",
    "winter",
    "orbit",
    "canvas",
    "thunder",
    "garden",
    "pepper",
    "violin",
    "marble",
    "compass",
    "ember",
    "willow",
    "falcon",
    "glacier",
    "summit",
    "velvet",
    "cobalt",
)


def _text(n_words: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt * 13 + i // len(WORDS)) % len(WORDS)] for i in range(n_words))


def _raw_prompt(engine: Engine, n_tokens: int, salt: int) -> list[int]:
    ids = engine.tokenizer.encode(f"Document {salt}: " + _text(n_tokens * 2, salt))
    return ids[:n_tokens]


async def _run(engine: Engine, prompt: list[int], max_tokens: int, params: SamplingParams | None = None) -> dict:
    """One request (greedy, to max_tokens, no speculation unless `params`); its final event's numbers, its
    tokens and the arrival time of every token (a step may bring several: speculative decoding).

    The plain rows (prefill, TTFT, decode, aggregate, chat) measure kernels and batching, comparable with
    llama.cpp's plain decoding; speculation is measured on its own workload (`_speculative`)."""
    params = params or SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative="off")
    stamps: list[float] = []
    text: list[str] = []
    token_ids: list[int] = []
    start = time.perf_counter()
    final = None
    async for ev in engine.generate(GenerationRequest(prompt, params)):
        text.append(ev.text)
        token_ids += ev.token_ids
        stamps += [time.perf_counter()] * len(ev.token_ids)
        if ev.final:
            final = ev
    assert final is not None  # a generation always ends with a final event
    return {
        "start": start,
        "stamps": stamps,
        "text": "".join(text),
        "token_ids": token_ids,
        "usage": final.usage,
        "timings": final.timings,
    }


def _decode_rate(stamps: list[float]) -> float:
    """Tokens/s after the first token (which waits for the prefill)."""
    first = stamps.count(stamps[0])  # tokens that came with the first step
    return (len(stamps) - first) / (stamps[-1] - stamps[0]) if stamps[-1] > stamps[0] else 0.0


REWRITE_CODE = """def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, email, age = line.strip().split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users


def adults(users):
    result = []
    for user in users:
        if user["age"] >= 18:
            result.append(user)
    return result
"""
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "steps": {"type": "array", "items": {"type": "string", "maxLength": 80}, "minItems": 3, "maxItems": 8},
    },
    "required": ["title", "steps"],
    "additionalProperties": False,
}


async def _structured(engine: Engine, max_tokens: int) -> dict:
    """Decode tokens/s for the same prompt free and under a JSON schema (speculation off: the mask's cost alone)."""
    prompt = engine.render_chat(
        [{"role": "user", "content": "Give a recipe for pancakes as JSON with a title and steps."}]
    )
    free = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative="off")
    schema = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        speculative="off",
        response_format=ResponseFormat("json_schema", json.dumps(JSON_SCHEMA)),
    )
    await _run(engine, prompt, 2, schema)  # compile the schema outside the measurement
    await engine.reset_prefix_cache()
    r_free = await _run(engine, prompt, max_tokens, free)
    await engine.reset_prefix_cache()
    r_schema = await _run(engine, prompt, max_tokens, schema)
    return {
        "tok_s_free": _decode_rate(r_free["stamps"]),
        "tok_s_schema": _decode_rate(r_schema["stamps"]),
        "schema_tokens": len(r_schema["token_ids"]),
    }


NOTE_TOOL = Tool(
    "save_note",
    json.dumps(
        {
            "type": "object",
            "properties": {"title": {"type": "string", "maxLength": 60}, "body": {"type": "string", "maxLength": 4000}},
            "required": ["title", "body"],
        }
    ),
    "Save a note with a title and a body",
)


async def _tools(engine: Engine, max_tokens: int) -> dict:
    """Decode tokens/s for the same tool-listing prompt free and under tool_choice "required" (the call grammar's
    mask and the splitter-free engine side; speculation off): the constraint's overhead."""
    prompt = engine.render_chat(
        [{"role": "user", "content": "Save a long note about the history of pancakes."}], tools=[NOTE_TOOL]
    )
    free = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative="off")
    grammar = tool_grammar(engine.tool_format, [NOTE_TOOL], ToolChoice("required"), parallel=False)
    tools = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative="off", response_format=grammar)
    await _run(engine, prompt, 2, tools)  # compile the grammar outside the measurement
    await engine.reset_prefix_cache()
    r_free = await _run(engine, prompt, max_tokens, free)
    await engine.reset_prefix_cache()
    r_tools = await _run(engine, prompt, max_tokens, tools)
    return {
        "tok_s_free": _decode_rate(r_free["stamps"]),
        "tok_s_tools": _decode_rate(r_tools["stamps"]),
        "tools_tokens": len(r_tools["token_ids"]),
    }


async def _speculative(engine: Engine, max_tokens: int, repeats: int) -> dict:
    """Single-stream greedy decode, speculation off vs on, each to the reply's natural end (or max_tokens): a
    rewrite task (fix one typo: the reply copies most of the prompt), and a story, where little is worth
    copying and speculation should cost nothing (`story_*`)."""
    rewrite = await _off_and_on(
        engine,
        max_tokens,
        repeats,
        (
            "Fix the typo in this code (retrn should be return). Reply with the whole corrected code and nothing else:"
            "\n```python\n" + REWRITE_CODE.replace("return result", "retrn result") + "```"
        ),
    )
    story = await _off_and_on(
        engine, max_tokens, repeats, "Write a short story about a lighthouse keeper who finds a message in a bottle."
    )
    return {
        **rewrite,
        "story_tok_s_off": story["tok_s_off"],
        "story_tok_s_on": story["tok_s_on"],
        "story_identical": story["identical"],
    }


async def _off_and_on(engine: Engine, max_tokens: int, repeats: int, content: str) -> dict:
    """`repeats` pairs of runs, off/on then on/off alternately (a machine that speeds up or slows down
    during the pairs favours neither), each side's median rate."""
    prompt = engine.render_chat([{"role": "user", "content": content}])
    rates: dict[str, list[float]] = {"off": [], "ngram": []}
    replies: dict[str, list[list[int]]] = {"off": [], "ngram": []}
    drafted = accepted = 0
    for i in range(repeats):
        for mode in ("off", "ngram") if i % 2 == 0 else ("ngram", "off"):
            await engine.reset_prefix_cache()
            before = engine.stats()
            r = await _run(
                engine, prompt, max_tokens, SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=mode)
            )
            after = engine.stats()
            drafted += after["spec_drafted_tokens"] - before["spec_drafted_tokens"]
            accepted += after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
            rates[mode].append(_decode_rate(r["stamps"]))
            replies[mode].append(r["token_ids"])
    reference = replies["off"][0]
    return {
        "tokens": len(reference),
        "repeats": repeats,
        "tok_s_off": statistics.median(rates["off"]),
        "tok_s_on": statistics.median(rates["ngram"]),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "identical": all(ids == reference for ids in replies["off"] + replies["ngram"]),
    }


EMBED_TOKENS = 64  # each embedding input's length


async def _embeddings(engine: Engine, batch: int, repeats: int) -> dict:
    """Embedding inputs per second: one input a request, one after another, and `batch` inputs in one request
    (the step loop computes them together); each the median of `repeats`."""
    docs = [_raw_prompt(engine, EMBED_TOKENS, 300 + i) for i in range(batch)]
    await engine.embed(docs[:2])  # warm-up
    alone, together = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for doc in docs[:8]:
            await engine.embed([doc])
        alone.append(8 / (time.perf_counter() - t))
        t = time.perf_counter()
        await engine.embed(docs)
        together.append(batch / (time.perf_counter() - t))
    return {
        "input_tokens": EMBED_TOKENS,
        "inputs_per_s_batch1": statistics.median(alone),
        f"inputs_per_s_batch{batch}": statistics.median(together),
    }


RESUME_TOKENS = 2000  # the conversation whose next turn `_resume` times


async def _resume(engine: Engine, repeats: int) -> dict:
    """TTFT of a ~2,000-token conversation's next turn (a new question, one token out) with the conversation's KV
    in memory (`cached`), evicted to a spill tier in a temporary folder (`spilled`), and evicted with no spill
    tier (`recompute`); the median of `repeats` rounds, each question new (its own blocks are never reused)."""
    info = engine.model_info
    # A small model or KV budget (the GPU check's tiny dry run) gets a shorter conversation, never a refusal.
    target = min(RESUME_TOKENS, engine.max_context // 2, info["kv_blocks"] * info["kv_block_size"] // 2)
    history: list[dict] = []
    while len(engine.render_chat(history or [{"role": "user", "content": ""}])) < target:
        turn = len(history) // 2
        history += [
            {"role": "user", "content": f"Question {turn}: " + _text(60, turn)},
            {"role": "assistant", "content": _text(140, turn + 50)},
        ]
    times: dict[str, list[float]] = {"recompute": [], "cached": [], "spilled": [], "restore": []}
    restored = 0
    question = iter(range(10_000))

    async def next_turn() -> tuple[float, int]:
        q = next(question)
        prompt = engine.render_chat(history + [{"role": "user", "content": f"Follow-up {q}: " + _text(12, q)}])
        r = await _run(engine, prompt, 1)
        return r["timings"].ttft * 1000, len(prompt)

    with tempfile.TemporaryDirectory(prefix="forge-bench-spill-") as folder:
        tier = engine.spill_tier(folder, 1 << 30)
        own = await engine.use_spill_tier(None)
        try:
            for _ in range(repeats):
                await engine.use_spill_tier(None)
                await engine.reset_prefix_cache()
                ms, prompt_len = await next_turn()  # nothing cached: the whole conversation computed
                times["recompute"].append(ms)
                times["cached"].append((await next_turn())[0])  # the conversation's blocks in memory
                await engine.use_spill_tier(tier)
                await engine.reset_prefix_cache(spill=True)  # evicted: every cached block to the tier
                before, spent = tier.stats.restored_blocks, tier.stats.restore_s
                times["spilled"].append((await next_turn())[0])
                restored = tier.stats.restored_blocks - before
                times["restore"].append((tier.stats.restore_s - spent) * 1000)
        finally:
            await engine.use_spill_tier(own)
            tier.close()
        await engine.reset_prefix_cache()
    result = {k: statistics.median(v) for k, v in times.items()}
    restore_ms = result.pop("restore")
    return {
        "ttft_ms": result,
        "prompt_tokens": prompt_len,
        "restored_blocks": restored,
        "restore_ms": restore_ms,
        "spilled_over_recompute": result["spilled"] / result["recompute"],
    }


async def _profile_decode(engine: Engine, tokens: int) -> dict:
    """Single-stream decode (speculation off: one token per step) with every op timed: where one step's
    time goes, and how much of it is Python between the kernels (forward time minus op time). The prompt's
    forward, a prefill, is left out: `rows_per_step` says what the timed steps ran (1.0: decode only)."""
    await engine.reset_prefix_cache()
    prompt = _raw_prompt(engine, 32, 3)
    prof = OpProfile(engine.core.backend, skip=1)
    await engine.profile_ops(prof)
    try:
        await _run(
            engine,
            prompt,
            tokens,
            SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, speculative="off"),
        )
    finally:
        await engine.profile_ops(None)
    forward_s, steps = prof.forward_s, prof.forwards
    ops_s = sum(prof.seconds.values())
    return {
        "steps": steps,
        "rows_per_step": prof.rows / steps,
        "step_ms": forward_s / steps * 1000,
        "ops_ms": {k: v / steps * 1000 for k, v in sorted(prof.seconds.items(), key=lambda kv: -kv[1])},
        "calls_per_step": {k: v / steps for k, v in prof.calls.items()},
        "outside_kernels_share": (forward_s - ops_s) / forward_s,
    }


async def _resume_fields(engine: Engine, repeats: int) -> dict:
    r = await _resume(engine, repeats)
    return {"resume_ttft_ms": r["ttft_ms"], "resume": {k: v for k, v in r.items() if k != "ttft_ms"}}


async def _single_decode(engine: Engine, tokens: int) -> dict:
    """One sequence's decode rate; on a CPU also the weight bytes it reads a second (a CPU decode step reads every
    weight byte once: the read bandwidth, `_with_read_bandwidth`, is its bound)."""
    await engine.reset_prefix_cache()
    r = await _run(engine, _raw_prompt(engine, 32, 2), tokens)
    out = {"decode_tokens": tokens, "decode_tok_s": _decode_rate(r["stamps"])}
    info = engine.model_info
    if info["backend"] != "cupy":
        out["weight_read_gb_s"] = info["weight_bytes"] * out["decode_tok_s"] / 1e9
    return out


def _with_read_bandwidth(result: dict, threads: int) -> dict:
    """`result` with the read bandwidth of `threads` threads beside decode's weight reads (CPU only), measured once
    the workload is over: the engine's threads are free then, and the peak RSS is read before its buffer exists."""
    if "weight_read_gb_s" in result:
        from kernels.read_bandwidth import read_bandwidth

        result["read_gb_s"] = read_bandwidth(threads) / 1e9
    return result


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


async def _bench(engine: Engine, quick: bool, profile: bool, report: Callable[[dict], None] | None = None) -> dict:
    """The workload, section by section; `report` gets a copy of the figures so far after each section (a caller
    that may be stopped part-way keeps what was measured). Decode graphs were all captured at load: no timed
    window here holds a capture."""
    info = engine.model_info
    result: dict = {
        "model": info["name"],
        "backend": info["backend"],
        "threads": engine.threads,
        "activations": info["activations"],
        "kv_blocks": info["kv_blocks"],
        "weight_mb": info["weight_bytes"] / 1e6,
        "kv_context_tokens": info["kv_blocks"] * info["kv_block_size"],
    }

    def done(**fields: Any) -> None:
        result.update(fields)
        if report:
            report(dict(result))

    decode_len = 32 if quick else 128
    await _run(engine, _raw_prompt(engine, 64, 999), 4)  # warm-up

    await engine.reset_prefix_cache()
    prefill_len = 500
    r = await _run(engine, _raw_prompt(engine, prefill_len, 1), 1)
    done(prefill_tokens=prefill_len, prefill_tok_s=prefill_len / r["timings"].ttft)

    ttfts = []
    for i in range(3 if quick else 5):
        await engine.reset_prefix_cache()
        prompt = engine.render_chat([{"role": "user", "content": f"Give me {i + 2} tips to sleep better tonight."}])
        ttfts.append((await _run(engine, prompt, 1))["timings"].ttft)
    done(chat_prompt_tokens=len(prompt), ttft_ms=statistics.median(ttfts) * 1000)

    done(**await _single_decode(engine, decode_len))

    aggregate, e2e, itl = {}, {}, []
    for n in (8, 32):
        await engine.reset_prefix_cache()
        runs = await asyncio.gather(*(_run(engine, _raw_prompt(engine, 32, 100 + n + i), decode_len) for i in range(n)))
        t0 = max(run["stamps"][0] for run in runs)  # everyone is decoding from here ...
        t1 = min(run["stamps"][-1] for run in runs)  # ... until the first one ends
        window = sum(sum(t0 < s <= t1 for s in run["stamps"]) for run in runs)
        aggregate[str(n)] = window / (t1 - t0) if t1 > t0 else 0.0
        total = sum(len(run["stamps"]) for run in runs)
        e2e[str(n)] = total / (max(run["stamps"][-1] for run in runs) - min(run["start"] for run in runs))
        if n == 32:
            itl = [b - a for run in runs for a, b in zip(run["stamps"], run["stamps"][1:]) if b > a]
        done(aggregate_tok_s=dict(aggregate), end_to_end_tok_s=dict(e2e))
    done(itl_ms={"p50": _pct(itl, 0.5) * 1000, "p95": _pct(itl, 0.95) * 1000})

    await engine.reset_prefix_cache()
    turns, history, chat = 8, [], []
    for turn in range(1, turns + 1):
        history.append({"role": "user", "content": f"Question {turn}: " + _text(12, turn)})
        prompt = engine.render_chat(history)
        r = await _run(engine, prompt, 16)
        history.append({"role": "assistant", "content": r["text"]})
        chat.append(
            {
                "turn": turn,
                "prompt_tokens": r["usage"].prompt_tokens,
                "cached_tokens": r["usage"].cached_tokens,
                "ttft_ms": r["timings"].ttft * 1000,
            }
        )
    done(chat_ttft_ms={"turn1": chat[0]["ttft_ms"], "turn8": chat[-1]["ttft_ms"]}, chat_turns=chat)

    done(structured=await _structured(engine, decode_len))
    done(tools=await _tools(engine, decode_len))
    done(speculative=await _speculative(engine, 64 if quick else 160, 1 if quick else 3))
    done(embeddings=await _embeddings(engine, 32, 1 if quick else 3))
    done(**await _resume_fields(engine, 1 if quick else 3))
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if profile and engine.model_info["backend"] != "cupy":  # GPU ops return before they run: nothing to time here
        result["decode_profile"] = await _profile_decode(engine, decode_len)
    return result


def run_bench(engine: Engine, as_json: bool = False, quick: bool = False, profile: bool = False) -> dict:
    async def main() -> dict:
        try:
            return _with_read_bandwidth(await _bench(engine, quick, profile), engine.threads)
        finally:
            await engine.shutdown()

    result = asyncio.run(main())
    if as_json:
        print(json.dumps(result, indent=2))
        return result
    rows = [
        (
            "model / backend / threads / activations",
            f"{result['model']} / {result['backend']} / {result['threads']} / {result['activations']}",
        ),
        (f"prefill ({result['prefill_tokens']}-token prompt)", f"{result['prefill_tok_s']:.0f} tok/s"),
        (f"TTFT ({result['chat_prompt_tokens']}-token chat prompt)", f"{result['ttft_ms']:.0f} ms"),
        (f"single-stream decode ({result['decode_tokens']} tokens)", f"{result['decode_tok_s']:.1f} tok/s"),
        ("aggregate decode, 8 sequences", f"{result['aggregate_tok_s']['8']:.0f} tok/s"),
        ("aggregate decode, 32 sequences", f"{result['aggregate_tok_s']['32']:.0f} tok/s"),
        (
            "inter-token latency p50 / p95 (32 seqs)",
            f"{result['itl_ms']['p50']:.0f} / {result['itl_ms']['p95']:.0f} ms",
        ),
        (
            "chat TTFT turn 1 / turn 8",
            f"{result['chat_ttft_ms']['turn1']:.0f} / {result['chat_ttft_ms']['turn8']:.0f} ms",
        ),
        ("cached tokens per turn", " ".join(str(t["cached_tokens"]) for t in result["chat_turns"])),
        (
            "decode free / under a JSON schema",
            f"{result['structured']['tok_s_free']:.1f} / {result['structured']['tok_s_schema']:.1f} tok/s",
        ),
        (
            "decode free / under a tool call (required)",
            f"{result['tools']['tok_s_free']:.1f} / {result['tools']['tok_s_tools']:.1f} tok/s",
        ),
        (
            f"rewrite decode, speculation off / on ({result['speculative']['tokens']} tokens, "
            f"median of {result['speculative']['repeats']})",
            f"{result['speculative']['tok_s_off']:.1f} / {result['speculative']['tok_s_on']:.1f} tok/s, "
            f"acceptance {result['speculative']['acceptance_rate']:.0%}, "
            f"{'identical' if result['speculative']['identical'] else 'DIFFERENT'} output",
        ),
        (
            "story decode, speculation off / on",
            f"{result['speculative']['story_tok_s_off']:.1f} / "
            f"{result['speculative']['story_tok_s_on']:.1f} tok/s, "
            f"{'identical' if result['speculative']['story_identical'] else 'DIFFERENT'} output",
        ),
        (
            f"embeddings ({result['embeddings']['input_tokens']}-token inputs), alone / 32 in one request",
            f"{result['embeddings']['inputs_per_s_batch1']:.1f} / {result['embeddings']['inputs_per_s_batch32']:.1f} "
            "inputs/s",
        ),
        (
            f"next turn of a {result['resume']['prompt_tokens']}-token chat: KV recomputed / cached / spilled",
            f"{result['resume_ttft_ms']['recompute']:.0f} / {result['resume_ttft_ms']['cached']:.0f} / "
            f"{result['resume_ttft_ms']['spilled']:.0f} ms TTFT "
            f"({result['resume']['restored_blocks']} blocks read back)",
        ),
        ("peak RSS", f"{result['peak_rss_mb']:.0f} MB ({result['kv_context_tokens']}-token KV budget)"),
        ("weights (read once a decode step)", f"{result['weight_mb']:.0f} MB"),
    ]
    _print_rows(result, rows)
    return result


def _print_rows(result: dict, rows: list[tuple[str, str]]) -> None:
    """The table, with the rows only some runs have: the read bandwidth (CPU) and the decode profile."""
    if "read_gb_s" in result:  # after the single-stream decode row
        w, r = result["weight_read_gb_s"], result["read_gb_s"]
        share = f"{w:.1f} / {r:.1f} GB/s ({w / r:.0%}, {result['threads']} threads)"
        rows.insert(4, ("decode's weight reads / the read bandwidth", share))
    if "decode_profile" in result:
        p = result["decode_profile"]
        rows.append(
            ("decode step (profiled)", f"{p['step_ms']:.2f} ms, {p['outside_kernels_share']:.0%} outside the ops")
        )
        rows += [(f"  {op} x{p['calls_per_step'][op]:.0f}", f"{ms:.2f} ms") for op, ms in p["ops_ms"].items()]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")

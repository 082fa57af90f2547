"""Forge beside llama.cpp's `llama-bench` on one GGUF, in alternating rounds: prefill and single-stream decode.

    .venv/bin/python scripts/llamacpp_rounds.py --model FILE.gguf --llama-bin DIR [--rounds 5] [--threads 2]
        [--activations f32|q8] [--prompt 256] [--tokens 64]

Each round runs `llama-bench -p P -n 0`, `llama-bench -p 0 -n N` (one repetition each, --threads threads), then the
same in Forge's engine in this process (the model loaded once; a fresh P-token prompt, then N tokens decoded after a
short prompt, greedy, speculation off). On a machine whose memory bandwidth other tenants share, a figure moves by
10-30% from one minute to the next: rounds that alternate expose both programs to the same spells, and the medians
and their ratios are what the script reports (the per-round figures too). `compare_llamacpp.sh` is the one-pass
side-by-side of `forge bench` and llama.cpp (aggregate decode included); this is its steadier prefill/decode check.
--llama-bin is the directory of a llama.cpp build's `llama-bench` (its shared libraries beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import Engine, GenerationRequest, SamplingParams


def llama_bench(bin_dir: Path, model: str, threads: int, prompt: int, tokens: int) -> float:
    """llama-bench's tokens/s for one test (-p prompt -n tokens, one repetition)."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    cmd = [str(bin_dir / "llama-bench"), "-m", model, "-t", str(threads), "-p", str(prompt), "-n", str(tokens)]
    out = subprocess.run([*cmd, "-r", "1", "-o", "json"], env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def prompt_ids(engine: Engine, n: int, salt: int) -> list[int]:
    """n token ids of plain text, different for every salt (no prefix-cache hits between rounds)."""
    words = " ".join(f"word{(i * 7919 + salt * 104729) % 5003}" for i in range(2 * n))
    ids = engine.tokenizer.encode(f"Round {salt}: {words}")
    if len(ids) < n:
        raise SystemExit(f"the tokenizer made {len(ids)} tokens of the filler text, {n} needed")
    return ids[:n]


async def forge_round(engine: Engine, prompt: int, tokens: int, salt: int) -> tuple[float, float]:
    """(prefill tok/s of a `prompt`-token prompt, decode tok/s over `tokens` tokens after the first)."""
    greedy = dict(temperature=0.0, ignore_eos=True, speculative="off")
    start, first = time.perf_counter(), None
    async for ev in engine.generate(GenerationRequest(prompt_ids(engine, prompt, salt), SamplingParams(1, **greedy))):
        if ev.token_ids and first is None:
            first = time.perf_counter()
    assert first is not None
    stamps: list[float] = []
    request = GenerationRequest(prompt_ids(engine, 8, salt + 1000), SamplingParams(tokens + 1, **greedy))
    async for ev in engine.generate(request):
        stamps += [time.perf_counter()] * len(ev.token_ids)
    return prompt / (first - start), (len(stamps) - 1) / (stamps[-1] - stamps[0])


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GGUF file both programs load")
    p.add_argument("--llama-bin", required=True, type=Path, help="the directory holding llama-bench")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--activations", default="f32", choices=["f32", "q8"])
    p.add_argument("--prompt", type=int, default=256, help="prefill test tokens (llama-bench -p)")
    p.add_argument("--tokens", type=int, default=64, help="decode test tokens (llama-bench -n)")
    args = p.parse_args()
    if not (args.llama_bin / "llama-bench").is_file():
        raise SystemExit(f"no llama-bench in {args.llama_bin}")
    engine = Engine.load(
        model=args.model, threads=args.threads, activations=args.activations, speculative="off", kv_memory="1GiB"
    )
    runs: dict[str, list[float]] = {"llama prefill": [], "llama decode": [], "forge prefill": [], "forge decode": []}
    try:
        await forge_round(engine, 16, 4, salt=0)  # warm-up
        for r in range(1, args.rounds + 1):
            runs["llama prefill"].append(llama_bench(args.llama_bin, args.model, args.threads, args.prompt, 0))
            runs["llama decode"].append(llama_bench(args.llama_bin, args.model, args.threads, 0, args.tokens))
            pp, tg = await forge_round(engine, args.prompt, args.tokens, salt=r)
            runs["forge prefill"].append(pp)
            runs["forge decode"].append(tg)
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs.items()), flush=True)
    finally:
        await engine.shutdown()
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(
        f"{Path(args.model).name}, {args.threads} threads, Forge --activations {args.activations}, medians of "
        f"{args.rounds} rounds (tok/s):"
    )
    for what, n in (("prefill", f"{args.prompt}-token prompt"), ("decode", f"{args.tokens} tokens")):
        ratio = med[f"forge {what}"] / med[f"llama {what}"]
        print(
            f"  {what:8} ({n}): forge {med[f'forge {what}']:7.1f}  llama.cpp {med[f'llama {what}']:7.1f}  {ratio:.2f}x"
        )


if __name__ == "__main__":
    asyncio.run(main())
